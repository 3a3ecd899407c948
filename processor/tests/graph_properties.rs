//! The engine on generated span forests: what it counts is a function of the spans alone (any
//! arrival order, any batches, retries), nothing is held once everything may go, and no input --
//! a forest with spans lost, under tight bounds, random or damaged bytes -- makes it panic.

mod common;

use common::counted::Counted;
use common::mutations::*;
use common::spans::*;
use opentelemetry_proto::tonic::trace::v1::Span;
use otel_guard_engine::graph::{Engine, Limits};
use proptest::collection::vec;
use proptest::prelude::*;

const NAMES: [&str; 3] = ["planner", "budget", "fx"];
const SCOPES: [&str; 4] = [
    "pydantic-ai",
    GUARD,
    "openinference.instrumentation.langchain",
    "opentelemetry.instrumentation.langchain",
];
const SWEEP: f64 = 1e12;

/// One generated span: where it hangs, what it is written as.
#[derive(Debug, Clone)]
struct Spec {
    /// None: a trace root; Some(Ok(n)): below the n-th span of its trace before it (modulo);
    /// Some(Err(())): below a span that never comes.
    parent: Option<Result<usize, ()>>,
    form: u8,
    name: usize,
    scope: usize,
    kind: i32,
    start: u64,
    /// A trace root's link to (an earlier trace, one of its spans), modulo.
    link: Option<(usize, usize)>,
    chain: Vec<usize>,
    hops: i64,
}

fn spec() -> impl Strategy<Value = Spec> {
    let parent = prop_oneof![
        1 => Just(None),
        6 => any::<usize>().prop_map(|n| Some(Ok(n))),
        1 => Just(Some(Err(()))),
    ];
    (
        parent,
        0u8..10,
        0..NAMES.len(),
        0..SCOPES.len(),
        0..6i32,
        0u64..40,
        prop::option::weighted(0.3, (any::<usize>(), any::<usize>())),
        vec(0..NAMES.len(), 0..4),
        -1i64..4,
    )
        .prop_map(
            |(parent, form, name, scope, kind, start, link, chain, hops)| Spec {
                parent,
                form,
                name,
                scope,
                kind,
                start,
                link,
                chain,
                hops,
            },
        )
}

/// The spans of a forest of `traces`, each (scope, span).
fn render(traces: &[Vec<Spec>]) -> Vec<(&'static str, Span)> {
    let mut out = Vec::new();
    for (trace, specs) in traces.iter().enumerate() {
        let trace_no = trace as u64 + 1;
        for (at, spec) in specs.iter().enumerate() {
            let id = trace_no * 1000 + at as u64;
            let parent = match spec.parent {
                Some(Ok(n)) if at > 0 => Some(trace_no * 1000 + (n % at) as u64),
                Some(Err(())) => Some(999_999),
                _ => None,
            };
            let name = NAMES[spec.name];
            let (span_name, attributes): (String, Vec<(&str, &str)>) = match spec.form {
                0 => (format!("invoke_agent {name}"), vec![]),
                1 => (format!("execute_tool {name}"), vec![]),
                2 => (format!("invoke_workflow {name}"), vec![]),
                3 => (
                    "chat".into(),
                    vec![
                        ("gen_ai.operation.name", "invoke_agent"),
                        ("gen_ai.agent.name", name),
                    ],
                ),
                4 => (
                    format!("{name}.agent"),
                    vec![
                        ("traceloop.span.kind", "agent"),
                        ("gen_ai.agent.name", name),
                    ],
                ),
                5 => (
                    "tool".into(),
                    vec![("openinference.span.kind", "TOOL"), ("tool.name", name)],
                ),
                6 => (name.into(), vec![("openinference.span.kind", "CHAIN")]),
                7 => (
                    format!("{name}.task"),
                    vec![
                        ("traceloop.span.kind", "task"),
                        ("traceloop.entity.name", name),
                    ],
                ),
                _ => ("POST".into(), vec![]),
            };
            let mut span = kind(
                span(trace_no, id, parent, &span_name, spec.start),
                spec.kind,
            );
            for (key, value) in attributes {
                span = with(span, key, text(value));
            }
            let scope = SCOPES[spec.scope];
            if scope == GUARD {
                let chain: Vec<&str> = spec.chain.iter().map(|&at| NAMES[at]).collect();
                span = guarded(
                    span,
                    &chain,
                    if spec.hops > 1 {
                        "would_refuse"
                    } else {
                        "allow"
                    },
                );
                span = with(span, "otel_guard.chain.root", text(NAMES[spec.name % 2]));
                span = with(span, "otel_guard.budget.hops", int(spec.hops));
            }
            if parent.is_none()
                && trace > 0
                && let Some((other, span_at)) = spec.link
            {
                let other = other % trace;
                let target = span_at % traces[other].len().max(1);
                span = linked(
                    span,
                    other as u64 + 1,
                    (other as u64 + 1) * 1000 + target as u64,
                );
            }
            out.push((scope, span));
        }
    }
    out
}

