//! The rules as the graph applies them: a span's path from the path it continues (a link, the
//! call above again, a tool's run, a new call), the cycle it closes, the count it makes.
#![forbid(unsafe_code)]

use std::mem;

use super::events::{CycleKind, SEPARATOR, push_name};
use super::trace::{
    CallFacts, CycleState, Due, Facts, NONE, Node, NodeRef, PathRef, Run, Shared, Trace,
};
use super::{Engine, MAX_LABEL_CHARS};
use crate::calls::{self, Hop, Step};
use crate::dialects::Kind;
use crate::lru::{Handle, Lru};

impl Engine {
    /// The path of a span in trace `handle` whose path so far is `base`, counting what it shows.
    pub(super) fn settle(&mut self, handle: Handle, facts: &Facts<'_>, base: PathRef) -> PathRef {
        let Some(call) = &facts.call else {
            return base;
        };
        let Engine { traces, shared, .. } = self;
        // The trace id, for the exemplar of the decision the span carries (if any).
        let trace_id = match facts.decision {
            Some(_) => traces
                .key(handle)
                .and_then(|key| <[u8; 16]>::try_from(&key[..]).ok()),
            None => None,
        };
        let Some(trace) = traces.get_mut(handle) else {
            return base;
        };
        let name = trace.intern(&call.name, shared.keys);
        let mut repeats = 0usize;
        let mut tail = base.tail;
        for _ in 0..base.len {
            let entry = trace.entry(tail);
            repeats += usize::from(entry.name == name);
            tail = entry.parent;
        }
        let last = trace.last(base).copied();
        let same_name = last.is_some_and(|last| last.name == name);
        let step = calls::step(
            last.as_ref().map(|last| &last.hop),
            same_name,
            &call.hop,
            call.conditional,
            repeats,
        );
        if step == Step::Link {
            return base;
        }
        shared.decide(trace_id, facts, &call.name);
        match step {
            Step::Link => base,
            Step::Again => {
                // One call: a transfer when any of its spans marks it as one.
                let node = last.map_or(NONE, |last| last.node);
                let hop = Hop {
                    transfer: call.hop.transfer || last.is_some_and(|last| last.hop.transfer),
                    ..call.hop
                };
                trace.with_last(base, name, hop, node)
            }
            Step::New => {
                Self::returned(trace, shared, handle, facts, base, name, call.hop.transfer);
                Self::new_call(trace, shared, handle, base, name, call.hop)
            }
            Step::RunOfTool => self.run_of_tool(handle, facts, name, call, base),
        }
    }

    /// An agent run directly below a tool call: the tool's run, in the agent's name.
    fn run_of_tool(
        &mut self,
        handle: Handle,
        facts: &Facts<'_>,
        name: u32,
        call: &CallFacts<'_>,
        below: PathRef,
    ) -> PathRef {
        let Engine { traces, shared, .. } = self;
        let keys = shared.keys;
        let Some(trace) = traces.get_mut(handle) else {
            return below;
        };
        let last = trace.last(below).copied();
        let tool = last.and_then(|entry| trace.node_ref(handle, entry.node));
        // The run is a transfer when the tool's span or its own marks one (the conventions'
        // `execute_tool transfer_to_X X` with `gen_ai.transfer.mode` `pass_control`).
        let hop = Hop {
            transfer: call.hop.transfer || last.is_some_and(|entry| entry.hop.transfer),
            ..call.hop
        };
        let base = trace.without_last(below);
        Self::returned(trace, shared, handle, facts, base, name, hop.transfer);
        // The run is kept by the tool's trace, under the agent's name as that trace knows it.
        let ran = tool.and_then(|tool| {
            let owner = traces.get_mut(tool.trace)?;
            let agent = owner.intern(&call.name, keys);
            let ran = owner.run_mut((tool.index, agent)).map(|run| run.clone());
            Some((tool, agent, ran))
        });
        if let Some((_, _, Some(run))) = ran {
            Self::also_of_run(traces, shared, run.node, call.hop.guard);
            let trace = traces.get_mut(handle).expect("the trace being read");
            let node = trace.node_for(handle, run.node);
            return trace.plus(base, name, hop, node);
        }
        let trace = traces.get_mut(handle).expect("the trace being read");
        let path = Self::new_call(trace, shared, handle, base, name, hop);
        let node = trace.last(path).map(|entry| NodeRef {
            trace: handle,
            index: entry.node,
        });
        if let (Some((tool, agent, None)), Some(node)) = (ran, node)
            && let Some(owner) = traces.get_mut(tool.trace)
        {
            let run = Run { node };
            owner.add_run((tool.index, agent), run, keys);
            if let Some(Node::Local { ran, .. }) = owner.nodes.get_mut(tool.index as usize) {
                *ran = true;
            }
        }
        path
    }

