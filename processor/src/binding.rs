//! The Python module `otel_guard_processor._engine`: coarse calls, one per request.
//!
//! Every call runs its work under `catch_unwind`: a panic (a bug, never an input's fault) becomes
//! `EngineFault`, an ordinary exception the service counts and answers as a refused request,
//! rather than PyO3's `PanicException` (a `BaseException`, which would escape the service's
//! handlers). An [`Engine`] that panicked starts again empty (its state may be half changed):
//! its detection state is lost, never a span. The work itself runs with the GIL released.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::calls;
use crate::decode::{self, Keys, Request, Value};
use crate::dialects::{self, On, Source};
use crate::graph::{self, Limits};

create_exception!(
    otel_guard_processor._engine,
    DecodeError,
    PyValueError,
    "The bytes are not a readable OTLP ExportTraceServiceRequest; the message says where and why."
);
create_exception!(
    otel_guard_processor._engine,
    EngineFault,
    PyRuntimeError,
    "The engine failed on this input (a bug in the engine, not in the input): refuse the request."
);

pub(crate) fn guarded<T>(work: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(result) => result,
        Err(panic) => Err(EngineFault::new_err(panic_message(&*panic))),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_owned())
}

fn keys_of(keys: Vec<String>) -> PyResult<Keys> {
    Keys::new(keys).map_err(|error| PyValueError::new_err(error.to_string()))
}

fn decoded<'a>(py: Python<'_>, request: &'a [u8], keys: &Keys) -> PyResult<Request<'a>> {
    py.detach(|| decode::decode(request, keys))
        .map_err(|error| DecodeError::new_err(error.to_string()))
}

/// decode_counts(request, keys) -> (spans, links, attributes)
///
/// Decode an ExportTraceServiceRequest and count what it holds: its spans, their links, and the
/// attributes whose key is one of `keys`. Raises DecodeError for bytes that do not decode.
#[pyfunction]
fn decode_counts(
    py: Python<'_>,
    request: &[u8],
    keys: Vec<String>,
) -> PyResult<(usize, usize, usize)> {
    guarded(|| {
        let keys = keys_of(keys)?;
        let decoded = decoded(py, request, &keys)?;
        Ok((
            decoded.spans.len(),
            decoded.links.len(),
            decoded.attributes.len(),
        ))
    })
}

/// check(request) -> spans
///
/// Decode a request as `Engine.ingest` does (the same keys, so a string value it reads that is not
/// UTF-8 too) and count its spans, keeping nothing: DecodeError exactly where `ingest` would raise
/// it. The service checks a request with it before it answers and detects it later.
#[pyfunction]
fn check(py: Python<'_>, request: &[u8]) -> PyResult<usize> {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    guarded(|| {
        let keys = match KEYS.get() {
            Some(keys) => keys,
            None => {
                let keys = Keys::new(dialects::Key::ALL.iter().map(|key| key.name()))
                    .map_err(|error| PyValueError::new_err(error.to_string()))?;
                KEYS.get_or_init(|| keys)
            }
        };
        Ok(decoded(py, request, keys)?.spans.len())
    })
}

