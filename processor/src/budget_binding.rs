//! The processor's one memory budget ([`ByteBudget`]) as the Python classes `MemoryBudget` and
//! `Reservation` of `otel_guard_processor._engine`.
//!
//! Every holder of request bytes draws from one `MemoryBudget`: the gRPC receiver (given it as
//! `GrpcServer(budget=...)`), the HTTP receiver, the pipeline and the forwarder. What a reader
//! would not guess: a `Reservation` gives its bytes back when it is released, when its `with`
//! block ends (however it ends), and when Python lets go of it, so no exception path leaks them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::binding::guarded;
use crate::budget::{ByteBudget, Taken};

/// MemoryBudget(limit, *, keep_for=None)
///
/// A budget of `limit` bytes. `reserve(n)` takes `n` bytes of it, or None when that would pass
/// the limit while others hold some of it (a holder of everything taken may pass it: one request
/// is always taken when nothing else is held). With `keep_for` (seconds) it keeps room for the
/// largest request refused at it, for at most that long after its last refusal: a request of a
/// smaller claim (`Reservation.declare`) is refused when it would leave less than that room free.
#[pyclass(name = "MemoryBudget", module = "otel_guard_processor._engine", frozen)]
pub struct PyMemoryBudget {
    pub(crate) budget: Arc<ByteBudget>,
}

/// A limit of at least 1 byte, or ValueError.
fn positive(limit: usize) -> PyResult<usize> {
    if limit == 0 {
        return Err(PyValueError::new_err(
            "a memory budget's limit must be at least 1 byte",
        ));
    }
    Ok(limit)
}

/// A positive, finite number of seconds, or ValueError.
fn keep_for(seconds: f64) -> PyResult<Duration> {
    if !seconds.is_finite() || seconds <= 0.0 {
        return Err(PyValueError::new_err(format!(
            "keep_for must be a positive number of seconds, got {seconds}"
        )));
    }
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| PyValueError::new_err(format!("keep_for is too large: {seconds}")))
}

#[pymethods]
impl PyMemoryBudget {
    #[new]
    #[pyo3(signature = (limit, *, keep_for=None))]
    fn new(limit: usize, keep_for: Option<f64>) -> PyResult<Self> {
        let limit = positive(limit)?;
        let budget = match keep_for.map(self::keep_for).transpose()? {
            Some(keep) => ByteBudget::fair(limit, keep),
            None => ByteBudget::new(limit),
        };
        Ok(PyMemoryBudget { budget })
    }

    /// share(limit, *, keep_for=None) -> MemoryBudget
    ///
    /// A budget of at most `limit` bytes whose every byte is also taken of this one (a
    /// protocol's share); with `keep_for`, it keeps room for the largest request refused at it
    /// or above it.
    #[pyo3(signature = (limit, *, keep_for=None))]
    fn share(&self, limit: usize, keep_for: Option<f64>) -> PyResult<Self> {
        let limit = positive(limit)?;
        let budget = match keep_for.map(self::keep_for).transpose()? {
            Some(keep) => ByteBudget::share(&self.budget, limit, keep),
            None => ByteBudget::within(&self.budget, limit),
        };
        Ok(PyMemoryBudget { budget })
    }

    #[getter]
    fn limit(&self) -> usize {
        self.budget.limit()
    }

    /// The bytes held now, by every holder.
    #[getter]
    fn used(&self) -> usize {
        self.budget.used()
    }

    /// The bytes of room kept now for a refused request (0 when none, or it keeps none).
    #[getter]
    fn kept_bytes(&self) -> usize {
        self.budget.kept_bytes()
    }

    /// What its kept room counted, ever: `kept` (rooms begun), `claimed` (taken by a request as
    /// large), `expired` (nobody came back in time), `refused` (takes refused to leave it free).
    #[getter]
    fn kept_counts(&self) -> HashMap<&'static str, u64> {
        let counts = self.budget.kept_counts();
        HashMap::from([
            ("kept", counts.kept),
            ("claimed", counts.claimed),
            ("expired", counts.expired),
            ("refused", counts.refused),
        ])
    }

    /// reserve(n, *, finishing=False) -> Reservation | None
    ///
    /// `n` bytes (a request of `n` bytes as sent), or None when the budget cannot hold them now.
    /// `finishing`: the bytes finish a request already taken (the forwarder's parts of it), so
    /// they may use the room a share keeps for a refused request, which other takes leave free.
    #[pyo3(signature = (n, *, finishing=false))]
    fn reserve(&self, n: usize, finishing: bool) -> PyResult<Option<PyReservation>> {
        guarded(|| {
            let mut taken = self.budget.empty();
            if finishing {
                taken = taken.finishing();
            }
            Ok(taken.try_grow(n).then(|| PyReservation::of(taken)))
        })
    }

    /// A reservation of nothing yet, to `grow` as bytes arrive.
    fn empty(&self) -> PyReservation {
        PyReservation::of(self.budget.empty())
    }
}

/// Bytes held of a `MemoryBudget`: `grow`, `shrink`, `release` (also at the end of a `with` block,
/// and when the object is collected).
#[pyclass(name = "Reservation", module = "otel_guard_processor._engine")]
pub struct PyReservation {
    taken: Option<Taken>,
}

impl PyReservation {
    pub(crate) fn of(taken: Taken) -> Self {
        PyReservation { taken: Some(taken) }
    }

    /// A reservation that holds nothing and takes nothing (already released).
    pub(crate) fn released() -> Self {
        PyReservation { taken: None }
    }
}

#[pymethods]
impl PyReservation {
    /// The bytes held.
    #[getter]
    fn bytes(&self) -> usize {
        self.taken.as_ref().map_or(0, Taken::bytes)
    }

    /// Say that its request is `n` bytes as sent (the largest said counts): a room its budget
    /// keeps for a refused request of at most that size is this reservation's to take. Say it
    /// before the first `grow`, and the same when the request comes again.
    fn declare(&mut self, n: usize) {
        if let Some(taken) = self.taken.as_mut() {
            taken.declare(n);
        }
    }

    /// Hold `n` bytes more; False (nothing more held) when the budget cannot, or once released.
    fn grow(&mut self, n: usize) -> PyResult<bool> {
        guarded(|| Ok(self.taken.as_mut().is_some_and(|taken| taken.try_grow(n))))
    }

    /// Give back `n` of the bytes held (at most all of them).
    fn shrink(&mut self, n: usize) {
        if let Some(taken) = self.taken.as_mut() {
            taken.shrink(n);
        }
    }

    /// Hold exactly `n` bytes: grow or shrink to it; False (unchanged) when it cannot grow.
    fn resize(&mut self, n: usize) -> PyResult<bool> {
        guarded(|| {
            let Some(taken) = self.taken.as_mut() else {
                return Ok(false);
            };
            let now = taken.bytes();
            if n >= now {
                Ok(taken.try_grow(n - now))
            } else {
                taken.shrink(now - n);
                Ok(true)
            }
        })
    }

    /// Give every byte back; later calls do nothing.
    fn release(&mut self) {
        self.taken = None;
    }

    /// Move what this holds into a new reservation (this one then holds nothing).
    fn hand_over(&mut self) -> PyReservation {
        PyReservation {
            taken: self.taken.take(),
        }
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(
        &mut self,
        _kind: Option<Bound<'_, PyAny>>,
        _value: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) -> bool {
        self.release();
        false
    }

    fn __repr__(&self) -> String {
        format!("Reservation(bytes={})", self.bytes())
    }
}

pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PyMemoryBudget>()?;
    module.add_class::<PyReservation>()?;
    Ok(())
}
