//! The graph through `Engine::ingest`, case by case: cycles and their kinds, the span each count
//! names, edges, decisions, tree hops, spans in any order, and the bounds.

mod common;

use std::collections::BTreeMap;

use common::counted::Counted;
use common::spans::*;
use opentelemetry_proto::tonic::trace::v1::Span;
use otel_guard_engine::graph::{Engine, Limits, label_names, push_name};

const SWEEP: f64 = 1e12;

/// Every request at `now` 0, then a sweep past every wait and TTL, then the trees let go.
fn run(requests: &[Vec<u8>]) -> Counted {
    run_with(Limits::default(), requests)
}

fn run_with(limits: Limits, requests: &[Vec<u8>]) -> Counted {
    let mut engine = Engine::new(limits).expect("limits");
    let mut counted = Counted::default();
    for request in requests {
        counted.add(&engine.ingest(request, 0.0).expect("a request"));
    }
    counted.add(&engine.expire(SWEEP));
    counted.add(&engine.release_trees());
    assert_eq!(
        (engine.stored_spans(), engine.pending_spans()),
        (0, 0),
        "{counted:?}"
    );
    counted
}

fn one(scope: &str, spans: Vec<Span>) -> Vec<Vec<u8>> {
    vec![encode(&[(scope, spans)])]
}

/// planner > budget > planner in one trace, in pydantic-ai's spans.
fn a_loop() -> Vec<Span> {
    vec![
        span(1, 1, None, "invoke_agent planner", 10),
        span(1, 2, Some(1), "invoke_agent budget", 20),
        span(1, 3, Some(2), "invoke_agent planner", 30),
        span(1, 4, Some(3), "invoke_agent budget", 40),
    ]
}

#[test]
fn a_loop_counts_once_from_the_span_where_the_name_first_returned() {
    let counted = run(&one("pydantic-ai", a_loop()));
    assert_eq!(
        counted.cycles(),
        [("cross_function", "planner>budget>planner")]
    );
    let spans = &counted.cycles[&("cross_function".into(), "planner>budget>planner".into())];
    assert_eq!(spans, &[(trace_id(1), span_id(3))]);
    assert_eq!(
        counted.edges(),
        [("budget", "planner", 1), ("planner", "budget", 2)]
    );
}

#[test]
fn any_order_and_any_batches_count_alike() {
    let spans = a_loop();
    let whole = run(&one("pydantic-ai", spans.clone()));
    let reversed: Vec<Span> = spans.iter().rev().cloned().collect();
    assert_eq!(run(&one("pydantic-ai", reversed.clone())), whole);
    let singly: Vec<Vec<u8>> = reversed
        .iter()
        .map(|span| encode(&[("pydantic-ai", vec![span.clone()])]))
        .collect();
    assert_eq!(run(&singly), whole);
    let mut engine = Engine::new(Limits::default()).expect("limits");
    engine.ingest(&singly[0], 0.0).expect("a request");
    assert_eq!((engine.stored_spans(), engine.pending_spans()), (1, 1));
    engine.ingest(&singly[1], 0.0).expect("a request");
    assert_eq!((engine.stored_spans(), engine.pending_spans()), (2, 2));
}

#[test]
fn the_same_form_again_is_a_direct_cycle_and_two_instrumentations_one_call() {
    let again = vec![
        span(1, 1, None, "invoke_agent wiki", 1),
        span(1, 2, Some(1), "invoke_agent wiki", 2),
    ];
    assert_eq!(
        run(&one("pydantic-ai", again.clone())).cycles(),
        [("direct", "wiki>wiki")]
    );
    let two = encode(&[
        ("pydantic-ai", vec![again[0].clone()]),
        ("openinference", vec![again[1].clone()]),
    ]);
    let counted = run(&[two]);
    assert!(counted.cycles.is_empty() && counted.edges.is_empty());
}

#[test]
fn adks_workflow_around_its_agent_is_one_call_and_the_reverse_a_new_run() {
    let wrapped = vec![
        span(1, 1, None, "invoke_workflow planner", 1),
        span(1, 2, Some(1), "invoke_agent planner", 2),
    ];
    assert!(run(&one("gcp.vertex.agent", wrapped)).cycles.is_empty());
    let again = vec![
        span(1, 1, None, "invoke_agent planner", 1),
        span(1, 2, Some(1), "invoke_workflow planner", 2),
    ];
    assert_eq!(
        run(&one("gcp.vertex.agent", again)).cycles(),
        [("direct", "planner>planner")]
    );
}

