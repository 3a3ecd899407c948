//! The state of one trace: its spans' paths (entries of named ancestors, shared by prefix), its
//! calls and their tallies per path of names, its loops, its waiting spans; and what every trace's
//! work writes to ([`Shared`]).
#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::collections::VecDeque;
use std::mem::{self, size_of};

use super::events::{Cycle, CycleKind, Events, cut};
use super::flat::{Flat, FlatKind};
use super::{Limits, MAX_LABEL_CHARS, MAX_PATH_NAMES};
use crate::calls::Hop;
use crate::ids::{self, Keyed, Map, SpanId};
use crate::lru::Handle;

// --- spans as the graph reads them ----------------------------------------------------------------

/// What settling a span reads of it: owned while it waits, borrowed from the request otherwise.
#[derive(Debug, Clone)]
pub(super) struct Facts<'a> {
    pub(super) span_id: Cow<'a, [u8]>,
    pub(super) start: u64,
    /// Its end: read of the flat instrumentation's spans alone (0 for the others).
    pub(super) end: u64,
    /// What it is to the flat reading (`flat.rs`), if anything.
    pub(super) flat: Option<FlatKind>,
    pub(super) call: Option<CallFacts<'a>>,
    /// (decision, reason) of the guard's `otel_guard.decision`, cut.
    pub(super) decision: Option<(Cow<'a, str>, Cow<'a, str>)>,
}

#[derive(Debug, Clone)]
pub(super) struct CallFacts<'a> {
    pub(super) name: Cow<'a, str>,
    pub(super) hop: Hop,
    pub(super) conditional: bool,
}

pub(super) fn owned(text: Cow<'_, str>) -> Cow<'static, str> {
    Cow::Owned(text.into_owned())
}

impl Facts<'_> {
    pub(super) fn into_owned(self) -> Facts<'static> {
        Facts {
            span_id: Cow::Owned(self.span_id.into_owned()),
            start: self.start,
            end: self.end,
            flat: self.flat,
            call: self.call.map(|call| CallFacts {
                name: owned(call.name),
                hop: call.hop,
                conditional: call.conditional,
            }),
            decision: self
                .decision
                .map(|(verdict, reason)| (owned(verdict), owned(reason))),
        }
    }

    pub(super) fn order(&self) -> (u64, &[u8]) {
        (self.start, &self.span_id)
    }
}

/// A span that waits: for its parent (`parent` true), or as a trace root for the span it links to.
#[derive(Debug)]
pub(super) struct Waiting {
    pub(super) parent: bool,
    pub(super) facts: Facts<'static>,
    /// The earlier hops of the guard's chain it carries, for when its parent never comes.
    pub(super) chain: Option<Vec<Box<str>>>,
}

impl Waiting {
    /// The bytes it holds, itself included.
    pub(super) fn heap(&self) -> usize {
        let facts = &self.facts;
        let mut bytes = alloc(size_of::<Waiting>()) + alloc(facts.span_id.len());
        if let Some(call) = &facts.call {
            bytes += alloc(call.name.len());
        }
        if let Some((verdict, reason)) = &facts.decision {
            bytes += alloc(verdict.len()) + alloc(reason.len());
        }
        if let Some(chain) = &self.chain {
            bytes += vec_bytes(chain) + chain.iter().map(|name| alloc(name.len())).sum::<usize>();
        }
        bytes
    }
}

/// What an allocation of `bytes` takes of the heap: glibc's malloc adds 8 bytes, rounds to 16,
/// and gives no less than 32.
pub(super) const fn alloc(bytes: usize) -> usize {
    if bytes == 0 {
        return 0;
    }
    let rounded = (bytes + 8 + 15) & !15;
    if rounded < 32 { 32 } else { rounded }
}

pub(super) fn vec_bytes<T>(items: &Vec<T>) -> usize {
    alloc(items.capacity() * size_of::<T>())
}