/// decode_summary(request, keys) -> (scopes, spans)
///
/// What the engine reads of a request, as Python values (for tests and benchmarks: the service
/// never needs one object a span). `scopes`: a (resource index, name, version) per ScopeSpans.
/// `spans`: a (trace_id, span_id, parent_span_id, name, kind, start_time_unix_nano, scope index,
/// links, attributes) per span, links as (trace_id, span_id), attributes as (key, value) for the
/// keys asked for, in the span's order; a value is a str, int, bool, a list of str (None for an
/// item that is not a string), or None for any other type.
#[pyfunction]
fn decode_summary<'py>(
    py: Python<'py>,
    request: &[u8],
    keys: Vec<String>,
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
    guarded(|| {
        let keys = keys_of(keys)?;
        let decoded = decoded(py, request, &keys)?;
        let key_names = (0..keys.len())
            .map(|index| {
                let index = u16::try_from(index).unwrap_or(u16::MAX);
                PyString::new(py, keys.name(index))
            })
            .collect::<Vec<_>>();
        let scopes = PyList::empty(py);
        for scope in &decoded.scopes {
            scopes.append((scope.resource, scope.name, scope.version))?;
        }
        let spans = PyList::empty(py);
        for span in &decoded.spans {
            let links = PyList::empty(py);
            for link in decoded.links_of(span) {
                links.append((
                    PyBytes::new(py, link.trace_id),
                    PyBytes::new(py, link.span_id),
                ))?;
            }
            let attributes = PyList::empty(py);
            for attribute in decoded.attributes_of(span) {
                let value: Bound<'py, PyAny> = match attribute.value {
                    Value::Str(text) => PyString::new(py, text).into_any(),
                    Value::Int(number) => number.into_pyobject(py)?.into_any(),
                    Value::Bool(flag) => flag.into_pyobject(py)?.to_owned().into_any(),
                    Value::Array(range) => PyList::new(py, decoded.items_of(range))?.into_any(),
                    Value::Other => py.None().into_bound(py),
                };
                let key = &key_names[usize::from(attribute.key)];
                attributes.append(PyTuple::new(py, [key.as_any(), &value])?)?;
            }
            spans.append((
                PyBytes::new(py, span.trace_id),
                PyBytes::new(py, span.span_id),
                PyBytes::new(py, span.parent_span_id),
                span.name,
                span.kind,
                span.start_time_unix_nano,
                span.scope,
                links,
                attributes,
            ))?;
        }
        Ok((scopes, spans))
    })
}

/// Engine(*, max_traces=50000, max_spans=1000000, max_spans_per_trace=10000,
///        max_held_bytes=268435456, trace_ttl=120.0, tool_edge_wait=10.0, cycle_wait=10.0,
///        dialects=())
///
/// The detection state of one processor: requests in (`ingest`), counts out (`Events`), in bounded
/// state (see docs/processor.md). Times are seconds on a clock that does not go back. `dialects`:
/// more dialect rows, read after the built-in table's, each in `dialect_table()`'s form (a
/// dialects file's rows; ValueError naming the row when one is malformed).
/// Checker: `check(request) -> spans`, the module's `check` with an engine's keys (from
/// `Engine.checker()`): DecodeError exactly where that engine's `ingest` would raise it, nothing
/// kept. Frozen, so any thread may use it while the engine is borrowed for its work.
#[pyclass(frozen, module = "otel_guard_processor._engine", name = "Checker")]
struct PyChecker {
    keys: Keys,
}

#[pymethods]
impl PyChecker {
    fn check(&self, py: Python<'_>, request: &[u8]) -> PyResult<usize> {
        guarded(|| Ok(decoded(py, request, &self.keys)?.spans.len()))
    }
}

#[pyclass(module = "otel_guard_processor._engine", name = "Engine")]
struct PyEngine {
    engine: graph::Engine,
    faults: u64,
}

impl PyEngine {
    /// `work` on the engine, with the GIL released; a panic starts the engine again empty.
    fn run<T: Send>(
        &mut self,
        py: Python<'_>,
        work: impl FnOnce(&mut graph::Engine) -> T + Send,
    ) -> PyResult<T> {
        let engine = &mut self.engine;
        let outcome = py.detach(move || catch_unwind(AssertUnwindSafe(|| work(engine))));
        match outcome {
            Ok(value) => Ok(value),
            Err(panic) => {
                self.faults += 1;
                let limits = self.engine.limits();
                if let Ok(fresh) = graph::Engine::with_dialects(limits, self.engine.dialects()) {
                    self.engine = fresh;
                }
                Err(EngineFault::new_err(panic_message(&*panic)))
            }
        }
    }
}

