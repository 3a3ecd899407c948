//! The graph through `Engine::ingest`, case by case: cycles and their kinds, the span each count
//! names, edges, decisions, tree hops, spans in any order, and the bounds; one module a concern.
//!
//! What a reader would not guess: [`run`] reads every request at time 0, then sweeps past every
//! wait and TTL, and fails the case if any span is still held after it.

#[path = "../common/mod.rs"]
mod common;

mod bounds;
mod flat;
mod guard;
mod labels;
mod paths;

use common::counted::Counted;
use common::spans::*;
use opentelemetry_proto::tonic::trace::v1::Span;
use otel_guard_engine::graph::{Engine, Limits};

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
