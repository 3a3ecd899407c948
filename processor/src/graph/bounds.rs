//! Bounds and eviction: which trace goes at capacity, the weighing of what traces hold, the
//! counts made when their wait is over or their trace goes, and the delegation trees.
//!
//! What a reader would not guess: traces with a delegation path (two names or more) form a class
//! of their own, evicted after the others unless they hold more than three quarters of the
//! traces or bytes; and a trace that goes first settles what waited in it and makes its counts,
//! so an eviction changes when a count is made, not whether.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::mem;

use super::trace::{Due, PathRef, Waiter};
use super::{Engine, Reason, Trace, Tree, kept};
use crate::ids::SpanId;
use crate::lru::Handle;

impl Engine {
    /// The trace of `trace_id`, made the newest (made when new, the oldest evicted at capacity).
    pub(super) fn touch(&mut self, trace_id: &[u8]) -> Handle {
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

    /// Make the counts due by `now`.
    pub(super) fn count_due(&mut self, now: f64) {
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
    pub(super) fn promote(&mut self, handle: Handle, path: PathRef) {
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
    pub(super) fn reckon(&mut self) {
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
    pub(super) fn enforce_budget(&mut self, spare: Option<Handle>) {
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
    pub(super) fn evict(&mut self, group: &[Handle], reason: Reason) {
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

    pub(super) fn note_trees(&mut self, trees: HashMap<&str, i64>) {
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

    pub(super) fn release_tree(&mut self, handle: Handle, reason: Option<Reason>) {
        if let Some((_, tree)) = self.trees.remove(handle) {
            self.shared.events.tree_hops.push(tree.hops);
            if let Some(reason) = reason {
                self.shared.events.tree_evictions[reason as usize] += 1;
            }
        }
    }
}