#[pymethods]
impl PyEngine {
    #[new]
    #[pyo3(signature = (
        *,
        max_traces = 50_000,
        max_spans = 1_000_000,
        max_spans_per_trace = 10_000,
        max_held_bytes = 256 * 1024 * 1024,
        trace_ttl = 120.0,
        tool_edge_wait = 10.0,
        cycle_wait = 10.0,
        dialects = Vec::new(),
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        max_traces: usize,
        max_spans: usize,
        max_spans_per_trace: usize,
        max_held_bytes: usize,
        trace_ttl: f64,
        tool_edge_wait: f64,
        cycle_wait: f64,
        dialects: Vec<dialects::RowSpec>,
    ) -> PyResult<Self> {
        let limits = Limits {
            max_traces,
            max_spans,
            max_spans_per_trace,
            max_held_bytes,
            trace_ttl,
            tool_edge_wait,
            cycle_wait,
        };
        let dialects = dialects::FileRows::new(dialects)
            .map_err(|error| PyValueError::new_err(format!("dialects: {error}")))?;
        let engine = graph::Engine::with_dialects(limits, std::sync::Arc::new(dialects))
            .map_err(|error| PyValueError::new_err(error.to_string()))?;
        Ok(PyEngine { engine, faults: 0 })
    }

    /// checker() -> Checker
    ///
    /// A checker with this engine's keys (a dialects file's too), usable while the engine works on
    /// another thread: a method of the engine itself could not be (it is borrowed for the work).
    fn checker(&self) -> PyChecker {
        PyChecker {
            keys: self.engine.keys().clone(),
        }
    }

    /// ingest(request, now) -> Events
    ///
    /// Read one ExportTraceServiceRequest (its protobuf bytes) received at `now`. Raises
    /// DecodeError for bytes that do not decode (nothing changed), EngineFault for a bug.
    fn ingest(&mut self, py: Python<'_>, request: &[u8], now: f64) -> PyResult<PyEvents> {
        let events = self
            .run(py, |engine| engine.ingest(request, now))?
            .map_err(|error| DecodeError::new_err(error.to_string()))?;
        guarded(|| PyEvents::of(py, &events))
    }

    /// expire(now) -> Events
    ///
    /// Evict the traces idle for longer than the TTL (settling what waited in them), let go of
    /// such trees, and make the counts whose wait is over.
    fn expire(&mut self, py: Python<'_>, now: f64) -> PyResult<PyEvents> {
        let events = self.run(py, |engine| engine.expire(now))?;
        guarded(|| PyEvents::of(py, &events))
    }

    /// release_trees() -> Events
    ///
    /// Let go of every delegation tree held (the processor stops): each observed in `tree_hops`.
    fn release_trees(&mut self, py: Python<'_>) -> PyResult<PyEvents> {
        let events = self.run(py, graph::Engine::release_trees)?;
        guarded(|| PyEvents::of(py, &events))
    }

    /// drain() -> Events
    ///
    /// Make every count still waiting (the processor stops: no later span can change them):
    /// the spans still waiting for their parent or linked span settle as if their trace went,
    /// every due count is made, and every trace and tree is let go of (not counted as evictions).
    fn drain(&mut self, py: Python<'_>) -> PyResult<PyEvents> {
        let events = self.run(py, graph::Engine::drain)?;
        guarded(|| PyEvents::of(py, &events))
    }

    /// Traces held.
    #[getter]
    fn active_traces(&self) -> usize {
        self.engine.active_traces()
    }

    /// Delegation trees held.
    #[getter]
    fn active_trees(&self) -> usize {
        self.engine.active_trees()
    }

    /// Spans held, settled or waiting.
    #[getter]
    fn stored_spans(&self) -> usize {
        self.engine.stored_spans()
    }

    /// Held spans waiting for their parent or linked span.
    #[getter]
    fn pending_spans(&self) -> usize {
        self.engine.pending_spans()
    }

    /// The bytes the traces hold, as the engine reckons them (bounded by `max_held_bytes`).
    #[getter]
    fn held_bytes(&self) -> usize {
        self.engine.held_bytes()
    }

    /// Traces held that have a delegation path of two names or more (evicted after the others).
    #[getter]
    fn delegating_traces(&self) -> usize {
        self.engine.delegating_traces()
    }

    /// Calls that panicked (each raised EngineFault and started the engine again empty).
    #[getter]
    fn faults(&self) -> u64 {
        self.faults
    }

    /// _fault(message): panic inside the engine's work (for the tests).
    fn _fault(&mut self, py: Python<'_>, message: String) -> PyResult<()> {
        self.run(py, move |_| panic!("{message}"))
    }
}

