//! The tonic receiver (`tonic-receiver` feature) against a real tonic client on 127.0.0.1: an
//! OTLP export reaches the engine through the same inbox as the h2 receiver's, and the budget,
//! the size limit and gzip are answered as the h2 receiver answers them.
#![cfg(feature = "tonic-receiver")]

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::{Buf, BufMut};
use common::counted::Counted;
use common::spans::{encode, span};
use http::uri::PathAndQuery;
use otel_guard_engine::graph::{Engine, Limits as EngineLimits};
use otel_guard_engine::grpc::{Limits, METHODS, Outcome, Server, Transport};
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Request and response messages as bytes, on the client's side.
#[derive(Clone, Copy)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// The server, and a thread that takes its calls as the Python service does: each trace
/// request into one engine, answered OK (an empty ExportTraceServiceResponse).
struct Served {
    server: Arc<Server>,
    taker: Option<JoinHandle<Counted>>,
    stop: Arc<AtomicBool>,
}

impl Served {
    fn start(limits: Limits, taking: bool) -> Self {
        let server = Server::bind(&[IpAddr::V4(Ipv4Addr::LOCALHOST)], 0, limits, &METHODS)
            .unwrap()
            .with_transport(Transport::Tonic);
        server.start().unwrap();
        let server = Arc::new(server);
        let stop = Arc::new(AtomicBool::new(false));
        let taker = taking.then(|| {
            let (server, stop) = (Arc::clone(&server), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut engine = Engine::new(EngineLimits::default()).unwrap();
                let mut counted = Counted::default();
                while !stop.load(Ordering::Relaxed) {
                    for call in server.take().calls {
                        let events = engine.ingest(&call.message.to_bytes(), 0.0).unwrap();
                        counted.add(&events);
                        call.reply.send(Outcome::ok(Vec::new()));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                counted.add(&engine.expire(1e12));
                counted
            })
        });
        Served {
            server,
            taker,
            stop,
        }
    }

    fn counted(mut self) -> Counted {
        self.stop.store(true, Ordering::Relaxed);
        let counted = self.taker.take().unwrap().join().unwrap();
        self.server.shutdown(Duration::ZERO);
        counted
    }
}

async fn export(server: &Server, message: Vec<u8>, gzip: bool) -> Result<Vec<u8>, Status> {
    let address = format!("http://{}", server.addresses()[0]);
    let channel = Channel::from_shared(address)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = tonic::client::Grpc::new(channel);
    if gzip {
        client = client.send_compressed(CompressionEncoding::Gzip);
    }
    client.ready().await.unwrap();
    let mut request = tonic::Request::new(message);
    request.set_timeout(Duration::from_secs(5));
    client
        .unary(request, PathAndQuery::from_static(METHODS[0]), Raw)
        .await
        .map(tonic::Response::into_inner)
}

/// planner > budget > planner, as pydantic-ai's spans.
fn a_loop(trace: u64) -> Vec<u8> {
    encode(&[(
        "pydantic-ai",
        vec![
            span(trace, 1, None, "invoke_agent planner", 10),
            span(trace, 2, Some(1), "invoke_agent budget", 20),
            span(trace, 3, Some(2), "invoke_agent planner", 30),
        ],
    )])
}

#[tokio::test]
async fn an_export_through_tonic_reaches_the_engine_plain_and_gzip() {
    let served = Served::start(Limits::new(4 << 20, 64 << 20), true);
    assert_eq!(
        export(&served.server, a_loop(1), false).await.unwrap(),
        Vec::<u8>::new()
    );
    assert_eq!(
        export(&served.server, a_loop(2), true).await.unwrap(),
        Vec::<u8>::new()
    );
    let counted = served.counted();
    assert_eq!(
        counted.cycles.keys().collect::<Vec<_>>(),
        [&(
            "cross_function".to_owned(),
            "planner>budget>planner".to_owned()
        )]
    );
    assert_eq!(
        counted.cycles.values().next().map(Vec::len),
        Some(2),
        "{counted:?}"
    );
}

#[tokio::test]
async fn a_message_over_the_limit_is_refused_from_its_prefix() {
    let served = Served::start(Limits::new(1000, 64 << 20), true);
    let refused = export(&served.server, vec![0x0a; 5000], false)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(
        refused.message(),
        "Received message larger than max (5000 vs. 1000)"
    );
    assert!(refused.details().is_empty());
    served.counted();
}

#[tokio::test]
async fn a_call_the_budget_cannot_hold_is_refused_busy_with_a_retry_delay() {
    // Nothing is taken: the first call holds its bytes, the second finds the budget full.
    let served = Served::start(Limits::new(1 << 20, 100 << 10), false);
    let first = tokio::spawn({
        let server = Arc::clone(&served.server);
        async move { export(&server, vec![0x0a; 80 << 10], false).await }
    });
    let mut held = 0;
    for _ in 0..500 {
        held = served.server.budget().used();
        if held >= 80 << 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(held >= 80 << 10, "the first call holds {held} bytes");
    let refused = export(&served.server, vec![0x0a; 40 << 10], false)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("max_pending_bytes"),
        "{refused:?}"
    );
    assert!(!refused.details().is_empty(), "no RetryInfo");
    assert_eq!(served.server.refused_busy(), 1);
    served.server.shutdown(Duration::ZERO);
    // Unanswered at stop: UNAVAILABLE, which clients retry.
    let first = first.await.unwrap().unwrap_err();
    assert!(
        matches!(
            first.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled
        ),
        "{first:?}"
    );
    drop(served.server.take());
    assert_eq!(served.server.budget().used(), 0);
}

#[tokio::test]
async fn an_unended_call_holds_its_declared_length_from_its_prefix() {
    let (size, sent) =
        std::env::var("DBG").map_or((600u32 << 10, 1000), |_| ((16u32 << 20) - 64, 1 << 20));
    let served = Served::start(Limits::new(16 << 20, 128 << 20), false);
    let socket = tokio::net::TcpStream::connect(served.server.addresses()[0])
        .await
        .unwrap();
    let (client, connection) = h2::client::handshake(socket).await.unwrap();
    tokio::spawn(connection);
    let request = http::Request::post(format!("http://localhost{}", METHODS[0]))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (_response, mut stream) = client
        .ready()
        .await
        .unwrap()
        .send_request(request, false)
        .unwrap();
    let mut body = vec![0u8];
    body.extend_from_slice(&size.to_be_bytes());
    body.resize(5 + sent, 0x0a);
    stream.send_data(bytes::Bytes::from(body), false).unwrap();
    let mut held = 0;
    for _ in 0..300 {
        held = served.server.budget().used();
        if held > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(held, size as usize);
    served.server.shutdown(Duration::ZERO);
}

#[tokio::test]
async fn a_gzip_message_inflating_past_its_limit_is_refused() {
    let mut limits = Limits::new(1 << 20, 64 << 20);
    limits.max_inflated_bytes = 10_000;
    let served = Served::start(limits, true);
    let refused = export(&served.server, vec![0x0a; 50_000], true)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(
        refused.message(),
        "Received message larger than max (50000 vs. 10000)"
    );
    // Within it, the same message arrives whole.
    assert_eq!(
        export(&served.server, a_loop(3), true).await.unwrap(),
        Vec::<u8>::new()
    );
    served.counted();
}
