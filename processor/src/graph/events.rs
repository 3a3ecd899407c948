//! What one call into the engine counted ([`Events`]), and how label values are bounded.
#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::mem;

use crate::ids::Map;

const CUT: char = '…';

/// A cycle's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CycleKind {
    /// Nothing named stands between the two occurrences.
    Direct,
    /// Other names stand between.
    CrossFunction,
    /// The path crossed into another trace between them.
    CrossTrace,
}

impl CycleKind {
    pub fn name(self) -> &'static str {
        match self {
            CycleKind::Direct => "direct",
            CycleKind::CrossFunction => "cross_function",
            CycleKind::CrossTrace => "cross_trace",
        }
    }
}

/// A counted cycle: its kind, its label, and the span where the name returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    pub kind: CycleKind,
    pub label: String,
    pub trace_id: Vec<u8>,
    pub span_id: Vec<u8>,
    /// The `otel_guard.chain.root` the guard's spans of its trace name, when they name one.
    pub chain_root: Option<Box<str>>,
}

/// A span by its trace id and span id, as sent.
pub type SpanAt = ([u8; 16], [u8; 8]);

/// Why a trace or a tree went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Ttl,
    Capacity,
}

/// What one call into the engine counted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Events {
    /// Spans in the request.
    pub received: usize,
    pub cycles: Vec<Cycle>,
    /// (caller, callee) -> calls (see [`Events::delegations`]).
    pub(super) delegations: Labelled,
    /// (decision, reason, name) -> spans.
    pub(super) decisions: Labelled,
    /// Per (decision, reason, name), in the order of `decisions`: the latest span counted there
    /// whose ids have the sizes of real ids (16 and 8 bytes), as (trace id, span id).
    pub(super) decision_spans: Vec<Option<SpanAt>>,
    /// The largest hop count of each delegation tree let go of.
    pub tree_hops: Vec<i64>,
    /// Traces evicted: [ttl, capacity].
    pub evictions: [u64; 2],
    /// Trees let go of for a reason: [ttl, capacity] (not those released at stop).
    pub tree_evictions: [u64; 2],
    /// Spans left out because their trace was full.
    pub dropped: u64,
    /// Spans received again while their trace was held.
    pub duplicates: u64,
    /// Names and labels cut to their bound.
    pub truncated_names: u64,
    pub truncated_labels: u64,
}

impl Events {
    /// The calls counted on each edge, (caller, callee), in the order the edges were first counted.
    pub fn delegations(&self) -> impl Iterator<Item = ([&str; 2], u64)> {
        self.delegations.iter()
    }

    /// The spans counted per (decision, reason, name), in the order first counted.
    pub fn decisions(&self) -> impl Iterator<Item = ([&str; 3], u64)> {
        self.decisions.iter()
    }

    /// The latest span of each (decision, reason, name) counted, where its ids have the sizes of
    /// real ids (for an exemplar: a trace store finds nothing by other ids).
    pub fn decision_spans(&self) -> impl Iterator<Item = ([&str; 3], &SpanAt)> {
        self.decisions
            .iter()
            .zip(&self.decision_spans)
            .filter_map(|((values, _), at)| Some((values, at.as_ref()?)))
    }

    /// Count one span's decision `values` (decision, reason, name); the span is `span_id` of
    /// the trace `trace_id` (None: not the size of a real trace id).
    pub(super) fn decide(
        &mut self,
        scratch: &mut String,
        values: &[&str; 3],
        trace_id: Option<[u8; 16]>,
        span_id: &[u8],
    ) {
        let at = self.decisions.add(scratch, values, 1);
        if self.decision_spans.len() <= at {
            self.decision_spans.resize(at + 1, None);
        }
        if let (Some(trace_id), Ok(span_id)) = (trace_id, <[u8; 8]>::try_from(span_id)) {
            self.decision_spans[at] = Some((trace_id, span_id));
        }
    }
}

