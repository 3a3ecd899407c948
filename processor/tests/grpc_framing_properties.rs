//! The gRPC receiver's HTTP/2 framing, fuzzed over a real socket on 127.0.0.1: sequences of frames
//! a hostile or broken sender writes (valid and invalid SETTINGS, HEADERS with hand-encoded HPACK,
//! DATA with any gRPC length prefix, resets, window updates, pings, GOAWAY, CONTINUATION, unknown
//! types, garbage, cut anywhere). After each sequence the connection is closed, and the receiver must
//! hold no byte of it and still answer a well-formed call.
//!
//! What a reader would not guess: the cases run against one server, so anything a sequence leaks
//! (bytes in the budget, a stuck task, a dead accept loop) fails the next check, not only its own.
//! `PROPTEST_CASES` runs more cases than the default (scripts/check keeps the default).
#![cfg(feature = "grpc")]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use otel_guard_engine::grpc::{Limits, METHODS, Outcome, Server, code};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const MAX_MESSAGE: usize = 64 << 10;

// --- frames written by hand ---------------------------------------------------------------------

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = payload.len().min(0xff_ffff) as u32;
    let mut out = length.to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend((stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(&payload[..length as usize]);
    out
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 §5.1), the prefix's other bits zero.
fn hpack_int(value: usize, n: u32, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(value as u8);
        return;
    }
    out.push(max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128 + 128) as u8);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// A header block of literal fields without indexing, new names, no Huffman (RFC 7541 §6.2.2).
fn header_block(headers: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        out.push(0);
        hpack_int(name.len(), 7, &mut out);
        out.extend_from_slice(name.as_bytes());
        hpack_int(value.len(), 7, &mut out);
        out.extend_from_slice(value.as_bytes());
    }
    out
}

fn call_headers(path: &str) -> Vec<(String, String)> {
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    .iter()
    .map(|(name, value)| (name.to_string(), value.to_string()))
    .collect()
}

// --- what a sender may write ----------------------------------------------------------------------

fn stream_id() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), Just(1), Just(3), Just(5), Just(2), any::<u32>()]
}

fn headers_frame() -> impl Strategy<Value = Vec<u8>> {
    let path = prop_oneof![
        Just(METHODS[0].to_string()),
        Just(METHODS[1].to_string()),
        Just("/some.Service/Method".to_string()),
        "[ -~]{0,40}",
    ];
    let extra = prop::collection::vec(
        (
            prop_oneof![
                Just("grpc-encoding".to_string()),
                Just("grpc-timeout".to_string()),
                Just("content-type".to_string()),
                Just(":path".to_string()),
                Just("content-length".to_string()),
                "[a-z:-]{0,12}",
            ],
            prop_oneof![
                Just("gzip".to_string()),
                Just("identity".to_string()),
                Just("1S".to_string()),
                Just("99999999n".to_string()),
                "[ -~]{0,24}",
            ],
        ),
        0..3,
    );
    (stream_id(), path, extra, any::<u8>()).prop_map(|(stream, path, extra, flags)| {
        let mut headers = call_headers(&path);
        headers.extend(extra);
        // END_HEADERS usually set; END_STREAM, PADDED and PRIORITY as they fall.
        let flags = flags | if flags & 0x80 == 0 { 0x4 } else { 0 };
        frame(0x1, flags & 0x2d, stream, &header_block(&headers))
    })
}

/// DATA carrying a gRPC message prefix (any flag, any declared length) and some of its bytes.
fn data_frame() -> impl Strategy<Value = Vec<u8>> {
    let declared = prop_oneof![
        0u32..64,
        Just(MAX_MESSAGE as u32),
        Just(MAX_MESSAGE as u32 + 1),
        any::<u32>()
    ];
    (
        stream_id(),
        any::<u8>(),
        declared,
        prop::collection::vec(any::<u8>(), 0..600),
        any::<bool>(),
    )
        .prop_map(|(stream, flag, declared, body, end)| {
            let mut payload = vec![flag % 3];
            payload.extend(declared.to_be_bytes());
            payload.extend(body);
            frame(0x0, u8::from(end), stream, &payload)
        })
}

