//! The gRPC receiver's transport against a real HTTP/2 client on 127.0.0.1: what a call carries to
//! `take()`, and how each malformed call is answered without reaching it.
#![cfg(feature = "grpc")]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use http::{HeaderMap, Request};
use otel_guard_engine::grpc::{Arrived, Limits, METHODS, Outcome, Server, code};
use tokio::net::TcpStream;

const TRACES: &str = METHODS[0];

fn server(max: usize) -> Arc<Server> {
    server_within(Limits::new(max, 64 << 20))
}

fn server_within(limits: Limits) -> Arc<Server> {
    let server = Server::bind(&[IpAddr::V4(Ipv4Addr::LOCALHOST)], 0, limits, &METHODS).unwrap();
    server.start().unwrap();
    Arc::new(server)
}

async fn client(server: &Server) -> SendRequest<Bytes> {
    let socket = TcpStream::connect(server.addresses()[0]).await.unwrap();
    let (client, connection) = h2::client::handshake(socket).await.unwrap();
    tokio::spawn(connection);
    client
}

fn framed(flag: u8, message: &[u8]) -> Bytes {
    let mut body = vec![flag];
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(message);
    Bytes::from(body)
}

/// The answer to a call: the status, its message, and the response's message on OK.
#[derive(Debug)]
struct Answer {
    status: u32,
    message: String,
    body: Vec<u8>,
}

fn status_of(headers: &HeaderMap) -> Option<(u32, String)> {
    let status = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let message = headers
        .get("grpc-message")
        .map(|value| value.to_str().unwrap().to_owned())
        .unwrap_or_default();
    Some((status, message))
}

async fn call(
    client: &mut SendRequest<Bytes>,
    path: &str,
    headers: &[(&str, &str)],
    chunks: &[Bytes],
) -> Answer {
    let mut request = Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let (response, mut stream) = client
        .clone()
        .ready()
        .await
        .unwrap()
        .send_request(request.body(()).unwrap(), chunks.is_empty())
        .unwrap();
    for (index, chunk) in chunks.iter().enumerate() {
        stream
            .send_data(chunk.clone(), index + 1 == chunks.len())
            .unwrap();
    }
    answer_of(response).await
}

/// The answer a response brings: its status from the headers (trailers only) or the trailers.
async fn answer_of(response: h2::client::ResponseFuture) -> Answer {
    let response = response.await.unwrap();
    if let Some((status, message)) = status_of(response.headers()) {
        return Answer {
            status,
            message,
            body: Vec::new(),
        };
    }
    let mut body = response.into_body();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let (status, message) = status_of(&body.trailers().await.unwrap().unwrap()).unwrap();
    Answer {
        status,
        message,
        body: data,
    }
}

/// What `take()` has within five seconds (polled, the clients' tasks running meanwhile; the tests
/// do not watch the wake-up socket).
async fn taken(server: &Server, calls: usize, cancelled: usize) -> Arrived {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut all = Arrived::default();
    while (all.calls.len() < calls || all.cancelled.len() < cancelled) && Instant::now() < deadline
    {
        let arrived = server.take();
        all.calls.extend(arrived.calls);
        all.cancelled.extend(arrived.cancelled);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    all
}

#[tokio::test]
async fn a_call_reaches_take_whole_and_is_answered_with_its_reply() {
    let server = server(1 << 20);
    let mut client = client(&server).await;
    let message = vec![7u8; 300_000]; // more than a window and a frame
    let chunks: Vec<Bytes> = framed(0, &message)
        .chunks(16_384)
        .map(Bytes::copy_from_slice)
        .collect();
    let answering = tokio::spawn(async move { call(&mut client, TRACES, &[], &chunks).await });
    let call_taken = taken(&server, 1, 0).await.calls.pop().unwrap();
    assert_eq!(
        (call_taken.method, &call_taken.message.to_bytes()[..]),
        (0, &message[..])
    );
    assert!(call_taken.reply.send(Outcome::ok(b"response".to_vec())));
    let answer = answering.await.unwrap();
    assert_eq!(
        (answer.status, answer.body),
        (code::OK, framed(0, b"response").to_vec())
    );
    server.shutdown(Duration::ZERO);
}

#[tokio::test]
async fn an_error_is_answered_with_its_status_message_and_details() {
    let server = server(1 << 20);
    let mut client = client(&server).await;
    let answering =
        tokio::spawn(async move { call(&mut client, METHODS[2], &[], &[framed(0, b"")]).await });
    let mut arrived = taken(&server, 1, 0).await;
    let call_taken = arrived.calls.pop().unwrap();
    assert_eq!(call_taken.method, 2);
    let mut busy = Outcome::error(code::RESOURCE_EXHAUSTED, "busy: 100% full");
    busy.details = Some(vec![1, 2, 3]);
    assert!(call_taken.reply.send(busy));
    let answer = answering.await.unwrap();
    assert_eq!(
        (answer.status, answer.message.as_str()),
        (code::RESOURCE_EXHAUSTED, "busy: 100%25 full")
    );
}

/// A malformed call: its path, headers and body, and the status and words it is answered with.
type Malformed<'a> = (&'a str, &'a [(&'a str, &'a str)], Vec<Bytes>, u32, &'a str);

