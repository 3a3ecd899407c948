//! The OTLP/gRPC receiver on tonic and tower: the prototype issue 41 weighed against the h2 one
//! (`docs/processor.md`, *tonic and tower*), behind the `tonic-receiver` feature.
//!
//! It feeds the same [`Inbox`] as [`super::serve`], so a call reaches the Python service and the
//! engine by the same path, its message read once and never decoded here. tonic gives the HTTP/2
//! settings, `grpc-timeout`, the size limit and gzip; the rest is this module's. What a reader
//! would not guess: tonic allocates a message's whole declared length when its 5-byte prefix
//! arrives, so the budget is drawn there, for the whole length, by a body wrapper ([`Budgeted`])
//! that sees the prefix before tonic does; the h2 receiver draws only for bytes that arrived.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::TcpListener as StdListener;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Sleep;
use tonic::Status;
use tonic::body::Body;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{Grpc, UnaryService};
use tonic::transport::server::Connected;

use super::message::{Message, PREFIX, too_large};
use super::{
    CONNECTION_WINDOW, Call, Inbox, MAX_FRAME, MAX_HEADERS, MAX_STREAMS, Outcome, Reply,
    STREAM_WINDOW, Serving, code,
};
use crate::budget::{ByteBudget, Taken};

type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Serve `listeners` until `stop` says so, then let the calls in flight finish for its grace.
pub(super) async fn serve(
    listeners: Vec<StdListener>,
    inbox: Arc<Inbox>,
    serving: Arc<Serving>,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    let limits = serving.limits;
    let share = u32::try_from(limits.max_connection_bytes).unwrap_or(u32::MAX);
    let (accepted, sockets) = mpsc::channel::<io::Result<Connection>>(64);
    let live = Arc::new(AtomicUsize::new(0));
    for listener in listeners {
        tokio::spawn(accept(
            listener,
            accepted.clone(),
            Arc::clone(&live),
            Arc::clone(&serving),
        ));
    }
    drop(accepted);
    let (graced, grace) = oneshot::channel();
    let signal = async move {
        let grace = loop {
            if stop.changed().await.is_err() {
                break Duration::ZERO;
            }
            if let Some(grace) = *stop.borrow() {
                break grace;
            }
        };
        let _ = graced.send(grace);
    };
    let server = tonic::transport::Server::builder()
        .initial_stream_window_size(STREAM_WINDOW.min(share).max(1))
        .initial_connection_window_size(CONNECTION_WINDOW.min(share).max(1))
        .max_frame_size(MAX_FRAME)
        .max_concurrent_streams(MAX_STREAMS)
        .http2_max_header_list_size(MAX_HEADERS)
        .serve_with_incoming_shutdown(Receiver { inbox, serving }, Incoming(sockets), signal);
    tokio::pin!(server);
    tokio::select! {
        _ = &mut server => {}
        grace = grace => {
            // tonic waits for every connection to close; the grace bounds that wait.
            let _ = tokio::time::timeout(grace.unwrap_or_default(), &mut server).await;
        }
    }
}

async fn accept(
    listener: StdListener,
    accepted: mpsc::Sender<io::Result<Connection>>,
    live: Arc<AtomicUsize>,
    serving: Arc<Serving>,
) {
    let Some(listener) = super::h2_connections::listening(listener) else {
        return;
    };
    loop {
        let socket = super::h2_connections::next_socket(&listener).await;
        // tonic has no connection cap: past it a new connection is closed unserved
        // (the h2 receiver closes the one idle the longest instead).
        if live.load(Ordering::Relaxed) >= serving.limits.max_connections {
            continue;
        }
        let _ = socket.set_nodelay(true);
        live.fetch_add(1, Ordering::Relaxed);
        let connection = Connection {
            socket,
            share: Share(ByteBudget::within(
                &serving.budget,
                serving.limits.max_connection_bytes,
            )),
            live: Arc::clone(&live),
        };
        if accepted.send(Ok(connection)).await.is_err() {
            return;
        }
    }
}

/// The accepted connections, as the stream tonic serves.
struct Incoming(mpsc::Receiver<io::Result<Connection>>);

impl futures_core::Stream for Incoming {
    type Item = io::Result<Connection>;

    fn poll_next(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(context)
    }
}

/// A connection's share of the budget: tonic hands it to every call through the request's
/// extensions ([`Connected`]).
#[derive(Clone)]
struct Share(Arc<ByteBudget>);

