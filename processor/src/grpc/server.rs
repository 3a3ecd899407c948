//! The receiver as the binding holds it: [`Server`] binds its listeners, starts its thread, hands
//! the calls over and shuts down.
//!
//! What a reader would not guess: the listeners are bound in [`Server::bind`] (the port is known
//! and a failure is reported at once) but served only from [`Server::start`], on a thread with a
//! Tokio runtime of its own; [`Server::shutdown`] blocks until that thread ends.

use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

use super::h2_connections::serve;
#[cfg(feature = "tonic-receiver")]
use super::tonic_receiver;
use super::{Arrived, Bounds, INFLATING, Inbox, Limits, Serving};
use crate::budget::ByteBudget;

/// The HTTP/2 stack a [`Server`] serves with: the engine's own on h2 (the default), or tonic and
/// tower (the `tonic-receiver` feature; a prototype, see `docs/processor.md`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Transport {
    #[default]
    H2,
    #[cfg(feature = "tonic-receiver")]
    Tonic,
}

enum State {
    Bound(Vec<StdListener>),
    Running {
        thread: JoinHandle<()>,
        stop: watch::Sender<Option<Duration>>,
    },
    Stopped,
}

/// The receiver's listeners and, once started, the thread that serves them.
pub struct Server {
    inbox: Arc<Inbox>,
    woken: UnixStream,
    addresses: Vec<SocketAddr>,
    serving: Arc<Serving>,
    state: Mutex<State>,
    transport: Transport,
}

impl Server {
    /// Bind `port` on each of `hosts` (with port 0, the port the first one got on the others), to
    /// serve `methods` (paths, as [`METHODS`]) within `limits`; the first error when none can be
    /// bound.
    pub fn bind(
        hosts: &[std::net::IpAddr],
        port: u16,
        limits: Limits,
        methods: &[&str],
    ) -> io::Result<Self> {
        let mut listeners = Vec::new();
        let mut first_error = None;
        let mut port = port;
        for host in hosts {
            match StdListener::bind(SocketAddr::new(*host, port)) {
                Ok(listener) => {
                    port = listener.local_addr()?.port();
                    listeners.push(listener);
                }
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        if listeners.is_empty() {
            return Err(first_error.unwrap_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "no address to listen on")
            }));
        }
        let addresses = listeners
            .iter()
            .map(StdListener::local_addr)
            .collect::<io::Result<_>>()?;
        let (wake, woken) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        woken.set_nonblocking(true)?;
        Ok(Server {
            inbox: Arc::new(Inbox {
                arrived: Mutex::new(Arrived::default()),
                wake,
                next_id: AtomicU64::new(1),
            }),
            woken,
            addresses,
            serving: Arc::new(Serving {
                methods: methods.iter().map(|method| (*method).to_owned()).collect(),
                limits,
                bounds: Bounds {
                    max: limits.max_message_bytes,
                    max_inflated: limits.max_inflated_bytes,
                    retry_after: limits.retry_after,
                },
                budget: ByteBudget::new(limits.max_held_bytes),
                inflating: Arc::new(Semaphore::new(INFLATING)),
                epoch: Instant::now(),
                headers: Vec::new(),
                refused_busy: AtomicU64::new(0),
            }),
            state: Mutex::new(State::Bound(listeners)),
            transport: Transport::default(),
        })
    }

    /// Keep the values of the request headers named `names` (lowercase) with each call; before
    /// [`Server::start`] only (after it, nothing changes).
    #[must_use]
    pub fn with_headers(mut self, names: Vec<String>) -> Self {
        if let Some(serving) = Arc::get_mut(&mut self.serving) {
            serving.headers = names;
        }
        self
    }

    /// Draw every call's bytes from `budget` (shared with other holders) rather than a budget of
    /// its own of `max_held_bytes`; before [`Server::start`] only (after it, nothing changes).
    #[must_use]
    pub fn with_budget(mut self, budget: Arc<ByteBudget>) -> Self {
        if let Some(serving) = Arc::get_mut(&mut self.serving) {
            serving.budget = budget;
        }
        self
    }

    /// Serve with `transport` rather than the default; before [`Server::start`] only.
    #[must_use]
    pub fn with_transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    pub fn addresses(&self) -> &[SocketAddr] {
        &self.addresses
    }

    /// The budget every call's bytes are drawn from until [`Server::take`] hands them over.
    pub fn budget(&self) -> &Arc<ByteBudget> {
        &self.serving.budget
    }

    pub fn limits(&self) -> &Limits {
        &self.serving.limits
    }

    /// How many calls were refused for want of budget since the server was bound.
    pub fn refused_busy(&self) -> u64 {
        self.serving.refused_busy.load(Ordering::Relaxed)
    }

    /// The descriptor that becomes readable when calls arrive: then call [`Server::take`].
    pub fn wake_fd(&self) -> RawFd {
        self.woken.as_raw_fd()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Start serving on a thread of its own; an error when it started before or stopped.
    pub fn start(&self) -> io::Result<()> {
        let mut state = self.state();
        let State::Bound(listeners) = std::mem::replace(&mut *state, State::Stopped) else {
            return Err(io::Error::other("the gRPC receiver was already started"));
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(INFLATING)
            .build()?;
        let (stop, stopped) = watch::channel(None);
        let inbox = Arc::clone(&self.inbox);
        let serving = Arc::clone(&self.serving);
        let transport = self.transport;
        let thread = std::thread::Builder::new()
            .name("otel-guard-grpc".into())
            .spawn(move || match transport {
                Transport::H2 => runtime.block_on(serve(listeners, inbox, serving, stopped)),
                #[cfg(feature = "tonic-receiver")]
                Transport::Tonic => {
                    runtime.block_on(tonic_receiver::serve(listeners, inbox, serving, stopped))
                }
            })?;
        *state = State::Running { thread, stop };
        Ok(())
    }

    /// What arrived since the last call; drains the wake-up socket first, so that a call added
    /// after it wakes the loop again. The calls' bytes stay in the budget while their messages
    /// are held.
    pub fn take(&self) -> Arrived {
        let mut sink = [0u8; 256];
        while matches!((&self.woken).read(&mut sink), Ok(read) if read > 0) {}
        std::mem::take(&mut *self.inbox.lock())
    }

    /// Stop taking connections and calls, let the calls in flight finish for up to `grace`,
    /// then close every connection; returns once the thread ended. Blocks: call it with the
    /// interpreter lock released. Safe to call more than once, and before [`Server::start`].
    pub fn shutdown(&self, grace: Duration) {
        let previous = std::mem::replace(&mut *self.state(), State::Stopped);
        if let State::Running { thread, stop } = previous {
            let _ = stop.send(Some(grace));
            let _ = thread.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown(Duration::ZERO);
    }
}
