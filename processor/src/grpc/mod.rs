//! The OTLP/gRPC receiver's transport: HTTP/2 and gRPC's framing, on a thread of its own.
//!
//! A Tokio runtime of one thread accepts the connections and reads each Export call whole (gzip
//! inflated off that thread); the Python service takes the calls that arrived in one batch
//! ([`Server::take`]) and answers each through its [`Reply`]. What a reader would not guess: this
//! thread never takes Python's interpreter lock. It wakes the event loop with one byte on a socket
//! pair, written only when the batch it adds to was empty, so under load a wake-up brings many
//! calls, and a reply wakes the runtime through its own channel.
//!
//! Every byte of a call, from its first DATA frame until Python takes it, is drawn from one
//! [`ByteBudget`] (a global limit, and a share of it a connection); a call the budget cannot hold
//! is answered RESOURCE_EXHAUSTED with a retry delay at once. Every wait has a deadline: the
//! call's `grpc-timeout`, `read_timeout` for its request to arrive, `idle_timeout` for a
//! connection with no call; and at `max_connections` a new connection closes the one idle the
//! longest.

pub mod message;
#[cfg(feature = "tonic-receiver")]
mod tonic_receiver;

use std::collections::HashMap;
use std::future::poll_fn;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use h2::RecvStream;
use h2::server::SendResponse;
use http::{HeaderMap, HeaderValue, Request, Response};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::budget::ByteBudget;
use message::{Body, Bounds, Message};
pub use message::{Encoding, Outcome, code};

/// The methods an OTLP receiver serves (the default of [`Server::bind`]).
pub const METHODS: [&str; 3] = [
    "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
];

/// HTTP/2 flow-control windows, at most (and never more than a connection's share of the
/// budget): a call of a few hundred kilobytes arrives without waiting for a window update, and
/// what HTTP/2 buffers for a connection before its calls read it stays within the window.
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 2 << 20;
const MAX_FRAME: u32 = 1 << 20;
const MAX_STREAMS: u32 = 1024;
const MAX_HEADERS: u32 = 64 << 10;
/// How long a connection closed for idleness has to finish after its GOAWAY.
const GOODBYE: Duration = Duration::from_secs(1);
/// Inflations at once, each on a blocking thread of its own.
const INFLATING: usize = 2;
/// The longest `grpc-timeout` (8 digits, as gRPC's wire format allows).
const GRPC_TIMEOUT_DIGITS: usize = 8;

/// What the receiver holds and waits for, at most.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest request message as it arrives (compressed or not); larger is refused from
    /// its prefix.
    pub max_message_bytes: usize,
    /// The largest request message once inflated.
    pub max_inflated_bytes: usize,
    /// Bytes of calls received and not yet taken by [`Server::take`], in all.
    pub max_held_bytes: usize,
    /// The same, of one connection's calls (a share of `max_held_bytes`).
    pub max_connection_bytes: usize,
    /// Connections open at once; a new one past it closes the one idle the longest.
    pub max_connections: usize,
    /// How long a call's request may take to arrive whole (and a connection its preface).
    pub read_timeout: Duration,
    /// How long a connection may stay open with no call.
    pub idle_timeout: Duration,
    /// The retry delay a refusal for want of budget suggests.
    pub retry_after: Duration,
}

impl Limits {
    /// The limits for messages of at most `max_message_bytes`, `max_held_bytes` held in all, a
    /// connection's share half of it (a call alone in the budget is taken whatever its size:
    /// [`ByteBudget`]'s rule).
    pub fn new(max_message_bytes: usize, max_held_bytes: usize) -> Self {
        let held = max_held_bytes.max(1);
        Limits {
            max_message_bytes,
            max_inflated_bytes: max_message_bytes,
            max_held_bytes: held,
            max_connection_bytes: (held / 2).max(1),
            max_connections: 1024,
            read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
            retry_after: Duration::from_secs(1),
        }
    }
}

