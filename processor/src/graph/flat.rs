//! OpenLLMetry's flat OpenAI Agents traces: the tool call that started each agent run, where
//! provable (as `tests/processor/reference/flat.py` says it, the rule's specification).
//!
//! OpenLLMetry hangs every agent run (`traceloop.span.kind` `agent`) off the trace's workflow span
//! (`workflow`, naming nothing), none below the tool span that ran it: the nesting is only in
//! time. Such a *flat run* is held, unsettled, until its trace's workflow span has arrived and the
//! count wait has run out after (the workflow span ends last: the tool spans that could hold the
//! run have come by then), and is then read as the run of the one tool span left of those whose
//! interval holds it once those on the proven path above another are set aside; below the
//! workflow span, as before, when none or several are left. Runs are decided in order of start.
//!
//! What a reader would not guess: only this instrumentation's spans keep their end time (its tool
//! spans and runs, a few dozen bytes each, in [`Flat`]); a run whose workflow span never comes waits
//! for it as any span waits for its parent, and settles unattributed when its trace goes; a trace's
//! runs past the first [`MAX_FLAT_RUNS`] stay unattributed (a decision costs a scan of the tools).
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::mem::size_of;

use super::Engine;
use super::trace::{Due, NONE, PathRef, Trace, Waiter, Waiting, alloc, vec_bytes};
use crate::ids::SpanId;
use crate::lru::Handle;

/// A trace's flat runs past this many (in order of start) stay unattributed: what deciding one
/// costs grows with the tool spans of its trace, so a trace of thousands costs at most this many.
pub const MAX_FLAT_RUNS: usize = 256;

/// What a span of the flat instrumentation is to the flat reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FlatKind {
    Agent,
    Tool,
    Workflow,
}

impl FlatKind {
    /// A span's kind by its `traceloop.span.kind` and whether it is read as a call.
    pub(super) fn of(kind: Option<&str>, named: bool) -> Option<FlatKind> {
        match (kind?, named) {
            ("agent", true) => Some(FlatKind::Agent),
            ("tool", true) => Some(FlatKind::Tool),
            ("workflow", false) => Some(FlatKind::Workflow),
            _ => None,
        }
    }
}

/// A span with its interval: a tool span, or a flat run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timed {
    pub(super) span: SpanId,
    /// Its parent: of a tool, the run it belongs to; of a run, its workflow span.
    pub(super) parent: SpanId,
    pub(super) start: u64,
    pub(super) end: u64,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct FlatRun {
    pub(super) timed: Timed,
    /// The tool span it is the run of (an index into `tools`; NONE: none, or not decided yet).
    pub(super) tool: u32,
    pub(super) decided: bool,
}

/// A trace's flat spans.
#[derive(Debug, Default)]
pub(super) struct Flat {
    pub(super) workflows: Vec<SpanId>,
    pub(super) tools: Vec<Timed>,
    pub(super) runs: Vec<FlatRun>,
    /// A decision is due.
    pub(super) queued: bool,
}

impl Flat {
    pub(super) fn weigh(&self) -> usize {
        alloc(size_of::<Flat>())
            + vec_bytes(&self.workflows)
            + vec_bytes(&self.tools)
            + vec_bytes(&self.runs)
    }

    /// Decide run `at` (its callers decided): the tool span it is the run of, or NONE.
    fn attribute(&self, at: usize, runs: &HashMap<SpanId, usize>, marks: &mut [bool]) -> u32 {
        let run = self.runs[at].timed;
        let holds = |tool: &Timed| {
            tool.parent != run.span
                && tool.start <= run.start
                && run.end <= tool.end
                && (tool.start, tool.end) != (run.start, run.end)
        };
        marks.iter_mut().for_each(|mark| *mark = false);
        // The candidates on the proven path above another candidate are not the run's caller.
        for tool in self.tools.iter().filter(|tool| holds(tool)) {
            let mut parent = tool.parent;
            for _ in 0..self.tools.len() {
                let Some(&caller) = runs.get(&parent) else {
                    break;
                };
                let caller = self.runs[caller];
                if !caller.decided || caller.tool == NONE || marks[caller.tool as usize] {
                    break;
                }
                marks[caller.tool as usize] = true;
                parent = self.tools[caller.tool as usize].parent;
            }
        }
        let mut left =
            (0..self.tools.len()).filter(|&index| !marks[index] && holds(&self.tools[index]));
        match (left.next(), left.next()) {
            (Some(only), None) => only as u32,
            _ => NONE,
        }
    }
}

