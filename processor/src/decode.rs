//! Bytes -> spans: an OTLP `ExportTraceServiceRequest` read once, in place.
//!
//! The walker follows `resource_spans -> scope_spans -> spans` and keeps, for each span, what the
//! rules read: ids, parent, name, kind, start time, its scope, its links, and only the attributes
//! whose keys a [`Keys`] set asks for. Everything it keeps is borrowed from the request's bytes, so
//! a prompt in an attribute nobody asked for is never copied, nor even checked: the walker checks
//! the framing of every message it walks into (every tag and length) and skips the rest by length.
//!
//! What a reader would not guess: it answers as a full protobuf decoder (upb) would on any request
//! that decoder accepts. A singular field given twice counts its last value; a message field given
//! twice merges (a `scope` written in two parts, an `AnyValue` whose `array_value` comes twice); a
//! field of the wrong wire type is an unknown field, skipped; an attribute's value may come before
//! its key (the Collector's encoder writes them so). It refuses some requests upb refuses (bad
//! framing, a string it reads that is not UTF-8) and accepts some others that upb would refuse for
//! reasons inside fields it never reads.
#![forbid(unsafe_code)]

pub use crate::keys::{Keys, TooManyKeys};
use std::fmt;
use std::ops::Range;

/// A request the walker cannot read: where (a byte offset into the request), in which message,
/// and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    pub offset: usize,
    pub within: &'static str,
    pub reason: &'static str,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "not an OTLP ExportTraceServiceRequest: at byte {}, in {}: {}",
            self.offset, self.within, self.reason
        )
    }
}

impl std::error::Error for DecodeError {}

/// The messages an error can be in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Within {
    Request,
    ResourceSpans,
    ScopeSpans,
    Scope,
    Span,
    Link,
    KeyValue,
    AnyValue,
    ArrayValue,
}

impl Within {
    fn name(self) -> &'static str {
        match self {
            Within::Request => "ExportTraceServiceRequest",
            Within::ResourceSpans => "ResourceSpans",
            Within::ScopeSpans => "ScopeSpans",
            Within::Scope => "InstrumentationScope",
            Within::Span => "Span",
            Within::Link => "Span.Link",
            Within::KeyValue => "KeyValue",
            Within::AnyValue => "AnyValue",
            Within::ArrayValue => "ArrayValue",
        }
    }
}

/// What can be wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    Truncated,
    LongVarint,
    LongTag,
    WideTag,
    FieldZero,
    NoWireType,
    PastTheEnd,
    NoGroupOpen,
    GroupWithoutEnd,
    GroupEndedByAnother,
    SpanName,
    ScopeName,
    ScopeVersion,
    StringValue,
}

impl Reason {
    fn text(self) -> &'static str {
        match self {
            Reason::Truncated => "truncated",
            Reason::LongVarint => "a varint longer than 10 bytes",
            Reason::LongTag => "a tag longer than 5 bytes",
            Reason::WideTag => "a tag past 32 bits",
            Reason::FieldZero => "field number 0",
            Reason::NoWireType => "wire type 6 or 7 (there is none)",
            Reason::PastTheEnd => "a length past the end of its message",
            Reason::NoGroupOpen => "an end-group tag with no group open",
            Reason::GroupWithoutEnd => "a group with no end",
            Reason::GroupEndedByAnother => "a group ended by another field's end tag",
            Reason::SpanName => "a span name not UTF-8",
            Reason::ScopeName => "a scope name not UTF-8",
            Reason::ScopeVersion => "a scope version not UTF-8",
            Reason::StringValue => "a string value not UTF-8",
        }
    }
}

/// A [`DecodeError`] while the walk goes on: 8 bytes, so that a `Result` of a tag or a varint
/// comes back in registers (the walk returns one for every field it reads).
#[derive(Debug, Clone, Copy)]
struct Fault {
    offset: u32,
    within: Within,
    reason: Reason,
}

impl From<Fault> for DecodeError {
    fn from(fault: Fault) -> DecodeError {
        DecodeError {
            offset: fault.offset as usize,
            within: fault.within.name(),
            reason: fault.reason.text(),
        }
    }
}

type Result<T> = std::result::Result<T, Fault>;

/// One `ScopeSpans` of the request: the resource it is under (the index of its `ResourceSpans`)
/// and its instrumentation scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope<'a> {
    pub resource: u32,
    pub name: &'a str,
    pub version: &'a str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link<'a> {
    pub trace_id: &'a [u8],
    pub span_id: &'a [u8],
}