/// A hash map's table: its buckets (a key, a value and a control byte each) and a group of
/// control bytes, as the standard library's map (hashbrown) sizes it for its capacity.
pub(super) fn map_bytes<K, V>(map: &Map<K, V>) -> usize {
    let capacity = map.capacity();
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        capacity + 1
    } else {
        capacity / 7 * 8
    };
    alloc(buckets * (size_of::<(K, V)>() + 1) + 16)
}

/// A span that waits in some trace's index: its own trace, and its id.
#[derive(Debug, Clone, Copy)]
pub(super) struct Waiter {
    pub(super) trace: Handle,
    pub(super) span: SpanId,
}

// --- paths ----------------------------------------------------------------------------------------

pub(super) const NONE: u32 = u32::MAX;

/// A path: the entry of its last name (an index into its trace's entries, plus one; 0 for the
/// empty path), how many names it holds (the entries from there up, at most MAX_PATH_NAMES),
/// and how many of them lie before its latest crossing into this trace. A held span's path, or
/// [`PathRef::WAITING`] while it waits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct PathRef {
    pub(super) tail: u32,
    pub(super) len: u8,
    pub(super) crossed: u8,
}

impl PathRef {
    pub(super) const ROOT: PathRef = PathRef {
        tail: 0,
        len: 0,
        crossed: 0,
    };
    pub(super) const WAITING: PathRef = PathRef {
        tail: 0,
        len: u8::MAX,
        crossed: 0,
    };

    pub(super) fn across(self) -> PathRef {
        PathRef {
            crossed: self.len,
            ..self
        }
    }

    pub(super) fn waits(self) -> bool {
        self.len == u8::MAX
    }
}

/// A named entry on a path: its name (of its trace's names), its parent entry, its call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    pub(super) parent: u32,
    pub(super) name: u32,
    /// Its call, of the trace's nodes (NONE: a chain's hop, a named caller).
    pub(super) node: u32,
    pub(super) hop: Hop,
}

/// A call anywhere: its trace, and its index in that trace's nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NodeRef {
    pub(super) trace: Handle,
    pub(super) index: u32,
}

/// A call an entry stands for: one of this trace's (its tally, NONE for a path of one name, which
/// counts no edge; whether the guard's span recorded it first), or another trace's, which a path
/// copied from there leads to.
#[derive(Debug, Clone, Copy)]
pub(super) enum Node {
    /// `guard`: the source of its first span; `both`: the other source has recorded it too (a
    /// tool's run, recorded below the tool by each source, counts once for each).
    Local {
        tally: u32,
        guard: bool,
        both: bool,
        ran: bool,
    },
    Foreign(NodeRef),
}

/// The calls at one path of names and kind, per source ([others, the guard's]); `path` the path
/// of the first.
#[derive(Debug)]
pub(super) struct Tally {
    pub(super) path: PathRef,
    pub(super) tool: bool,
    pub(super) calls: [u32; 2],
    pub(super) ran: [u32; 2],
    pub(super) counted: u32,
    pub(super) unflushed: u32,
}

/// An agent's run below a tool call: its node (every later span of the run, of either source,
/// continues it).
#[derive(Debug, Clone)]
pub(super) struct Run {
    pub(super) node: NodeRef,
}

