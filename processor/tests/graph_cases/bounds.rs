//! The bounds: a path's last names, spans again, traces and trees past
//! capacity or their TTL, the bytes held, bad requests, and draining.
//!
//! What a reader would not guess: a trace that goes (at capacity, its TTL or a drain) first
//! settles what waited in it and makes its counts, so the bounds change when a count is made,
//! not whether.

use crate::common::counted::Counted;
use crate::common::spans::*;
use crate::{a_loop, one, run, run_with};
use opentelemetry_proto::tonic::trace::v1::Span;
use otel_guard_engine::graph::{Engine, Limits};

#[test]
fn a_path_keeps_its_last_64_names() {
    let mut spans = vec![span(1, 1, None, "invoke_agent agent-0", 0)];
    for at in 1..=84u64 {
        spans.push(span(
            1,
            at + 1,
            Some(at),
            &format!("invoke_agent agent-{at}"),
            at,
        ));
    }
    spans.push(span(1, 200, Some(85), "invoke_agent agent-0", 90));
    spans.push(span(1, 201, Some(85), "invoke_agent agent-84", 91));
    let counted = run(&one("pydantic-ai", spans));
    assert_eq!(counted.cycles(), [("direct", "agent-84>agent-84")]);
}

#[test]
fn a_span_received_again_counts_once_and_a_full_trace_drops_the_rest() {
    let request = encode(&[("pydantic-ai", a_loop())]);
    let counted = run(&[request.clone(), request.clone()]);
    assert_eq!(counted.duplicates, 4);
    assert_eq!(
        counted.edges(),
        [("budget", "planner", 1), ("planner", "budget", 2)]
    );
    let limits = Limits {
        max_spans_per_trace: 2,
        ..Limits::default()
    };
    let halves = [
        encode(&[("pydantic-ai", a_loop()[..3].to_vec())]),
        encode(&[("pydantic-ai", a_loop()[3..].to_vec())]),
    ];
    let counted = run_with(limits, &halves);
    assert_eq!(counted.dropped, 1); // checked as a request starts on the trace
    assert_eq!(
        counted.cycles(),
        [("cross_function", "planner>budget>planner")]
    );
}

#[test]
fn traces_past_capacity_go_oldest_first_and_settle_what_waited() {
    let limits = Limits {
        max_traces: 2,
        ..Limits::default()
    };
    let mut engine = Engine::new(limits).expect("limits");
    let mut counted = Counted::default();
    let orphan = span(1, 2, Some(1), "invoke_agent budget", 2);
    let orphan_child = span(1, 3, Some(2), "invoke_agent budget", 3);
    counted.add(
        &engine
            .ingest(&encode(&[("x", vec![orphan, orphan_child])]), 0.0)
            .expect("a request"),
    );
    for trace in 2..5 {
        let request = encode(&[("x", vec![span(trace, 1, None, "chat", 1)])]);
        counted.add(&engine.ingest(&request, 1.0).expect("a request"));
    }
    assert_eq!(counted.evictions, [0, 2]);
    assert_eq!(engine.active_traces(), 2);
    assert_eq!(counted.cycles(), [("direct", "budget>budget")]);
    let limits = Limits {
        max_spans: 3,
        ..Limits::default()
    };
    let counted = run_with(limits, &one("x", a_loop()));
    assert_eq!(counted.evictions[1], 0); // one trace is never evicted for its own spans
}

#[test]
fn trees_are_let_go_after_their_ttl_and_at_capacity() {
    let limits = Limits {
        max_traces: 2,
        ..Limits::default()
    };
    let mut engine = Engine::new(limits).expect("limits");
    let mut counted = Counted::default();
    for (trace, root) in [(1, "a"), (2, "b"), (3, "c")] {
        let hop = with(
            with(
                span(trace, 1, None, "chat", 1),
                "otel_guard.chain.root",
                text(root),
            ),
            "otel_guard.budget.hops",
            int(trace as i64),
        );
        counted.add(
            &engine
                .ingest(&encode(&[(GUARD, vec![hop])]), 0.0)
                .expect("a request"),
        );
    }
    assert_eq!(counted.tree_hops, [1]);
    assert_eq!(engine.active_trees(), 2);
    counted.add(&engine.expire(120.0));
    assert_eq!(counted.tree_hops, [1, 2, 3]);
    assert_eq!(engine.active_trees(), 0);
}

#[test]
fn bytes_that_are_no_request_change_nothing() {
    let mut engine = Engine::new(Limits::default()).expect("limits");
    engine
        .ingest(&encode(&[("x", a_loop()[..2].to_vec())]), 0.0)
        .expect("a request");
    assert!(engine.ingest(b"\x0a\x05", 0.0).is_err());
    assert_eq!(engine.stored_spans(), 2);
    assert!(
        Engine::new(Limits {
            max_traces: 1,
            ..Limits::default()
        })
        .is_err()
    );
    assert!(
        Engine::new(Limits {
            cycle_wait: f64::NAN,
            ..Limits::default()
        })
        .is_err()
    );
}