/// Counts by label values, in the order each set of values was first counted (so that a
/// metric that keeps only so many label sets keeps the first ones, as the detector does).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Labelled {
    counts: Vec<(Box<str>, u64)>,
    index: Map<Box<str>, usize>,
}

impl Labelled {
    /// Add `by` to the count of `values` (`scratch`: a buffer to pack them in); their index in
    /// the order first counted.
    pub(super) fn add(&mut self, scratch: &mut String, values: &[&str], by: u64) -> usize {
        pack(scratch, values);
        match self.index.get(scratch.as_str()) {
            Some(&at) => {
                self.counts[at].1 += by;
                at
            }
            None => {
                let at = self.counts.len();
                self.index.insert(scratch.as_str().into(), at);
                self.counts.push((scratch.as_str().into(), by));
                at
            }
        }
    }

    fn iter<const N: usize>(&self) -> impl Iterator<Item = ([&str; N], u64)> {
        self.counts.iter().map(|(key, count)| (unpack(key), *count))
    }
}

/// Label values in one string: each but the last after its length in bytes, as two characters
/// of ten bits each (a value is at most 256 characters, 1 KiB, long).
fn pack(out: &mut String, parts: &[&str]) {
    out.clear();
    for (at, part) in parts.iter().enumerate() {
        if at + 1 < parts.len() {
            let length = u32::try_from(part.len()).unwrap_or(u32::MAX).min(0xf_ffff);
            out.push(char::from_u32(0x100 + (length >> 10)).unwrap_or('?'));
            out.push(char::from_u32(0x100 + (length & 0x3ff)).unwrap_or('?'));
        }
        out.push_str(part);
    }
}

fn unpack<const N: usize>(mut packed: &str) -> [&str; N] {
    let mut parts = [""; N];
    for (at, part) in parts.iter_mut().enumerate() {
        if at + 1 == N {
            *part = packed;
            break;
        }
        let mut chars = packed.chars();
        let mut ten = || {
            chars
                .next()
                .map_or(0, |c| (u32::from(c).saturating_sub(0x100)) as usize)
        };
        let length = (ten() << 10) | ten();
        let rest = chars.as_str();
        let (head, tail) = rest.split_at(length.min(rest.len()));
        *part = head;
        packed = tail;
    }
    parts
}

/// `text` within `limit` characters, the cut shown by a last `…`.
pub fn cut(text: &str, limit: usize) -> Cow<'_, str> {
    if text.len() <= limit {
        return Cow::Borrowed(text);
    }
    match text.char_indices().nth(limit) {
        None => Cow::Borrowed(text),
        Some(_) => {
            let end = text
                .char_indices()
                .nth(limit - 1)
                .map_or(text.len(), |(at, _)| at);
            let mut out = String::with_capacity(end + CUT.len_utf8());
            out.push_str(&text[..end]);
            out.push(CUT);
            Cow::Owned(out)
        }
    }
}

/// The separator of a `cycle` label's names, and the escape that keeps it out of a name.
pub const SEPARATOR: char = '>';
pub const ESCAPE: char = '\\';

/// Append `name` to a `cycle` label, escaped so the label reads back into its names
/// ([`label_names`]): a `\` is written `\\` and a `>` `\>`.
pub fn push_name(label: &mut String, name: &str) {
    if !name.contains([SEPARATOR, ESCAPE]) {
        label.push_str(name);
        return;
    }
    for c in name.chars() {
        if c == SEPARATOR || c == ESCAPE {
            label.push(ESCAPE);
        }
        label.push(c);
    }
}

/// The names a `cycle` label joins: split at each `>` that no `\` escapes, each `\x` read as `x`.
/// (A label cut to its bound ends in a cut last name, `…` its last character.)
pub fn label_names(label: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut name = String::new();
    let mut chars = label.chars();
    while let Some(c) = chars.next() {
        match c {
            ESCAPE => name.extend(chars.next()),
            SEPARATOR => names.push(mem::take(&mut name)),
            c => name.push(c),
        }
    }
    names.push(name);
    names
}
