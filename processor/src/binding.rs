//! The Python module `otel_guard_processor._engine`: coarse calls, one per request.
//!
//! Every call runs its work under `catch_unwind`: a panic (a bug, never an input's fault) becomes
//! `EngineFault`, an ordinary exception the service counts and answers as a refused request,
//! rather than PyO3's `PanicException` (a `BaseException`, which would escape the service's
//! handlers). The decoding itself runs with the GIL released.

use std::panic::{AssertUnwindSafe, catch_unwind};

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use crate::decode::{self, Keys, Request, Value};

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

fn guarded<T>(work: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            Err(EngineFault::new_err(message))
        }
    }
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
    module.add_function(wrap_pyfunction!(decode_counts, module)?)?;
    module.add_function(wrap_pyfunction!(decode_summary, module)?)?;
    module.add_function(wrap_pyfunction!(_fault, module)?)?;
    Ok(())
}