/// An attribute's value, as far as the rules read values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    Str(&'a str),
    Int(i64),
    Bool(bool),
    /// An `array_value`: its items are [`Request::items`] of this range.
    Array(Range32),
    /// Any other type (double, bytes, a key-value list, a string table index), or no value.
    Other,
}

/// A range into one of a [`Request`]'s tables, in 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Range32 {
    pub start: u32,
    pub end: u32,
}

impl Range32 {
    fn of(range: Range<usize>) -> Range32 {
        // A table grows by at most one entry per byte of the request, and requests are far below
        // 4 GiB (the receivers bound them), so the casts never truncate; saturate all the same.
        Range32 {
            start: u32::try_from(range.start).unwrap_or(u32::MAX),
            end: u32::try_from(range.end).unwrap_or(u32::MAX),
        }
    }

    fn range(self) -> Range<usize> {
        self.start as usize..self.end as usize
    }

    pub fn len(self) -> usize {
        self.range().len()
    }

    pub fn is_empty(self) -> bool {
        self.start == self.end
    }
}

/// One attribute a [`Keys`] set asked for: the key's index and the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attribute<'a> {
    pub key: u16,
    pub value: Value<'a>,
}

/// One span. Ids are as received (any length: the rules judge them); `kind` is the wire integer
/// (an unknown kind is kept, not an error); `scope` indexes [`Request::scopes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span<'a> {
    pub trace_id: &'a [u8],
    pub span_id: &'a [u8],
    pub parent_span_id: &'a [u8],
    pub name: &'a str,
    pub kind: i32,
    pub start_time_unix_nano: u64,
    pub end_time_unix_nano: u64,
    pub scope: u32,
    pub links: Range32,
    pub attributes: Range32,
}

/// A decoded request: flat tables that borrow from its bytes. A span's links and attributes are
/// ranges of [`Request::links`] and [`Request::attributes`], an array's items of
/// [`Request::items`] (`None` for an item that is not a string).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request<'a> {
    pub scopes: Vec<Scope<'a>>,
    pub spans: Vec<Span<'a>>,
    pub links: Vec<Link<'a>>,
    pub attributes: Vec<Attribute<'a>>,
    pub items: Vec<Option<&'a str>>,
}

impl<'a> Request<'a> {
    pub fn links_of(&self, span: &Span<'a>) -> &[Link<'a>] {
        &self.links[span.links.range()]
    }

    pub fn attributes_of(&self, span: &Span<'a>) -> &[Attribute<'a>] {
        &self.attributes[span.attributes.range()]
    }

    pub fn items_of(&self, array: Range32) -> &[Option<&'a str>] {
        &self.items[array.range()]
    }
}

/// Decode `request` (the protobuf bytes of an `ExportTraceServiceRequest`), keeping the attributes
/// `keys` asks for.
pub fn decode<'a>(request: &'a [u8], keys: &Keys) -> std::result::Result<Request<'a>, DecodeError> {
    // Sized for typical spans (a few hundred bytes each, a few attributes asked for), so that the
    // tables rarely grow while they fill.
    let spans = request.len() / 256 + 4;
    let mut walker = Walker {
        bytes: request,
        keys,
        out: Request {
            scopes: Vec::with_capacity(4),
            spans: Vec::with_capacity(spans),
            links: Vec::new(),
            attributes: Vec::with_capacity(spans * 4),
            items: Vec::with_capacity(spans),
        },
    };
    walker.request()?;
    Ok(walker.out)
}

// --- the wire format -----------------------------------------------------------------------------

const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const SGROUP: u8 = 3;
const EGROUP: u8 = 4;
const I32: u8 = 5;

/// What is left to read of the message being read, and where that message ends in the request
/// (so that an error can say at which byte of the request it is: `end - rest.len()`).
#[derive(Clone, Copy)]
struct Cursor<'a> {
    rest: &'a [u8],
    end: usize,
    within: Within,
}

impl<'a> Cursor<'a> {
    #[inline(always)]
    fn more(&self) -> bool {
        !self.rest.is_empty()
    }

    #[cold]
    #[inline(never)]
    fn error(&self, reason: Reason) -> Fault {
        Fault {
            // Requests are far below 4 GiB (the receivers bound them); saturate all the same.
            offset: u32::try_from(self.end - self.rest.len()).unwrap_or(u32::MAX),
            within: self.within,
            reason,
        }
    }

    #[inline(always)]
    fn byte(&mut self) -> Result<u8> {
        match self.rest.split_first() {
            Some((&byte, rest)) => {
                self.rest = rest;
                Ok(byte)
            }
            None => Err(self.error(Reason::Truncated)),
        }
    }

