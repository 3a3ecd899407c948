//! The engine's gRPC client ([`crate::grpc_client`], feature `h2-forwarder`) as the Python class
//! `GrpcChannel` of `otel_guard_processor._engine`.
//!
//! A request is handed over as the Python `bytes` object itself (`PyBackedBytes`, kept alive
//! until HTTP/2 has sent it): nothing is copied. As in `binding.rs`, a panic inside becomes
//! `EngineFault`; `close` releases the interpreter lock while the client's thread ends.

use std::time::Duration;

use bytes::Bytes;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

use crate::binding::guarded;
use crate::grpc_client::{Call, Channel, Options, Stack};

/// An answer taken: (call id, gRPC code, message, `grpc-status-details-bin` or None, response).
type Answered = (u64, u32, String, Option<Py<PyBytes>>, Py<PyBytes>);

/// GrpcChannel(target, *, gzip=False, max_send_bytes=4 MiB, max_receive_bytes=64 MiB,
///             connect_timeout=20.0, stack="h2")
///
/// Unary gRPC calls to `target` (`host:port`) on one HTTP/2 connection, opened at the first
/// call. `call(method, request, headers, timeout)` starts one and returns its id; the answers
/// come from `take()` once `wake_fd()` is readable. `stack`: the HTTP/2 client, "h2" (the
/// engine's own) or "tonic" (in an engine built with the `tonic-forwarder` feature).
#[pyclass(name = "GrpcChannel", module = "otel_guard_processor._engine", frozen)]
pub struct PyChannel {
    channel: Channel,
}

#[pymethods]
impl PyChannel {
    #[new]
    #[pyo3(signature = (
        target, *, gzip=false, max_send_bytes=4 << 20, max_receive_bytes=64 << 20,
        connect_timeout=20.0, stack="h2"
    ))]
    fn new(
        target: &str,
        gzip: bool,
        max_send_bytes: usize,
        max_receive_bytes: usize,
        connect_timeout: f64,
        stack: &str,
    ) -> PyResult<Self> {
        guarded(|| {
            let stack = match stack {
                "h2" => Stack::H2,
                #[cfg(feature = "tonic-forwarder")]
                "tonic" => Stack::Tonic,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "stack must be one this engine was built with (h2, or tonic with the \
                         tonic-forwarder feature), not {other:?}"
                    )));
                }
            };
            let connect_timeout = positive("connect_timeout", connect_timeout)?;
            let options = Options {
                gzip,
                max_send_bytes,
                max_receive_bytes,
                connect_timeout,
                stack,
            };
            let channel = Channel::new(target, options)
                .map_err(|error| PyOSError::new_err(error.to_string()))?;
            Ok(PyChannel { channel })
        })
    }

    #[getter]
    fn target(&self) -> &str {
        self.channel.target()
    }

    /// call(method, request, headers, timeout) -> id: start a call of `method` (a path) with
    /// `request` (bytes, sent as they are), `headers` ((name, value) pairs of printable ASCII) as
    /// its metadata, within `timeout` seconds.
    fn call(
        &self,
        method: String,
        request: PyBackedBytes,
        headers: Vec<(String, String)>,
        timeout: f64,
    ) -> PyResult<u64> {
        guarded(|| {
            let timeout = positive("timeout", timeout)?;
            let headers = headers
                .into_iter()
                .map(|(name, value)| (name.to_ascii_lowercase(), value))
                .collect();
            Ok(self.channel.call(Call {
                method,
                message: Bytes::from_owner(request),
                headers,
                timeout,
            }))
        })
    }

    /// The descriptor to watch for reading: it becomes readable when answers arrive.
    fn wake_fd(&self) -> i32 {
        self.channel.wake_fd()
    }

    /// take() -> [(id, code, message, details or None, response)]: the answers since the last.
    fn take(&self, py: Python<'_>) -> PyResult<Vec<Answered>> {
        guarded(|| {
            Ok(self
                .channel
                .take()
                .into_iter()
                .map(|(id, outcome)| {
                    let details = outcome
                        .details
                        .map(|details| PyBytes::new(py, &details).unbind());
                    let response = PyBytes::new(py, &outcome.response).unbind();
                    (id, outcome.code, outcome.message, details, response)
                })
                .collect())
        })
    }

    /// End the calls in flight (their answers never come) and the connection.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        guarded(|| {
            py.detach(|| self.channel.close());
            Ok(())
        })
    }
}

fn positive(what: &str, value: f64) -> PyResult<Duration> {
    if !value.is_finite() || value <= 0.0 {
        return Err(PyValueError::new_err(format!(
            "{what} must be a positive number of seconds, got {value}"
        )));
    }
    Duration::try_from_secs_f64(value)
        .map_err(|_| PyValueError::new_err(format!("{what} is too large: {value}")))
}

pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PyChannel>()
}
