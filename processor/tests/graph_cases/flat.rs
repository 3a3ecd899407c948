//! OpenLLMetry's flat OpenAI Agents traces: every agent run hung off the workflow span, read back
//! below the tool span that ran it where the intervals prove which one.
//!
//! What a reader would not guess: a run that two tool spans at once could have started is
//! attributed to neither; the loop goes unseen rather than guessed.

use crate::common::counted::Counted;
use crate::common::spans::*;
use crate::{common, one, run};
use opentelemetry_proto::tonic::trace::v1::Span;
use otel_guard_engine::graph::{Engine, Limits};

// --- OpenLLMetry's flat OpenAI Agents traces ------------------------------------------------------

const OAI_TL: &str = "opentelemetry.instrumentation.openai_agents";

/// A span of OpenLLMetry's OpenAI Agents instrumentation in trace 1: `kind` `workflow` (the
/// root, naming nothing), `agent` (a run of `name`) or `tool` (a call of `name`), over [start, end].
fn flat(id: u64, parent: Option<u64>, kind: &str, name: &str, start: u64, end: u64) -> Span {
    let mut span = match kind {
        "workflow" => span(1, id, parent, "Agent Workflow", start),
        "agent" => with(
            span(1, id, parent, &format!("{name}.agent"), start),
            "gen_ai.agent.name",
            text(name),
        ),
        _ => with(
            span(1, id, parent, &format!("{name}.tool"), start),
            "gen_ai.tool.name",
            text(name),
        ),
    };
    span.end_time_unix_nano = end;
    with(span, "traceloop.span.kind", text(kind))
}

/// planner → budget → planner → budget through agents as tools, every run below the workflow
/// span (1) and each inside the tool span that ran it in time alone, as exported (ended first).
fn flat_loop() -> Vec<Span> {
    vec![
        flat(8, Some(1), "agent", "budget", 70, 930),
        flat(7, Some(6), "tool", "ask_budget", 60, 940),
        flat(6, Some(1), "agent", "planner", 50, 950),
        flat(5, Some(4), "tool", "ask_planner", 40, 960),
        flat(4, Some(1), "agent", "budget", 30, 970),
        flat(3, Some(2), "tool", "ask_budget", 20, 980),
        flat(2, Some(1), "agent", "planner", 10, 990),
        flat(1, None, "workflow", "", 0, 1000),
    ]
}

#[test]
fn a_flat_loop_is_read_call_by_call_and_counts_once() {
    let counted = run(&one(OAI_TL, flat_loop()));
    assert_eq!(
        counted.cycles(),
        [("cross_function", "planner>budget>planner")]
    );
    let spans = &counted.cycles[&("cross_function".into(), "planner>budget>planner".into())];
    assert_eq!(spans, &[(trace_id(1), span_id(6))]);
    assert_eq!(
        counted.edges(),
        [("budget", "planner", 1), ("planner", "budget", 2)]
    );
}

#[test]
fn a_healthy_flat_run_counts_its_call_and_no_cycle() {
    let counted = run(&one(OAI_TL, flat_loop()[4..].to_vec()));
    assert_eq!(counted.cycles(), []);
    assert_eq!(counted.edges(), [("planner", "budget", 1)]);
}

#[test]
fn flat_spans_in_any_order_and_any_batches_count_alike() {
    let spans = flat_loop();
    let whole = run(&one(OAI_TL, spans.clone()));
    let reversed: Vec<Span> = spans.iter().rev().cloned().collect();
    assert_eq!(run(&one(OAI_TL, reversed.clone())), whole);
    let mut rng = common::Rng(7);
    for order in [spans.clone(), reversed] {
        let singly: Vec<Vec<u8>> = order
            .iter()
            .map(|span| encode(&[(OAI_TL, vec![span.clone()])]))
            .collect();
        assert_eq!(run(&singly), whole);
    }
    for _ in 0..20 {
        let mut mixed = spans.clone();
        for at in (1..mixed.len()).rev() {
            mixed.swap(at, rng.below(at + 1));
        }
        let batches: Vec<Vec<u8>> = mixed
            .chunks(1 + rng.below(3))
            .map(|chunk| encode(&[(OAI_TL, chunk.to_vec())]))
            .collect();
        assert_eq!(run(&batches), whole);
    }
}