    /// A varint of at most 10 bytes; bits past the 64th are dropped, as protobuf decoders do.
    #[inline(always)]
    fn varint(&mut self) -> Result<u64> {
        let first = self.byte()?;
        if first < 0x80 {
            return Ok(u64::from(first));
        }
        self.varint_rest(u64::from(first & 0x7f))
    }

    #[inline(never)]
    fn varint_rest(&mut self, mut value: u64) -> Result<u64> {
        for shift in (7..70).step_by(7) {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(self.error(Reason::LongVarint))
    }

    /// A field's tag: its number and wire type. A tag is a 32-bit varint of at most 5 bytes, and
    /// field number 0 does not exist.
    #[inline(always)]
    fn tag(&mut self) -> Result<(u32, u8)> {
        let first = self.byte()?;
        let tag = if first < 0x80 {
            u32::from(first)
        } else {
            self.tag_rest(u32::from(first & 0x7f))?
        };
        let wire = (tag & 7) as u8;
        if tag < 8 || wire > I32 {
            return Err(self.error(if tag < 8 {
                Reason::FieldZero
            } else {
                Reason::NoWireType
            }));
        }
        Ok((tag >> 3, wire))
    }

    #[inline(never)]
    fn tag_rest(&mut self, low: u32) -> Result<u32> {
        let mut value = u64::from(low);
        for shift in (7..35).step_by(7) {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return u32::try_from(value).map_err(|_| self.error(Reason::WideTag));
            }
        }
        Err(self.error(Reason::LongTag))
    }

    /// The next `length` bytes of a length-delimited field.
    #[inline(always)]
    fn take(&mut self, length: u64) -> Result<&'a [u8]> {
        match usize::try_from(length) {
            Ok(length) if length <= self.rest.len() => {
                let (taken, rest) = self.rest.split_at(length);
                self.rest = rest;
                Ok(taken)
            }
            _ => Err(self.error(Reason::PastTheEnd)),
        }
    }

    /// A length-delimited field's payload.
    #[inline(always)]
    fn bytes(&mut self) -> Result<&'a [u8]> {
        let length = self.varint()?;
        self.take(length)
    }

    /// A length-delimited field's payload, to walk as the message `within`.
    #[inline(always)]
    fn message(&mut self, within: Within) -> Result<Cursor<'a>> {
        let payload = self.bytes()?;
        Ok(Cursor {
            rest: payload,
            end: self.end - self.rest.len(),
            within,
        })
    }

    /// `width` bytes of a fixed-width field.
    #[inline(always)]
    fn fixed(&mut self, width: usize) -> Result<&'a [u8]> {
        if self.rest.len() < width {
            return Err(self.error(Reason::Truncated));
        }
        let (taken, rest) = self.rest.split_at(width);
        self.rest = rest;
        Ok(taken)
    }

    #[inline(always)]
    fn fixed64(&mut self) -> Result<u64> {
        let mut word = [0u8; 8];
        word.copy_from_slice(self.fixed(8)?);
        Ok(u64::from_le_bytes(word))
    }

    /// Skip a field this walker does not read (its tag already read).
    fn skip(&mut self, field: u32, wire: u8) -> Result<()> {
        match wire {
            VARINT => self.varint().map(drop),
            I64 => self.fixed(8).map(drop),
            LEN => self.bytes().map(drop),
            I32 => self.fixed(4).map(drop),
            SGROUP => self.skip_group(field),
            _ => Err(self.error(Reason::NoGroupOpen)),
        }
    }

    /// Skip a group (its start tag already read) up to its end tag, nested groups included.
    /// Iterative: a hostile nesting depth costs time, never stack.
    fn skip_group(&mut self, field: u32) -> Result<()> {
        let mut depth = 1usize;
        loop {
            if !self.more() {
                return Err(self.error(Reason::GroupWithoutEnd));
            }
            let (number, wire) = self.tag()?;
            match wire {
                SGROUP => depth += 1,
                EGROUP => {
                    depth -= 1;
                    if depth == 0 {
                        if number != field {
                            return Err(self.error(Reason::GroupEndedByAnother));
                        }
                        return Ok(());
                    }
                }
                _ => self.skip(number, wire)?,
            }
        }
    }
}

#[inline]
fn utf8<'a>(bytes: &'a [u8], cursor: &Cursor<'_>, reason: Reason) -> Result<&'a str> {
    std::str::from_utf8(bytes).map_err(|_| cursor.error(reason))
}

