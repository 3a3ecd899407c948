//! The bounds on the engine's state (traces and spans held, how long a trace and a wait last), the
//! bounds on what a name or a label may hold, and the check the engine runs them through.

pub const MAX_NAME_CHARS: usize = 256;
pub const MAX_LABEL_CHARS: usize = 1024;
pub const MAX_PATH_NAMES: usize = 64;
/// A tree's root longer than this (in bytes) is not read.
pub const MAX_ROOT_BYTES: usize = 125;

/// The bounds on the engine's state, and the waits (see the module docstring).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub max_traces: usize,
    pub max_spans: usize,
    pub max_spans_per_trace: usize,
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
