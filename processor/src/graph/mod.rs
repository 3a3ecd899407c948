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
//! others' (beside the guard another instrumentation records the same calls beside its spans).
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
//! capacity first): a run below a tool after the tool's edge counted, an earlier return after its
//! loop counted, or the span of a tool's run that started first, of another source, after the
//! run's count; and where parents form a loop (broken at another span than the reference breaks
//! it).
//!
//! Bounds: `max_traces` traces (least recently active go first; traces that go together, as at a
//! sweep, settle what waited across them first), `max_spans` spans over all of them,
//! `max_spans_per_trace` (checked as a request starts on a trace), `trace_ttl` seconds after a
//! trace's latest span; names cut to [`MAX_NAME_CHARS`] characters and labels to
//! [`MAX_LABEL_CHARS`]; as many delegation trees as `max_traces`, each `trace_ttl` after its
//! latest hop.
#![forbid(unsafe_code)]

mod events;
mod flat;
mod limits;
mod rules;
mod trace;

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::mem;
use std::sync::Arc;

pub use events::{
    Cycle, CycleKind, ESCAPE, Events, Reason, SEPARATOR, cut, label_names, push_name,
};
use flat::{FlatKind, Timed};
pub use limits::{
    BadLimits, Limits, MAX_CHAIN_BYTES, MAX_ID_BYTES, MAX_LABEL_CHARS, MAX_NAME_CHARS,
    MAX_PATH_NAMES, MAX_ROOT_BYTES,
};
use trace::{CallFacts, Due, Facts, NONE, PathRef, Shared, Trace, Waiter, Waiting, alloc};

use crate::calls::Hop;
use crate::decode::{self, DecodeError, Keys, Request, Value};
use crate::dialects::{self, Attributes, FileRows, Key};
use crate::ids::{self, Keyed, SpanId};
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

