//! Hops -> the graph: each span's path of named ancestors, and from the paths the counts (cycles
//! with their kind and the span where the name returned, delegation edges, decisions, tree hops),
//! in bounded state, whatever order the spans arrive in.
//!
//! A span continues the path of the span it depends on: its parent; for a trace's first span the
//! guard's chain it carries, else the span its first link points to, else the caller it names. A
//! span whose parent (or linked span) has not arrived waits for it, and settles, with everything
//! that waited for it, when it does; one whose parent never comes settles when its trace goes (on
//! its chain, else as a root). The guard leaves the chain out of a hop nested directly in the
//! previous hop's span (lean hop spans): such a span's path is its parent's, as any span's, and
//! its parent is the previous hop's span, which the same process exports. An agent run that
//! OpenLLMetry hung off the workflow span, not below the tool span that ran it (a flat run), is
//! held until its workflow span came and the wait ran out, then continues that tool span's path
//! where the intervals prove which one it is (`flat.rs`). A path keeps its last
//! [`MAX_PATH_NAMES`] names. A name that comes back is a loop only where it still waits on the
//! path: a place followed by a transfer (a handoff its spans mark as one) handed off, and control
//! coming back to it is no loop. One loop counts
//! once per trace, labelled from the return that started first (each name in the label escaped:
//! [`push_name`]); one call counts once on the edge
//! from its nearest named ancestor, per path the larger of the guard's spans' calls and the
//! others' (beside the guard another instrumentation records the same calls beside its spans); a
//! tool's run recorded below the tool by both counts for each.
//!
//! What a reader would not guess: counts that later spans can still change wait before they are
//! made. A tool call's edge waits `tool_edge_wait` seconds for an agent run below it to take its
//! place; a loop's count waits `cycle_wait` seconds for an earlier return to name it. Both are
//! made at the latest when the trace goes, so a trace whose spans all arrive within the wait
//! counts exactly what the plain reference (`tests/processor/reference`) counts of it, in any
//! order and any batches.
//!
//! A count once made stays made, so the engine counts otherwise than the reference only where
//! spans of one trace come further apart than the waits (or than the TTL, or a trace goes at
//! capacity first): a run below a tool after the tool's edge counted, or an earlier return after
//! its loop counted; and where parents form a loop (broken at another span than the reference
//! breaks it).
//!
//! Bounds: `max_traces` traces (least recently active go first; traces that go together, as at a
//! sweep, settle what waited across them first), `max_spans` spans over all of them,
//! `max_spans_per_trace` (checked as a request starts on a trace), `trace_ttl` seconds after a
//! trace's latest span; names cut to [`MAX_NAME_CHARS`] characters and labels to
//! [`MAX_LABEL_CHARS`]; as many delegation trees as `max_traces`, each `trace_ttl` after its
//! latest hop.
#![forbid(unsafe_code)]

mod bounds;
mod events;
mod flat;
mod limits;
mod rules;
mod span;
mod trace;
mod waiting;

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::mem;
use std::sync::Arc;

pub use events::{
    Cycle, CycleKind, ESCAPE, Events, Reason, SEPARATOR, cut, label_names, push_name,
};
pub use limits::{
    BadLimits, Limits, MAX_CHAIN_BYTES, MAX_ID_BYTES, MAX_LABEL_CHARS, MAX_NAME_CHARS,
    MAX_PATH_NAMES, MAX_ROOT_BYTES,
};
use trace::{Shared, Trace};

use crate::decode::{self, DecodeError, Keys};
use crate::dialects::{self, FileRows, Key};
use crate::ids::{self, Keyed};
use crate::lru::{Handle, Lru};

#[derive(Debug)]
struct Tree {
    hops: i64,
    last_seen: f64,
}

/// The engine: its state, fed one request at a time.
#[derive(Debug)]
pub struct Engine {
    keys: Keys,
    /// A dialects file's rows, read after the built-in table's (none: the built-in table alone).
    dialects: Arc<FileRows>,
    traces: Lru<Box<[u8]>, Trace>,
    trees: Lru<Box<[u8]>, Tree>,
    shared: Shared,
    stored: usize,
    pending: usize,
    /// The bytes the traces weighed when last weighed, per class (see [`Lru`]): traces of one
    /// name, and those with a delegation path.
    held: [usize; 2],
    changed: Vec<Handle>,
    /// The trace that eviction spares while a span of it is read.
    reading: Option<Handle>,
}

