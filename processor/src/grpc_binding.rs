//! The OTLP/gRPC receiver's transport ([`crate::grpc`]) as the Python classes `GrpcServer` and
//! `GrpcReply` of `otel_guard_processor._engine`.
//!
//! As in `binding.rs`, a panic inside becomes `EngineFault`, never a crash; a blocking call
//! (`shutdown`) releases the interpreter lock.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::binding::guarded;
use crate::budget::Taken;
use crate::budget_binding::{PyMemoryBudget, PyReservation};
use crate::grpc::{self, Limits, Outcome, Reply, Server};

/// `max_held_bytes` when none is given.
const DEFAULT_HELD_BYTES: usize = 64 << 20;

/// A positive, finite number of seconds as a Duration, or ValueError naming `what`.
fn seconds(what: &str, value: f64) -> PyResult<Duration> {
    if !value.is_finite() || value <= 0.0 {
        return Err(PyValueError::new_err(format!(
            "{what} must be a positive number of seconds, got {value}"
        )));
    }
    Duration::try_from_secs_f64(value)
        .map_err(|_| PyValueError::new_err(format!("{what} is too large: {value}")))
}

/// A call taken from the server: (id, method index, request bytes, reply).
type TakenCall = (u64, usize, Py<PyBytes>, PyReply);

/// GrpcServer(hosts, port, max_message_bytes, methods=METHODS, *, max_inflated_bytes=None,
///            max_held_bytes=None, max_connection_bytes=None, max_connections=1024,
///            read_timeout=30.0, idle_timeout=None, retry_after=1.0, headers=(), budget=None)
///
/// Unary gRPC `methods` (paths; by default OTLP's three Export methods) over HTTP/2 on `port` of
/// each address in `hosts` (IP literals; port 0: the port the first one gets). Raises OSError
/// when none can be bound. The limits are those of `grpc::Limits`: by default a message inflates
/// to `max_message_bytes`, 64 MiB (at least one message) is held in all, half of it a connection,
/// and a connection with no call is closed after `read_timeout`. Each call's reply carries the
/// values of the request headers named in `headers` (lowercase names), as `reply.headers`.
/// With `budget` (a `MemoryBudget`) the calls' bytes are drawn from it (`max_held_bytes` is its
/// limit), and each call's bytes stay held after `take()` until its reply lets go of them
/// (`reply.reservation()`, or the reply collected).
#[pyclass(name = "GrpcServer", module = "otel_guard_processor._engine", frozen)]
pub struct PyGrpcServer {
    server: Server,
}

#[pymethods]
impl PyGrpcServer {
    #[new]
    #[pyo3(signature = (
        hosts, port, max_message_bytes, methods=None, *, max_inflated_bytes=None,
        max_held_bytes=None, max_connection_bytes=None, max_connections=1024, read_timeout=30.0,
        idle_timeout=None, retry_after=1.0, headers=Vec::new(), budget=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        hosts: Vec<String>,
        port: u16,
        max_message_bytes: usize,
        methods: Option<Vec<String>>,
        max_inflated_bytes: Option<usize>,
        max_held_bytes: Option<usize>,
        max_connection_bytes: Option<usize>,
        max_connections: usize,
        read_timeout: f64,
        idle_timeout: Option<f64>,
        retry_after: f64,
        headers: Vec<String>,
        budget: Option<PyRef<'_, PyMemoryBudget>>,
    ) -> PyResult<Self> {
        guarded(|| {
            let hosts = hosts
                .iter()
                .map(|host| {
                    host.parse::<IpAddr>().map_err(|_| {
                        PyValueError::new_err(format!("{host:?} is not an IP address"))
                    })
                })
                .collect::<PyResult<Vec<_>>>()?;
            let methods = methods.unwrap_or_else(|| grpc::METHODS.map(str::to_owned).to_vec());
            let methods: Vec<&str> = methods.iter().map(String::as_str).collect();
            let shared = budget.map(|budget| Arc::clone(&budget.budget));
            let held = match &shared {
                Some(budget) => budget.limit(),
                None => max_held_bytes.unwrap_or(DEFAULT_HELD_BYTES),
            };
            let mut limits = Limits::new(max_message_bytes, held);
            if let Some(inflated) = max_inflated_bytes {
                limits.max_inflated_bytes = inflated;
            }
            if let Some(share) = max_connection_bytes {
                limits.max_connection_bytes = share.clamp(1, limits.max_held_bytes);
            }
            limits.max_connections = max_connections.max(1);
            limits.read_timeout = seconds("read_timeout", read_timeout)?;
            limits.idle_timeout = seconds("idle_timeout", idle_timeout.unwrap_or(read_timeout))?;
            limits.retry_after = seconds("retry_after", retry_after)?;
            let server = Server::bind(&hosts, port, limits, &methods).map_err(os_error)?;
            let headers = headers
                .iter()
                .map(|name| name.to_ascii_lowercase())
                .collect();
            let mut server = server.with_headers(headers);
            if let Some(budget) = shared {
                server = server.with_budget(budget);
            }
            Ok(PyGrpcServer { server })
        })
    }

    /// The port bound (the one the system chose, for port 0).
    #[getter]
    fn port(&self) -> u16 {
        self.server
            .addresses()
            .first()
            .map_or(0, |address| address.port())
    }

    /// Bytes held of its budget: of calls being read or waiting for `take()` (and, with a shared
    /// budget, whatever else holds it).
    #[getter]
    fn held_bytes(&self) -> usize {
        self.server.budget().used()
    }

    /// The most `held_bytes` may be (`max_held_bytes`, or one message when that is larger).
    #[getter]
    fn max_held_bytes(&self) -> usize {
        self.server.limits().max_held_bytes
    }

    /// How many calls it refused for want of budget (RESOURCE_EXHAUSTED with a retry delay).
    #[getter]
    fn refused_busy(&self) -> u64 {
        self.server.refused_busy()
    }

    /// A connection's share of `max_held_bytes`.
    #[getter]
    fn max_connection_bytes(&self) -> usize {
        self.server.limits().max_connection_bytes
    }

    /// The descriptor to watch for reading: it becomes readable when calls arrive.
    fn wake_fd(&self) -> i32 {
        self.server.wake_fd()
    }

    /// Start serving, on a thread of the server's own.
    fn start(&self) -> PyResult<()> {
        guarded(|| self.server.start().map_err(os_error))
    }

    /// take() -> ([(id, method, request, reply)], [cancelled id])
    ///
    /// The calls that arrived since the last take (method: an index in its methods), and the ids
    /// of calls whose client reset them before they were answered.
    fn take(&self, py: Python<'_>) -> PyResult<(Vec<TakenCall>, Vec<u64>)> {
        guarded(|| {
            let arrived = self.server.take();
            let calls = arrived
                .calls
                .into_iter()
                .map(|call| {
                    // Copied once, from the chunks as they arrived; the chunks are let go of
                    // here and their bytes stay held for the copy, by the reply, of the
                    // server's budget only (the connection's share is for calls being read).
                    let message = call.message;
                    let request = PyBytes::new_with(py, message.len(), |out| {
                        message.copy_to(out);
                        Ok(())
                    })?
                    .unbind();
                    let reply = PyReply {
                        reply: Mutex::new(Some(call.reply)),
                        headers: call.headers,
                        held: Mutex::new(Some(
                            message.into_held().into_budget(self.server.budget()),
                        )),
                    };
                    Ok((call.id, call.method, request, reply))
                })
                .collect::<PyResult<_>>()?;
            Ok((calls, arrived.cancelled))
        })
    }

    /// Stop taking calls, let those in flight finish for up to `grace` seconds, then close
    /// every connection. Blocks until the server's thread ended, without the interpreter lock.
    fn shutdown(&self, py: Python<'_>, grace: f64) -> PyResult<()> {
        guarded(|| {
            let grace = Duration::try_from_secs_f64(grace.max(0.0)).unwrap_or(Duration::MAX);
            py.detach(|| self.server.shutdown(grace));
            Ok(())
        })
    }
}