#[test]
fn a_remote_calls_two_sides_are_one_call() {
    let spans = vec![
        span(1, 1, None, "invoke_agent planner", 1),
        kind(span(1, 2, Some(1), "invoke_agent budget", 2), CLIENT),
        span(1, 3, Some(2), "POST", 3),
        kind(span(1, 4, Some(3), "invoke_agent budget", 4), SERVER),
    ];
    let counted = run(&one("pydantic-ai", spans));
    assert!(counted.cycles.is_empty());
    assert_eq!(counted.edges(), [("planner", "budget", 1)]);
}

#[test]
fn an_agent_run_below_a_tool_is_the_tools_run_and_a_plain_tools_edge_waits() {
    let spans = vec![
        span(1, 1, None, "invoke_agent planner", 1),
        span(1, 2, Some(1), "execute_tool ask_budget", 2),
        span(1, 3, Some(2), "invoke_agent budget", 3),
        span(1, 4, Some(1), "execute_tool search", 4),
    ];
    let request = one("pydantic-ai", spans);
    assert_eq!(
        run(&request).edges(),
        [("planner", "budget", 1), ("planner", "search", 1)]
    );
    let limits = Limits {
        tool_edge_wait: 5.0,
        ..Limits::default()
    };
    let mut engine = Engine::new(limits).expect("limits");
    let mut counted = Counted::default();
    counted.add(&engine.ingest(&request[0], 100.0).expect("a request"));
    assert_eq!(counted.edges(), [("planner", "budget", 1)]);
    counted.add(&engine.expire(104.9));
    assert_eq!(counted.edges(), [("planner", "budget", 1)]);
    counted.add(&engine.expire(105.0));
    assert_eq!(
        counted.edges(),
        [("planner", "budget", 1), ("planner", "search", 1)]
    );
}

#[test]
fn a_loop_waits_for_an_earlier_return_before_it_counts() {
    let spans = [
        span(1, 1, None, "invoke_agent fx", 1),
        span(1, 2, Some(1), "invoke_agent planner", 2),
        span(1, 3, Some(2), "invoke_agent budget", 3),
        span(1, 4, Some(3), "invoke_agent planner", 4),
        span(1, 5, Some(1), "invoke_agent budget", 5),
        span(1, 6, Some(5), "invoke_agent planner", 6),
        span(1, 7, Some(6), "invoke_agent budget", 7),
    ];
    let later_first = encode(&[("pydantic-ai", spans[4..].to_vec())]);
    let first = encode(&[("pydantic-ai", spans[..4].to_vec())]);
    let limits = Limits {
        cycle_wait: 3.0,
        ..Limits::default()
    };
    let mut engine = Engine::new(limits).expect("limits");
    let mut counted = Counted::default();
    counted.add(&engine.ingest(&later_first, 10.0).expect("a request"));
    counted.add(&engine.ingest(&first, 11.0).expect("a request"));
    assert!(counted.cycles.is_empty());
    counted.add(&engine.expire(13.9)); // first seen at 11: due at 14
    assert!(counted.cycles.is_empty());
    counted.add(&engine.expire(14.0));
    assert_eq!(
        counted.cycles(),
        [("cross_function", "planner>budget>planner")]
    );
    counted.add(&engine.expire(SWEEP));
    assert_eq!(counted.cycles.values().map(Vec::len).sum::<usize>(), 1);
}

#[test]
fn a_linked_root_and_a_chained_root_continue_their_path_across_traces() {
    let first = vec![
        span(1, 1, None, "invoke_agent planner", 1),
        kind(span(1, 2, Some(1), "publish", 2), 4),
    ];
    let second = vec![
        linked(kind(span(2, 3, None, "process", 3), 5), 1, 2),
        span(2, 4, Some(3), "invoke_agent planner", 4),
    ];
    let counted = run(&[
        encode(&[("pydantic-ai", second.clone())]),
        encode(&[("pydantic-ai", first.clone())]),
    ]);
    assert_eq!(counted.cycles(), [("cross_trace", "planner>planner")]);
    assert_eq!(counted.edges(), [("planner", "planner", 1)]);
    // The guard's chain: a trace's first span carries the earlier hops.
    let chained = guarded(
        span(3, 1, None, "invoke_agent budget", 1),
        &["planner", "budget", "planner", "budget"],
        "would_refuse",
    );
    let counted = run(&one(GUARD, vec![chained]));
    assert_eq!(counted.cycles(), [("cross_trace", "budget>planner>budget")]);
    assert_eq!(
        counted.decisions.keys().collect::<Vec<_>>(),
        [&("would_refuse".into(), String::new(), "budget".into())]
    );
}