/// Spans read between two checks of the bounds within one request.
const CHECK_EVERY: usize = 256;

/// A trace id as kept: as sent up to MAX_ID_BYTES, else its first 16 bytes and a keyed hash.
fn kept(id: &[u8], keys: Keyed) -> Cow<'_, [u8]> {
    if id.len() <= MAX_ID_BYTES {
        return Cow::Borrowed(id);
    }
    let mut out = Vec::with_capacity(32);
    out.extend_from_slice(&id[..16]);
    out.extend_from_slice(&ids::hash_of(keys, id).to_le_bytes());
    out.extend_from_slice(&ids::hash_of(keys, &(id, 1u8)).to_le_bytes());
    Cow::Owned(out)
}

/// A scope of the request being read.
struct ScopeFacts<'a> {
    name: &'a str,
    hash: u64,
    guard: bool,
    /// OpenLLMetry's OpenAI Agents scope: its spans may be flat (`flat.rs`).
    flat: bool,
}

impl Engine {
    pub fn new(limits: Limits) -> Result<Engine, BadLimits> {
        Engine::with_dialects(limits, Arc::default())
    }

    /// An engine that reads calls by the built-in table and then by `dialects` (a dialects file's
    /// rows): their attribute keys are kept besides the built-in ones.
    pub fn with_dialects(limits: Limits, dialects: Arc<FileRows>) -> Result<Engine, BadLimits> {
        let limits = limits.check()?;
        let names = Key::ALL.iter().map(|key| key.name());
        let keys = Keys::new(names.chain(dialects.keys().iter().map(String::as_str)))
            .map_err(|_| BadLimits("keys"))?;
        Ok(Engine {
            keys,
            dialects,
            traces: Lru::tracked(),
            trees: Lru::default(),
            shared: Shared {
                limits,
                keys: Keyed::new(),
                now: 0.0,
                events: Events::default(),
                queue: VecDeque::new(),
                dirty: Vec::new(),
                scratch: Vec::new(),
                text: String::new(),
                waited: false,
            },
            stored: 0,
            pending: 0,
            held: [0; 2],
            changed: Vec::new(),
            reading: None,
        })
    }

    pub fn limits(&self) -> Limits {
        self.shared.limits
    }

    /// The attribute keys its decode keeps: [`Key::ALL`], then a dialects file's own.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The dialects file's rows it reads by.
    pub fn dialects(&self) -> Arc<FileRows> {
        Arc::clone(&self.dialects)
    }

    pub fn active_traces(&self) -> usize {
        self.traces.len()
    }

    pub fn active_trees(&self) -> usize {
        self.trees.len()
    }

    /// Spans held, settled or waiting.
    pub fn stored_spans(&self) -> usize {
        self.stored
    }

    /// Held spans waiting for their parent or linked span.
    pub fn pending_spans(&self) -> usize {
        self.pending
    }

    /// The bytes the traces hold, as reckoned after the latest call (see [`Limits`]).
    pub fn held_bytes(&self) -> usize {
        self.held[0] + self.held[1]
    }

    /// Traces held that have a delegation path (of two names or more), which go after the others.
    pub fn delegating_traces(&self) -> usize {
        self.traces.len_of(1)
    }