impl Trace {
    pub(super) fn flat(&mut self) -> &mut Flat {
        self.flat.get_or_insert_with(Box::default)
    }

    pub(super) fn is_workflow(&self, span: &SpanId) -> bool {
        self.flat
            .as_ref()
            .is_some_and(|flat| flat.workflows.contains(span))
    }
}

impl Engine {
    /// Hold a flat run (its workflow span `workflow` arrived) until its decision.
    pub(super) fn hold_flat(
        &mut self,
        handle: Handle,
        span: SpanId,
        workflow: SpanId,
        waiting: Box<Waiting>,
    ) {
        let keys = self.shared.keys;
        let at = self.shared.now + self.shared.limits.cycle_wait;
        let Engine { traces, shared, .. } = self;
        let Some(trace) = traces.get_mut(handle) else {
            return;
        };
        self.pending += 1;
        let timed = Timed {
            span,
            parent: workflow,
            start: waiting.facts.start,
            end: waiting.facts.end,
        };
        trace.spans.insert(span, PathRef::WAITING);
        trace.heap += waiting.heap();
        trace.rare(keys).pending.insert(span, waiting);
        let flat = trace.flat();
        flat.runs.push(FlatRun {
            timed,
            tool: NONE,
            decided: false,
        });
        if !flat.queued {
            flat.queued = true;
            trace.queue(shared, handle, at, Due::Flat);
        }
    }

    /// Decide the trace's held flat runs, in order of start, and settle them (or let them wait
    /// for the span they continue).
    pub(super) fn decide_flat(&mut self, handle: Handle) {
        let Some(trace) = self.traces.get_mut(handle) else {
            return;
        };
        let Some(flat) = trace.flat.as_mut() else {
            return;
        };
        flat.queued = false;
        let runs: HashMap<SpanId, usize> = flat
            .runs
            .iter()
            .enumerate()
            .map(|(at, run)| (run.timed.span, at))
            .collect();
        let pending = trace.rare.as_ref().map(|rare| &rare.pending);
        let mut order: Vec<(u64, Box<[u8]>, usize)> = flat
            .runs
            .iter()
            .enumerate()
            .filter(|(_, run)| !run.decided)
            .map(|(at, run)| {
                let id = pending
                    .and_then(|pending| pending.get(&run.timed.span))
                    .map_or_else(Box::default, |waiting| Box::from(&*waiting.facts.span_id));
                (run.timed.start, id, at)
            })
            .collect();
        order.sort_unstable();
        let mut marks = vec![false; flat.tools.len()];
        let mut settle = Vec::with_capacity(order.len());
        let before = flat.runs.len() - order.len();
        for (decided, &(_, _, at)) in (before..).zip(&order) {
            let tool = match decided < MAX_FLAT_RUNS {
                true => flat.attribute(at, &runs, &mut marks),
                false => NONE,
            };
            let run = &mut flat.runs[at];
            run.tool = tool;
            run.decided = true;
            let on = match tool {
                NONE => run.timed.parent,
                tool => flat.tools[tool as usize].span,
            };
            settle.push((run.timed.span, on));
        }
        // The runs and what waited for them settle after the wait: their counts are due at once.
        self.shared.waited = true;
        for (span, on) in settle {
            let Some(mut waiting) = self.take_waiting(Waiter {
                trace: handle,
                span,
            }) else {
                continue;
            };
            waiting.facts.flat = None; // decided: read as any span from here
            let Some(trace) = self.traces.get_mut(handle) else {
                break;
            };
            match trace.spans.get(&on).copied().filter(|path| !path.waits()) {
                Some(base) => {
                    let path = self.settle(handle, &waiting.facts, base);
                    let Some(trace) = self.traces.get_mut(handle) else {
                        break;
                    };
                    trace.spans.insert(span, path);
                    let awaited = trace.awaited(&span);
                    self.promote(handle, path);
                    if awaited {
                        self.release(handle, span, path);
                    }
                }
                None => self.wait(handle, on, handle, span, *waiting),
            }
        }
        self.shared.waited = false;
    }
}