#[derive(Debug)]
pub(super) struct CycleState {
    pub(super) kind: CycleKind,
    pub(super) start: u64,
    pub(super) span_id: Box<[u8]>,
    pub(super) label: Box<str>,
    pub(super) counted: bool,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Due {
    Tool(u32),
    Cycle(u32),
    /// The decision of the held flat runs (made by the engine: `flat.rs`).
    Flat,
}

/// Tallies and names a trace looks up by a scan while it has at most this many.
pub(super) const SCANNED: usize = 16;

/// The state of one trace.
#[derive(Debug)]
pub(super) struct Trace {
    pub(super) last_seen: f64,
    /// Every span held: its path, or WAITING (its facts in `rare.pending`).
    pub(super) spans: Map<SpanId, PathRef>,
    pub(super) names: Vec<Box<str>>,
    pub(super) entries: Vec<Entry>,
    pub(super) nodes: Vec<Node>,
    pub(super) tallies: Vec<Tally>,
    /// (a call, an agent's name) -> that agent's run directly below the call. Most traces with a
    /// tool hold one, so it lives here rather than in `rare`, where it would keep the rare parts
    /// (300 bytes and a map) alive for one entry.
    pub(super) runs: Vec<((u32, u32), Run)>,
    pub(super) due: Vec<(f64, Due)>,
    pub(super) queued: bool,
    pub(super) rare: Option<Box<Rare>>,
    /// The first `otel_guard.chain.root` its guard spans named (a cycle's `chain_root`).
    pub(super) root: Option<Box<str>>,
    /// Its flat instrumentation's spans (`flat.rs`), when it has any.
    pub(super) flat: Option<Box<Flat>>,
    /// What the trace's names, waiting spans and index keys hold on the heap (what
    /// [`Trace::weigh`] cannot read from a length).
    pub(super) heap: usize,
    /// What it weighed when last weighed (what the engine's total holds of it).
    pub(super) weighed: usize,
}

/// What only some traces need.
#[derive(Debug)]
pub(super) struct Rare {
    /// Span id of this trace -> the spans waiting for it: its children that came first, and
    /// trace roots (of any trace) that link to it.
    pub(super) waiting: Map<SpanId, Vec<Waiter>>,
    /// This trace's spans that wait.
    pub(super) pending: Map<SpanId, Box<Waiting>>,
    pub(super) cycles: Vec<CycleState>,
    /// (the loop's names from its least rotation, its kind) -> its index in `cycles`.
    pub(super) cycle_index: Map<Box<[u32]>, u32>,
    /// Past SCANNED of them: (a call, an agent's name) -> its index in `runs`; name -> its index;
    /// (names, kind) -> the tally.
    pub(super) run_index: Map<(u32, u32), u32>,
    pub(super) name_index: Map<Box<str>, u32>,
    pub(super) tally_index: Map<Box<[u32]>, u32>,
}

impl Rare {
    pub(super) fn new(keys: Keyed) -> Rare {
        Rare {
            waiting: ids::map(keys),
            pending: ids::map(keys),
            cycles: Vec::new(),
            cycle_index: ids::map(keys),
            run_index: ids::map(keys),
            name_index: ids::map(keys),
            tally_index: ids::map(keys),
        }
    }
}

impl Trace {
    pub(super) fn new(now: f64, keys: Keyed) -> Trace {
        Trace {
            last_seen: now,
            spans: ids::map(keys),
            names: Vec::new(),
            entries: Vec::new(),
            nodes: Vec::new(),
            tallies: Vec::new(),
            runs: Vec::new(),
            due: Vec::new(),
            queued: false,
            rare: None,
            root: None,
            flat: None,
            heap: 0,
            weighed: 0,
        }
    }

    /// The bytes the trace holds, reckoned from its parts' lengths and capacities (`key`: its id's
    /// length): itself in its slot and the engine's index, the id kept twice, its tables, what
    /// `heap` counts, its loops.
    pub(super) fn weigh(&self, key: usize) -> usize {
        let mut bytes = size_of::<Trace>() + 48 + 40 + 2 * alloc(key);
        bytes += map_bytes(&self.spans)
            + vec_bytes(&self.names)
            + vec_bytes(&self.entries)
            + vec_bytes(&self.nodes)
            + vec_bytes(&self.tallies)
            + vec_bytes(&self.runs)
            + vec_bytes(&self.due)
            + self.root.as_ref().map_or(0, |root| alloc(root.len()))
            + self.flat.as_ref().map_or(0, |flat| flat.weigh())
            + self.heap;
        if let Some(rare) = &self.rare {
            bytes += alloc(size_of::<Rare>())
                + map_bytes(&rare.waiting)
                + map_bytes(&rare.pending)
                + vec_bytes(&rare.cycles)
                + map_bytes(&rare.cycle_index)
                + map_bytes(&rare.run_index)
                + map_bytes(&rare.name_index)
                + map_bytes(&rare.tally_index);
            for cycle in &rare.cycles {
                bytes += alloc(cycle.label.len()) + alloc(cycle.span_id.len());
            }
            for key in rare.cycle_index.keys() {
                bytes += alloc(key.len() * size_of::<u32>());
            }
        }
        bytes
    }

