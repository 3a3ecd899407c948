//! What the decoder's tests share: protobuf written by hand, the OTLP schema's nesting (to reorder
//! an encoding's fields), and the decoder's answer as owned values to compare.
#![allow(dead_code)] // each test file uses part of it

pub mod counted;
pub mod mutations;
pub mod spans;

use otel_guard_engine::decode::{Request, Value};

// --- writing protobuf by hand --------------------------------------------------------------------

pub fn varint(mut value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let low = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(low);
            return out;
        }
        out.push(low | 0x80);
    }
}

pub fn tag(field: u32, wire: u8) -> Vec<u8> {
    varint(u64::from(field) << 3 | u64::from(wire))
}

/// Field `field`, length-delimited.
pub fn len(field: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = tag(field, 2);
    out.extend(varint(payload.len() as u64));
    out.extend_from_slice(payload);
    out
}

pub fn int(field: u32, value: u64) -> Vec<u8> {
    let mut out = tag(field, 0);
    out.extend(varint(value));
    out
}

pub fn fixed64(field: u32, value: u64) -> Vec<u8> {
    let mut out = tag(field, 1);
    out.extend(value.to_le_bytes());
    out
}

pub fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// A request of one resource of one scope (`scope` its encoded InstrumentationScope) holding
/// `spans` (each encoded).
pub fn request(scope: &[u8], spans: &[Vec<u8>]) -> Vec<u8> {
    let mut scope_spans = len(1, scope);
    for span in spans {
        scope_spans.extend(len(2, span));
    }
    len(1, &len(2, &scope_spans))
}

/// A KeyValue, key first.
pub fn key_value(key: &str, value: &[u8]) -> Vec<u8> {
    cat(&[&len(1, key.as_bytes()), &len(2, value)])
}

pub fn string_value(text: &str) -> Vec<u8> {
    len(1, text.as_bytes())
}

// --- reordering an encoding ----------------------------------------------------------------------

/// The messages of an OTLP trace request, as far as nesting goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    Request,
    ResourceSpans,
    Resource,
    ScopeSpans,
    Scope,
    Span,
    Event,
    Link,
    Status,
    KeyValue,
    AnyValue,
    ArrayValue,
    KeyValueList,
}

impl Message {
    /// The message a length-delimited field of this message holds, if it holds one.
    fn child(self, field: u32) -> Option<Message> {
        use Message::*;
        Some(match (self, field) {
            (Request, 1) => ResourceSpans,
            (ResourceSpans, 1) => Resource,
            (ResourceSpans, 2) => ScopeSpans,
            (Resource, 1) | (Scope, 3) | (Event, 3) | (Link, 4) | (Span, 9) | (KeyValueList, 1) => {
                KeyValue
            }
            (ScopeSpans, 1) => Scope,
            (ScopeSpans, 2) => Span,
            (Span, 11) => Event,
            (Span, 13) => Link,
            (Span, 15) => Status,
            (KeyValue, 2) | (ArrayValue, 1) => AnyValue,
            (AnyValue, 5) => ArrayValue,
            (AnyValue, 6) => KeyValueList,
            _ => return None,
        })
    }
}

/// SplitMix64: enough randomness for reordering, from a seed proptest chose.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn read_varint(bytes: &[u8], at: &mut usize) -> u64 {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = bytes[*at];
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return value;
        }
        shift += 7;
    }
}

/// A field: its number, its whole encoding, its payload if length-delimited.
type Field = (u32, Vec<u8>, Option<Vec<u8>>);

/// The fields of a valid encoding.
fn fields(bytes: &[u8]) -> Vec<Field> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let start = at;
        let tag = read_varint(bytes, &mut at);
        let (field, wire) = ((tag >> 3) as u32, (tag & 7) as u8);
        let payload = match wire {
            0 => {
                read_varint(bytes, &mut at);
                None
            }
            1 => {
                at += 8;
                None
            }
            5 => {
                at += 4;
                None
            }
            2 => {
                let length = read_varint(bytes, &mut at) as usize;
                at += length;
                Some(bytes[at - length..at].to_vec())
            }
            _ => panic!("groups are not written by prost"),
        };
        out.push((field, bytes[start..at].to_vec(), payload));
    }
    out
}

/// The same message with its fields (at every depth) in a random order that keeps the order of
/// each field's repeats: what any encoder may write, the Collector's value-first KeyValues
/// included. Decoding it must give what decoding the original gives.
pub fn reorder(bytes: &[u8], message: Message, rng: &mut Rng) -> Vec<u8> {
    let mut groups: Groups = Vec::new();
    for (field, whole, payload) in fields(bytes) {
        let encoded = match (payload, message.child(field)) {
            (Some(payload), Some(child)) => len(field, &reorder(&payload, child, rng)),
            _ => whole,
        };
        match groups.iter_mut().find(|(number, _)| *number == field) {
            Some((_, group)) => group.push_back(encoded),
            None => groups.push((field, [encoded].into())),
        }
    }
    rewrite(message, &mut groups, rng);
    let mut out = Vec::with_capacity(bytes.len());
    while !groups.is_empty() {
        let pick = rng.below(groups.len());
        out.extend(groups[pick].1.pop_front().unwrap_or_default());
        if groups[pick].1.is_empty() {
            groups.remove(pick);
        }
    }
    out
}