#[test]
fn a_lean_hop_span_takes_its_path_from_its_parent_in_any_order() {
    // fx arrived over the wire (its span names the chain), then, directly in fx's span, planner
    // again with another skill: allowed, so the guard leaves the chain's lists out (lean). Its
    // path is its parent's: the loop across traces is counted as with the lists, in either order.
    let arrived = guarded(
        span(1, 1, None, "invoke_agent fx", 1),
        &["planner", "budget", "fx"],
        "allow",
    );
    let full = guarded(
        span(1, 2, Some(1), "invoke_agent planner", 2),
        &["planner", "budget", "fx", "planner"],
        "allow",
    );
    let mut lean = full.clone();
    lean.attributes
        .retain(|pair| pair.key != "otel_guard.chain.agents");
    assert_eq!(lean.attributes.len() + 1, full.attributes.len());
    for nested in [lean, full] {
        for spans in [
            vec![arrived.clone(), nested.clone()],
            vec![nested.clone(), arrived.clone()],
        ] {
            let counted = run(&one(GUARD, spans));
            assert_eq!(
                counted.cycles(),
                [("cross_trace", "planner>budget>fx>planner")]
            );
            assert_eq!(counted.edges(), [("budget", "fx", 1), ("fx", "planner", 1)]);
        }
    }
}

#[test]
fn a_span_whose_parent_never_comes_settles_on_its_chain_when_its_trace_goes() {
    let orphan = guarded(
        span(1, 2, Some(99), "invoke_agent planner", 2),
        &["planner", "budget", "planner"],
        "allow",
    );
    let below = span(1, 3, Some(2), "invoke_agent budget", 3);
    let mut engine = Engine::new(Limits::default()).expect("limits");
    let mut counted = Counted::default();
    counted.add(
        &engine
            .ingest(&encode(&[(GUARD, vec![orphan, below])]), 0.0)
            .expect("a request"),
    );
    assert_eq!(engine.pending_spans(), 2);
    counted.add(&engine.expire(119.0));
    assert_eq!((engine.active_traces(), engine.pending_spans()), (1, 2));
    counted.add(&engine.expire(120.0));
    counted.add(&engine.expire(SWEEP));
    assert_eq!((engine.active_traces(), engine.stored_spans()), (0, 0));
    assert_eq!(counted.evictions, [1, 0]);
    // planner returns on its chain's path; so does budget below it, one turn later: one loop.
    assert_eq!(
        counted.cycles(),
        [("cross_trace", "planner>budget>planner")]
    );
}

#[test]
fn decisions_and_tree_hops_are_the_guards() {
    let mut planner = guarded(
        span(1, 1, None, "invoke_agent planner", 1),
        &["planner"],
        "allow",
    );
    let mut budget = guarded(
        span(1, 2, Some(1), "invoke_agent budget", 2),
        &["planner", "budget"],
        "refuse",
    );
    budget = with(budget, "otel_guard.reason", text("budget"));
    for (span, hops) in [(&mut planner, 1), (&mut budget, 7)] {
        *span = with(span.clone(), "otel_guard.chain.root", text("r1"));
        *span = with(span.clone(), "otel_guard.budget.hops", int(hops));
    }
    let counted = run(&one(GUARD, vec![planner.clone(), budget.clone()]));
    assert_eq!(
        counted.decisions,
        BTreeMap::from([
            (("allow".into(), "".into(), "planner".into()), 1),
            (("refuse".into(), "budget".into(), "budget".into()), 1),
        ])
    );
    assert_eq!(counted.tree_hops, [7]);
    // Another scope's hop counts are not the guard's.
    assert!(
        run(&one("other", vec![planner, budget]))
            .tree_hops
            .is_empty()
    );
}