    /// A later span of a tool's run, recorded by `guard`'s source: the run counts for that source
    /// too if it did not yet (each source counts the calls it recorded, and the larger count is the
    /// path's: counts only grow, so the order the sources' spans arrive in changes nothing).
    fn also_of_run(
        traces: &mut Lru<Box<[u8]>, Trace>,
        shared: &mut Shared,
        node: NodeRef,
        guard: bool,
    ) {
        let Some(trace) = traces.get_mut(node.trace) else {
            return;
        };
        let Some(Node::Local {
            tally,
            guard: first,
            both,
            ..
        }) = trace.nodes.get_mut(node.index as usize)
        else {
            return;
        };
        if *first == guard || *both {
            return;
        }
        *both = true;
        let tally = *tally;
        if tally != NONE {
            trace.tallies[tally as usize].calls[usize::from(guard)] += 1;
            trace.recount(shared, node.trace, tally);
        }
    }

    /// A new call at `base` plus `name`: its node, and its count (a tool's waits).
    fn new_call(
        trace: &mut Trace,
        shared: &mut Shared,
        handle: Handle,
        base: PathRef,
        name: u32,
        hop: Hop,
    ) -> PathRef {
        let index = u32::try_from(trace.nodes.len()).unwrap_or(NONE);
        let path = trace.plus(base, name, hop, index);
        let tool = hop.kind == Kind::Tool;
        let tally = trace.tally(path, tool, shared);
        trace.nodes.push(Node::Local {
            tally,
            guard: hop.guard,
            both: false,
            ran: false,
        });
        if tool {
            let at = shared.due(shared.limits.tool_edge_wait);
            trace.queue(shared, handle, at, Due::Tool(index));
        } else if tally != NONE {
            trace.tallies[tally as usize].calls[usize::from(hop.guard)] += 1;
            trace.recount(shared, handle, tally);
        }
        path
    }

    /// Note the cycle of `name` (arriving by a transfer or not) if it is on `path` where it still
    /// waits (from its latest such place): counted once per loop and trace, from the return that
    /// started first. A place waits unless the place after it (for the last, the arriving call)
    /// is a transfer: an agent that handed off waits for no answer, and control coming back to it
    /// is no cycle.
    fn returned(
        trace: &mut Trace,
        shared: &mut Shared,
        handle: Handle,
        facts: &Facts<'_>,
        path: PathRef,
        name: u32,
        transfer: bool,
    ) {
        let mut after = transfer;
        let mut tail = path.tail;
        let mut waits = None;
        for back in 0..path.len {
            let entry = trace.entry(tail);
            if entry.name == name && !after {
                waits = Some(usize::from(path.len - 1 - back));
                break;
            }
            after = entry.hop.transfer;
            tail = entry.parent;
        }
        let Some(at) = waits else {
            return;
        };
        let mut names = mem::take(&mut shared.scratch);
        trace.names_of(path, &mut names);
        let kind = if at < usize::from(path.crossed) {
            CycleKind::CrossTrace
        } else if at == names.len() - 1 {
            CycleKind::Direct
        } else {
            CycleKind::CrossFunction
        };
        let turn = &names[at..];
        let least = (0..turn.len())
            .min_by(|&a, &b| {
                let rotation = |from: usize| {
                    turn[from..]
                        .iter()
                        .chain(&turn[..from])
                        .map(|&id| trace.name(id))
                };
                rotation(a).cmp(rotation(b))
            })
            .unwrap_or(0);
        let key: Box<[u32]> = turn[least..]
            .iter()
            .chain(&turn[..least])
            .copied()
            .chain([kind as u32])
            .collect();
        let (start, span_id) = facts.order();
        let label = |trace: &Trace, shared: &mut Shared| -> Box<str> {
            let mut label = String::new();
            for &id in turn {
                push_name(&mut label, trace.name(id));
                label.push(SEPARATOR);
            }
            push_name(&mut label, trace.name(name));
            shared
                .cut(&label, MAX_LABEL_CHARS)
                .into_owned()
                .into_boxed_str()
        };
        let keys = shared.keys;
        let index = trace
            .rare
            .as_ref()
            .and_then(|rare| rare.cycle_index.get(&key).copied());
        match index {
            Some(index) => {
                let cycle = &trace.rare(keys).cycles[index as usize];
                if !cycle.counted && (start, span_id) < (cycle.start, &*cycle.span_id) {
                    let label = label(trace, shared);
                    let cycle = &mut trace.rare(keys).cycles[index as usize];
                    cycle.start = start;
                    cycle.span_id = span_id.into();
                    cycle.label = label;
                }
            }
            None => {
                let label = label(trace, shared);
                let rare = trace.rare(keys);
                let index = u32::try_from(rare.cycles.len()).unwrap_or(NONE);
                rare.cycles.push(CycleState {
                    kind,
                    start,
                    span_id: span_id.into(),
                    label,
                    counted: false,
                });
                rare.cycle_index.insert(key, index);
                let due = shared.due(shared.limits.cycle_wait);
                trace.queue(shared, handle, due, Due::Cycle(index));
            }
        }
        shared.scratch = names;
    }
}