    /// Let go of what waiting held once nothing waits (and of the rare parts once all empty).
    pub(super) fn tidy(&mut self) {
        let Some(rare) = self.rare.as_mut() else {
            return;
        };
        if !rare.waiting.is_empty() || !rare.pending.is_empty() {
            return;
        }
        rare.waiting.shrink_to_fit();
        rare.pending.shrink_to_fit();
        let unused = rare.cycles.is_empty()
            && rare.run_index.is_empty()
            && rare.name_index.is_empty()
            && rare.tally_index.is_empty();
        if unused {
            self.rare = None;
        }
    }

    pub(super) fn rare(&mut self, keys: Keyed) -> &mut Rare {
        self.rare.get_or_insert_with(|| Box::new(Rare::new(keys)))
    }

    pub(super) fn awaited(&self, span: &SpanId) -> bool {
        self.rare
            .as_ref()
            .is_some_and(|rare| !rare.waiting.is_empty() && rare.waiting.contains_key(span))
    }

    pub(super) fn intern(&mut self, name: &str, keys: Keyed) -> u32 {
        if self.names.len() <= SCANNED {
            if let Some(at) = self.names.iter().position(|known| **known == *name) {
                return at as u32;
            }
        } else if let Some(&at) = self
            .rare
            .as_ref()
            .and_then(|rare| rare.name_index.get(name))
        {
            return at;
        }
        let id = u32::try_from(self.names.len()).unwrap_or(NONE);
        self.names.push(name.into());
        self.heap += alloc(name.len());
        if self.names.len() > SCANNED {
            let rare = self.rare.get_or_insert_with(|| Box::new(Rare::new(keys)));
            if rare.name_index.is_empty() {
                for (at, known) in self.names.iter().enumerate() {
                    rare.name_index.insert(known.clone(), at as u32);
                    self.heap += alloc(known.len());
                }
            } else {
                rare.name_index.insert(name.into(), id);
                self.heap += alloc(name.len());
            }
        }
        id
    }

    /// The run below call `key.0` of the agent named `key.1`.
    pub(super) fn run_mut(&mut self, key: (u32, u32)) -> Option<&mut Run> {
        let at = if self.runs.len() <= SCANNED {
            self.runs.iter().position(|(known, _)| *known == key)?
        } else {
            *self.rare.as_ref()?.run_index.get(&key)? as usize
        };
        self.runs.get_mut(at).map(|(_, run)| run)
    }

    /// Keep a run (its key not here yet).
    pub(super) fn add_run(&mut self, key: (u32, u32), run: Run, keys: Keyed) {
        if self.runs.is_empty() {
            self.runs.reserve_exact(1);
        }
        self.runs.push((key, run));
        if self.runs.len() > SCANNED {
            let fresh = self
                .rare
                .as_ref()
                .is_none_or(|rare| rare.run_index.is_empty());
            let from = if fresh { 0 } else { self.runs.len() - 1 };
            let indexed: Vec<((u32, u32), u32)> = (from..self.runs.len())
                .map(|index| (self.runs[index].0, index as u32))
                .collect();
            self.rare(keys).run_index.extend(indexed);
        }
    }

    pub(super) fn name(&self, id: u32) -> &str {
        &self.names[id as usize]
    }

    pub(super) fn entry(&self, tail: u32) -> &Entry {
        &self.entries[(tail - 1) as usize]
    }

    pub(super) fn last(&self, path: PathRef) -> Option<&Entry> {
        (path.len > 0).then(|| self.entry(path.tail))
    }

    /// The names of `path`, oldest first.
    pub(super) fn names_of(&self, path: PathRef, out: &mut Vec<u32>) {
        out.clear();
        let mut tail = path.tail;
        for _ in 0..path.len {
            let entry = self.entry(tail);
            out.push(entry.name);
            tail = entry.parent;
        }
        out.reverse();
    }

