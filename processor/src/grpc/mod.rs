//! The OTLP/gRPC receiver's transport: HTTP/2 and gRPC's framing, on a thread of its own.
//!
//! A Tokio runtime of one thread accepts the connections and reads each Export call whole (gzip
//! inflated there); the Python service takes the calls that arrived in one batch
//! ([`Server::take`]) and answers each through its [`Reply`]. What a reader would not guess: this
//! thread never takes Python's interpreter lock. It wakes the event loop with one byte on a socket
//! pair, written only when the batch it adds to was empty, so under load a wake-up brings many
//! calls, and a reply wakes the runtime through its own channel.

pub mod message;

use std::future::poll_fn;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use h2::RecvStream;
use h2::server::SendResponse;
use http::{HeaderMap, HeaderValue, Request, Response};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;

use message::{Body, Message};
pub use message::{Encoding, Outcome, code};

/// The methods an OTLP receiver serves (the default of [`Server::bind`]).
pub const METHODS: [&str; 3] = [
    "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
];

/// How long a connection may take to open HTTP/2 (its preface and settings).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);
/// HTTP/2 flow-control windows: a call of a few hundred kilobytes arrives without waiting for a
/// window update. What a connection holds is bounded by `max_message_bytes` a call anyway.
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 1 << 24;
const MAX_FRAME: u32 = 1 << 20;
const MAX_STREAMS: u32 = 1024;
const MAX_HEADERS: u32 = 64 << 10;

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
}

/// What every call is read against: the methods served, the largest message, the headers kept.
struct Serving {
    methods: Vec<String>,
    max: usize,
    headers: Vec<String>,
}

impl Server {
    /// Bind `port` on each of `hosts` (with port 0, the port the first one got on the others), to
    /// serve `methods` (paths, as [`METHODS`]); the first error when none can be bound.
    pub fn bind(
        hosts: &[std::net::IpAddr],
        port: u16,
        max_message_bytes: usize,
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
                max: max_message_bytes,
                headers: Vec::new(),
            }),
            state: Mutex::new(State::Bound(listeners)),
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

    pub fn addresses(&self) -> &[SocketAddr] {
        &self.addresses
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
            .build()?;
        let (stop, stopped) = watch::channel(None);
        let inbox = Arc::clone(&self.inbox);
        let serving = Arc::clone(&self.serving);
        let thread = std::thread::Builder::new()
            .name("otel-guard-grpc".into())
            .spawn(move || runtime.block_on(serve(listeners, inbox, serving, stopped)))?;
        *state = State::Running { thread, stop };
        Ok(())
    }

    /// What arrived since the last call; drains the wake-up socket first, so that a call added
    /// after it wakes the loop again.
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
            let Ok(listener) = listener
                .set_nonblocking(true)
                .and_then(|()| TcpListener::from_std(listener))
            else {
                return;
            };
            loop {
                match listener.accept().await {
                    Ok((socket, _)) => {
                        if accepted.send(socket).await.is_err() {
                            return;
                        }
                    }
                    // Out of descriptors, say: wait a little rather than spin.
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
    }
    drop(accepted);
    let mut connections = JoinSet::new();
    let mut listening = true;
    let grace = loop {
        tokio::select! {
            socket = sockets.recv(), if listening => match socket {
                Some(socket) => {
                    connections.spawn(connection(
                        socket,
                        Arc::clone(&inbox),
                        Arc::clone(&serving),
                        stop.clone(),
                    ));
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
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
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
    inbox: Arc<Inbox>,
    serving: Arc<Serving>,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    let _ = socket.set_nodelay(true);
    let handshake = h2::server::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADERS)
        .handshake::<_, Bytes>(socket);
    let Ok(Ok(mut connection)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await else {
        return;
    };
    let mut stopping = stop.borrow().is_some();
    if stopping {
        connection.graceful_shutdown();
    }
    loop {
        let next = if stopping {
            connection.accept().await
        } else {
            tokio::select! {
                next = connection.accept() => next,
                _ = stop.changed() => {
                    stopping = true;
                    connection.graceful_shutdown();
                    continue;
                }
            }
        };
        match next {
            Some(Ok((request, respond))) => {
                tokio::spawn(call(
                    request,
                    respond,
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
    inbox: Arc<Inbox>,
    serving: Arc<Serving>,
) {
    let outcome = match read(request, &serving).await {
        Err(refused) => refused,
        Ok((method, message, headers)) => {
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
            tokio::select! {
                outcome = &mut answered => outcome.unwrap_or_else(|_| {
                    Outcome::error(code::UNAVAILABLE, "the processor stopped before it answered")
                }),
                _ = poll_fn(|context| respond.poll_reset(context)) => {
                    inbox.add(|arrived| arrived.cancelled.push(id));
                    return;
                }
            }
        }
    };
    send(respond, &outcome);
}

/// The call's method, message and kept headers, or the outcome that refuses it.
async fn read(
    request: Request<RecvStream>,
    serving: &Serving,
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
    let mut body = Body::new(serving.max);
    while let Some(chunk) = stream.data().await {
        let chunk = chunk.map_err(|error| {
            Outcome::error(
                code::CANCELLED,
                format!("the request stream failed: {error}"),
            )
        })?;
        let _ = stream.flow_control().release_capacity(chunk.len());
        body.push(&chunk)?;
    }
    Ok((method, body.finish(encoding)?, kept))
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
