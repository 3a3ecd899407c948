//! A unary gRPC client on the receiver's own stack (h2 on a Tokio runtime of one thread): the
//! forwarder's downstream calls made in the engine rather than by grpcio (cargo feature
//! `h2-forwarder`, a prototype weighed in `docs/processor.md`, *The forwarder's client*).
//!
//! One HTTP/2 connection, opened at the first call and reused by every call; when it breaks, the
//! next call opens another, and a failed attempt is not retried for a backoff (100 ms, growing
//! 1.6× to 5 s, as grpcio's channel backs off): calls meanwhile fail UNAVAILABLE at once. Each
//! call has a deadline (`grpc-timeout` sent, DEADLINE_EXCEEDED past it, the stream reset), carries
//! the metadata it is given, and is gzipped when the channel is. What a reader would not guess: a
//! request's bytes are never copied: the message goes to HTTP/2 as the [`Bytes`] it came as (in
//! the binding, the Python `bytes` object itself), so a request in flight is held once, by its
//! owner; the answers come back as the receiver's calls do, in a batch taken after one byte on a
//! socket pair wakes the event loop.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use bytes::Bytes;
use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use h2::client::SendRequest;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request};
use percent_encoding::percent_decode_str;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::grpc::message::{Outcome, PREFIX, code};

/// UNKNOWN: a status the downstream did not give.
const UNKNOWN: u32 = 2;

/// How the channel sends: compression and the size limits grpcio's channel options set.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Gzip every request (`grpc-encoding: gzip`).
    pub gzip: bool,
    /// A larger request is not sent: RESOURCE_EXHAUSTED in grpc-core's words.
    pub max_send_bytes: usize,
    /// A larger response is refused: RESOURCE_EXHAUSTED.
    pub max_receive_bytes: usize,
    /// How long opening the connection may take (within each call's own deadline).
    pub connect_timeout: Duration,
    /// The HTTP/2 client the calls go through.
    pub stack: Stack,
}

/// The client a [`Channel`] calls with: h2 by hand (the default), or tonic's (the
/// `tonic-forwarder` feature, weighed beside it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Stack {
    #[default]
    H2,
    #[cfg(feature = "tonic-forwarder")]
    Tonic,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            gzip: false,
            max_send_bytes: 4 << 20,
            max_receive_bytes: 64 << 20,
            connect_timeout: Duration::from_secs(20),
            stack: Stack::H2,
        }
    }
}

/// One unary call to make.
#[derive(Debug)]
pub struct Call {
    /// The method's path (`/package.Service/Method`).
    pub method: String,
    pub message: Bytes,
    /// Metadata: (lowercase name, value) pairs, in order.
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
}

/// What arrived since the last [`Channel::take`] and wakes the event loop when it was empty.
struct Answers {
    answered: Mutex<Vec<(u64, Outcome)>>,
    wake: UnixStream,
}

impl Answers {
    fn lock(&self) -> MutexGuard<'_, Vec<(u64, Outcome)>> {
        self.answered
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn add(&self, id: u64, outcome: Outcome) {
        let mut answered = self.lock();
        let was_empty = answered.is_empty();
        answered.push((id, outcome));
        drop(answered);
        if was_empty {
            // Non-blocking: when the socket is full a byte is already waiting to be read.
            let _ = (&self.wake).write(&[1]);
        }
    }
}

/// A channel to one downstream: calls in, answers out (see the module's documentation).
pub struct Channel {
    target: String,
    calls: mpsc::UnboundedSender<(u64, Call)>,
    answers: Arc<Answers>,
    woken: UnixStream,
    next_id: AtomicU64,
    running: Mutex<Option<(JoinHandle<()>, oneshot::Sender<()>)>>,
}