/// Whether a call span marks its call as a transfer (a handoff): the guard's
/// `otel_guard.hop.kind` `transfer`, or the conventions' `gen_ai.transfer.mode` `pass_control`.
fn transfer(attributes: &Attributes<'_, '_>) -> bool {
    attributes.text(Key::HopKind) == Some("transfer")
        || attributes.text(Key::TransferMode) == Some("pass_control")
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

    // --- reading one span ------------------------------------------------------------------------

    fn span<'a>(
        &mut self,
        request: &Request<'a>,
        span: &decode::Span<'a>,
        scope: &ScopeFacts<'a>,
        current: &mut Option<(&'a [u8], Handle, bool)>,
        trees: &mut HashMap<&'a str, i64>,
    ) {
        let (handle, full) = match *current {
            Some((trace_id, handle, full))
                if trace_id == span.trace_id && self.traces.alive(handle) =>
            {
                (handle, full)
            }
            _ => {
                let handle = self.touch(span.trace_id);
                let limits = &self.shared.limits;
                let full = self.traces.get(handle).is_some_and(|trace| {
                    trace.spans.len() >= limits.max_spans_per_trace
                        || trace.weighed >= limits.max_held_bytes
                });
                *current = Some((span.trace_id, handle, full));
                (handle, full)
            }
        };
        let keys = self.shared.keys;
        let span_id = SpanId::of(span.span_id, &keys);
        let Some(trace) = self.traces.get(handle) else {
            return;
        };
        if trace.spans.contains_key(&span_id) {
            self.shared.events.duplicates += 1;
            return;
        }
        let attributes = Attributes::of(request, span);
        if scope.guard
            && let (Some(hops), Some(root)) = (
                attributes.integer(Key::TreeHops),
                attributes.text(Key::ChainRoot),
            )
            && hops > 0
            && !root.is_empty()
            && root.len() <= MAX_ROOT_BYTES
        {
            let largest = trees.entry(root).or_insert(hops);
            *largest = (*largest).max(hops);
        }
        if scope.guard
            && let Some(root) = attributes.text(Key::ChainRoot)
            && !root.is_empty()
            && root.len() <= MAX_ROOT_BYTES
            && let Some(trace) = self.traces.get_mut(handle)
            && trace.root.is_none()
        {
            trace.root = Some(root.into());
        }
        if full {
            self.shared.events.dropped += 1;
            return;
        }
        let facts = self.facts(span, scope, &attributes);
        self.stored += 1;
        if facts.flat.is_some() {
            self.note_flat(handle, span, span_id, &facts);
        }
        if !span.parent_span_id.is_empty() {
            let parent_id = SpanId::of(span.parent_span_id, &keys);
            let trace = self.traces.get(handle);
            let parent = trace
                .and_then(|trace| trace.spans.get(&parent_id))
                .copied()
                .filter(|path| !path.waits());
            match parent {
                Some(_)
                    if facts.flat == Some(FlatKind::Agent)
                        && trace.is_some_and(|trace| trace.is_workflow(&parent_id)) =>
                {
                    let waiting = Waiting {
                        parent: true,
                        facts: facts.into_owned(),
                        chain: None,
                    };
                    self.hold_flat(handle, span_id, parent_id, Box::new(waiting));
                }
                Some(path) => self.settle_now(handle, span_id, &facts, path),
                None => {
                    let chain = self.chain(request, &facts, &attributes);
                    let waiting = Waiting {
                        parent: true,
                        facts: facts.into_owned(),
                        chain,
                    };
                    self.wait(handle, parent_id, handle, span_id, waiting);
                }
            }
            return;
        }
        if let Some(chain) = self.chain(request, &facts, &attributes) {
            let base = self.chain_path(handle, &chain);
            self.settle_now(handle, span_id, &facts, base);
            return;
        }
        if let Some(link) = request.links_of(span).first() {
            let holder = self.holder(link.trace_id, handle);
            let linked_id = SpanId::of(link.span_id, &keys);
            let linked = self
                .traces
                .get(holder)
                .and_then(|trace| trace.spans.get(&linked_id).copied())
                .filter(|path| !path.waits());
            match linked {
                Some(path) => {
                    let base = self.copy_path(holder, path, handle).across();
                    self.settle_now(handle, span_id, &facts, base);
                }
                None => {
                    let waiting = Waiting {
                        parent: false,
                        facts: facts.into_owned(),
                        chain: None,
                    };
                    self.wait(holder, linked_id, handle, span_id, waiting);
                }
            }
            return;
        }
        // The caller a server's span names ran in the trace before; the caller an invoke_agent
        // CLIENT span names (the conventions' caller-aware refinement) in this one.
        let caller = [Key::Caller, Key::CallerName].into_iter().find_map(|key| {
            let caller = attributes.text(key).filter(|caller| !caller.is_empty())?;
            Some((caller, key == Key::Caller))
        });
        let base = match (&facts.call, caller) {
            (Some(_), Some((caller, across))) => {
                let caller = self.shared.cut(caller, MAX_NAME_CHARS);
                let trace = self.traces.get_mut(handle).expect("the trace being read");
                let name = trace.intern(&caller, keys);
                let path = trace.plus(PathRef::ROOT, name, Hop::named_caller(), NONE);
                if across { path.across() } else { path }
            }
            _ => PathRef::ROOT,
        };
        self.settle_now(handle, span_id, &facts, base);
    }

    /// Keep what the flat reading needs of a span of the flat instrumentation: a workflow span's
    /// id, a tool span's interval.
    fn note_flat(
        &mut self,
        handle: Handle,
        span: &decode::Span<'_>,
        span_id: SpanId,
        facts: &Facts<'_>,
    ) {
        let keys = self.shared.keys;
        let Some(trace) = self.traces.get_mut(handle) else {
            return;
        };
        match facts.flat {
            Some(FlatKind::Workflow) => trace.flat().workflows.push(span_id),
            Some(FlatKind::Tool) => trace.flat().tools.push(Timed {
                span: span_id,
                parent: SpanId::of(span.parent_span_id, &keys),
                start: facts.start,
                end: facts.end,
            }),
            _ => {}
        }
    }

    fn facts<'a>(
        &mut self,
        span: &decode::Span<'a>,
        scope: &ScopeFacts<'a>,
        attributes: &Attributes<'_, 'a>,
    ) -> Facts<'a> {
        let call = dialects::call_of(span.name, scope.name, attributes, &self.dialects);
        let call = call.and_then(|call| {
            let name = call.name?;
            Some(CallFacts {
                name: self.shared.cut(name, MAX_NAME_CHARS),
                hop: Hop::of_span(
                    call.kind(),
                    call.row,
                    scope.hash,
                    span.kind,
                    scope.guard,
                    attributes.integer(Key::NameDepth).unwrap_or(0),
                    transfer(attributes),
                ),
                conditional: call.conditional,
            })
        });
        let decision = match (&call, attributes.text(Key::Decision)) {
            (Some(_), Some(verdict)) => {
                let reason = if verdict == "allow" {
                    ""
                } else {
                    attributes.text(Key::Reason).unwrap_or("")
                };
                Some((
                    self.shared.cut(verdict, MAX_NAME_CHARS),
                    self.shared.cut(reason, MAX_NAME_CHARS),
                ))
            }
            _ => None,
        };
        let (flat, end) = match scope.flat {
            true => (
                FlatKind::of(attributes.text(Key::TlKind), call.is_some()),
                span.end_time_unix_nano,
            ),
            false => (None, 0),
        };
        Facts {
            span_id: kept(span.span_id, self.shared.keys),
            start: span.start_time_unix_nano,
            end,
            flat,
            call,
            decision,
        }
    }

    /// The earlier hops of the guard's chain that a call span carries (more than one hop): its
    /// `otel_guard.chain.agents` but the span's own call when it is the last.
    fn chain(
        &mut self,
        request: &Request<'_>,
        facts: &Facts<'_>,
        attributes: &Attributes<'_, '_>,
    ) -> Option<Vec<Box<str>>> {
        let call = facts.call.as_ref()?;
        if attributes.integer(Key::ChainDepth).unwrap_or(0) <= 1 {
            return None;
        }
        let Some(Value::Array(items)) = attributes.value(Key::ChainAgents) else {
            return None;
        };
        let mut names: Vec<Box<str>> = request
            .items_of(items)
            .iter()
            .map(|item| {
                self.shared
                    .cut(item.unwrap_or(""), MAX_NAME_CHARS)
                    .into_owned()
                    .into_boxed_str()
            })
            .collect();
        if names.last().is_some_and(|last| **last == *call.name) {
            names.pop();
        }
        if names.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let kept = names
            .iter()
            .rev()
            .take(MAX_PATH_NAMES)
            .take_while(|name| {
                bytes += name.len();
                bytes <= MAX_CHAIN_BYTES
            })
            .count();
        names.drain(..names.len() - kept);
        (!names.is_empty()).then_some(names)
    }

    /// The path of the earlier hops of a chain.
    fn chain_path(&mut self, handle: Handle, chain: &[Box<str>]) -> PathRef {
        let keys = self.shared.keys;
        let Some(trace) = self.traces.get_mut(handle) else {
            return PathRef::ROOT;
        };
        let mut path = PathRef::ROOT;
        for name in chain {
            let name = trace.intern(name, keys);
            path = trace.plus(path, name, Hop::chained(), NONE);
        }
        path.across()
    }

    /// The trace of `trace_id`, made the newest (made when new, the oldest evicted at capacity).
    fn touch(&mut self, trace_id: &[u8]) -> Handle {
        let now = self.shared.now;
        let trace_id = kept(trace_id, self.shared.keys);
        if let Some(handle) = self.traces.find(&*trace_id) {
            self.traces.touch(handle);
            if let Some(trace) = self.traces.get_mut(handle) {
                trace.last_seen = now;
            }
            return handle;
        }
        if self.traces.len() >= self.shared.limits.max_traces
            && let Some(victim) = self.victim(self.reading)
        {
            self.evict(&[victim], Reason::Capacity);
        }
        self.traces.insert(
            trace_id.into_owned().into(),
            Trace::new(now, self.shared.keys),
        )
    }

    /// The trace a root links into; the root's own trace stays the newest.
    fn holder(&mut self, trace_id: &[u8], own: Handle) -> Handle {
        self.reading = Some(own);
        let holder = self.touch(trace_id);
        self.reading = None;
        self.traces.touch(own);
        holder
    }

    fn wait(
        &mut self,
        holder: Handle,
        awaited: SpanId,
        own: Handle,
        span: SpanId,
        waiting: Waiting,
    ) {
        let keys = self.shared.keys;
        self.pending += 1;
        if let Some(trace) = self.traces.get_mut(own) {
            trace.spans.insert(span, PathRef::WAITING);
            trace.heap += waiting.heap();
            trace.rare(keys).pending.insert(span, Box::new(waiting));
        }
        if let Some(trace) = self.traces.get_mut(holder) {
            let waiter = Waiter { trace: own, span };
            let group = trace.rare(keys).waiting.entry(awaited).or_default();
            let before = group_bytes(group);
            group.push(waiter);
            let grown = group_bytes(group) - before;
            trace.heap += grown;
        }
    }

    /// Settle a span of the request being read, and what waited for it.
    fn settle_now(&mut self, handle: Handle, span: SpanId, facts: &Facts<'_>, base: PathRef) {
        let path = self.settle(handle, facts, base);
        let Some(trace) = self.traces.get_mut(handle) else {
            return;
        };
        trace.spans.insert(span, path);
        let awaited = trace.awaited(&span);
        self.promote(handle, path);
        if awaited {
            self.release(handle, span, path);
        }
    }

    /// Settle what waited for the span `span` of `holder`, whose path is `path`, and what waited
    /// for those.
    fn release(&mut self, holder: Handle, span: SpanId, path: PathRef) {
        let mut stack = vec![(holder, span, path)];
        while let Some((holder, awaited, path)) = stack.pop() {
            let Some(group) = self.traces.get_mut(holder).and_then(|trace| {
                let group = trace.rare.as_mut()?.waiting.remove(&awaited)?;
                trace.heap -= group_bytes(&group);
                trace.tidy();
                Some(group)
            }) else {
                continue;
            };
            for waiter in group {
                let Some(waiting) = self.take_waiting(waiter) else {
                    continue;
                };
                // A flat run whose workflow span came: held for its decision.
                if waiting.parent
                    && waiting.facts.flat == Some(FlatKind::Agent)
                    && waiter.trace == holder
                    && self
                        .traces
                        .get(holder)
                        .is_some_and(|trace| trace.is_workflow(&awaited))
                {
                    self.hold_flat(holder, waiter.span, awaited, waiting);
                    continue;
                }
                let mut base = self.copy_path(holder, path, waiter.trace);
                if !waiting.parent {
                    base = base.across();
                }
                let settled = self.settle(waiter.trace, &waiting.facts, base);
                let Some(trace) = self.traces.get_mut(waiter.trace) else {
                    continue;
                };
                trace.spans.insert(waiter.span, settled);
                let awaited = trace.awaited(&waiter.span);
                self.promote(waiter.trace, settled);
                if awaited {
                    stack.push((waiter.trace, waiter.span, settled));
                }
            }
        }
    }

    /// Take a waiting span out of waiting (None: it settled meanwhile, or its trace went).
    fn take_waiting(&mut self, waiter: Waiter) -> Option<Box<Waiting>> {
        let trace = self.traces.get_mut(waiter.trace)?;
        let waiting = trace.rare.as_mut()?.pending.remove(&waiter.span)?;
        trace.heap -= waiting.heap();
        trace.tidy();
        self.pending -= 1;
        Some(waiting)
    }

    /// Settle a waiting span as one whose parent (or linked span) never came.
    fn settle_orphan(&mut self, waiter: Waiter) {
        let Some(waiting) = self.take_waiting(waiter) else {
            return;
        };
        let base = match &waiting.chain {
            Some(chain) => self.chain_path(waiter.trace, chain),
            None => PathRef::ROOT,
        };
        let path = self.settle(waiter.trace, &waiting.facts, base);
        let Some(trace) = self.traces.get_mut(waiter.trace) else {
            return;
        };
        trace.spans.insert(waiter.span, path);
        let awaited = trace.awaited(&waiter.span);
        self.promote(waiter.trace, path);
        if awaited {
            self.release(waiter.trace, waiter.span, path);
        }
    }

    /// `path` of `from`, as a path of `to`.
    fn copy_path(&mut self, from: Handle, path: PathRef, to: Handle) -> PathRef {
        if from == to || path.len == 0 {
            return path;
        }
        let Some(source) = self.traces.get(from) else {
            return PathRef::ROOT;
        };
        let mut entries = Vec::with_capacity(usize::from(path.len));
        let mut tail = path.tail;
        for _ in 0..path.len {
            let entry = source.entry(tail);
            let node = source.node_ref(from, entry.node);
            entries.push((Box::<str>::from(source.name(entry.name)), entry.hop, node));
            tail = entry.parent;
        }
        let keys = self.shared.keys;
        let Some(target) = self.traces.get_mut(to) else {
            return PathRef::ROOT;
        };
        let mut copy = PathRef::ROOT;
        for (name, hop, node) in entries.into_iter().rev() {
            let name = target.intern(&name, keys);
            let node = node.map_or(NONE, |node| target.node_for(to, node));
            copy = target.plus(copy, name, hop, node);
        }
        PathRef {
            crossed: path.crossed,
            ..copy
        }
    }
    // --- bounds and eviction ----------------------------------------------------------------

    /// Make the counts due by `now`.
    fn count_due(&mut self, now: f64) {
        while let Some(&(at, handle)) = self.shared.queue.front() {
            if at > now {
                break;
            }
            self.shared.queue.pop_front();
            let Some(trace_id) = self.traces.key(handle).cloned() else {
                continue;
            };
            let Some(trace) = self.traces.get_mut(handle) else {
                continue;
            };
            trace.queued = false;
            let flat = trace
                .due
                .iter()
                .any(|(at, due)| matches!(due, Due::Flat) && *at <= now);
            if flat {
                trace
                    .due
                    .retain(|(at, due)| !(matches!(due, Due::Flat) && *at <= now));
                self.decide_flat(handle);
            }
            let Engine { traces, shared, .. } = self;
            let Some(trace) = traces.get_mut(handle) else {
                continue;
            };
            trace.count_due(shared, handle, &trace_id, Some(now));
            if !trace.queued
                && let Some(next) = trace.due.iter().map(|(at, _)| *at).reduce(f64::min)
            {
                trace.queued = true;
                shared.queue.push_back((next, handle));
            }
        }
    }

    /// A trace with a span whose path holds two names or more goes into the class that is
    /// evicted last.
    fn promote(&mut self, handle: Handle, path: PathRef) {
        if path.len >= 2
            && !path.waits()
            && self.traces.class(handle) == Some(0)
            && let Some(trace) = self.traces.get(handle)
        {
            let weighed = trace.weighed;
            self.held[0] -= weighed;
            self.held[1] += weighed;
            self.traces.promote(handle);
        }
    }

    /// Weigh again the traces changed since they were last weighed.
    fn reckon(&mut self) {
        let mut changed = mem::take(&mut self.changed);
        self.traces.take_changed(&mut changed);
        for &handle in &changed {
            let key = self.traces.key(handle).map_or(0, |key| key.len());
            let class = usize::from(self.traces.class(handle).unwrap_or(0));
            if let Some(trace) = self.traces.get_mut_unnoted(handle) {
                let weight = trace.weigh(key);
                self.held[class] = self.held[class] - trace.weighed + weight;
                trace.weighed = weight;
            }
        }
        self.changed = changed;
    }

    /// The trace to evict at capacity, but `spare` (the trace being read): the oldest of those
    /// with no delegation path, unless those with one hold more than their share (three quarters
    /// of the traces or of the bytes), or there are none; else the oldest with one.
    fn victim(&self, spare: Option<Handle>) -> Option<Handle> {
        let limits = &self.shared.limits;
        let crowded = self.traces.len_of(1) > limits.max_traces / 4 * 3
            || self.held[1] > limits.max_held_bytes / 4 * 3;
        let order: [u8; 2] = if crowded { [1, 0] } else { [0, 1] };
        for class in order {
            let mut at = self.traces.oldest_of(class);
            while let Some(handle) = at {
                if Some(handle) != spare {
                    return Some(handle);
                }
                at = self.traces.newer(handle);
            }
        }
        None
    }

    /// Evict traces until the spans and the bytes held are within their bounds (the trace being
    /// read, `spare`, stays).
    fn enforce_budget(&mut self, spare: Option<Handle>) {
        self.reckon();
        let limits = self.shared.limits;
        while self.stored > limits.max_spans || self.held_bytes() > limits.max_held_bytes {
            let Some(victim) = self.victim(spare) else {
                break;
            };
            self.evict(&[victim], Reason::Capacity);
            self.reckon();
        }
    }

    /// Drop traces, after settling what waited in them in vain, and making their counts.
    fn evict(&mut self, group: &[Handle], reason: Reason) {
        // The spans waiting for a span that never came, and everything that waited for them.
        for &handle in group {
            let Some(trace) = self.traces.get(handle) else {
                continue;
            };
            let Some(rare) = trace.rare.as_ref() else {
                continue;
            };
            let absent: Vec<SpanId> = rare
                .waiting
                .keys()
                .filter(|awaited| !trace.spans.contains_key(*awaited))
                .copied()
                .collect();
            for awaited in absent {
                let waiters = self
                    .traces
                    .get_mut(handle)
                    .and_then(|trace| trace.rare.as_mut())
                    .and_then(|rare| rare.waiting.remove(&awaited))
                    .unwrap_or_default();
                for waiter in waiters {
                    self.settle_orphan(waiter);
                }
            }
        }
        // The flat runs held for their decision: decided with what came.
        for &handle in group {
            self.decide_flat(handle);
        }
        // What is left of these traces' spans waits on a loop of parents, or on a span of a trace
        // that stays: the trace roots first, then anywhere.
        for &handle in group {
            for roots in [true, false] {
                let Some(rare) = self
                    .traces
                    .get(handle)
                    .and_then(|trace| trace.rare.as_ref())
                else {
                    continue;
                };
                let mut left: Vec<SpanId> = rare
                    .pending
                    .iter()
                    .filter(|(_, waiting)| waiting.parent != roots)
                    .map(|(span, _)| *span)
                    .collect();
                left.sort_unstable();
                for span in left {
                    self.settle_orphan(Waiter {
                        trace: handle,
                        span,
                    });
                }
            }
        }
        for &handle in group {
            let Some(trace_id) = self.traces.key(handle).cloned() else {
                continue;
            };
            let Engine { traces, shared, .. } = self;
            let Some(trace) = traces.get_mut(handle) else {
                continue;
            };
            trace.count_due(shared, handle, &trace_id, None);
            self.flush();
            let class = usize::from(self.traces.class(handle).unwrap_or(0));
            if let Some((_, trace)) = self.traces.remove(handle) {
                self.held[class] -= trace.weighed;
                self.stored -= trace.spans.len();
                self.pending -= trace.rare.as_ref().map_or(0, |rare| rare.pending.len());
                self.shared.events.evictions[reason as usize] += 1;
            }
        }
    }

    fn note_trees(&mut self, trees: HashMap<&str, i64>) {
        let now = self.shared.now;
        for (root, hops) in trees {
            match self.trees.find(root.as_bytes()) {
                Some(handle) => {
                    self.trees.touch(handle);
                    if let Some(tree) = self.trees.get_mut(handle) {
                        tree.hops = tree.hops.max(hops);
                        tree.last_seen = now;
                    }
                }
                None => {
                    if self.trees.len() >= self.shared.limits.max_traces
                        && let Some(oldest) = self.trees.oldest()
                    {
                        self.release_tree(oldest, Some(Reason::Capacity));
                    }
                    self.trees.insert(
                        root.as_bytes().into(),
                        Tree {
                            hops,
                            last_seen: now,
                        },
                    );
                }
            }
        }
    }

    fn release_tree(&mut self, handle: Handle, reason: Option<Reason>) {
        if let Some((_, tree)) = self.trees.remove(handle) {
            self.shared.events.tree_hops.push(tree.hops);
            if let Some(reason) = reason {
                self.shared.events.tree_evictions[reason as usize] += 1;
            }
        }
    }
}

/// The bytes a group of spans waiting for one span holds.
fn group_bytes(group: &Vec<Waiter>) -> usize {
    alloc(group.capacity() * mem::size_of::<Waiter>())
}