/// The requests of `spans` in `batches` (split points), each a ScopeSpans per scope.
fn requests(spans: &[(&'static str, Span)], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut points: Vec<usize> = cuts.iter().map(|cut| cut % (spans.len() + 1)).collect();
    points.extend([0, spans.len()]);
    points.sort_unstable();
    points
        .windows(2)
        .map(|window| {
            let mut scopes: Vec<(&str, Vec<Span>)> = Vec::new();
            for (scope, span) in &spans[window[0]..window[1]] {
                match scopes.iter_mut().find(|(known, _)| known == scope) {
                    Some((_, spans)) => spans.push(span.clone()),
                    None => scopes.push((scope, vec![span.clone()])),
                }
            }
            encode(&scopes)
        })
        .collect()
}

fn run(limits: Limits, requests: &[Vec<u8>]) -> Result<Counted, TestCaseError> {
    let mut engine = Engine::new(limits).expect("limits");
    let mut counted = Counted::default();
    for request in requests {
        counted.add(&engine.ingest(request, 0.0).expect("a request"));
        prop_assert!(engine.pending_spans() <= engine.stored_spans());
        prop_assert!(engine.active_traces() <= limits.max_traces);
    }
    counted.add(&engine.expire(SWEEP));
    counted.add(&engine.release_trees());
    prop_assert_eq!(
        (
            engine.stored_spans(),
            engine.pending_spans(),
            engine.active_traces()
        ),
        (0, 0, 0)
    );
    prop_assert_eq!(engine.active_trees(), 0);
    Ok(counted)
}

fn forest() -> impl Strategy<Value = Vec<Vec<Spec>>> {
    vec(vec(spec(), 1..10), 1..4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn a_forest_counts_alike_in_any_order_and_batches(
        traces in forest(),
        order in any::<u64>(),
        cuts in vec(any::<usize>(), 0..6),
        again in any::<prop::sample::Index>(),
    ) {
        let spans = render(&traces);
        let whole = run(Limits::default(), &requests(&spans, &[]))?;
        let mut shuffled = spans.clone();
        let mut rng = common::Rng(order);
        for at in (1..shuffled.len()).rev() {
            shuffled.swap(at, rng.below(at + 1));
        }
        let mut delivered = requests(&shuffled, &cuts);
        let retry = delivered[again.index(delivered.len())].clone();
        delivered.push(retry);
        let delivered = run(Limits::default(), &delivered)?;
        prop_assert_eq!(delivered.findings(), whole.findings());
    }

    #[test]
    fn tight_bounds_hold_and_let_nothing_panic(
        traces in forest(),
        cuts in vec(any::<usize>(), 0..6),
        max_traces in 2usize..5,
        max_spans in 0usize..12,
        max_spans_per_trace in 0usize..6,
    ) {
        let limits = Limits { max_traces, max_spans, max_spans_per_trace, ..Limits::default() };
        run(limits, &requests(&render(&traces), &cuts))?;
    }

    #[test]
    fn damaged_requests_are_an_answer(
        traces in forest(),
        mutations in vec(mutation(), 1..4),
    ) {
        let spans = render(&traces);
        let mut engine = Engine::new(Limits::default()).expect("limits");
        for request in requests(&spans, &[1, 5]) {
            let _ = engine.ingest(&mutate(request, &mutations), 0.0);
        }
        engine.expire(SWEEP);
        prop_assert_eq!((engine.stored_spans(), engine.pending_spans()), (0, 0));
    }

    #[test]
    fn random_bytes_are_an_answer(bytes in vec(any::<u8>(), 0..600)) {
        let mut engine = Engine::new(Limits::default()).expect("limits");
        let _ = engine.ingest(&bytes, 0.0);
    }
}