impl Channel {
    /// A channel to `target` (`host:port`); nothing is connected before the first call.
    pub fn new(target: &str, options: Options) -> io::Result<Self> {
        let (wake, woken) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        woken.set_nonblocking(true)?;
        let answers = Arc::new(Answers {
            answered: Mutex::new(Vec::new()),
            wake,
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(2)
            .build()?;
        let (calls, incoming) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel();
        let thread = {
            let target = target.to_owned();
            let answers = Arc::clone(&answers);
            std::thread::Builder::new()
                .name("otel-guard-forward".into())
                .spawn(move || runtime.block_on(run(target, options, incoming, answers, stopped)))?
        };
        Ok(Channel {
            target: target.to_owned(),
            calls,
            answers,
            woken,
            next_id: AtomicU64::new(1),
            running: Mutex::new(Some((thread, stop))),
        })
    }

    pub fn target(&self) -> &str {
        &self.target
    }

    /// Start `call`; its answer comes with its id from [`Channel::take`]. After [`Channel::close`]
    /// it is answered UNAVAILABLE at once.
    pub fn call(&self, call: Call) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if self.calls.send((id, call)).is_err() {
            self.answers.add(
                id,
                Outcome::error(code::UNAVAILABLE, "the channel is closed"),
            );
        }
        id
    }

    /// The descriptor that becomes readable when answers arrive: then call [`Channel::take`].
    pub fn wake_fd(&self) -> RawFd {
        self.woken.as_raw_fd()
    }

    /// The answers that arrived since the last take: (call id, outcome).
    pub fn take(&self) -> Vec<(u64, Outcome)> {
        let mut sink = [0u8; 256];
        while matches!((&self.woken).read(&mut sink), Ok(read) if read > 0) {}
        std::mem::take(&mut *self.answers.lock())
    }

    /// End every call in flight (unanswered) and the connection; returns once the thread ended.
    /// Blocks: call it with the interpreter lock released. Safe to call more than once.
    pub fn close(&self) {
        let running = self
            .running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some((thread, stop)) = running {
            let _ = stop.send(());
            let _ = thread.join();
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.close();
    }
}

async fn run(
    target: String,
    options: Options,
    mut incoming: mpsc::UnboundedReceiver<(u64, Call)>,
    answers: Arc<Answers>,
    mut stopped: oneshot::Receiver<()>,
) {
    let connector = Arc::new(Caller::new(target, options));
    let mut calls = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            next = incoming.recv() => {
                let Some((id, call)) = next else { break };
                let connector = Arc::clone(&connector);
                let answers = Arc::clone(&answers);
                calls.spawn(async move {
                    answers.add(id, connector.call(call).await);
                });
            }
            Some(_) = calls.join_next(), if !calls.is_empty() => {}
        }
    }
    calls.shutdown().await;
}

/// The stack that makes the calls, and what every call is checked against first.
enum Caller {
    H2(Connector),
    #[cfg(feature = "tonic-forwarder")]
    Tonic(crate::grpc_client_tonic::TonicCaller),
}

impl Caller {
    fn new(target: String, options: Options) -> Self {
        match options.stack {
            Stack::H2 => Caller::H2(Connector::new(target, options)),
            #[cfg(feature = "tonic-forwarder")]
            Stack::Tonic => {
                Caller::Tonic(crate::grpc_client_tonic::TonicCaller::new(&target, options))
            }
        }
    }

    fn options(&self) -> &Options {
        match self {
            Caller::H2(connector) => &connector.options,
            #[cfg(feature = "tonic-forwarder")]
            Caller::Tonic(caller) => caller.options(),
        }
    }

    /// Make `call` within its deadline.
    async fn call(&self, call: Call) -> Outcome {
        let size = call.message.len();
        let max = self.options().max_send_bytes;
        if size > max {
            // grpc-core's words, which the forwarder reads as the limit it must split to.
            return Outcome::error(
                code::RESOURCE_EXHAUSTED,
                format!("Sent message larger than max ({size} vs. {max})"),
            );
        }
        let deadline = Instant::now() + call.timeout;
        let exchanged = match self {
            Caller::H2(connector) => {
                tokio::time::timeout_at(deadline, connector.exchange(call, deadline)).await
            }
            #[cfg(feature = "tonic-forwarder")]
            Caller::Tonic(caller) => {
                tokio::time::timeout_at(deadline, caller.exchange(call, deadline)).await
            }
        };
        match exchanged {
            Ok(Ok(outcome)) | Ok(Err(outcome)) => outcome,
            Err(_) => Outcome::error(code::DEADLINE_EXCEEDED, "Deadline Exceeded"),
        }
    }
}