    /// Whether two paths of this trace hold the same names.
    pub(super) fn same_names(&self, a: PathRef, b: PathRef) -> bool {
        if a.len != b.len {
            return false;
        }
        let (mut x, mut y) = (a.tail, b.tail);
        for _ in 0..a.len {
            if x == y {
                return true;
            }
            let (left, right) = (self.entry(x), self.entry(y));
            if left.name != right.name {
                return false;
            }
            (x, y) = (left.parent, right.parent);
        }
        true
    }

    /// `path` and one more name.
    pub(super) fn plus(&mut self, path: PathRef, name: u32, hop: Hop, node: u32) -> PathRef {
        let parent = if path.len == 0 { 0 } else { path.tail };
        self.entries.push(Entry {
            parent,
            name,
            node,
            hop,
        });
        let tail = u32::try_from(self.entries.len()).unwrap_or(NONE);
        if usize::from(path.len) < MAX_PATH_NAMES {
            PathRef {
                tail,
                len: path.len + 1,
                crossed: path.crossed,
            }
        } else {
            PathRef {
                tail,
                len: path.len,
                crossed: path.crossed.saturating_sub(1),
            }
        }
    }

    pub(super) fn without_last(&self, path: PathRef) -> PathRef {
        let len = path.len - 1;
        PathRef {
            tail: if len == 0 {
                0
            } else {
                self.entry(path.tail).parent
            },
            len,
            crossed: path.crossed.min(len),
        }
    }

    pub(super) fn with_last(&mut self, path: PathRef, name: u32, hop: Hop, node: u32) -> PathRef {
        let shorter = self.without_last(path);
        PathRef {
            crossed: path.crossed,
            ..self.plus(shorter, name, hop, node)
        }
    }

    /// The call node `index` of this trace (`me`) stands for.
    pub(super) fn node_ref(&self, me: Handle, index: u32) -> Option<NodeRef> {
        match self.nodes.get(index as usize)? {
            Node::Local { .. } => Some(NodeRef { trace: me, index }),
            Node::Foreign(node) => Some(*node),
        }
    }

    /// A node of this trace for `node` (a node of any trace).
    pub(super) fn node_for(&mut self, me: Handle, node: NodeRef) -> u32 {
        if node.trace == me {
            return node.index;
        }
        self.nodes.push(Node::Foreign(node));
        u32::try_from(self.nodes.len() - 1).unwrap_or(NONE)
    }

    pub(super) fn queue(&mut self, shared: &mut Shared, me: Handle, at: f64, due: Due) {
        self.due.push((at, due));
        if !self.queued {
            self.queued = true;
            shared.queue.push_back((at, me));
        }
    }

    /// The tally of the calls at `path`, of a tool or not (NONE for one name: no edge).
    pub(super) fn tally(&mut self, path: PathRef, tool: bool, shared: &mut Shared) -> u32 {
        if path.len < 2 {
            return NONE;
        }
        let scanned = self.tallies.len() <= SCANNED;
        if scanned {
            for (at, tally) in self.tallies.iter().enumerate() {
                if tally.tool == tool && self.same_names(tally.path, path) {
                    return at as u32;
                }
            }
        }
        let keys = shared.keys;
        let mut key = mem::take(&mut shared.scratch);
        if !scanned {
            self.names_of(path, &mut key);
            key.push(u32::from(tool));
            if let Some(&at) = self
                .rare
                .as_ref()
                .and_then(|rare| rare.tally_index.get(key.as_slice()))
            {
                shared.scratch = key;
                return at;
            }
        }
        let at = u32::try_from(self.tallies.len()).unwrap_or(NONE);
        self.tallies.push(Tally {
            path,
            tool,
            calls: [0; 2],
            ran: [0; 2],
            counted: 0,
            unflushed: 0,
        });
        if self.tallies.len() > SCANNED {
            let mut indexed = Vec::new();
            for (index, tally) in self.tallies.iter().enumerate() {
                if scanned || index as u32 == at {
                    self.names_of(tally.path, &mut key);
                    key.push(u32::from(tally.tool));
                    indexed.push((Box::<[u32]>::from(key.as_slice()), index as u32));
                    self.heap += alloc(key.len() * size_of::<u32>());
                }
            }
            self.rare(keys).tally_index.extend(indexed);
        }
        shared.scratch = key;
        at
    }