/// What one call into an Engine counted.
///
/// `received`: spans in the request; `cycles`: a (kind, label, trace_id, span_id) per counted
/// cycle, the ids of the span where the name returned; `cycle_roots`: per cycle, in the same
/// order, the `otel_guard.chain.root` its trace's guard spans name, or None; `delegations`: {(caller, callee): calls};
/// `decisions`: {(decision, reason, name): spans}; `decision_spans`: {(decision, reason, name):
/// (trace_id, span_id)} of the latest such span whose ids have the sizes of real ones; `tree_hops`: the largest hop count of each
/// tree let go of; `evictions`, `tree_evictions`: {"ttl": n, "capacity": n}; `dropped`: spans of
/// full traces left out; `duplicates`: spans received again; `truncated`: {"name": n, "label": n}.
#[pyclass(frozen, module = "otel_guard_processor._engine", name = "Events")]
struct PyEvents {
    #[pyo3(get)]
    received: usize,
    #[pyo3(get)]
    cycles: Py<PyList>,
    #[pyo3(get)]
    cycle_roots: Py<PyList>,
    #[pyo3(get)]
    delegations: Py<PyDict>,
    #[pyo3(get)]
    decisions: Py<PyDict>,
    #[pyo3(get)]
    decision_spans: Py<PyDict>,
    #[pyo3(get)]
    tree_hops: Py<PyList>,
    #[pyo3(get)]
    evictions: Py<PyDict>,
    #[pyo3(get)]
    tree_evictions: Py<PyDict>,
    #[pyo3(get)]
    dropped: u64,
    #[pyo3(get)]
    duplicates: u64,
    #[pyo3(get)]
    truncated: Py<PyDict>,
}

fn reasons<'py>(py: Python<'py>, counts: [u64; 2]) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("ttl", counts[0])?;
    out.set_item("capacity", counts[1])?;
    Ok(out)
}

impl PyEvents {
    fn of(py: Python<'_>, events: &graph::Events) -> PyResult<PyEvents> {
        let cycles = PyList::empty(py);
        for cycle in &events.cycles {
            cycles.append((
                cycle.kind.name(),
                cycle.label.as_str(),
                PyBytes::new(py, &cycle.trace_id),
                PyBytes::new(py, &cycle.span_id),
            ))?;
        }
        let cycle_roots = PyList::empty(py);
        for cycle in &events.cycles {
            cycle_roots.append(cycle.chain_root.as_deref())?;
        }
        let delegations = PyDict::new(py);
        for ([caller, callee], count) in events.delegations() {
            delegations.set_item((caller, callee), count)?;
        }
        let decisions = PyDict::new(py);
        for ([decision, reason, name], count) in events.decisions() {
            decisions.set_item((decision, reason, name), count)?;
        }
        let decision_spans = PyDict::new(py);
        for ([decision, reason, name], (trace_id, span_id)) in events.decision_spans() {
            decision_spans.set_item(
                (decision, reason, name),
                (PyBytes::new(py, trace_id), PyBytes::new(py, span_id)),
            )?;
        }
        let truncated = PyDict::new(py);
        truncated.set_item("name", events.truncated_names)?;
        truncated.set_item("label", events.truncated_labels)?;
        Ok(PyEvents {
            received: events.received,
            cycles: cycles.unbind(),
            cycle_roots: cycle_roots.unbind(),
            delegations: delegations.unbind(),
            decisions: decisions.unbind(),
            decision_spans: decision_spans.unbind(),
            tree_hops: PyList::new(py, &events.tree_hops)?.unbind(),
            evictions: reasons(py, events.evictions)?.unbind(),
            tree_evictions: reasons(py, events.tree_evictions)?.unbind(),
            dropped: events.dropped,
            duplicates: events.duplicates,
            truncated: truncated.unbind(),
        })
    }
}