#[tokio::test]
async fn malformed_calls_are_answered_without_reaching_take() {
    let server = server(1000);
    let mut client = client(&server).await;
    let cut = framed(0, b"abcdef");
    let cases: [Malformed; 7] = [
        (
            "/some.Service/Method",
            &[],
            vec![framed(0, b"")],
            code::UNIMPLEMENTED,
            "no method",
        ),
        (
            TRACES,
            &[("grpc-encoding", "snappy")],
            vec![framed(1, b"x")],
            code::UNIMPLEMENTED,
            "snappy",
        ),
        (
            TRACES,
            &[],
            vec![framed(1, b"x")],
            code::INTERNAL,
            "no grpc-encoding",
        ),
        (
            TRACES,
            &[],
            vec![cut.slice(..8)],
            code::INTERNAL,
            "ended after 3 of its 6 bytes",
        ),
        (
            TRACES,
            &[],
            vec![framed(0, b"a"), framed(0, b"b")],
            code::UNIMPLEMENTED,
            "more than one",
        ),
        (
            TRACES,
            &[],
            vec![framed(0, &[0; 1001])],
            code::RESOURCE_EXHAUSTED,
            "(1001 vs. 1000)",
        ),
        (
            TRACES,
            &[("grpc-encoding", "gzip")],
            vec![framed(1, b"not gzip")],
            code::INTERNAL,
            "gzip",
        ),
    ];
    for (path, headers, chunks, status, message) in cases {
        let answer = call(&mut client, path, headers, &chunks).await;
        assert_eq!(answer.status, status, "{path} {headers:?}: {answer:?}");
        assert!(answer.message.contains(message), "{answer:?}");
    }
    assert!(server.take().calls.is_empty());
    server.shutdown(Duration::ZERO);
}

#[tokio::test]
async fn a_call_its_client_resets_is_reported_cancelled() {
    let server = server(1 << 20);
    let client = client(&server).await;
    let request = Request::post(format!("http://localhost{TRACES}"))
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let (_, mut stream) = client
        .ready()
        .await
        .unwrap()
        .send_request(request, false)
        .unwrap();
    stream.send_data(framed(0, b"spans"), true).unwrap();
    let first = taken(&server, 1, 0).await;
    let id = first.calls[0].id;
    stream.send_reset(h2::Reason::CANCEL);
    let then = taken(&server, 0, 1).await;
    assert_eq!(then.cancelled, vec![id]);
}

#[tokio::test]
async fn shutdown_lets_a_call_in_flight_finish_then_answers_the_rest_unavailable() {
    let server = server(1 << 20);
    let mut first_client = client(&server).await;
    let mut second_client = client(&server).await;
    let first =
        tokio::spawn(async move { call(&mut first_client, TRACES, &[], &[framed(0, b"1")]).await });
    let second =
        tokio::spawn(
            async move { call(&mut second_client, TRACES, &[], &[framed(0, b"2")]).await },
        );
    let mut arrived = taken(&server, 2, 0).await;
    // One is answered while the shutdown waits; the other is never answered, and the grace ends.
    let answered = arrived.calls.remove(0);
    let unanswered = arrived.calls.remove(0);
    let stopping = Arc::clone(&server);
    let started = Instant::now();
    let shutdown =
        tokio::task::spawn_blocking(move || stopping.shutdown(Duration::from_millis(300)));
    assert!(answered.reply.send(Outcome::ok(Vec::new())));
    shutdown.await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(!unanswered.reply.send(Outcome::ok(Vec::new())));
    let answers = [first.await, second.await];
    let statuses: Vec<Option<u32>> = answers
        .iter()
        .map(|answer| answer.as_ref().ok().map(|answer| answer.status))
        .collect();
    // The answered call got OK; the other one's connection was closed (a client error).
    assert!(statuses.contains(&Some(code::OK)), "{statuses:?}");
    assert!(TcpStream::connect(server.addresses()[0]).await.is_err());
}