type Groups = Vec<(u32, std::collections::VecDeque<Vec<u8>>)>;

fn payload(field: &[u8]) -> Vec<u8> {
    fields(field).remove(0).2.unwrap_or_default()
}

/// Rewrites that keep a message's meaning, as protobuf merges fields: a decoy given before a
/// singular field (the last one counts), a scope in two parts, an array value in two parts.
fn rewrite(message: Message, groups: &mut Groups, rng: &mut Rng) {
    fn group(groups: &mut Groups, field: u32) -> Option<&mut std::collections::VecDeque<Vec<u8>>> {
        groups
            .iter_mut()
            .find(|(number, _)| *number == field)
            .map(|(_, g)| g)
    }
    match message {
        Message::Span | Message::KeyValue if rng.below(4) == 0 => {
            let field = if message == Message::Span { 5 } else { 1 };
            if let Some(group) = group(groups, field) {
                group.push_front(len(field, b"decoy"));
            }
        }
        Message::ScopeSpans if rng.below(3) == 0 => {
            if let Some(group) = group(groups, 1).filter(|group| group.len() == 1) {
                let parts: Vec<Vec<u8>> = fields(&payload(&group[0]))
                    .into_iter()
                    .map(|(_, whole, _)| whole)
                    .collect();
                let at = rng.below(parts.len() + 1);
                let (first, second) = (parts[..at].concat(), parts[at..].concat());
                *group = [len(1, &first), len(1, &second)].into();
            }
        }
        Message::KeyValue if rng.below(2) == 0 => {
            if let Some(group) = group(groups, 2).filter(|group| group.len() == 1) {
                let value = fields(&payload(&group[0]));
                if let [(5, _, Some(array))] = value.as_slice() {
                    let items = fields(array);
                    let at = rng.below(items.len() + 1);
                    let part = |range: std::ops::Range<usize>| {
                        len(
                            5,
                            &items[range]
                                .iter()
                                .flat_map(|(_, whole, _)| whole.clone())
                                .collect::<Vec<_>>(),
                        )
                    };
                    let (first, second) = (part(0..at), part(at..items.len()));
                    *group = if rng.below(2) == 0 {
                        [len(2, &first), len(2, &second)].into()
                    } else {
                        [len(2, &cat(&[&first, &second]))].into()
                    };
                }
            }
        }
        _ => {}
    }
}

// --- the decoder's answer, owned -----------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
pub enum Owned {
    Str(String),
    Int(i64),
    Bool(bool),
    Array(Vec<Option<String>>),
    Other,
}

#[derive(Debug, Clone, PartialEq)]
pub struct OwnedSpan {
    pub trace_id: Vec<u8>,
    pub span_id: Vec<u8>,
    pub parent_span_id: Vec<u8>,
    pub name: String,
    pub kind: i32,
    pub start_time_unix_nano: u64,
    pub scope: u32,
    pub links: Vec<(Vec<u8>, Vec<u8>)>,
    pub attributes: Vec<(String, Owned)>,
}

/// (scopes as (resource, name, version), spans)
pub type OwnedRequest = (Vec<(u32, String, String)>, Vec<OwnedSpan>);

pub fn owned(request: &Request<'_>, keys: &otel_guard_engine::decode::Keys) -> OwnedRequest {
    let scopes = request
        .scopes
        .iter()
        .map(|scope| {
            (
                scope.resource,
                scope.name.to_owned(),
                scope.version.to_owned(),
            )
        })
        .collect();
    let spans = request
        .spans
        .iter()
        .map(|span| OwnedSpan {
            trace_id: span.trace_id.to_vec(),
            span_id: span.span_id.to_vec(),
            parent_span_id: span.parent_span_id.to_vec(),
            name: span.name.to_owned(),
            kind: span.kind,
            start_time_unix_nano: span.start_time_unix_nano,
            scope: span.scope,
            links: request
                .links_of(span)
                .iter()
                .map(|link| (link.trace_id.to_vec(), link.span_id.to_vec()))
                .collect(),
            attributes: request
                .attributes_of(span)
                .iter()
                .map(|attribute| {
                    let value = match attribute.value {
                        Value::Str(text) => Owned::Str(text.to_owned()),
                        Value::Int(number) => Owned::Int(number),
                        Value::Bool(flag) => Owned::Bool(flag),
                        Value::Array(items) => Owned::Array(
                            request
                                .items_of(items)
                                .iter()
                                .map(|item| item.map(str::to_owned))
                                .collect(),
                        ),
                        Value::Other => Owned::Other,
                    };
                    (keys.name(attribute.key).to_owned(), value)
                })
                .collect(),
        })
        .collect();
    (scopes, spans)
}