/// A TCP connection, counted while open, carrying its share of the budget.
struct Connection {
    socket: TcpStream,
    share: Share,
    live: Arc<AtomicUsize>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Connected for Connection {
    type ConnectInfo = Share;

    fn connect_info(&self) -> Share {
        self.share.clone()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.socket).poll_read(context, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.socket).poll_write(context, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.socket).poll_write_vectored(context, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.socket.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.socket).poll_flush(context)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.socket).poll_shutdown(context)
    }
}

/// The service tonic calls for every request: routes by path, draws the budget, reads the
/// message with tonic's unary machinery and hands it to the inbox.
#[derive(Clone)]
struct Receiver {
    inbox: Arc<Inbox>,
    serving: Arc<Serving>,
}

impl tower::Service<http::Request<Body>> for Receiver {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Boxed<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let serving = Arc::clone(&self.serving);
        let inbox = Arc::clone(&self.inbox);
        Box::pin(async move {
            let path = request.uri().path();
            let Some(method) = serving.methods.iter().position(|method| method == path) else {
                let refused = Status::unimplemented(format!(
                    "no method {path} here: this is an OTLP receiver"
                ));
                return Ok(refused.into_http());
            };
            let share = request
                .extensions()
                .get::<Share>()
                .map_or_else(|| Arc::clone(&serving.budget), |share| Arc::clone(&share.0));
            let headers = serving
                .headers
                .iter()
                .flat_map(|name| {
                    request
                        .headers()
                        .get_all(name.as_str())
                        .iter()
                        .map(move |value| (name.clone(), value.as_bytes().to_vec()))
                })
                .collect();
            let held = Arc::new(Mutex::new(None));
            let limits = serving.limits;
            let request = request.map(|body| {
                Body::new(Budgeted {
                    inner: body,
                    taken: Some(share.empty()),
                    held: Arc::clone(&held),
                    serving: Arc::clone(&serving),
                    prefix: [0; PREFIX],
                    prefix_len: 0,
                    expected: None,
                    received: 0,
                    read_by: Box::pin(tokio::time::sleep(limits.read_timeout)),
                })
            });
            let mut grpc = Grpc::new(Raw {
                held,
                max_inflated: limits.max_inflated_bytes,
                retry_after: limits.retry_after,
            })
            .accept_compressed(CompressionEncoding::Gzip)
            // tonic has one limit for a message as it arrives and once inflated: the larger
            // here, the inflated one checked after (see RawDecoder).
            .max_decoding_message_size(limits.max_message_bytes.max(limits.max_inflated_bytes));
            let handler = Handler {
                inbox,
                method,
                headers: Some(headers),
            };
            Ok(grpc.unary(handler, request).await)
        })
    }
}

/// The status of an outcome (its details, the `RetryInfo`, kept).
fn status(outcome: Outcome) -> Status {
    let code = tonic::Code::from_i32(outcome.code as i32);
    match outcome.details {
        Some(details) => Status::with_details(code, outcome.message, Bytes::from(details)),
        None => Status::new(code, outcome.message),
    }
}

/// A request body drawn from the budget as tonic reads it: at the prefix, the message's whole
/// length (tonic allocates it then); refused RESOURCE_EXHAUSTED when it is larger than the limit
/// or the budget cannot hold it, and DEADLINE_EXCEEDED when it has not arrived within
/// `read_timeout`. The take is handed to the codec through `held`.
struct Budgeted {
    inner: Body,
    taken: Option<Taken>,
    held: Held,
    serving: Arc<Serving>,
    prefix: [u8; PREFIX],
    prefix_len: usize,
    expected: Option<usize>,
    received: usize,
    read_by: Pin<Box<Sleep>>,
}

impl Budgeted {
    fn check(&mut self, data: &[u8]) -> Result<(), Status> {
        let mut data = data;
        if self.prefix_len < PREFIX {
            let take = (PREFIX - self.prefix_len).min(data.len());
            self.prefix[self.prefix_len..self.prefix_len + take].copy_from_slice(&data[..take]);
            self.prefix_len += take;
            data = &data[take..];
            if self.prefix_len == PREFIX {
                let [_, a, b, c, d] = self.prefix;
                let length = u32::from_be_bytes([a, b, c, d]) as usize;
                let max = self.serving.limits.max_message_bytes;
                if length > max {
                    return Err(status(too_large(length, max)));
                }
                let Some(taken) = self.taken.as_mut() else {
                    return Err(Status::internal("the request body was read after its end"));
                };
                taken.declare(length);
                if !taken.try_grow(length) {
                    self.serving.refused_busy.fetch_add(1, Ordering::Relaxed);
                    return Err(status(Outcome::busy(
                        format!(
                            "the processor holds as many bytes of requests as it may \
                             (max_pending_bytes; {} free for a message of {length}); retry later",
                            taken.available()
                        ),
                        self.serving.limits.retry_after,
                    )));
                }
                self.expected = Some(length);
            }
        }
        self.received += data.len();
        if self
            .expected
            .is_some_and(|expected| self.received > expected)
        {
            return Err(Status::unimplemented(
                "more than one request message in a unary call",
            ));
        }
        Ok(())
    }