#[tokio::test]
async fn a_call_whose_reply_is_dropped_unanswered_is_answered_unavailable() {
    let server = server(1 << 20);
    let mut client = client(&server).await;
    let answering =
        tokio::spawn(async move { call(&mut client, TRACES, &[], &[framed(0, b"")]).await });
    let arrived = taken(&server, 1, 0).await;
    drop(arrived);
    let answer = answering.await.unwrap();
    assert_eq!(answer.status, code::UNAVAILABLE, "{answer:?}");
}

fn limits(max: usize, held: usize) -> Limits {
    Limits::new(max, held)
}

/// A call's request sent, its body left open (`end` false) or ended; the answer's future.
async fn open_call(
    client: &SendRequest<Bytes>,
    headers: &[(&str, &str)],
    chunks: &[Bytes],
    end: bool,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let mut request = Request::post(format!("http://localhost{TRACES}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let (response, mut stream) = client
        .clone()
        .ready()
        .await
        .unwrap()
        .send_request(request.body(()).unwrap(), false)
        .unwrap();
    for (index, chunk) in chunks.iter().enumerate() {
        stream
            .send_data(chunk.clone(), end && index + 1 == chunks.len())
            .unwrap();
    }
    (response, stream)
}

/// The status of a trailers-only answer, and its `grpc-status-details-bin` decoded.
async fn refusal(response: h2::client::ResponseFuture) -> (u32, String, Vec<u8>) {
    use base64::Engine as _;
    let response = response.await.unwrap();
    let (status, message) = status_of(response.headers()).expect("a trailers-only answer");
    let details = response
        .headers()
        .get("grpc-status-details-bin")
        .map(|value| {
            base64::engine::general_purpose::STANDARD_NO_PAD
                .decode(value.as_bytes())
                .unwrap()
        })
        .unwrap_or_default();
    (status, message, details)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

#[tokio::test]
async fn calls_past_the_budget_are_refused_at_once_with_a_retry_delay() {
    // 2 MiB in all, a connection's share 1 MiB (and 5 bytes): calls of 600 kB, never taken.
    let server = server_within(limits(1 << 20, 2 << 20));
    let (first, second, third, fourth) = (
        client(&server).await,
        client(&server).await,
        client(&server).await,
        client(&server).await,
    );
    let call = framed(0, &[1; 600_000]);
    let mut waiting = Vec::new();
    for client in [&first, &second, &third] {
        waiting.push(open_call(client, &[], std::slice::from_ref(&call), true).await);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.budget().used() < 1_800_000 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        server.budget().used(),
        1_800_000,
        "three calls held, none taken"
    );
    // Past the first connection's share, then past the whole budget: refused at once.
    for client in [&first, &fourth] {
        let started = Instant::now();
        let (response, _stream) = open_call(client, &[], std::slice::from_ref(&call), true).await;
        let (status, message, details) = refusal(response).await;
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(status, code::RESOURCE_EXHAUSTED, "{message}");
        assert!(message.contains("retry later"), "{message}");
        assert!(contains(
            &details,
            b"type.googleapis.com/google.rpc.RetryInfo"
        ));
    }
    // Taken, the calls give their bytes back and the budget takes calls again.
    let arrived = taken(&server, 3, 0).await;
    assert_eq!(arrived.calls.len(), 3);
    drop(arrived);
    assert_eq!(server.budget().used(), 0);
    let (response, _stream) = open_call(&fourth, &[], &[call], true).await;
    let taken_again = taken(&server, 1, 0).await.calls.pop().unwrap();
    assert!(taken_again.reply.send(Outcome::ok(Vec::new())));
    assert_eq!(answer_of(response).await.status, code::OK);
}

#[tokio::test]
async fn unended_streams_are_in_the_budget_and_closed_after_read_timeout() {
    let mut bounds = limits(16 << 20, 64 << 20);
    bounds.read_timeout = Duration::from_millis(500);
    let server = server_within(bounds);
    let client = client(&server).await;
    let mut open = Vec::new();
    let mut start = framed(0, &[0; 20_000]).to_vec();
    start[1..5].copy_from_slice(&(16u32 << 20).to_be_bytes()); // declares 16 MiB, sends 20 kB
    let started = Instant::now();
    for _ in 0..48 {
        open.push(open_call(&client, &[], &[Bytes::from(start.clone())], false).await);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while server.budget().used() < 48 * 20_000 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(server.budget().used(), 48 * 20_000, "held, and counted");
    for (response, _stream) in open {
        let (status, message, _) = refusal(response).await;
        assert_eq!(status, code::DEADLINE_EXCEEDED, "{message}");
        assert!(message.contains("read_timeout"), "{message}");
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(server.budget().used(), 0);
}

#[tokio::test]
async fn grpc_timeout_is_honoured_while_reading_and_while_waiting_for_the_answer() {
    let server = server(1 << 20);
    let client = client(&server).await;
    // Never ended: answered at its deadline, not at read_timeout's 30 s.
    let started = Instant::now();
    let (half_open, _stream) = open_call(
        &client,
        &[("grpc-timeout", "200m")],
        &[framed(0, b"x").slice(..3)],
        false,
    )
    .await;
    let (status, _, _) = refusal(half_open).await;
    assert_eq!(status, code::DEADLINE_EXCEEDED);
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(started.elapsed() < Duration::from_secs(2));
    // Read whole but never answered: DEADLINE_EXCEEDED at its deadline, and reported cancelled.
    let started = Instant::now();
    let (waiting, _stream) = open_call(
        &client,
        &[("grpc-timeout", "300000u")],
        &[framed(0, b"spans")],
        true,
    )
    .await;
    let first = taken(&server, 1, 0).await;
    let (status, _, _) = refusal(waiting).await;
    assert_eq!(status, code::DEADLINE_EXCEEDED);
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        taken(&server, 0, 1).await.cancelled,
        vec![first.calls[0].id]
    );
    // A malformed one is refused.
    let (malformed, _stream) = open_call(
        &client,
        &[("grpc-timeout", "soon")],
        &[framed(0, b"")],
        true,
    )
    .await;
    assert_eq!(refusal(malformed).await.0, code::INTERNAL);
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// A connection that sends HTTP/2's preface and an empty SETTINGS, then nothing.
async fn idle_connection(server: &Server) -> TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut socket = TcpStream::connect(server.addresses()[0]).await.unwrap();
    socket.write_all(PREFACE).await.unwrap();
    socket
}

/// Whether the server closed `socket` within `within` (what it sent meanwhile read and dropped).
async fn closed_within(socket: &mut TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buffer = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, socket.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_idle_timeout() {
    let mut bounds = limits(1 << 20, 64 << 20);
    bounds.idle_timeout = Duration::from_millis(300);
    let server = server_within(bounds);
    let started = Instant::now();
    let mut socket = idle_connection(&server).await;
    assert!(closed_within(&mut socket, Duration::from_secs(5)).await);
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn at_the_connection_cap_the_idlest_connection_makes_room() {
    let mut bounds = limits(1 << 20, 64 << 20);
    bounds.max_connections = 8;
    let server = server_within(bounds);
    let mut flood = Vec::new();
    for _ in 0..50 {
        flood.push(idle_connection(&server).await);
    }
    // A well-behaved client, arriving during the flood, is served.
    let mut good = client(&server).await;
    let answering =
        tokio::spawn(async move { call(&mut good, TRACES, &[], &[framed(0, b"ok")]).await });
    let arrived = taken(&server, 1, 0).await;
    assert_eq!(arrived.calls.len(), 1);
    for call in arrived.calls {
        assert!(call.reply.send(Outcome::ok(Vec::new())));
    }
    assert_eq!(answering.await.unwrap().status, code::OK);
    // The oldest idle ones were closed to make room; the newest are still open.
    let mut closed = 0;
    for socket in &mut flood {
        if closed_within(socket, Duration::from_millis(20)).await {
            closed += 1;
        }
    }
    assert!(closed >= 50 - 8, "{closed} of 50 closed");
    assert!(!closed_within(flood.last_mut().unwrap(), Duration::from_millis(20)).await);
}

#[tokio::test]
async fn streams_that_send_only_a_length_prefix_hold_nothing() {
    let server = server(16 << 20);
    let client = client(&server).await;
    let mut prefix = framed(0, b"").to_vec();
    prefix[1..5].copy_from_slice(&(16u32 << 20).to_be_bytes());
    let mut open = Vec::new();
    for _ in 0..500 {
        open.push(open_call(&client, &[], &[Bytes::from(prefix.clone())], false).await);
    }
    // A call sent after them is answered: the server read every frame before it.
    let mut late = client.clone();
    let answering =
        tokio::spawn(async move { call(&mut late, TRACES, &[], &[framed(0, b"")]).await });
    let arrived = taken(&server, 1, 0).await;
    assert_eq!(
        server.budget().used(),
        0,
        "nothing reserved ahead of the bytes"
    );
    drop(arrived);
    assert_eq!(answering.await.unwrap().status, code::UNAVAILABLE);
    drop(open);
}