/// One Export call read whole, waiting for its answer.
#[derive(Debug)]
pub struct Call {
    pub id: u64,
    /// Its index in the methods the server was bound with.
    pub method: usize,
    pub message: Message,
    pub reply: Reply,
    /// The values of the request headers the server keeps ([`Server::with_headers`]), in order.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// How a call is answered: once; a reply dropped unanswered answers UNAVAILABLE.
#[derive(Debug)]
pub struct Reply(oneshot::Sender<Outcome>);

impl Reply {
    /// Answer the call; false when its client is gone or the server stopped.
    pub fn send(self, outcome: Outcome) -> bool {
        self.0.send(outcome).is_ok()
    }
}

/// What arrived since the last [`Server::take`]: calls, and the ids of calls whose client reset
/// them before they were answered.
#[derive(Debug, Default)]
pub struct Arrived {
    pub calls: Vec<Call>,
    pub cancelled: Vec<u64>,
}

struct Inbox {
    arrived: Mutex<Arrived>,
    wake: UnixStream,
    next_id: AtomicU64,
}

impl Inbox {
    fn lock(&self) -> MutexGuard<'_, Arrived> {
        self.arrived
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn add(&self, add: impl FnOnce(&mut Arrived)) {
        let mut arrived = self.lock();
        let was_empty = arrived.calls.is_empty() && arrived.cancelled.is_empty();
        add(&mut arrived);
        drop(arrived);
        if was_empty {
            // Non-blocking: when the socket is full a byte is already waiting to be read.
            let _ = (&self.wake).write(&[1]);
        }
    }
}

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

/// What every call is read against: the methods served, the limits, the budget, the headers kept.
struct Serving {
    methods: Vec<String>,
    limits: Limits,
    bounds: Bounds,
    budget: Arc<ByteBudget>,
    inflating: Arc<Semaphore>,
    epoch: Instant,
    headers: Vec<String>,
    /// Calls refused for want of budget (RESOURCE_EXHAUSTED with a retry delay), ever.
    refused_busy: AtomicU64,
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

/// A connection as the accept loop sees it: its calls open now, when it last started or ended
/// one, and the signal that closes it at once.
struct Peer {
    /// Its place in the order of arrival (of two idle as long, the older is closed first).
    seq: u64,
    calls: AtomicUsize,
    /// Milliseconds from the server's epoch.
    last: AtomicU64,
    close: Notify,
}

impl Peer {
    fn new(serving: &Serving, seq: u64) -> Self {
        let peer = Peer {
            seq,
            calls: AtomicUsize::new(0),
            last: AtomicU64::new(0),
            close: Notify::new(),
        };
        peer.touch(serving);
        peer
    }

    fn touch(&self, serving: &Serving) {
        let now = serving.epoch.elapsed().as_millis() as u64;
        self.last.store(now, Ordering::Relaxed);
    }

