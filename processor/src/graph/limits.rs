//! The bounds on the engine's state (traces and spans held, how long a trace and a wait last), the
//! bounds on what a name or a label may hold, and the check the engine runs them through.
//!
//! What a reader would not guess: `max_held_bytes` is a reckoning, not a measure of the heap. Each
//! trace weighs what it allocated (its names, paths, calls, loops, waiting spans, its id, its place
//! in the engine's maps, with the allocator's rounding) as a trace is changed; the test of the
//! memory bound holds the reckoning to the resident set it stands for.

pub const MAX_NAME_CHARS: usize = 256;
pub const MAX_LABEL_CHARS: usize = 1024;
pub const MAX_PATH_NAMES: usize = 64;
/// A tree's root longer than this (in bytes) is not read.
pub const MAX_ROOT_BYTES: usize = 125;
/// The earlier hops of a guard's chain are read to at most this many bytes of names (the last
/// ones), besides MAX_PATH_NAMES names: what one span's chain makes a trace hold.
pub const MAX_CHAIN_BYTES: usize = 4096;
/// A trace id or a span id longer than this (only a broken or hostile sender writes one) is kept
/// as its first 16 bytes and a 16-byte keyed hash of it.
pub const MAX_ID_BYTES: usize = 32;

/// The bounds on the engine's state, and the waits (see the module docstring).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub max_traces: usize,
    pub max_spans: usize,
    pub max_spans_per_trace: usize,
    /// The bytes all traces may hold (see the module docstring).
    pub max_held_bytes: usize,
    pub trace_ttl: f64,
    pub tool_edge_wait: f64,
    pub cycle_wait: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_traces: 50_000,
            max_spans: 1_000_000,
            max_spans_per_trace: 10_000,
            max_held_bytes: 256 * 1024 * 1024,
            trace_ttl: 120.0,
            tool_edge_wait: 10.0,
            cycle_wait: 10.0,
        }
    }
}

/// Limits the engine cannot run with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLimits(pub &'static str);

impl std::fmt::Display for BadLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for BadLimits {}

impl Limits {
    pub fn check(self) -> Result<Limits, BadLimits> {
        if self.max_traces < 2 {
            return Err(BadLimits("max_traces must be at least 2"));
        }
        let waits = [self.trace_ttl, self.tool_edge_wait, self.cycle_wait];
        if waits.iter().any(|wait| !wait.is_finite() || *wait < 0.0) {
            return Err(BadLimits(
                "trace_ttl, tool_edge_wait and cycle_wait must be finite and not negative",
            ));
        }
        Ok(self)
    }
}
