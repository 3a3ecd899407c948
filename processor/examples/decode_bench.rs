//! The decoder alone, natively, on requests saved to files (`python bench/engine_decode.py --save
//! DIR` writes the bench's): the best of 30 rounds, nanoseconds a span. With `COUNT=n` it decodes
//! each file n times and stops, to count instructions under callgrind (the difference between two
//! counts, divided by the spans, is the decoder's cost a span, whatever the machine's load):
//!
//! ```sh
//! cargo run --release --example decode_bench -- DIR/*.bin
//! COUNT=20 valgrind --tool=callgrind target/release/examples/decode_bench DIR/guarded-0.bin
//! ```

use std::hint::black_box;
use std::time::Instant;

use otel_guard_engine::decode::{Keys, decode};

/// The keys bench/engine_decode.py asks for.
const KEYS: [&str; 19] = [
    "gen_ai.operation.name",
    "gen_ai.agent.name",
    "gen_ai.tool.name",
    "gen_ai.workflow.name",
    "gen_ai.caller.agent.name",
    "openinference.span.kind",
    "agent.name",
    "graph.node.id",
    "tool.name",
    "traceloop.span.kind",
    "traceloop.entity.name",
    "otel_guard.chain.agents",
    "otel_guard.chain.root",
    "otel_guard.chain.depth",
    "otel_guard.name_depth",
    "otel_guard.decision",
    "otel_guard.reason",
    "otel_guard.mode",
    "otel_guard.budget.hops",
];

fn main() {
    let keys = Keys::new(KEYS).expect("19 keys");
    let count: Option<usize> = std::env::var("COUNT")
        .ok()
        .map(|n| n.parse().expect("COUNT=<a number>"));
    for path in std::env::args().skip(1) {
        let bytes = std::fs::read(&path).expect("a readable file");
        let spans = match decode(&bytes, &keys) {
            Ok(request) => request.spans.len(),
            Err(error) => panic!("{path}: {error}"),
        };
        if let Some(count) = count {
            for _ in 0..count {
                black_box(decode(black_box(&bytes), &keys).is_ok());
            }
            continue;
        }
        let mut best = f64::MAX;
        for _ in 0..30 {
            let start = Instant::now();
            for _ in 0..100 {
                black_box(decode(black_box(&bytes), &keys).is_ok());
            }
            best = best.min(start.elapsed().as_nanos() as f64 / 100.0 / spans as f64);
        }
        println!("{path}: {spans} spans, {best:.0} ns a span");
    }
}