    fn idle_since(&self, serving: &Serving) -> Instant {
        serving.epoch + Duration::from_millis(self.last.load(Ordering::Relaxed))
    }
}

/// A call open on its connection, from its headers until its answer is sent.
struct Open<'a> {
    peer: &'a Peer,
    serving: &'a Serving,
}

impl<'a> Open<'a> {
    fn new(peer: &'a Peer, serving: &'a Serving) -> Self {
        peer.calls.fetch_add(1, Ordering::Relaxed);
        peer.touch(serving);
        Open { peer, serving }
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.peer.touch(self.serving);
        self.peer.calls.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Close the connection idle the longest to make room for a new one; false when every one has
/// a call open.
fn make_room(peers: &mut HashMap<tokio::task::Id, Arc<Peer>>) -> bool {
    let idlest = peers
        .iter()
        .filter(|(_, peer)| peer.calls.load(Ordering::Relaxed) == 0)
        .min_by_key(|(_, peer)| (peer.last.load(Ordering::Relaxed), peer.seq))
        .map(|(id, _)| *id);
    match idlest.and_then(|id| peers.remove(&id)) {
        Some(peer) => {
            peer.close.notify_one();
            true
        }
        None => false,
    }
}

/// `listener` as the runtime's listener, or `None` when it cannot be one.
pub(crate) fn listening(listener: StdListener) -> Option<TcpListener> {
    listener
        .set_nonblocking(true)
        .and_then(|()| TcpListener::from_std(listener))
        .ok()
}

/// The next connection `listener` accepts; after a failure (out of descriptors, say) it waits a
/// little rather than spin.
pub(crate) async fn next_socket(listener: &TcpListener) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((socket, _)) => return socket,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn serve(
    listeners: Vec<StdListener>,
    inbox: Arc<Inbox>,
    serving: Arc<Serving>,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    let (accepted, mut sockets) = mpsc::channel::<TcpStream>(64);
    let mut accepting = JoinSet::new();
    for listener in listeners {
        let accepted = accepted.clone();
        accepting.spawn(async move {
            let Some(listener) = listening(listener) else {
                return;
            };
            loop {
                if accepted.send(next_socket(&listener).await).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(accepted);
    let mut connections = JoinSet::new();
    let mut peers: HashMap<tokio::task::Id, Arc<Peer>> = HashMap::new();
    let mut arrivals = 0u64;
    let mut listening = true;
    let grace = loop {
        tokio::select! {
            socket = sockets.recv(), if listening => match socket {
                Some(socket) => {
                    if peers.len() >= serving.limits.max_connections && !make_room(&mut peers) {
                        // Every connection has a call open: this one is closed unserved.
                        drop(socket);
                        continue;
                    }
                    arrivals += 1;
                    let peer = Arc::new(Peer::new(&serving, arrivals));
                    let task = connections.spawn(connection(
                        socket,
                        Arc::clone(&peer),
                        Arc::clone(&inbox),
                        Arc::clone(&serving),
                        stop.clone(),
                    ));
                    peers.insert(task.id(), peer);
                }
                None => listening = false,
            },
            changed = stop.changed() => {
                match (changed, *stop.borrow()) {
                    (Ok(()), Some(grace)) => break grace,
                    (Ok(()), None) => continue,
                    (Err(_), _) => break Duration::ZERO,
                }
            },
            Some(ended) = connections.join_next_with_id(), if !connections.is_empty() => {
                let id = match ended {
                    Ok((id, ())) => id,
                    Err(error) => error.id(),
                };
                peers.remove(&id);
            }
        }
    };
    // No new connections (the listeners close); the open ones send GOAWAY and finish their calls.
    accepting.abort_all();
    drop(sockets);
    let _ = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

async fn connection(
    socket: TcpStream,
    peer: Arc<Peer>,
    inbox: Arc<Inbox>,
    serving: Arc<Serving>,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    let _ = socket.set_nodelay(true);
    let limits = serving.limits;
    let share = u32::try_from(limits.max_connection_bytes).unwrap_or(u32::MAX);
    let handshake = h2::server::Builder::new()
        .initial_window_size(STREAM_WINDOW.min(share).max(1))
        .initial_connection_window_size(CONNECTION_WINDOW.min(share).max(1))
        .max_frame_size(MAX_FRAME)
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADERS)
        .handshake::<_, Bytes>(socket);
    let mut connection = tokio::select! {
        shaken = tokio::time::timeout(limits.read_timeout, handshake) => match shaken {
            Ok(Ok(connection)) => connection,
            _ => return,
        },
        () = peer.close.notified() => return,
    };
    let budget = ByteBudget::within(&serving.budget, limits.max_connection_bytes);
    let idle = tokio::time::sleep(limits.idle_timeout);
    tokio::pin!(idle);
    let mut stopping = stop.borrow().is_some();
    if stopping {
        connection.graceful_shutdown();
    }
    // When the connection was closed for idleness: when it must be gone.
    let mut goodbye: Option<Instant> = None;
    loop {
        let next = if let Some(by) = goodbye {
            tokio::select! {
                next = connection.accept() => next,
                () = tokio::time::sleep_until(by) => {
                    if peer.calls.load(Ordering::Relaxed) == 0 {
                        return;
                    }
                    goodbye = Some(Instant::now() + GOODBYE);
                    continue;
                }
            }
        } else if stopping {
            connection.accept().await
        } else {
            tokio::select! {
                next = connection.accept() => next,
                _ = stop.changed() => {
                    stopping = true;
                    connection.graceful_shutdown();
                    continue;
                }
                () = peer.close.notified() => return,
                () = &mut idle => {
                    let since = peer.idle_since(&serving);
                    if peer.calls.load(Ordering::Relaxed) == 0
                        && since + limits.idle_timeout <= Instant::now()
                    {
                        connection.graceful_shutdown();
                        goodbye = Some(Instant::now() + GOODBYE);
                    } else {
                        let from = since.max(Instant::now());
                        idle.as_mut().reset(from + limits.idle_timeout);
                    }
                    continue;
                }
            }
        };
        match next {
            Some(Ok((request, respond))) => {
                tokio::spawn(call(
                    request,
                    respond,
                    Arc::clone(&peer),
                    Arc::clone(&budget),
                    Arc::clone(&inbox),
                    Arc::clone(&serving),
                ));
            }
            Some(Err(_)) | None => return,
        }
    }
}

async fn call(
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    peer: Arc<Peer>,
    budget: Arc<ByteBudget>,
    inbox: Arc<Inbox>,
    serving: Arc<Serving>,
) {
    let _open = Open::new(&peer, &serving);
    let started = Instant::now();
    let deadline = match grpc_timeout(request.headers().get("grpc-timeout")) {
        Ok(timeout) => timeout.map(|timeout| started + timeout),
        Err(refused) => return send(respond, &refused),
    };
    let read_by = started + serving.limits.read_timeout;
    let reading = read(request, &serving, &budget);
    let outcome = match tokio::time::timeout_at(
        deadline.map_or(read_by, |at| at.min(read_by)),
        reading,
    )
    .await
    {
        Err(_) if deadline.is_some_and(|at| at <= read_by) => deadline_exceeded(),
        Err(_) => Outcome::error(
            code::DEADLINE_EXCEEDED,
            format!(
                "the request message did not arrive within read_timeout ({} s)",
                serving.limits.read_timeout.as_secs_f64()
            ),
        ),
        Ok(Err(refused)) => {
            if refused.code == code::RESOURCE_EXHAUSTED && refused.details.is_some() {
                serving.refused_busy.fetch_add(1, Ordering::Relaxed);
            }
            refused
        }
        Ok(Ok((method, message, headers))) => {
            let (answer, mut answered) = oneshot::channel();
            let id = inbox.next_id.fetch_add(1, Ordering::Relaxed);
            inbox.add(|arrived| {
                arrived.calls.push(Call {
                    id,
                    method,
                    message,
                    reply: Reply(answer),
                    headers,
                })
            });
            let past_deadline = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                outcome = &mut answered => outcome.unwrap_or_else(|_| {
                    Outcome::error(code::UNAVAILABLE, "the processor stopped before it answered")
                }),
                _ = poll_fn(|context| respond.poll_reset(context)) => {
                    inbox.add(|arrived| arrived.cancelled.push(id));
                    return;
                }
                () = past_deadline => {
                    inbox.add(|arrived| arrived.cancelled.push(id));
                    deadline_exceeded()
                }
            }
        }
    };
    send(respond, &outcome);
}

fn deadline_exceeded() -> Outcome {
    Outcome::error(
        code::DEADLINE_EXCEEDED,
        "the call's deadline (grpc-timeout) passed before it was answered",
    )
}

/// A call's `grpc-timeout` (absent: none), or the outcome that refuses a malformed one.
fn grpc_timeout(header: Option<&HeaderValue>) -> Result<Option<Duration>, Outcome> {
    let Some(header) = header else {
        return Ok(None);
    };
    let malformed = || {
        Outcome::error(
            code::INTERNAL,
            format!(
                "malformed grpc-timeout {:?}",
                String::from_utf8_lossy(header.as_bytes())
            ),
        )
    };
    let (digits, unit) = header
        .as_bytes()
        .split_last_chunk::<1>()
        .ok_or_else(malformed)?;
    if digits.is_empty()
        || digits.len() > GRPC_TIMEOUT_DIGITS
        || !digits.iter().all(u8::is_ascii_digit)
    {
        return Err(malformed());
    }
    let amount = digits
        .iter()
        .fold(0u64, |amount, digit| amount * 10 + u64::from(digit - b'0'));
    let timeout = match unit {
        [b'H'] => Duration::from_secs(amount * 3600),
        [b'M'] => Duration::from_secs(amount * 60),
        [b'S'] => Duration::from_secs(amount),
        [b'm'] => Duration::from_millis(amount),
        [b'u'] => Duration::from_micros(amount),
        [b'n'] => Duration::from_nanos(amount),
        _ => return Err(malformed()),
    };
    Ok(Some(timeout))
}

/// The call's method, message and kept headers, or the outcome that refuses it.
async fn read(
    request: Request<RecvStream>,
    serving: &Serving,
    budget: &Arc<ByteBudget>,
) -> Result<(usize, Message, Vec<(String, Vec<u8>)>), Outcome> {
    let path = request.uri().path();
    let Some(method) = serving.methods.iter().position(|method| method == path) else {
        return Err(Outcome::error(
            code::UNIMPLEMENTED,
            format!("no method {path} here: this is an OTLP receiver"),
        ));
    };
    let headers = request.headers();
    let grpc = headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|kind| kind.as_bytes().starts_with(b"application/grpc"));
    if !grpc {
        return Err(Outcome::error(
            code::INTERNAL,
            "content-type is not application/grpc",
        ));
    }
    let encoding = Encoding::of(headers.get("grpc-encoding").map(HeaderValue::as_bytes))?;
    let kept = serving
        .headers
        .iter()
        .flat_map(|name| {
            headers
                .get_all(name.as_str())
                .iter()
                .map(move |value| (name.clone(), value.as_bytes().to_vec()))
        })
        .collect();
    let mut stream = request.into_body();
    let mut body = Body::new(serving.bounds, budget.empty());
    while let Some(chunk) = stream.data().await {
        let chunk = chunk.map_err(|error| {
            Outcome::error(
                code::CANCELLED,
                format!("the request stream failed: {error}"),
            )
        })?;
        let _ = stream.flow_control().release_capacity(chunk.len());
        body.push(chunk)?;
    }
    let message = if body.compressed() {
        // Off this thread, two at a time: inflating must not stall every other connection.
        let permit = Arc::clone(&serving.inflating)
            .acquire_owned()
            .await
            .map_err(|_| Outcome::error(code::UNAVAILABLE, "the processor is stopping"))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            body.finish(encoding)
        })
        .await
        .map_err(|_| Outcome::error(code::INTERNAL, "inflating the request message failed"))??
    } else {
        body.finish(encoding)?
    };
    Ok((method, message, kept))
}
fn send(mut respond: SendResponse<Bytes>, outcome: &Outcome) {
    let mut response = Response::new(());
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(
        "grpc-accept-encoding",
        HeaderValue::from_static("identity,gzip"),
    );
    if outcome.code != code::OK {
        // Trailers only: the status in the one header block, ending the stream.
        status_headers(headers, outcome);
        let _ = respond.send_response(response, true);
        return;
    }
    let Ok(mut stream) = respond.send_response(response, false) else {
        return;
    };
    if stream
        .send_data(Bytes::from(outcome.framed()), false)
        .is_ok()
    {
        let mut trailers = HeaderMap::new();
        status_headers(&mut trailers, outcome);
        let _ = stream.send_trailers(trailers);
    }
}

fn status_headers(headers: &mut HeaderMap, outcome: &Outcome) {
    headers.insert("grpc-status", HeaderValue::from(outcome.code));
    if !outcome.message.is_empty()
        && let Ok(message) = HeaderValue::from_str(&outcome.encoded_message())
    {
        headers.insert("grpc-message", message);
    }
    if let Some(details) = outcome.encoded_details()
        && let Ok(details) = HeaderValue::from_str(&details)
    {
        headers.insert("grpc-status-details-bin", details);
    }
}
