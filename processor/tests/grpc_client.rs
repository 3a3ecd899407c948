//! The engine's gRPC client (`h2-forwarder` feature) against real HTTP/2 gRPC servers on
//! 127.0.0.1: the engine's own receiver, and an h2 server written here that shows what arrives on
//! the wire (connections, headers, gzip).
#![cfg(feature = "h2-forwarder")]

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener as StdListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use http::{HeaderMap, Response};
use otel_guard_engine::grpc::{Limits, METHODS, Outcome, Server, code};
use otel_guard_engine::grpc_client::{Call, Channel, Options};

const TRACES: &str = METHODS[0];

fn call(message: &[u8], timeout: Duration) -> Call {
    Call {
        method: TRACES.to_owned(),
        message: Bytes::copy_from_slice(message),
        headers: Vec::new(),
        timeout,
    }
}

/// The answers to calls `ids`, in their order, within five seconds.
fn answers(channel: &Channel, ids: &[u64]) -> Vec<Outcome> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut kept = Vec::new();
    while kept.len() < ids.len() {
        kept.extend(channel.take());
        assert!(
            Instant::now() < deadline,
            "no answer to some of {ids:?} in 5 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    ids.iter()
        .map(|id| {
            let at = kept
                .iter()
                .position(|(answered, _)| answered == id)
                .unwrap();
            kept.swap_remove(at).1
        })
        .collect()
}

/// The answer to call `id`, within five seconds.
fn answer(channel: &Channel, id: u64) -> Outcome {
    answers(channel, &[id]).remove(0)
}

/// The engine's receiver, answering every call with `answer(its request)` on a thread until
/// dropped.
struct Downstream {
    server: Arc<Server>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Downstream {
    fn start(port: u16, answer: impl Fn(&[u8]) -> Option<Outcome> + Send + 'static) -> Self {
        let server = Server::bind(
            &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
            port,
            Limits::new(8 << 20, 64 << 20),
            &METHODS,
        )
        .unwrap();
        server.start().unwrap();
        let server = Arc::new(server);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (server, stop) = (Arc::clone(&server), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut unanswered = Vec::new(); // replies kept unsent (answer None) until stop
                while !stop.load(Ordering::Relaxed) {
                    for call in server.take().calls {
                        match answer(&call.message.to_bytes()) {
                            Some(outcome) => {
                                call.reply.send(outcome);
                            }
                            None => unanswered.push(call.reply),
                        }
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        };
        Downstream {
            server,
            stop,
            thread: Some(thread),
        }
    }

    fn target(&self) -> String {
        self.server.addresses()[0].to_string()
    }
}

impl Drop for Downstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.server.shutdown(Duration::ZERO);
    }
}

#[test]
fn a_request_goes_byte_for_byte_and_the_response_comes_back() {
    let downstream = Downstream::start(0, |request| {
        let mut response = b"seen ".to_vec();
        response.extend_from_slice(request);
        Some(Outcome::ok(response))
    });
    let channel = Channel::new(&downstream.target(), Options::default()).unwrap();
    let request: Vec<u8> = (0..3_000_000u32).map(|at| (at % 251) as u8).collect();
    let ids: Vec<u64> = (0..4)
        .map(|_| channel.call(call(&request, Duration::from_secs(5))))
        .collect();
    for outcome in answers(&channel, &ids) {
        assert_eq!(outcome.code, code::OK, "{}", outcome.message);
        assert_eq!(&outcome.response[..5], b"seen ");
        assert!(outcome.response[5..] == request[..]);
    }
    channel.close();
}

#[test]
fn a_refusal_comes_back_with_its_code_message_and_retry_info() {
    let busy = Outcome::busy("too busy to take it", Duration::from_millis(1500));
    let expected = busy.clone();
    let downstream = Downstream::start(0, move |_| Some(busy.clone()));
    let channel = Channel::new(&downstream.target(), Options::default()).unwrap();
    let outcome = answer(
        &channel,
        channel.call(call(b"spans", Duration::from_secs(5))),
    );
    assert_eq!(outcome.code, code::RESOURCE_EXHAUSTED);
    assert_eq!(outcome.message, "too busy to take it");
    assert_eq!(outcome.details, expected.details);
    assert!(outcome.details.is_some());
}

#[test]
fn a_downstream_that_does_not_answer_is_deadline_exceeded_at_the_deadline() {
    let downstream = Downstream::start(0, |_| None);
    let channel = Channel::new(&downstream.target(), Options::default()).unwrap();
    let started = Instant::now();
    let outcome = answer(
        &channel,
        channel.call(call(b"spans", Duration::from_millis(300))),
    );
    let took = started.elapsed();
    assert_eq!(outcome.code, code::DEADLINE_EXCEEDED);
    assert!(took >= Duration::from_millis(290), "{took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[test]
fn a_request_over_the_limit_is_refused_in_grpc_core_words() {
    let channel = Channel::new(
        "127.0.0.1:9",
        Options {
            max_send_bytes: 100,
            ..Options::default()
        },
    )
    .unwrap();
    let outcome = answer(
        &channel,
        channel.call(call(&[7u8; 101], Duration::from_secs(5))),
    );
    assert_eq!(outcome.code, code::RESOURCE_EXHAUSTED);
    assert_eq!(
        outcome.message,
        "Sent message larger than max (101 vs. 100)"
    );
}

#[test]
fn an_unreachable_downstream_is_unavailable_and_reached_once_it_listens() {
    let port = StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // a port nobody listens on now
    let channel = Channel::new(&format!("127.0.0.1:{port}"), Options::default()).unwrap();
    let outcome = answer(
        &channel,
        channel.call(call(b"spans", Duration::from_secs(5))),
    );
    assert_eq!(outcome.code, code::UNAVAILABLE, "{}", outcome.message);
    let downstream = Downstream::start(port, |_| Some(Outcome::ok(b"ok".to_vec())));
    let deadline = Instant::now() + Duration::from_secs(8);
    loop {
        let outcome = answer(
            &channel,
            channel.call(call(b"spans", Duration::from_secs(5))),
        );
        if outcome.code == code::OK {
            assert_eq!(outcome.response, b"ok");
            break;
        }
        assert_eq!(outcome.code, code::UNAVAILABLE, "{}", outcome.message);
        assert!(Instant::now() < deadline, "not reconnected in 8 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(downstream);
}

/// What the h2 server written here saw of one call.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

/// An h2 server on its own thread that records every call and answers OK with a gzipped
/// response message (`grpc-encoding: gzip`), counting the connections it accepted.
struct Recorder {
    address: SocketAddr,
    connections: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Recorder {
    fn start(response: &'static [u8]) -> Self {
        let listener = StdListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let address = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = {
            let (connections, seen) = (Arc::clone(&connections), Arc::clone(&seen));
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    let accepting = async {
                        loop {
                            let (socket, _) = listener.accept().await.unwrap();
                            connections.fetch_add(1, Ordering::Relaxed);
                            tokio::spawn(serve(socket, Arc::clone(&seen), response));
                        }
                    };
                    tokio::select! {
                        () = accepting => {}
                        _ = stopped => {}
                    }
                });
            })
        };
        Recorder {
            address,
            connections,
            seen,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    socket: tokio::net::TcpStream,
    seen: Arc<Mutex<Vec<Seen>>>,
    response: &'static [u8],
) {
    let Ok(mut connection) = h2::server::handshake(socket).await else {
        return;
    };
    // Each call on a task of its own: the connection is driven only while it is polled here.
    while let Some(Ok((request, reply))) = connection.accept().await {
        tokio::spawn(answer_call(request, reply, Arc::clone(&seen), response));
    }
}

async fn answer_call(
    request: http::Request<h2::RecvStream>,
    mut reply: h2::server::SendResponse<Bytes>,
    seen: Arc<Mutex<Vec<Seen>>>,
    response: &[u8],
) {
    let (head, mut body) = request.into_parts();
    let mut data = Vec::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    seen.lock().unwrap().push(Seen {
        path: head.uri.path().to_owned(),
        headers: head.headers,
        body: data,
    });
    let mut gzipped = GzEncoder::new(Vec::new(), Compression::default());
    gzipped.write_all(response).unwrap();
    let gzipped = gzipped.finish().unwrap();
    let mut framed = vec![1u8];
    framed.extend_from_slice(&(gzipped.len() as u32).to_be_bytes());
    framed.extend_from_slice(&gzipped);
    let head = Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-encoding", "gzip")
        .body(())
        .unwrap();
    let mut stream = reply.send_response(head, false).unwrap();
    stream.send_data(Bytes::from(framed), false).unwrap();
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    stream.send_trailers(trailers).unwrap();
}

#[test]
fn calls_share_one_connection_carry_their_metadata_and_deadline_and_gzip_both_ways() {
    let recorder = Recorder::start(b"the response");
    let channel = Channel::new(
        &recorder.address.to_string(),
        Options {
            gzip: true,
            ..Options::default()
        },
    )
    .unwrap();
    let request = b"spans spans spans spans spans spans".repeat(1000);
    for round in 0..3 {
        let ids: Vec<u64> = (0..4)
            .map(|index| {
                channel.call(Call {
                    method: TRACES.to_owned(),
                    message: Bytes::from(request.clone()),
                    headers: vec![
                        (
                            "x-scope-orgid".to_owned(),
                            format!("tenant-{round}-{index}"),
                        ),
                        ("x-scope-orgid".to_owned(), "second".to_owned()),
                    ],
                    timeout: Duration::from_secs(5),
                })
            })
            .collect();
        for outcome in answers(&channel, &ids) {
            assert_eq!(outcome.code, code::OK, "{}", outcome.message);
            assert_eq!(outcome.response, b"the response");
        }
    }
    assert_eq!(recorder.connections.load(Ordering::Relaxed), 1);
    let seen = recorder.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 12);
    for call in &seen {
        assert_eq!(call.path, TRACES);
        assert_eq!(call.headers["content-type"], "application/grpc");
        assert_eq!(call.headers["te"], "trailers");
        assert_eq!(call.headers["grpc-encoding"], "gzip");
        let timeout = call.headers["grpc-timeout"].to_str().unwrap();
        assert!(
            timeout.ends_with('u') || timeout.ends_with('m'),
            "{timeout}"
        );
        let tenants: Vec<_> = call.headers.get_all("x-scope-orgid").iter().collect();
        assert_eq!(tenants.len(), 2);
        assert!(tenants[0].to_str().unwrap().starts_with("tenant-"));
        assert_eq!(tenants[1], "second");
        assert_eq!(call.body[0], 1, "the compressed flag");
        let length = u32::from_be_bytes(call.body[1..5].try_into().unwrap()) as usize;
        assert_eq!(length, call.body.len() - 5);
        assert!(length < request.len() / 10, "gzipped: {length} bytes");
        let mut inflated = Vec::new();
        GzDecoder::new(&call.body[5..])
            .read_to_end(&mut inflated)
            .unwrap();
        assert_eq!(inflated, request);
    }
}
