//! The engine's gRPC client on tonic (`tonic-forwarder` feature) against the engine's own
//! receiver on 127.0.0.1: the same answers as on h2 (`grpc_client.rs`).
#![cfg(feature = "tonic-forwarder")]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use otel_guard_engine::grpc::{Limits, METHODS, Outcome, Server, code};
use otel_guard_engine::grpc_client::{Call, Channel, Options, Stack};

fn tonic() -> Options {
    Options {
        stack: Stack::Tonic,
        ..Options::default()
    }
}

fn answer(channel: &Channel, id: u64) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some((_, outcome)) = channel
            .take()
            .into_iter()
            .find(|(answered, _)| *answered == id)
        {
            return outcome;
        }
        assert!(Instant::now() < deadline, "no answer to call {id} in 5 s");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The engine's receiver keeping `x-scope-orgid`, answering each call with `answer(request,
/// tenant)` (None: never) on a thread until dropped.
struct Downstream {
    server: Arc<Server>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Downstream {
    fn start(answer: impl Fn(&[u8], &[u8]) -> Option<Outcome> + Send + 'static) -> Self {
        let server = Server::bind(
            &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
            0,
            Limits::new(8 << 20, 64 << 20),
            &METHODS,
        )
        .unwrap()
        .with_headers(vec!["x-scope-orgid".to_owned()]);
        server.start().unwrap();
        let server = Arc::new(server);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (server, stop) = (Arc::clone(&server), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut unanswered = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    for call in server.take().calls {
                        let tenant = call
                            .headers
                            .first()
                            .map(|(_, v)| v.clone())
                            .unwrap_or_default();
                        match answer(&call.message.to_bytes(), &tenant) {
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
fn a_request_and_its_metadata_go_byte_for_byte_and_the_response_comes_back() {
    let downstream = Downstream::start(|request, tenant| {
        let mut response = tenant.to_vec();
        response.extend_from_slice(request);
        Some(Outcome::ok(response))
    });
    let channel = Channel::new(&downstream.target(), tonic()).unwrap();
    let request: Vec<u8> = (0..2_000_000u32).map(|at| (at % 251) as u8).collect();
    let id = channel.call(Call {
        method: METHODS[0].to_owned(),
        message: Bytes::from(request.clone()),
        headers: vec![("x-scope-orgid".to_owned(), "tenant-a".to_owned())],
        timeout: Duration::from_secs(5),
    });
    let outcome = answer(&channel, id);
    assert_eq!(outcome.code, code::OK, "{}", outcome.message);
    assert_eq!(&outcome.response[..8], b"tenant-a");
    assert!(outcome.response[8..] == request[..]);
}

#[test]
fn a_refusal_comes_back_with_its_retry_info_and_a_silent_downstream_is_deadline_exceeded() {
    let busy = Outcome::busy("too busy to take it", Duration::from_millis(1500));
    let expected = busy.clone();
    let downstream =
        Downstream::start(move |request, _| (request == b"refuse").then(|| busy.clone()));
    let channel = Channel::new(&downstream.target(), tonic()).unwrap();
    let call = |message: &'static [u8], timeout| Call {
        method: METHODS[0].to_owned(),
        message: Bytes::from_static(message),
        headers: Vec::new(),
        timeout,
    };
    let refused = answer(
        &channel,
        channel.call(call(b"refuse", Duration::from_secs(5))),
    );
    assert_eq!(refused.code, code::RESOURCE_EXHAUSTED);
    assert_eq!(refused.message, "too busy to take it");
    assert_eq!(refused.details, expected.details);
    let started = Instant::now();
    let silent = answer(
        &channel,
        channel.call(call(b"wait", Duration::from_millis(300))),
    );
    assert_eq!(silent.code, code::DEADLINE_EXCEEDED, "{}", silent.message);
    assert!(started.elapsed() >= Duration::from_millis(290));
}