/// How one call is answered: `ok(response)` or `fail(code, message, details)`, once; `headers`:
/// the (name, value) of each kept request header, in the order of the server's `headers`.
#[pyclass(name = "GrpcReply", module = "otel_guard_processor._engine", frozen)]
pub struct PyReply {
    reply: Mutex<Option<Reply>>,
    headers: Vec<(String, Vec<u8>)>,
    /// The budget the request's bytes hold, until handed over or the reply is collected.
    held: Mutex<Option<Taken>>,
}

impl PyReply {
    fn send(&self, outcome: Outcome) -> bool {
        let reply = self
            .reply
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        reply.is_some_and(|reply| reply.send(outcome))
    }
}

#[pymethods]
impl PyReply {
    /// The kept request headers: (name, value bytes) pairs.
    #[getter]
    fn headers<'py>(&self, py: Python<'py>) -> Vec<(&str, Bound<'py, PyBytes>)> {
        self.headers
            .iter()
            .map(|(name, value)| (name.as_str(), PyBytes::new(py, value)))
            .collect()
    }

    /// The bytes of the budget the request holds, handed over (the first call; later ones get a
    /// reservation of nothing): the caller keeps them held for as long as it holds the request.
    fn reservation(&self) -> PyReservation {
        let taken = self
            .held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        taken.map_or_else(PyReservation::released, PyReservation::of)
    }

    /// Answer OK with the response's bytes; false when the call was answered before, its
    /// client is gone or the server stopped.
    fn ok(&self, response: &[u8]) -> PyResult<bool> {
        guarded(|| Ok(self.send(Outcome::ok(response.to_vec()))))
    }

    /// Answer with an error status (a gRPC code), its message, and a serialized
    /// `google.rpc.Status` for `grpc-status-details-bin` when given.
    #[pyo3(signature = (code, message, details=None))]
    fn fail(&self, code: u32, message: &str, details: Option<&[u8]>) -> PyResult<bool> {
        guarded(|| {
            if code == grpc::code::OK || code > 16 {
                return Err(PyValueError::new_err(format!(
                    "{code} is not a gRPC error code (1-16)"
                )));
            }
            let mut outcome = Outcome::error(code, message);
            outcome.details = details.map(<[u8]>::to_vec);
            Ok(self.send(outcome))
        })
    }
}

/// An OSError with the errno and the system's words for it (without Rust's "(os error N)").
fn os_error(error: std::io::Error) -> PyErr {
    let text = error.to_string();
    let words = text.split(" (os error").next().unwrap_or(&text).to_owned();
    match error.raw_os_error() {
        Some(errno) => PyOSError::new_err((errno, words)),
        None => PyOSError::new_err(words),
    }
}

pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PyGrpcServer>()?;
    module.add_class::<PyReply>()?;
    module.add("METHODS", grpc::METHODS.to_vec())?;
    Ok(())
}