fn other_frame() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // SETTINGS: known and unknown ids, values past their bounds, an ACK with a payload.
        (
            prop::collection::vec((0u16..10, any::<u32>()), 0..4),
            any::<bool>()
        )
            .prop_map(|(pairs, ack)| {
                let payload: Vec<u8> = pairs
                    .iter()
                    .flat_map(|(id, value)| id.to_be_bytes().into_iter().chain(value.to_be_bytes()))
                    .collect();
                frame(0x4, u8::from(ack), 0, &payload)
            }),
        (stream_id(), any::<u32>()).prop_map(|(s, inc)| frame(0x8, 0, s, &inc.to_be_bytes())),
        (stream_id(), any::<u32>()).prop_map(|(s, code)| frame(0x3, 0, s, &code.to_be_bytes())),
        (any::<bool>(), prop::collection::vec(any::<u8>(), 0..12)).prop_map(|(ack, data)| frame(
            0x6,
            u8::from(ack),
            0,
            &data
        )),
        (any::<u32>(), any::<u32>()).prop_map(|(last, code)| {
            let mut payload = last.to_be_bytes().to_vec();
            payload.extend(code.to_be_bytes());
            frame(0x7, 0, 0, &payload)
        }),
        (stream_id(), prop::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(s, data)| frame(0x9, 0x4, s, &data)),
        (stream_id(), prop::collection::vec(any::<u8>(), 0..8))
            .prop_map(|(s, data)| frame(0x2, 0, s, &data)),
        (
            any::<u8>(),
            any::<u8>(),
            stream_id(),
            prop::collection::vec(any::<u8>(), 0..256)
        )
            .prop_map(|(kind, flags, s, data)| frame(kind, flags, s, &data)),
        prop::collection::vec(any::<u8>(), 1..64),
    ]
}

/// One item of a connection: a well-formed Export call (on the next odd stream), or any frame.
#[derive(Debug, Clone)]
enum Item {
    /// The message, in how many DATA frames, its declared length off by, its compression flag.
    Call(Vec<u8>, usize, i64, u8),
    Frame(Vec<u8>),
}

fn item() -> impl Strategy<Value = Item> {
    let call = (
        prop::collection::vec(any::<u8>(), 0..2000),
        1usize..4,
        prop_oneof![8 => Just(0i64), 1 => Just(-1), 1 => Just(1)],
        prop_oneof![9 => Just(0u8), 1 => Just(1)],
    )
        .prop_map(|(message, pieces, off, flag)| Item::Call(message, pieces, off, flag));
    let noise = prop_oneof![headers_frame(), data_frame(), other_frame()].prop_map(Item::Frame);
    prop_oneof![6 => call, 4 => noise]
}

fn whole_call(stream: u32, message: &[u8], pieces: usize, off: i64, flag: u8) -> Vec<u8> {
    let mut out = frame(0x1, 0x4, stream, &header_block(&call_headers(METHODS[0])));
    let mut body = vec![flag];
    body.extend(((message.len() as i64 + off).max(0) as u32).to_be_bytes());
    body.extend(message);
    let size = body.len().div_ceil(pieces).max(1);
    let chunks: Vec<&[u8]> = body.chunks(size).collect();
    for (index, chunk) in chunks.iter().enumerate() {
        out.extend(frame(
            0x0,
            u8::from(index + 1 == chunks.len()),
            stream,
            chunk,
        ));
    }
    out
}

/// A connection's bytes: the preface (usually), calls and frames, perhaps cut short.
fn connection() -> impl Strategy<Value = Vec<u8>> {
    let items = prop::collection::vec(item(), 0..16);
    (any::<u8>(), items, any::<Option<prop::sample::Index>>()).prop_map(|(p, items, cut)| {
        let mut bytes = if p < 230 {
            PREFACE.to_vec()
        } else {
            PREFACE[..usize::from(p) % PREFACE.len()].to_vec()
        };
        bytes.extend(frame(0x4, 0, 0, &[])); // the client's SETTINGS, as every client sends first
        let mut stream = 1;
        for item in items {
            match item {
                Item::Call(message, pieces, off, flag) => {
                    bytes.extend(whole_call(stream, &message, pieces, off, flag));
                    stream += 2;
                }
                Item::Frame(written) => bytes.extend(written),
            }
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        bytes
    })
}

// --- the checks -----------------------------------------------------------------------------------

/// Answer every call the server takes (OK, empty) until `stop`, as the processor's Python side does,
/// counting them in `answered`.
fn answer_everything(
    server: Arc<Server>,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            for call in server.take().calls {
                call.reply.send(Outcome::ok(Vec::new()));
                answered.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    })
}