    /// Hand the take to the codec (the body ended, or tonic stops reading it).
    fn hand_over(&mut self) {
        if let Some(taken) = self.taken.take()
            && let Ok(mut held) = self.held.lock()
        {
            *held = Some((taken, self.prefix[0] != 0));
        }
    }
}

impl HttpBody for Budgeted {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if this.taken.is_some() && this.read_by.as_mut().poll(context).is_ready() {
            this.taken = None;
            return Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                "the request message did not arrive within read_timeout ({} s)",
                this.serving.limits.read_timeout.as_secs_f64()
            )))));
        }
        let frame = match Pin::new(&mut this.inner).poll_frame(context) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => {
                this.hand_over();
                return Poll::Ready(None);
            }
            Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error))),
            Poll::Ready(Some(Ok(frame))) => frame,
        };
        if let Some(data) = frame.data_ref()
            && let Err(refused) = this.check(data)
        {
            this.taken = None;
            return Poll::Ready(Some(Err(refused)));
        }
        if this
            .expected
            .is_some_and(|expected| this.received == expected)
        {
            // The whole message is here: tonic decodes it before it reads on.
            this.hand_over();
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The request message as bytes (never decoded here), with the budget its body drew; the
/// response as the bytes the Python service answered with.
struct Raw {
    held: Held,
    max_inflated: usize,
    retry_after: Duration,
}

/// A call's take of the budget and whether its message is compressed, from its body to its
/// codec.
type Held = Arc<Mutex<Option<(Taken, bool)>>>;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Message;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder {
            held: Arc::clone(&self.held),
            max_inflated: self.max_inflated,
            retry_after: self.retry_after,
        }
    }
}

struct RawEncoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

struct RawDecoder {
    held: Held,
    max_inflated: usize,
    retry_after: Duration,
}

impl Decoder for RawDecoder {
    type Item = Message;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Message>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        let taken = self.held.lock().ok().and_then(|mut held| held.take());
        let Some((mut taken, compressed)) = taken else {
            return Err(Status::internal(
                "the request message was not drawn from the budget",
            ));
        };
        if compressed && bytes.len() > self.max_inflated {
            return Err(status(too_large(bytes.len(), self.max_inflated)));
        }
        // Inflated by tonic (bounded by max_inflated_bytes while it ran): drawn now, after.
        let inflated = bytes.len().saturating_sub(taken.bytes());
        if inflated > 0 && !taken.try_grow(inflated) {
            return Err(status(Outcome::busy(
                format!(
                    "the processor holds as many bytes of requests as it may \
                     (max_pending_bytes; a message inflated to {}); retry later",
                    bytes.len()
                ),
                self.retry_after,
            )));
        }
        Ok(Some(Message::whole(bytes, taken)))
    }
}

/// Hands a call's message to the inbox and waits for the Python service's answer.
struct Handler {
    inbox: Arc<Inbox>,
    method: usize,
    headers: Option<Vec<(String, Vec<u8>)>>,
}

/// Tells the inbox that a call was let go of unanswered (its client reset it, or its
/// `grpc-timeout` passed: tonic drops the call's future then).
struct Waiting {
    inbox: Arc<Inbox>,
    id: u64,
    answered: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if !self.answered {
            let id = self.id;
            self.inbox.add(|arrived| arrived.cancelled.push(id));
        }
    }
}

impl UnaryService<Message> for Handler {
    type Response = Vec<u8>;
    type Future = Boxed<Result<tonic::Response<Vec<u8>>, Status>>;

    fn call(&mut self, request: tonic::Request<Message>) -> Self::Future {
        let inbox = Arc::clone(&self.inbox);
        let method = self.method;
        let headers = self.headers.take().unwrap_or_default();
        Box::pin(async move {
            let message = request.into_inner();
            let (answer, answered) = oneshot::channel();
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
            let mut waiting = Waiting {
                inbox,
                id,
                answered: false,
            };
            let outcome = answered.await.unwrap_or_else(|_| {
                Outcome::error(
                    code::UNAVAILABLE,
                    "the processor stopped before it answered",
                )
            });
            waiting.answered = true;
            if outcome.code == code::OK {
                Ok(tonic::Response::new(outcome.response))
            } else {
                Err(status(outcome))
            }
        })
    }
}