#[test]
fn a_flat_run_that_two_tool_spans_at_once_could_have_started_is_not_guessed() {
    // planner runs ask_budget and ask_other at once; budget's ask_planner runs planner, which
    // lies in ask_other's interval as well as in ask_planner's: no attribution, so no false
    // `planner>planner`, and no cycle at all (the loop goes unseen rather than guessed).
    let spans = vec![
        flat(7, Some(1), "agent", "planner", 150, 400),
        flat(6, Some(5), "tool", "ask_planner", 90, 600),
        flat(4, Some(2), "tool", "ask_other", 100, 500),
        flat(5, Some(1), "agent", "budget", 30, 970),
        flat(3, Some(2), "tool", "ask_budget", 20, 980),
        flat(2, Some(1), "agent", "planner", 10, 990),
        flat(1, None, "workflow", "", 0, 1000),
    ];
    let counted = run(&one(OAI_TL, spans));
    assert_eq!(counted.cycles(), []);
    assert_eq!(
        counted.edges(),
        [
            ("budget", "ask_planner", 1),
            ("planner", "ask_other", 1),
            ("planner", "budget", 1)
        ]
    );
    // Two calls of one tool at once, each run inside both: each call an edge of its own.
    let spans = vec![
        flat(5, Some(1), "agent", "budget", 31, 850),
        flat(4, Some(1), "agent", "budget", 30, 800),
        flat(3, Some(2), "tool", "ask_budget", 21, 910),
        flat(6, Some(2), "tool", "ask_budget", 20, 900),
        flat(2, Some(1), "agent", "planner", 10, 990),
        flat(1, None, "workflow", "", 0, 1000),
    ];
    let counted = run(&one(OAI_TL, spans));
    assert_eq!(counted.cycles(), []);
    assert_eq!(counted.edges(), [("planner", "ask_budget", 2)]);
}

#[test]
fn flat_runs_whose_workflow_span_never_comes_count_as_each_agents_tool_calls() {
    let counted = run(&one(OAI_TL, flat_loop()[..7].to_vec()));
    assert_eq!(counted.cycles(), []);
    assert_eq!(
        counted.edges(),
        [("budget", "ask_planner", 1), ("planner", "ask_budget", 2)]
    );
}

#[test]
fn flat_runs_are_decided_once_the_workflow_span_came_and_the_wait_ran_out() {
    let limits = Limits {
        tool_edge_wait: 10.0,
        cycle_wait: 10.0,
        ..Limits::default()
    };
    let mut engine = Engine::new(limits).expect("limits");
    let mut counted = Counted::default();
    let spans = flat_loop();
    counted.add(
        &engine
            .ingest(&one(OAI_TL, spans[..7].to_vec())[0], 0.0)
            .unwrap(),
    );
    // Every run waits for the workflow span.
    counted.add(&engine.expire(50.0));
    assert_eq!((counted.edges(), engine.pending_spans()), (vec![], 7));
    counted.add(
        &engine
            .ingest(&one(OAI_TL, spans[7..].to_vec())[0], 50.0)
            .unwrap(),
    );
    // Held for their decision (and the tool spans below them, waiting for them).
    counted.add(&engine.expire(59.9));
    assert_eq!((counted.edges(), engine.pending_spans()), (vec![], 7));
    counted.add(&engine.expire(60.0));
    assert_eq!(
        counted.edges(),
        [("budget", "planner", 1), ("planner", "budget", 2)]
    );
    // Counted at once: the wait ran out before the decision.
    assert_eq!(
        (counted.cycles(), engine.pending_spans()),
        (vec![("cross_function", "planner>budget>planner")], 0)
    );
}
