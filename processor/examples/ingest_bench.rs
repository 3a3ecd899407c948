//! The whole engine, natively, on requests saved to files in the order given (`python
//! bench/engine_ingest.py --save DIR` writes the bench's): time advancing a millisecond a request
//! and a sweep every thousand, as in that bench; the first `WARMUP` (1500) requests untimed, to
//! fill the state to its bounds; the best of `ROUNDS` rounds (5), nanoseconds a span of the rest,
//! and the heap the engine holds a held span at the end (its allocations, counted).
//!
//! ```sh
//! cargo run --release --example ingest_bench -- DIR/dialects-*.bin
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use otel_guard_engine::graph::{Engine, Limits};

/// The system allocator, counting the bytes allocated and not yet freed.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: a pointer this allocator gave for this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as for dealloc and alloc.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn main() {
    let requests: Vec<Vec<u8>> = std::env::args()
        .skip(1)
        .map(|path| std::fs::read(&path).unwrap_or_else(|error| panic!("{path}: {error}")))
        .collect();
    let setting = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(default)
    };
    let (rounds, warmup) = (setting("ROUNDS", 5), setting("WARMUP", 1500));
    let mut best = f64::INFINITY;
    let mut spans = 0;
    let mut held = (0, 0);
    for _ in 0..rounds {
        let before = LIVE.load(Ordering::Relaxed);
        let mut engine = Engine::new(Limits::default()).expect("the default limits");
        spans = 0;
        let mut start = Instant::now();
        for (index, request) in requests.iter().enumerate() {
            if index == warmup {
                spans = 0;
                start = Instant::now();
            }
            let now = index as f64 * 0.001;
            spans += engine.ingest(request, now).expect("a request").received;
            if index % 1000 == 999 {
                engine.expire(now);
            }
        }
        best = best.min(start.elapsed().as_nanos() as f64 / spans as f64);
        held = (engine.stored_spans(), LIVE.load(Ordering::Relaxed) - before);
    }
    println!(
        "{} requests, {spans} spans timed: {best:.0} ns a span; {} spans held in {} MiB, {:.0} B a span",
        requests.len().saturating_sub(warmup),
        held.0,
        held.1 >> 20,
        held.1 as f64 / held.0.max(1) as f64
    );
}