/// The one connection, opened on demand, and the backoff after a failed attempt.
struct Connector {
    target: String,
    options: Options,
    state: tokio::sync::Mutex<Connection>,
}

#[derive(Default)]
struct Connection {
    send: Option<SendRequest<Bytes>>,
    /// Set false by the task that drives the connection when it ends.
    alive: Arc<AtomicBool>,
    /// After a failed attempt: no other before this, and what failed.
    retry_at: Option<(Instant, String)>,
    backoff: Duration,
}

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl Connector {
    fn new(target: String, options: Options) -> Self {
        Connector {
            target,
            options,
            state: tokio::sync::Mutex::new(Connection::default()),
        }
    }

    /// The connection's handle, opened now if there is none (or it broke).
    async fn open(&self) -> Result<SendRequest<Bytes>, Outcome> {
        let mut state = self.state.lock().await;
        if let Some(send) = &state.send
            && state.alive.load(Ordering::Relaxed)
        {
            return Ok(send.clone());
        }
        state.send = None;
        if let Some((at, why)) = &state.retry_at
            && Instant::now() < *at
        {
            return Err(unavailable(&self.target, why));
        }
        match tokio::time::timeout(self.options.connect_timeout, self.connect()).await {
            Ok(Ok((send, alive))) => {
                state.send = Some(send.clone());
                state.alive = alive;
                state.retry_at = None;
                state.backoff = Duration::ZERO;
                Ok(send)
            }
            failed => {
                let why = match failed {
                    Ok(Err(error)) => error.to_string(),
                    _ => "connecting timed out".to_owned(),
                };
                state.backoff = if state.backoff.is_zero() {
                    FIRST_BACKOFF
                } else {
                    state.backoff.mul_f64(1.6).min(MAX_BACKOFF)
                };
                state.retry_at = Some((Instant::now() + state.backoff, why.clone()));
                Err(unavailable(&self.target, &why))
            }
        }
    }

    async fn connect(&self) -> io::Result<(SendRequest<Bytes>, Arc<AtomicBool>)> {
        let tcp = TcpStream::connect(self.target.as_str()).await?;
        tcp.set_nodelay(true)?;
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(1 << 20)
            .initial_connection_window_size(2 << 20)
            .max_frame_size(1 << 20)
            .enable_push(false)
            .handshake::<_, Bytes>(tcp)
            .await
            .map_err(io::Error::other)?;
        let alive = Arc::new(AtomicBool::new(true));
        let ended = Arc::clone(&alive);
        tokio::spawn(async move {
            let _ = connection.await;
            ended.store(false, Ordering::Relaxed);
        });
        Ok((send, alive))
    }

    async fn exchange(&self, call: Call, deadline: Instant) -> Result<Outcome, Outcome> {
        let send = self.open().await?;
        let (message, compressed) = if self.options.gzip {
            let raw = call.message;
            let gzipped = tokio::task::spawn_blocking(move || gzip(&raw))
                .await
                .map_err(|error| Outcome::error(code::INTERNAL, error.to_string()))?
                .map_err(|error| Outcome::error(code::INTERNAL, error.to_string()))?;
            (Bytes::from(gzipped), true)
        } else {
            (call.message, false)
        };
        let request = self.request(&call.method, &call.headers, deadline, compressed)?;
        let mut send = send.ready().await.map_err(|e| self.failed(&e))?;
        let (response, mut stream) = send
            .send_request(request, false)
            .map_err(|e| self.failed(&e))?;
        let mut prefix = [0u8; PREFIX];
        prefix[0] = u8::from(compressed);
        prefix[1..].copy_from_slice(&(message.len() as u32).to_be_bytes());
        let sending = send_body(&mut stream, Bytes::copy_from_slice(&prefix), message);
        let (sent, response) = tokio::join!(sending, response);
        // A response that came while the request was still going (a refusal) is the answer.
        let response = response.map_err(|e| self.failed(&e))?;
        if let Err(error) = sent
            && response.headers().get("grpc-status").is_none()
        {
            return Err(self.failed(&error));
        }
        let (head, mut body) = response.into_parts();
        if head.status != http::StatusCode::OK {
            return Ok(Outcome::error(
                from_http(head.status.as_u16()),
                format!("the downstream answered HTTP {}", head.status.as_u16()),
            ));
        }
        if head.headers.contains_key("grpc-status") {
            return Ok(status(&head.headers, Vec::new())); // trailers only: no message
        }
        let mut received = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|e| self.failed(&e))?;
            let _ = body.flow_control().release_capacity(chunk.len());
            if received.len() + chunk.len() > self.options.max_receive_bytes + PREFIX {
                return Ok(Outcome::error(
                    code::RESOURCE_EXHAUSTED,
                    format!(
                        "Received message larger than max ({} vs. {})",
                        received.len() + chunk.len() - PREFIX,
                        self.options.max_receive_bytes
                    ),
                ));
            }
            received.extend_from_slice(&chunk);
        }
        let trailers = body.trailers().await.map_err(|e| self.failed(&e))?;
        let Some(trailers) = trailers else {
            return Ok(Outcome::error(
                code::INTERNAL,
                "the downstream ended the stream without a status",
            ));
        };
        let response = match unframe(&received, &head.headers, self.options.max_receive_bytes) {
            Ok(response) => response,
            Err(outcome) => return Ok(outcome),
        };
        Ok(status(&trailers, response))
    }

    fn request(
        &self,
        method: &str,
        headers: &[(String, String)],
        deadline: Instant,
        compressed: bool,
    ) -> Result<Request<()>, Outcome> {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(format!("http://{}{method}", self.target))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("grpc-accept-encoding", "identity,gzip")
            .header("grpc-timeout", grpc_timeout(left))
            .header("user-agent", "otel-guard-processor h2")
            .body(())
            .map_err(|error| Outcome::error(code::INTERNAL, error.to_string()))?;
        let fields = request.headers_mut();
        if compressed {
            fields.insert("grpc-encoding", HeaderValue::from_static("gzip"));
        }
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes());
            let value = HeaderValue::from_str(value);
            let (Ok(name), Ok(value)) = (name, value) else {
                return Err(Outcome::error(
                    code::INTERNAL,
                    "a forwarded header cannot be sent as metadata",
                ));
            };
            fields.append(name, value);
        }
        Ok(request)
    }

    /// An HTTP/2 error as gRPC reads it: a reset stream by its reason, anything else UNAVAILABLE.
    fn failed(&self, error: &h2::Error) -> Outcome {
        if error.is_reset()
            && let Some(reason) = error.reason()
        {
            let code = match reason {
                h2::Reason::REFUSED_STREAM => code::UNAVAILABLE,
                h2::Reason::CANCEL => code::CANCELLED,
                h2::Reason::ENHANCE_YOUR_CALM => code::RESOURCE_EXHAUSTED,
                h2::Reason::INADEQUATE_SECURITY => 7, // PERMISSION_DENIED
                _ => code::INTERNAL,
            };
            if !error.is_go_away() {
                return Outcome::error(code, format!("stream reset by the downstream: {reason}"));
            }
        }
        unavailable(&self.target, &error.to_string())
    }
}