/// dialect_table() -> (rows, wrappers)
///
/// The dialect table the engine reads calls by, as data: a row is (dialect, key, value, kind,
/// names, conditional, scope), `key` an attribute or "<the span name>", `kind` "agent", "tool" or
/// None, `names` attributes, "<the span name>", "<the span name's subject>" or "<the span name
/// before its last dot>"; a wrapper pair is
/// (the wrapper's row, the wrapped call's row), as indices into the rows.
#[pyfunction]
fn dialect_table(py: Python<'_>) -> PyResult<(Bound<'_, PyList>, Bound<'_, PyList>)> {
    guarded(|| {
        use dialects::{SPAN_NAME, STEM, SUBJECT};
        let rows = PyList::empty(py);
        for row in &dialects::ROWS {
            let key = match row.on {
                On::SpanName => SPAN_NAME,
                On::Attribute(key) => key.name(),
            };
            let names: Vec<&str> = row
                .names
                .iter()
                .map(|source| match source {
                    Source::Subject => SUBJECT,
                    Source::SpanName => SPAN_NAME,
                    Source::Stem => STEM,
                    Source::Attribute(key) => key.name(),
                })
                .collect();
            rows.append((
                row.dialect,
                key,
                row.value,
                row.kind.map(dialects::Kind::name),
                PyTuple::new(py, names)?,
                row.conditional,
                row.scope,
            ))?;
        }
        let wrappers = PyList::empty(py);
        for (wrapper, wrapped) in dialects::WRAPPERS {
            wrappers.append((wrapper.0, wrapped.0))?;
        }
        Ok((rows, wrappers))
    })
}

type HopFacts<'a> = (&'a str, Option<u8>, u64, bool, bool, bool, bool, u32);

fn facts(hop: &calls::Hop) -> HopFacts<'static> {
    (
        hop.kind.name(),
        hop.row.map(|row| row.0),
        hop.scope,
        hop.client,
        hop.server,
        hop.guard,
        hop.caller,
        hop.name_depth,
    )
}

/// one_call_rules() -> [(above, below, outcome, last, this, same_name, repeats)]
///
/// The one-call rules as the engine applies them, a case per rule in the order they are read:
/// what stands last on the path (`last`, None: nothing named) and the call span below it
/// (`this`), each as (kind, row index or None, scope, client, server, guard, caller,
/// name_depth), and what the engine makes of it (`outcome`: "one call", "a new call", "the
/// tool's run, in the agent's name" or "a link (no call)").
type Rule = (
    &'static str,
    &'static str,
    &'static str,
    Option<HopFacts<'static>>,
    HopFacts<'static>,
    bool,
    usize,
);

#[pyfunction]
fn one_call_rules() -> PyResult<Vec<Rule>> {
    guarded(|| {
        Ok(calls::CASES
            .iter()
            .map(|case| {
                (
                    case.above,
                    case.below,
                    case.step().describe(),
                    case.last.as_ref().map(facts),
                    facts(&case.this),
                    case.same_name,
                    case.repeats,
                )
            })
            .collect())
    })
}

/// cycle_names(label) -> [name]
///
/// The names a `cycle` label joins: split at each `>` that no `\` escapes, each `\x` read as
/// `x` (a name's `\` is written `\\` and its `>` `\>`). A label cut to its bound ends in a cut
/// name, `…` its last character.
#[pyfunction]
fn cycle_names(label: &str) -> PyResult<Vec<String>> {
    guarded(|| Ok(graph::label_names(label)))
}

/// _fault(message): panic inside the engine, so that the tests can see the panic become
/// EngineFault and the interpreter carry on.
#[pyfunction]
fn _fault(message: &str) -> PyResult<()> {
    guarded(|| panic!("{message}"))
}

#[pymodule]
#[pyo3(name = "_engine")]
fn engine(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("DecodeError", py.get_type::<DecodeError>())?;
    module.add("EngineFault", py.get_type::<EngineFault>())?;
    module.add_function(wrap_pyfunction!(check, module)?)?;
    module.add_function(wrap_pyfunction!(decode_counts, module)?)?;
    module.add_function(wrap_pyfunction!(decode_summary, module)?)?;
    module.add_function(wrap_pyfunction!(_fault, module)?)?;
    module.add_function(wrap_pyfunction!(dialect_table, module)?)?;
    module.add_function(wrap_pyfunction!(one_call_rules, module)?)?;
    module.add_function(wrap_pyfunction!(cycle_names, module)?)?;
    module.add_class::<PyEngine>()?;
    module.add_class::<PyChecker>()?;
    module.add_class::<PyEvents>()?;
    crate::grpc_binding::register(module)?;
    crate::budget_binding::register(module)?;
    #[cfg(feature = "h2-forwarder")]
    crate::grpc_client_binding::register(module)?;
    Ok(())
}
