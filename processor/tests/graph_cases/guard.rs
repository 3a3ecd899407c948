//! The guard's own spans: decisions, tree hops, and the transfers (handoffs) its hop spans or the
//! conventions' transfer mode mark.
//!
//! What a reader would not guess: control handed off and coming back is no loop here; a ping-pong
//! of transfers is stopped by the guard at its name depth, not counted by the graph.

use std::collections::BTreeMap;

use crate::common::spans::*;
use crate::{one, run};
use opentelemetry_proto::tonic::trace::v1::Span;

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