/// The most bytes of a request a stream asks HTTP/2 for at a time.
const CHUNK: usize = 1 << 20;

/// Send the prefix and the message, a window at a time: capacity is reserved for at most
/// [`CHUNK`] and a piece of the message sent once it is granted (as hyper does), rather than
/// buffering the whole message in h2 for it to ask capacity for.
async fn send_body(
    stream: &mut h2::SendStream<Bytes>,
    prefix: Bytes,
    mut message: Bytes,
) -> Result<(), h2::Error> {
    stream.send_data(prefix, message.is_empty())?;
    while !message.is_empty() {
        stream.reserve_capacity(message.len().min(CHUNK));
        let granted = match std::future::poll_fn(|context| stream.poll_capacity(context)).await {
            Some(granted) => granted?,
            None => return Ok(()), // the stream ended (the downstream answered): nothing to send
        };
        if granted == 0 {
            continue;
        }
        let piece = message.split_to(granted.min(message.len()));
        stream.send_data(piece, message.is_empty())?;
    }
    Ok(())
}

fn unavailable(target: &str, why: &str) -> Outcome {
    Outcome::error(
        code::UNAVAILABLE,
        format!("failed to connect to {target}: {why}"),
    )
}

/// `grpc-timeout` for `left`: at most 8 digits, in the finest unit that holds it.
fn grpc_timeout(left: Duration) -> String {
    const MAX: u128 = 99_999_999;
    let micros = left.as_micros().max(1);
    if micros <= MAX {
        format!("{micros}u")
    } else if micros / 1000 <= MAX {
        format!("{}m", micros / 1000)
    } else {
        format!("{}S", (micros / 1_000_000).min(MAX))
    }
}

