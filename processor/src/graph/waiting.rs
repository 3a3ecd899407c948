//! Spans waiting for their parent or linked span, and settling them when it comes (or as
//! orphans when it never does).
//!
//! What a reader would not guess: a span may wait on a span of another trace (the one its first
//! link points to), so the waiter is kept in the awaited span's trace and the waiting span in its
//! own, and a path settled in one trace is copied name by name into the other ([`Engine::copy_path`]'s
//! interning), never shared.
#![forbid(unsafe_code)]

use std::mem;

use super::Engine;
use super::flat::FlatKind;
use super::trace::{Facts, NONE, PathRef, Waiter, Waiting, alloc};
use crate::ids::SpanId;
use crate::lru::Handle;

impl Engine {
    /// The trace a root links into; the root's own trace stays the newest.
    pub(super) fn holder(&mut self, trace_id: &[u8], own: Handle) -> Handle {
        self.reading = Some(own);
        let holder = self.touch(trace_id);
        self.reading = None;
        self.traces.touch(own);
        holder
    }

    pub(super) fn wait(
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
    pub(super) fn settle_now(
        &mut self,
        handle: Handle,
        span: SpanId,
        facts: &Facts<'_>,
        base: PathRef,
    ) {
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
    pub(super) fn release(&mut self, holder: Handle, span: SpanId, path: PathRef) {
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
    pub(super) fn take_waiting(&mut self, waiter: Waiter) -> Option<Box<Waiting>> {
        let trace = self.traces.get_mut(waiter.trace)?;
        let waiting = trace.rare.as_mut()?.pending.remove(&waiter.span)?;
        trace.heap -= waiting.heap();
        trace.tidy();
        self.pending -= 1;
        Some(waiting)
    }

    /// Settle a waiting span as one whose parent (or linked span) never came.
    pub(super) fn settle_orphan(&mut self, waiter: Waiter) {
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
    pub(super) fn copy_path(&mut self, from: Handle, path: PathRef, to: Handle) -> PathRef {
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
}

/// The bytes a group of spans waiting for one span holds.
fn group_bytes(group: &Vec<Waiter>) -> usize {
    alloc(group.capacity() * mem::size_of::<Waiter>())
}