#[test]
fn names_and_labels_are_cut_to_their_bound() {
    let long = "p".repeat(300);
    let spans = vec![
        span(1, 1, None, &format!("invoke_agent {long}"), 1),
        span(1, 2, Some(1), &format!("invoke_agent {long}"), 2),
    ];
    let counted = run(&one("pydantic-ai", spans));
    let (kind, label) = counted.cycles()[0];
    assert_eq!(kind, "direct");
    assert_eq!(label.chars().count(), 2 * 256 + 1);
    assert!(label.contains("p…>p"));
    assert_eq!(counted.truncated.0, 2);
    let many: Vec<Span> = (0..6)
        .map(|at| {
            let name = format!("invoke_agent {at}{}", "x".repeat(300));
            span(1, at + 1, at.checked_sub(1).map(|p| p + 1), &name, at)
        })
        .chain([span(1, 7, Some(6), "invoke_agent 0", 7)])
        .collect();
    let counted = run(&one("pydantic-ai", many));
    assert!(counted.cycles.is_empty()); // "0" is no name cut short of "0xxx…"
}

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
fn a_tools_run_is_the_source_of_its_span_that_started_first_in_any_order() {
    // Beside the guard: the guard's spans record planner -> budget twice, and a tool call that ran
    // budget, recorded by the guard's span (started first) and pydantic-ai's; the run is the
    // guard's, so the guard's calls at planner > budget are three.
    let planner = span(1, 1, None, "invoke_agent planner", 1);
    let guard_calls = vec![
        span(1, 2, Some(1), "invoke_agent budget", 2),
        span(1, 3, Some(1), "invoke_agent budget", 3),
        span(1, 6, Some(4), "invoke_agent budget", 5),
    ];
    let tool = span(1, 4, Some(1), "execute_tool ask_budget", 4);
    let later = span(1, 5, Some(4), "invoke_agent budget", 6);
    let others_first = [
        encode(&[(
            "pydantic-ai",
            vec![planner.clone(), tool.clone(), later.clone()],
        )]),
        encode(&[(GUARD, guard_calls.clone())]),
    ];
    let guards_first = [
        encode(&[("pydantic-ai", vec![planner, tool])]),
        encode(&[(GUARD, guard_calls)]),
        encode(&[("pydantic-ai", vec![later])]),
    ];
    assert_eq!(run(&others_first).edges(), [("planner", "budget", 3)]);
    assert_eq!(run(&guards_first).edges(), [("planner", "budget", 3)]);
}