    /// Make the count of a tally what its calls say now, if that is more than it was.
    pub(super) fn recount(&mut self, shared: &mut Shared, me: Handle, tally: u32) {
        let state = &mut self.tallies[tally as usize];
        let made = state.calls[0].max(state.calls[1]);
        let taken = state.ran[0].max(state.ran[1]);
        let now = made.saturating_sub(taken);
        if now > state.counted {
            state.unflushed += now - state.counted;
            state.counted = now;
            shared.dirty.push((me, tally));
        }
    }

    /// Count what the due items say (those due by `deadline`, every one when None).
    pub(super) fn count_due(
        &mut self,
        shared: &mut Shared,
        me: Handle,
        trace_id: &[u8],
        deadline: Option<f64>,
    ) {
        let due = mem::take(&mut self.due);
        let mut tools = Vec::new();
        for (at, item) in due {
            if deadline.is_some_and(|deadline| at > deadline) {
                self.due.push((at, item));
                continue;
            }
            match item {
                Due::Tool(node) => {
                    if let Some(&Node::Local {
                        tally, guard, ran, ..
                    }) = self.nodes.get(node as usize)
                        && tally != NONE
                    {
                        let state = &mut self.tallies[tally as usize];
                        state.calls[usize::from(guard)] += 1;
                        state.ran[usize::from(guard)] += u32::from(ran);
                        tools.push(tally);
                    }
                }
                Due::Flat => {}
                Due::Cycle(at) => {
                    let Some(rare) = self.rare.as_mut() else {
                        continue;
                    };
                    let cycle = &mut rare.cycles[at as usize];
                    if !cycle.counted {
                        cycle.counted = true;
                        shared.events.cycles.push(Cycle {
                            kind: cycle.kind,
                            label: cycle.label.to_string(),
                            trace_id: trace_id.to_vec(),
                            span_id: cycle.span_id.to_vec(),
                            chain_root: self.root.clone(),
                        });
                    }
                }
            }
        }
        tools.sort_unstable();
        tools.dedup();
        for tally in tools {
            self.recount(shared, me, tally);
        }
    }
}

/// What every trace's work writes to: the events being counted, the queue of due counts.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) limits: Limits,
    pub(super) keys: Keyed,
    pub(super) now: f64,
    pub(super) events: Events,
    pub(super) queue: VecDeque<(f64, Handle)>,
    /// Tallies counted since the last flush.
    pub(super) dirty: Vec<(Handle, u32)>,
    pub(super) scratch: Vec<u32>,
    pub(super) text: String,
    /// The spans being settled waited already (flat runs decided after their wait): their counts
    /// are due at once.
    pub(super) waited: bool,
}

impl Shared {
    /// When a count that waits `wait` seconds from now is due.
    pub(super) fn due(&self, wait: f64) -> f64 {
        if self.waited {
            self.now
        } else {
            self.now + wait
        }
    }

    pub(super) fn cut<'a>(&mut self, text: &'a str, limit: usize) -> Cow<'a, str> {
        let out = cut(text, limit);
        if let Cow::Owned(_) = out {
            if limit == MAX_LABEL_CHARS {
                self.events.truncated_labels += 1;
            } else {
                self.events.truncated_names += 1;
            }
        }
        out
    }

    /// Count the guard's decision on a call span named `name`, if it has one (`trace_id`: its
    /// trace's id, where it is the size of a real one).
    pub(super) fn decide(&mut self, trace_id: Option<[u8; 16]>, facts: &Facts<'_>, name: &str) {
        if let Some((verdict, reason)) = &facts.decision {
            let Shared { events, text, .. } = self;
            events.decide(text, &[verdict, reason, name], trace_id, &facts.span_id);
        }
    }
}