// --- the schema ----------------------------------------------------------------------------------

struct Walker<'a, 'k> {
    bytes: &'a [u8],
    keys: &'k Keys,
    out: Request<'a>,
}

impl<'a> Walker<'a, '_> {
    fn request(&mut self) -> Result<()> {
        let mut c = Cursor {
            rest: self.bytes,
            end: self.bytes.len(),
            within: Within::Request,
        };
        let mut resource = 0u32;
        while c.more() {
            match c.tag()? {
                (1, LEN) => {
                    self.resource_spans(c.message(Within::ResourceSpans)?, resource)?;
                    resource = resource.saturating_add(1);
                }
                (field, wire) => c.skip(field, wire)?,
            }
        }
        Ok(())
    }

    fn resource_spans(&mut self, mut c: Cursor<'a>, resource: u32) -> Result<()> {
        while c.more() {
            match c.tag()? {
                (2, LEN) => self.scope_spans(c.message(Within::ScopeSpans)?, resource)?,
                (field, wire) => c.skip(field, wire)?,
            }
        }
        Ok(())
    }

    fn scope_spans(&mut self, mut c: Cursor<'a>, resource: u32) -> Result<()> {
        let index = self.out.scopes.len();
        let scope = u32::try_from(index).unwrap_or(u32::MAX);
        self.out.scopes.push(Scope {
            resource,
            name: "",
            version: "",
        });
        // The scope may come after the spans, and in parts (a message field given twice merges).
        let (mut name, mut version) = ("", "");
        while c.more() {
            match c.tag()? {
                (1, LEN) => {
                    let mut s = c.message(Within::Scope)?;
                    while s.more() {
                        match s.tag()? {
                            (1, LEN) => name = utf8(s.bytes()?, &s, Reason::ScopeName)?,
                            (2, LEN) => {
                                version = utf8(s.bytes()?, &s, Reason::ScopeVersion)?;
                            }
                            (field, wire) => s.skip(field, wire)?,
                        }
                    }
                }
                (2, LEN) => self.span(c.message(Within::Span)?, scope)?,
                (field, wire) => c.skip(field, wire)?,
            }
        }
        let entry = &mut self.out.scopes[index];
        entry.name = name;
        entry.version = version;
        Ok(())
    }

    fn span(&mut self, mut c: Cursor<'a>, scope: u32) -> Result<()> {
        let links = self.out.links.len();
        let attributes = self.out.attributes.len();
        let mut span = Span {
            trace_id: b"",
            span_id: b"",
            parent_span_id: b"",
            name: "",
            kind: 0,
            start_time_unix_nano: 0,
            end_time_unix_nano: 0,
            scope,
            links: Range32::default(),
            attributes: Range32::default(),
        };
        let mut name: &[u8] = b"";
        let mut name_at = c;
        while c.more() {
            match c.tag()? {
                (1, LEN) => span.trace_id = c.bytes()?,
                (2, LEN) => span.span_id = c.bytes()?,
                (4, LEN) => span.parent_span_id = c.bytes()?,
                (5, LEN) => {
                    name_at = c;
                    name = c.bytes()?;
                }
                // An enum, open in proto3: an int32 on the wire, kept whatever its value.
                (6, VARINT) => span.kind = c.varint()? as i32,
                (7, I64) => span.start_time_unix_nano = c.fixed64()?,
                (8, I64) => span.end_time_unix_nano = c.fixed64()?,
                (9, LEN) => self.attribute(c.message(Within::KeyValue)?)?,
                (13, LEN) => self.link(c.message(Within::Link)?)?,
                (field, wire) => c.skip(field, wire)?,
            }
        }
        span.name = utf8(name, &name_at, Reason::SpanName)?;
        span.links = Range32::of(links..self.out.links.len());
        span.attributes = Range32::of(attributes..self.out.attributes.len());
        self.out.spans.push(span);
        Ok(())
    }

    fn link(&mut self, mut c: Cursor<'a>) -> Result<()> {
        let mut link = Link {
            trace_id: b"",
            span_id: b"",
        };
        while c.more() {
            match c.tag()? {
                (1, LEN) => link.trace_id = c.bytes()?,
                (2, LEN) => link.span_id = c.bytes()?,
                (field, wire) => c.skip(field, wire)?,
            }
        }
        self.out.links.push(link);
        Ok(())
    }

    /// A `KeyValue`: its key found first (the last one given, wherever it stands), then, for a
    /// key asked for, its value (every `value` given, merged in order).
    fn attribute(&mut self, c: Cursor<'a>) -> Result<()> {
        let mut scan = c;
        let mut key: &[u8] = b"";
        let mut values = 0usize;
        let mut value = scan;
        while scan.more() {
            match scan.tag()? {
                (1, LEN) => key = scan.bytes()?,
                (2, LEN) => {
                    values += 1;
                    value = scan.message(Within::AnyValue)?;
                }
                (field, wire) => scan.skip(field, wire)?,
            }
        }
        let Some(index) = self.keys.index(key) else {
            return Ok(());
        };
        let mut any = AnyValue::new(self.out.items.len());
        if values == 1 {
            any.merge(value, &mut self.out.items)?;
        } else if values > 1 {
            let mut again = c;
            while again.more() {
                match again.tag()? {
                    (2, LEN) => any.merge(again.message(Within::AnyValue)?, &mut self.out.items)?,
                    (field, wire) => again.skip(field, wire)?,
                }
            }
        }
        self.out.attributes.push(Attribute {
            key: index,
            value: any.value(self.out.items.len()),
        });
        Ok(())
    }
}