/// The status a response's headers or trailers carry, with the response's message.
fn status(fields: &HeaderMap, response: Vec<u8>) -> Outcome {
    let code = fields
        .get("grpc-status")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u32>().ok())
        .unwrap_or(UNKNOWN);
    let message = fields
        .get("grpc-message")
        .and_then(|value| value.to_str().ok())
        .map(|value| percent_decode_str(value).decode_utf8_lossy().into_owned())
        .unwrap_or_default();
    let details = fields
        .get("grpc-status-details-bin")
        .and_then(|value| STANDARD_NO_PAD.decode(unpadded(value.as_bytes())).ok());
    Outcome {
        code,
        message,
        response: if code == code::OK {
            response
        } else {
            Vec::new()
        },
        details,
    }
}

/// A base64 value without its `=` padding (gRPC's is sent without, but may come with it).
fn unpadded(value: &[u8]) -> &[u8] {
    let end = value
        .iter()
        .rposition(|&byte| byte != b'=')
        .map_or(0, |at| at + 1);
    &value[..end]
}

/// The response's one message out of its gRPC framing, inflated when it says so.
fn unframe(body: &[u8], headers: &HeaderMap, max: usize) -> Result<Vec<u8>, Outcome> {
    if body.is_empty() {
        return Ok(Vec::new());
    }
    let malformed = || {
        Outcome::error(
            code::INTERNAL,
            "the downstream's response is not gRPC-framed",
        )
    };
    if body.len() < PREFIX {
        return Err(malformed());
    }
    let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let message = body.get(PREFIX..PREFIX + length).ok_or_else(malformed)?;
    if body[0] == 0 {
        return Ok(message.to_vec());
    }
    let gzip = headers
        .get("grpc-encoding")
        .is_some_and(|value| value.as_bytes() == b"gzip");
    if !gzip {
        return Err(Outcome::error(
            code::INTERNAL,
            "the downstream's response is compressed with an encoding not asked for",
        ));
    }
    let mut inflated = Vec::new();
    GzDecoder::new(message)
        .take(max as u64 + 1)
        .read_to_end(&mut inflated)
        .map_err(|error| Outcome::error(code::INTERNAL, format!("bad gzip response: {error}")))?;
    if inflated.len() > max {
        return Err(Outcome::error(
            code::RESOURCE_EXHAUSTED,
            format!("Received message larger than max (more vs. {max})"),
        ));
    }
    Ok(inflated)
}

fn gzip(raw: &[u8]) -> io::Result<Vec<u8>> {
    let mut encoder = GzEncoder::new(Vec::with_capacity(raw.len() / 4), Compression::default());
    encoder.write_all(raw)?;
    encoder.finish()
}

/// The gRPC code for an HTTP status that is not 200 (gRPC's HTTP-to-gRPC mapping).
fn from_http(status: u16) -> u32 {
    match status {
        400 => code::INTERNAL,
        401 => 16, // UNAUTHENTICATED
        403 => 7,  // PERMISSION_DENIED
        404 => code::UNIMPLEMENTED,
        429 | 502..=504 => code::UNAVAILABLE,
        _ => UNKNOWN,
    }
}