#[test]
fn drain_makes_the_counts_of_spans_still_waiting_for_their_parent_and_names_the_chain_root() {
    // The loop's spans under a top span that has not come: they wait for it, and a sweep within
    // the TTL settles nothing. At stop, drain settles them and counts the loop, with the root the
    // guard's spans name, and lets go of everything without counting evictions.
    let spans: Vec<Span> = a_loop()
        .into_iter()
        .map(|mut span| {
            if span.parent_span_id.is_empty() {
                span.parent_span_id = span_id(99);
            }
            with(span, "otel_guard.chain.root", text("r1"))
        })
        .collect();
    let mut engine = Engine::new(Limits::default()).expect("limits");
    let ingested = engine
        .ingest(&encode(&[(GUARD, spans)]), 0.0)
        .expect("a request");
    let swept = engine.expire(60.0);
    assert!(ingested.cycles.is_empty() && swept.cycles.is_empty());
    assert_eq!(engine.pending_spans(), 4);
    let drained = engine.drain();
    let roots: Vec<_> = drained
        .cycles
        .iter()
        .map(|cycle| (cycle.label.as_str(), cycle.chain_root.as_deref()))
        .collect();
    assert_eq!(roots, [("planner>budget>planner", Some("r1"))]);
    assert_eq!(drained.evictions, [0, 0]);
    assert_eq!((engine.stored_spans(), engine.pending_spans()), (0, 0));
    assert_eq!(engine.active_traces(), 0);
}

#[test]
fn drain_makes_the_counts_waiting_on_cycle_wait_in_traces_of_every_class() {
    // A whole loop's trace (its path two names deep: the class evicted last) whose count waits on
    // cycle_wait: drain makes it, as it does for a trace of one name.
    let mut engine = Engine::new(Limits::default()).expect("limits");
    let ingested = engine
        .ingest(&encode(&[(GUARD, a_loop())]), 0.0)
        .expect("a request");
    assert!(ingested.cycles.is_empty());
    let drained = engine.drain();
    let labels: Vec<_> = drained
        .cycles
        .iter()
        .map(|cycle| cycle.label.as_str())
        .collect();
    assert_eq!(labels, ["planner>budget>planner"]);
    assert_eq!(engine.active_traces(), 0);
}

#[test]
fn one_span_traces_past_capacity_do_not_evict_a_loop_in_progress() {
    // The attack at max_traces 100: one-span traces between a loop's second and third span.
    let limits = Limits {
        max_traces: 100,
        cycle_wait: 0.0,
        ..Limits::default()
    };
    let mut engine = Engine::new(limits).expect("limits");
    let mut counted = Counted::default();
    let first = vec![
        span(1, 1, None, "invoke_agent planner", 1),
        span(1, 2, Some(1), "invoke_agent budget", 2),
    ];
    counted.add(
        &engine
            .ingest(&encode(&[("pydantic-ai", first)]), 0.0)
            .expect("a request"),
    );
    for batch in 0..10u64 {
        let solo = (0..52)
            .map(|at| span(2 + batch * 52 + at, 1, None, "invoke_agent solo", 1))
            .collect();
        counted.add(
            &engine
                .ingest(&encode(&[("pydantic-ai", solo)]), 1.0)
                .expect("a request"),
        );
    }
    assert_eq!(engine.delegating_traces(), 1);
    let third = vec![span(1, 3, Some(2), "invoke_agent planner", 3)];
    counted.add(
        &engine
            .ingest(&encode(&[("pydantic-ai", third)]), 2.0)
            .expect("a request"),
    );
    assert!(counted.evictions[1] >= 420, "{:?}", counted.evictions);
    assert_eq!(
        counted.cycles(),
        [("cross_function", "planner>budget>planner")]
    );
}

#[test]
fn the_bytes_held_stay_within_max_held_bytes_and_a_chain_is_read_to_its_bound() {
    let limits = Limits {
        max_held_bytes: 1 << 20,
        ..Limits::default()
    };
    let mut engine = Engine::new(limits).expect("limits");
    let mut counted = Counted::default();
    let mut most = 0;
    for trace in 0..400u64 {
        let names: Vec<String> = (0..64)
            .map(|at| format!("{trace:08}-{at:02}-{}", "n".repeat(50)))
            .collect();
        let items: Vec<&str> = names.iter().map(String::as_str).collect();
        let hop = with(
            with(
                with(
                    span(trace + 1, 1, None, "invoke_agent last", 1),
                    "otel_guard.chain.agents",
                    texts(&items),
                ),
                "otel_guard.chain.depth",
                int(64),
            ),
            "otel_guard.chain.root",
            text("root"),
        );
        counted.add(
            &engine
                .ingest(&encode(&[("otel_guard", vec![hop])]), 0.0)
                .expect("a request"),
        );
        most = most.max(engine.held_bytes());
    }
    assert!(most <= 1 << 20, "{most}");
    assert!(counted.evictions[1] > 300, "{:?}", counted.evictions);
    // Each span holds what its chain's last 4,096 bytes of names make: about 22 KiB, the most.
    let per_span = engine.held_bytes() / engine.stored_spans();
    assert!(per_span <= 24 * 1024, "{per_span}");
    // The last trace's edge is from the chain's last name kept.
    assert!(
        counted
            .edges()
            .iter()
            .any(|(caller, callee, _)| caller.starts_with("00000399-63") && *callee == "last")
    );
}
