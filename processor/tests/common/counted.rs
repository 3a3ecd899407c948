//! What a run of the engine counted, summed over its calls (the events of each).

use std::collections::BTreeMap;

use otel_guard_engine::graph::Events;

/// The trace id and span id of the span where a cycle's name returned.
pub type Ids = (Vec<u8>, Vec<u8>);
pub type Findings<'a> = (
    &'a BTreeMap<(String, String), Vec<Ids>>,
    &'a BTreeMap<(String, String), u64>,
    &'a BTreeMap<(String, String, String), u64>,
    &'a Vec<i64>,
);

/// What a run of the engine counted, summed over its calls.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Counted {
    pub cycles: BTreeMap<(String, String), Vec<Ids>>,
    pub edges: BTreeMap<(String, String), u64>,
    pub decisions: BTreeMap<(String, String, String), u64>,
    pub tree_hops: Vec<i64>,
    pub evictions: [u64; 2],
    pub dropped: u64,
    pub duplicates: u64,
    pub truncated: (u64, u64),
}

impl Counted {
    pub fn add(&mut self, events: &Events) {
        for cycle in &events.cycles {
            self.cycles
                .entry((cycle.kind.name().into(), cycle.label.clone()))
                .or_default()
                .push((cycle.trace_id.clone(), cycle.span_id.clone()));
            self.cycles.values_mut().for_each(|spans| spans.sort());
        }
        for ([caller, callee], count) in events.delegations() {
            *self
                .edges
                .entry((caller.into(), callee.into()))
                .or_default() += count;
        }
        for ([decision, reason, name], count) in events.decisions() {
            *self
                .decisions
                .entry((decision.into(), reason.into(), name.into()))
                .or_default() += count;
        }
        self.tree_hops.extend(&events.tree_hops);
        self.tree_hops.sort_unstable();
        for at in 0..2 {
            self.evictions[at] += events.evictions[at];
        }
        self.dropped += events.dropped;
        self.duplicates += events.duplicates;
        self.truncated.0 += events.truncated_names;
        self.truncated.1 += events.truncated_labels;
    }

    pub fn cycles(&self) -> Vec<(&str, &str)> {
        self.cycles
            .keys()
            .map(|(kind, label)| (kind.as_str(), label.as_str()))
            .collect()
    }

    pub fn edges(&self) -> Vec<(&str, &str, u64)> {
        self.edges
            .iter()
            .map(|((caller, callee), count)| (caller.as_str(), callee.as_str(), *count))
            .collect()
    }

    /// What it found, apart from what it dropped or was sent twice.
    pub fn findings(&self) -> Findings<'_> {
        (&self.cycles, &self.edges, &self.decisions, &self.tree_hops)
    }
}
