//! A span's path: the parent, the guard's chain, a link or a named caller it continues, in any
//! order and any batches; one call of two forms or two sides, and a tool's run.
//!
//! What a reader would not guess: a count waits for the spans that could still change it (a
//! tool's edge for a run below it, a loop for an earlier return), so most cases read at time 0
//! and count only at the sweep ([`crate::run`]).

use crate::common::counted::Counted;
use crate::common::spans::*;
use crate::{SWEEP, a_loop, one, run};
use opentelemetry_proto::tonic::trace::v1::Span;
use otel_guard_engine::graph::{Engine, Limits};

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
fn a_tools_run_counts_for_each_source_that_recorded_it_in_any_order() {
    // Beside the guard: the guard's spans record planner -> budget twice, and a tool call that ran
    // budget, recorded by the guard's span and pydantic-ai's; the run counts for both, so the
    // guard's calls at planner > budget are three, pydantic-ai's one.
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
fn a_run_recorded_by_both_sources_counts_alike_whichever_arrives_first() {
    // pydantic-ai records planner calling budget directly and through a tool whose run it records
    // (started later); the guard records only the run (started first). Each source's calls at
    // planner > budget: pydantic-ai's two, the guard's one: two calls, in either order. Before,
    // the run was the source of its first-started span: counted at once as pydantic-ai's (2), then
    // moved to the guard's when the guard's span came (1), a count made staying made.
    let planner = span(1, 1, None, "invoke_agent planner", 0);
    let direct = span(1, 2, Some(1), "invoke_agent budget", 1);
    let tool = span(1, 3, Some(1), "execute_tool ask_budget", 2);
    let others_run = span(1, 4, Some(3), "invoke_agent budget", 9);
    let guards_run = span(1, 5, Some(3), "invoke_agent budget", 3);
    let others = encode(&[("pydantic-ai", vec![planner, direct, tool, others_run])]);
    let guard = encode(&[(GUARD, vec![guards_run])]);
    let others_first = run(&[others.clone(), guard.clone()]);
    let guard_first = run(&[guard, others]);
    assert_eq!(others_first.edges(), [("planner", "budget", 2)]);
    assert_eq!(guard_first.edges(), [("planner", "budget", 2)]);
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