#[test]
fn a_tools_run_is_found_again_however_many_runs_its_trace_holds() {
    // Past 16 runs a trace finds them by an index rather than a scan: each tool's run, recorded
    // twice below it (the second span later, in another request), counts as it does alone.
    let trace = |tools: u64| {
        let mut first = vec![span(1, 1, None, "invoke_agent planner", 1)];
        let mut again = Vec::new();
        for tool in 0..tools {
            let id = 10 + 3 * tool;
            first.push(span(
                1,
                id,
                Some(1),
                &format!("execute_tool ask_{tool}"),
                id,
            ));
            first.push(span(
                1,
                id + 1,
                Some(id),
                &format!("invoke_agent agent_{tool}"),
                id + 1,
            ));
            again.push(span(
                1,
                id + 2,
                Some(id),
                &format!("invoke_agent agent_{tool}"),
                id,
            ));
        }
        [
            encode(&[("pydantic-ai", first)]),
            encode(&[("pydantic-ai", again)]),
        ]
    };
    let alone = run(&trace(1));
    assert_eq!(alone.edges(), [("planner", "agent_0", 1)]);
    let many = run(&trace(40));
    let many = many.edges();
    assert_eq!(many.len(), 40);
    for (index, edge) in many.iter().enumerate() {
        assert_eq!(edge.0, "planner");
        assert_eq!(edge.2, 1, "{edge:?} (of {index})");
    }
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

/// The guard's hop span of `chain` (its name last), of kind `call` or `transfer` as the guard
/// writes it (a transfer's span also carries the conventions' `gen_ai.transfer.mode`).
fn hop(id: u64, parent: Option<u64>, chain: &[&str], transfer: bool, start: u64) -> Span {
    let name = format!("invoke_agent {}", chain.last().expect("a name"));
    let mut span = guarded(span(1, id, parent, &name, start), chain, "allow");
    span = with(
        span,
        "otel_guard.hop.kind",
        text(if transfer { "transfer" } else { "call" }),
    );
    if transfer {
        span = with(span, "gen_ai.transfer.mode", text("pass_control"));
    }
    span
}

#[test]
fn a_hand_back_by_transfers_is_no_cycle_and_a_call_back_is_one() {
    // triage ⇒ faq ⇒ triage by handoffs (the guard's spans, nested as the guard nests them).
    let handoffs = vec![
        hop(1, None, &["triage"], false, 1),
        hop(2, Some(1), &["triage", "faq"], true, 2),
        hop(3, Some(2), &["triage", "faq", "triage"], true, 3),
    ];
    let counted = run(&one(GUARD, handoffs.clone()));
    assert!(counted.cycles.is_empty(), "{counted:?}");
    assert_eq!(
        counted.edges(),
        [("faq", "triage", 1), ("triage", "faq", 1)]
    );
    // The same shape by calls: triage still waits for faq's answer.
    let calls = vec![
        hop(1, None, &["triage"], false, 1),
        hop(2, Some(1), &["triage", "faq"], false, 2),
        hop(3, Some(2), &["triage", "faq", "triage"], false, 3),
    ];
    assert_eq!(
        run(&one(GUARD, calls)).cycles(),
        [("cross_function", "triage>faq>triage")]
    );
    // A transfer into an agent that still waits (triage called faq, faq hands off to triage).
    let into_waiting = vec![
        hop(1, None, &["triage"], false, 1),
        hop(2, Some(1), &["triage", "faq"], false, 2),
        hop(3, Some(2), &["triage", "faq", "triage"], true, 3),
    ];
    assert_eq!(
        run(&one(GUARD, into_waiting)).cycles(),
        [("cross_function", "triage>faq>triage")]
    );
    // Handed back, triage calls billing, which calls triage: triage waits there, from its second
    // place on (the label starts there).
    let mut again = handoffs;
    again.push(hop(
        4,
        Some(3),
        &["triage", "faq", "triage", "billing"],
        false,
        4,
    ));
    again.push(hop(
        5,
        Some(4),
        &["triage", "faq", "triage", "billing", "triage"],
        false,
        5,
    ));
    assert_eq!(
        run(&one(GUARD, again)).cycles(),
        [("cross_function", "triage>billing>triage")]
    );
}

#[test]
fn an_agent_that_handed_off_is_not_waiting_whatever_comes_back_to_it() {
    // faq was handed control and calls triage: triage handed off, it waits for nothing.
    let spans = vec![
        hop(1, None, &["triage"], false, 1),
        hop(2, Some(1), &["triage", "faq"], true, 2),
        hop(3, Some(2), &["triage", "faq", "triage"], false, 3),
    ];
    assert!(run(&one(GUARD, spans)).cycles.is_empty());
    // An agent handing off to itself (a new turn of its own) is no cycle; calling itself is.
    let turn = vec![
        hop(1, None, &["faq"], false, 1),
        hop(2, Some(1), &["faq", "faq"], true, 2),
    ];
    assert!(run(&one(GUARD, turn)).cycles.is_empty());
    let call = vec![
        hop(1, None, &["faq"], false, 1),
        hop(2, Some(1), &["faq", "faq"], false, 2),
    ];
    assert_eq!(run(&one(GUARD, call)).cycles(), [("direct", "faq>faq")]);
}

#[test]
fn a_ping_pong_of_transfers_is_no_cycle_here_the_guard_stops_it_at_its_name_depth() {
    // The engine has no per-name depth of its own: the guard refuses the sixth triage
    // (name_depth), which the engine counts as the guard's decision.
    let mut chain = vec!["triage"];
    let mut spans = vec![hop(1, None, &chain, false, 1)];
    for id in 2..=11 {
        chain.push(if id % 2 == 0 { "faq" } else { "triage" });
        spans.push(hop(id, Some(id - 1), &chain, true, id));
    }
    // The sixth triage, refused: its span as the guard writes it.
    spans.pop();
    let refused = guarded(
        span(1, 11, Some(10), "invoke_agent triage", 11),
        &chain,
        "refuse",
    );
    let refused = with(refused, "otel_guard.reason", text("name_depth"));
    spans.push(with(refused, "otel_guard.hop.kind", text("transfer")));
    let counted = run(&one(GUARD, spans));
    assert!(counted.cycles.is_empty(), "{counted:?}");
    assert_eq!(
        counted.decisions[&("refuse".into(), "name_depth".into(), "triage".into())],
        1
    );
}

#[test]
fn the_conventions_transfer_tool_and_a_runtimes_span_of_a_guarded_transfer_mark_it_too() {
    // `execute_tool transfer_to_X X` with gen_ai.transfer.mode pass_control, the agent it hands
    // to run below it: the run is a transfer.
    let handoff = |id: u64, parent: u64, to: &str, mode: &str| {
        with(
            with(
                span(
                    1,
                    id,
                    Some(parent),
                    &format!("execute_tool transfer_to_{to} {to}"),
                    id,
                ),
                "gen_ai.tool.name",
                text(&format!("transfer_to_{to}")),
            ),
            "gen_ai.transfer.mode",
            text(mode),
        )
    };
    let spans = |mode: &str| {
        vec![
            span(1, 1, None, "invoke_agent triage", 1),
            handoff(2, 1, "faq", mode),
            span(1, 3, Some(2), "invoke_agent faq", 3),
            handoff(4, 3, "triage", mode),
            span(1, 5, Some(4), "invoke_agent triage", 5),
        ]
    };
    let counted = run(&one("openai-agents", spans("pass_control")));
    assert!(counted.cycles.is_empty(), "{counted:?}");
    assert_eq!(
        counted.edges(),
        [("faq", "triage", 1), ("triage", "faq", 1)]
    );
    // return_to_caller: an agent called as a tool, which the caller waits for.
    assert_eq!(
        run(&one("openai-agents", spans("return_to_caller"))).cycles(),
        [("cross_function", "triage>faq>triage")]
    );
    // The guard's transfer span with the runtime's own span of the same call inside it: one call,
    // a transfer.
    let beside = encode(&[
        (
            GUARD,
            vec![
                hop(1, None, &["triage"], false, 1),
                hop(2, Some(1), &["triage", "faq"], true, 2),
                hop(4, Some(3), &["triage", "faq", "triage"], true, 4),
            ],
        ),
        (
            "openai-agents",
            vec![
                span(1, 3, Some(2), "invoke_agent faq", 3),
                span(1, 5, Some(4), "invoke_agent triage", 5),
            ],
        ),
    ]);
    assert!(run(&[beside]).cycles.is_empty());
}

#[test]
fn a_name_holding_the_separator_or_the_escape_is_escaped_in_its_label() {
    // An agent `planner>budget` calling itself: one name, not a two-agent loop.
    let spans = vec![
        span(1, 1, None, "invoke_agent planner>budget", 1),
        span(1, 2, Some(1), "invoke_agent planner>budget", 2),
    ];
    let counted = run(&one("pydantic-ai", spans));
    assert_eq!(
        counted.cycles(),
        [("direct", r"planner\>budget>planner\>budget")]
    );
    assert_eq!(
        label_names(counted.cycles()[0].1),
        ["planner>budget", "planner>budget"]
    );
    // ... and the two-agent loop reads otherwise.
    let two = run(&one("pydantic-ai", a_loop())).cycles()[0].1.to_owned();
    assert_eq!(label_names(&two), ["planner", "budget", "planner"]);
    // A backslash, alone, at the end, and before a `>`.
    let names = [r"a\b", "c", r"d\", r"e\>f"];
    let spans: Vec<Span> = names
        .iter()
        .chain(&names[..1])
        .enumerate()
        .map(|(at, name)| {
            let id = at as u64 + 1;
            span(
                1,
                id,
                (at > 0).then(|| id - 1),
                &format!("invoke_agent {name}"),
                id,
            )
        })
        .collect();
    let counted = run(&one("pydantic-ai", spans));
    let (kind, label) = counted.cycles()[0];
    assert_eq!(kind, "cross_function");
    assert_eq!(label, r"a\\b>c>d\\>e\\\>f>a\\b");
    assert_eq!(label_names(label), [r"a\b", "c", r"d\", r"e\>f", r"a\b"]);
}

#[test]
fn any_label_reads_back_into_its_names() {
    for names in [
        vec![""],
        vec!["", ""],
        vec![">", "\\"],
        vec![r"\\>>", "x>", ">y", r"\"],
        vec!["plain", "names"],
    ] {
        let mut label = String::new();
        for (at, name) in names.iter().enumerate() {
            if at > 0 {
                label.push('>');
            }
            push_name(&mut label, name);
        }
        assert_eq!(label_names(&label), names, "{label}");
    }
}

#[test]
fn one_span_traces_past_capacity_do_not_evict_a_loop_in_progress() {
    // The issue's attack at max_traces 100: one-span traces between a loop's second and third span.
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