async fn send_raw(server: &Server, bytes: &[u8]) {
    let Ok(mut socket) = TcpStream::connect(server.addresses()[0]).await else {
        return;
    };
    // The server may close the connection at any byte: a refused write is an answer, not a failure.
    let _ = tokio::time::timeout(Duration::from_secs(2), socket.write_all(bytes)).await;
    let mut sink = vec![0u8; 16 << 10];
    let deadline = Instant::now() + Duration::from_millis(60);
    while let Ok(Ok(read)) = tokio::time::timeout_at(
        tokio::time::Instant::from_std(deadline),
        socket.read(&mut sink),
    )
    .await
    {
        if read == 0 {
            break;
        }
    }
}

/// A well-formed Export call over a new connection: its grpc-status, within 5 s.
async fn healthy_call(server: &Server) -> Result<u32, String> {
    let socket = TcpStream::connect(server.addresses()[0])
        .await
        .map_err(|e| e.to_string())?;
    let (client, connection) = h2::client::handshake(socket)
        .await
        .map_err(|e| e.to_string())?;
    let driving = tokio::spawn(connection);
    let request = Request::post(format!("http://localhost{}", METHODS[0]))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), async move {
        let mut client = client.ready().await.map_err(|e| e.to_string())?;
        let (response, mut stream) = client
            .send_request(request, false)
            .map_err(|e| e.to_string())?;
        stream
            .send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true)
            .map_err(|e| e.to_string())?;
        let response = response.await.map_err(|e| e.to_string())?;
        if let Some(status) = response.headers().get("grpc-status") {
            return Ok(status.to_str().unwrap_or("?").parse().unwrap_or(u32::MAX));
        }
        let mut body = response.into_body();
        while let Some(chunk) = body.data().await {
            let _ = chunk.map_err(|e| e.to_string())?;
        }
        let trailers = body.trailers().await.map_err(|e| e.to_string())?;
        let status = trailers
            .and_then(|t| t.get("grpc-status").cloned())
            .ok_or("no grpc-status")?;
        Ok(status.to_str().unwrap_or("?").parse().unwrap_or(u32::MAX))
    })
    .await
    .map_err(|_| "no answer within 5 s".to_string())?;
    driving.abort();
    answer
}

async fn held_bytes_return_to_zero(server: &Server) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.budget().used() > 0 {
        if Instant::now() > deadline {
            return Err(format!(
                "{} bytes still held 5 s after the connection closed",
                server.budget().used()
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

#[test]
fn any_framing_leaves_nothing_held_and_the_receiver_answering() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(64);
    let mut limits = Limits::new(MAX_MESSAGE, 1 << 20);
    limits.read_timeout = Duration::from_secs(2);
    let server =
        Arc::new(Server::bind(&[IpAddr::V4(Ipv4Addr::LOCALHOST)], 0, limits, &METHODS).unwrap());
    server.start().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let answering = answer_everything(
        Arc::clone(&server),
        Arc::clone(&stop),
        Arc::clone(&answered),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 64,
        ..Config::default()
    });
    let result = runner.run(&connection(), |bytes| {
        runtime.block_on(async {
            send_raw(&server, &bytes).await;
            held_bytes_return_to_zero(&server)
                .await
                .map_err(TestCaseError::fail)?;
            let status = healthy_call(&server).await.map_err(TestCaseError::fail)?;
            prop_assert_eq!(status, code::OK);
            Ok(())
        })
    });
    stop.store(true, Ordering::Relaxed);
    answering.join().unwrap();
    server.shutdown(Duration::ZERO);
    result.unwrap();
    // Each case ends in one healthy call; the rest are calls the fuzzed bytes made whole.
    let fuzzed_calls = answered
        .load(Ordering::Relaxed)
        .saturating_sub(cases as usize);
    eprintln!("{cases} sequences; {fuzzed_calls} of their calls reached take()");
}