/// An `AnyValue` as its fields arrive: the oneof's last case wins, and an `array_value` that comes
/// again while it is the case appends (protobuf merges a message field given twice).
struct AnyValue<'a> {
    items_start: usize,
    case: Case<'a>,
}

enum Case<'a> {
    None,
    Str(&'a str),
    Int(i64),
    Bool(bool),
    Array,
    Other,
}

impl<'a> AnyValue<'a> {
    fn new(items_start: usize) -> Self {
        AnyValue {
            items_start,
            case: Case::None,
        }
    }

    fn set(&mut self, case: Case<'a>, items: &mut Vec<Option<&'a str>>) {
        if matches!(self.case, Case::Array) {
            items.truncate(self.items_start);
        }
        self.case = case;
    }

    fn merge(&mut self, mut c: Cursor<'a>, items: &mut Vec<Option<&'a str>>) -> Result<()> {
        while c.more() {
            match c.tag()? {
                (1, LEN) => {
                    let text = utf8(c.bytes()?, &c, Reason::StringValue)?;
                    self.set(Case::Str(text), items);
                }
                (2, VARINT) => {
                    let value = c.varint()? != 0;
                    self.set(Case::Bool(value), items);
                }
                (3, VARINT) => {
                    let value = c.varint()? as i64;
                    self.set(Case::Int(value), items);
                }
                (4, I64) => {
                    c.fixed64()?;
                    self.set(Case::Other, items);
                }
                // string_value_strindex: a string table's index, which only profiles have.
                (8, VARINT) => {
                    c.varint()?;
                    self.set(Case::Other, items);
                }
                (5, LEN) => {
                    let array = c.message(Within::ArrayValue)?;
                    if !matches!(self.case, Case::Array) {
                        self.set(Case::Array, items);
                    }
                    array_items(array, items)?;
                }
                (field @ (6 | 7), LEN) => {
                    c.skip(field, LEN)?;
                    self.set(Case::Other, items);
                }
                (field, wire) => c.skip(field, wire)?,
            }
        }
        Ok(())
    }

    fn value(self, items_end: usize) -> Value<'a> {
        match self.case {
            Case::Str(text) => Value::Str(text),
            Case::Int(value) => Value::Int(value),
            Case::Bool(value) => Value::Bool(value),
            Case::Array => Value::Array(Range32::of(self.items_start..items_end)),
            Case::None | Case::Other => Value::Other,
        }
    }
}

/// An `ArrayValue`'s items, each a string or `None` (another type, or no value).
fn array_items<'a>(mut c: Cursor<'a>, items: &mut Vec<Option<&'a str>>) -> Result<()> {
    while c.more() {
        match c.tag()? {
            (1, LEN) => {
                let mut item = c.message(Within::AnyValue)?;
                let mut text = None;
                while item.more() {
                    match item.tag()? {
                        (1, LEN) => {
                            text = Some(utf8(item.bytes()?, &item, Reason::StringValue)?);
                        }
                        (field, wire) => {
                            // Another case of the oneof replaces a string given before it.
                            if matches!(
                                (field, wire),
                                (2 | 3 | 8, VARINT) | (4, I64) | (5..=7, LEN)
                            ) {
                                text = None;
                            }
                            item.skip(field, wire)?;
                        }
                    }
                }
                items.push(text);
            }
            (field, wire) => c.skip(field, wire)?,
        }
    }
    Ok(())
}