    /// Read one request (the protobuf bytes of an `ExportTraceServiceRequest`) received at `now`
    /// (seconds, on a clock that does not go back); what it counted. A request that does not
    /// decode changes nothing.
    pub fn ingest(&mut self, request: &[u8], now: f64) -> Result<Events, DecodeError> {
        let decoded = decode::decode(request, &self.keys)?;
        self.shared.now = now;
        self.shared.events.received = decoded.spans.len();
        let scopes: Vec<ScopeFacts<'_>> = decoded
            .scopes
            .iter()
            .map(|scope| ScopeFacts {
                name: scope.name,
                hash: ids::hash_of(self.shared.keys, scope.name),
                guard: scope.name == dialects::GUARD_SCOPE,
                flat: scope.name == dialects::OPENAI_AGENTS,
            })
            .collect();
        let mut trees: HashMap<&str, i64> = HashMap::new();
        let mut current: Option<(&[u8], Handle, bool)> = None;
        let spans = &decoded.spans;
        let mut at = 0;
        let mut read = 0;
        while at < spans.len() {
            let scope = spans[at].scope;
            let end = spans[at..]
                .iter()
                .position(|span| span.scope != scope)
                .map_or(spans.len(), |length| at + length);
            let run = &spans[at..end];
            // Exporters send spans as they end, children first: such a run is read backwards, so
            // that parents come first and little has to wait.
            let backwards = run.len() > 1
                && run[0].start_time_unix_nano > run[run.len() - 1].start_time_unix_nano;
            for index in 0..run.len() {
                let span = &run[if backwards {
                    run.len() - 1 - index
                } else {
                    index
                }];
                let facts = &scopes[span.scope as usize];
                self.span(&decoded, span, facts, &mut current, &mut trees);
                read += 1;
                if read % CHECK_EVERY == 0 {
                    self.enforce_budget(current.map(|(_, handle, _)| handle));
                    current = None;
                }
            }
            at = end;
        }
        self.note_trees(trees);
        self.enforce_budget(current.map(|(_, handle, _)| handle));
        self.count_due(now);
        Ok(self.take_events())
    }

    /// Evict the traces idle for longer than the TTL, let go of such trees, and make the counts
    /// whose wait is over.
    pub fn expire(&mut self, now: f64) -> Events {
        self.shared.now = now;
        let deadline = now - self.shared.limits.trace_ttl;
        let mut group = Vec::new();
        for class in [0, 1] {
            let mut at = self.traces.oldest_of(class);
            while let Some(handle) = at {
                match self.traces.get(handle) {
                    Some(trace) if trace.last_seen <= deadline => {
                        group.push((trace.last_seen, handle))
                    }
                    _ => break,
                }
                at = self.traces.newer(handle);
            }
        }
        group.sort_by(|a, b| a.0.total_cmp(&b.0));
        let group: Vec<Handle> = group.into_iter().map(|(_, handle)| handle).collect();
        self.evict(&group, Reason::Ttl);
        self.reckon();
        while let Some(oldest) = self.trees.oldest() {
            match self.trees.get(oldest) {
                Some(tree) if tree.last_seen <= deadline => {
                    self.release_tree(oldest, Some(Reason::Ttl))
                }
                _ => break,
            }
        }
        self.count_due(now);
        self.take_events()
    }

    /// Let go of every delegation tree held (the processor stops), each observed once.
    pub fn release_trees(&mut self) -> Events {
        while let Some(oldest) = self.trees.oldest() {
            self.release_tree(oldest, None);
        }
        self.take_events()
    }

    /// Make every count still waiting (the processor stops: no later span can change them):
    /// settle the spans still waiting for their parent or linked span as their trace's going
    /// would, make every due count, and let go of every trace and tree. Not counted as evictions.
    pub fn drain(&mut self) -> Events {
        let mut group = Vec::new();
        for class in [0, 1] {
            // Both classes of traces (one name, and a delegation path: see `promote`).
            let mut at = self.traces.oldest_of(class);
            while let Some(handle) = at {
                group.push(handle);
                at = self.traces.newer(handle);
            }
        }
        let evictions = self.shared.events.evictions;
        self.evict(&group, Reason::Ttl);
        self.shared.events.evictions = evictions;
        self.shared.queue.clear();
        self.release_trees()
    }

    fn take_events(&mut self) -> Events {
        self.flush();
        mem::take(&mut self.shared.events)
    }

    /// Move the edges counted since the last flush into the events.
    fn flush(&mut self) {
        let dirty = mem::take(&mut self.shared.dirty);
        for &(handle, tally) in &dirty {
            if let Some(trace) = self.traces.get_mut(handle) {
                Self::flush_tally(&mut self.shared, trace, tally);
            }
        }
        self.shared.dirty = dirty;
        self.shared.dirty.clear();
    }

    fn flush_tally(shared: &mut Shared, trace: &mut Trace, tally: u32) {
        let Shared { events, text, .. } = shared;
        let state = &mut trace.tallies[tally as usize];
        let by = mem::take(&mut state.unflushed);
        if by > 0 {
            let path = state.path;
            let callee = trace.entry(path.tail);
            let caller = trace.entry(callee.parent);
            let names = [trace.name(caller.name), trace.name(callee.name)];
            events.delegations.add(text, &names, u64::from(by));
        }
    }
}
