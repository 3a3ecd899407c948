//! The two OTLP/gRPC receivers side by side (issue 41 item 3): the engine's h2 one and the tonic
//! one (`tonic-receiver` feature), each in a process of its own that takes calls as the Python
//! service does (one thread, woken by the wake-up socket, each trace request into one engine,
//! answered OK), driven by one HTTP/2 client over 127.0.0.1 with the same recorded requests.
//!
//! `cargo bench --features tonic-receiver --bench receivers -- [rounds] [seconds]` prints, a
//! round at a time, the arms interleaved: spans/s and spans a CPU second of the receiving
//! process (ratios tonic / h2), then the receiving process's memory under two attacks: streams
//! that declare 16 MiB and never end, and 8 MiB calls while the taker is busy. Run it pinned
//! (`taskset -c 0`; each receiver runs on core 1): on a shared machine, read the ratios.
#![allow(dead_code)]

#[path = "../tests/common/spans.rs"]
mod spans;

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use otel_guard_engine::graph::{Engine, Limits as EngineLimits};
use otel_guard_engine::grpc::{Limits, METHODS, Outcome, Server, Transport};
use spans::{encode, guarded, span};
use tokio::io::unix::AsyncFd;
use tokio::net::TcpStream;

const ARMS: [&str; 2] = ["h2", "tonic"];
/// The processor's defaults: `--max-request-bytes` 8 MiB (a message arrives at twice it),
/// `--max-pending-bytes` 128 MiB.
const MAX_MESSAGE: usize = 16 << 20;
const MAX_INFLATED: usize = 8 << 20;
const MAX_HELD: usize = 128 << 20;
const TRACES: u64 = 40;
const SPANS: u64 = 13;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some("serve") {
        return serve(&args[1], args.get(2).is_some_and(|mode| mode == "busy"));
    }
    let rounds: usize = args.first().and_then(|n| n.parse().ok()).unwrap_or(5);
    let seconds: u64 = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(3);
    let attacks_only = args.get(2).is_some_and(|what| what == "attacks");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        if !attacks_only {
            compare(rounds, Duration::from_secs(seconds)).await;
        }
        attacks(rounds.min(3)).await;
    });
}

// ---- the receiving process ----

struct Wake(RawFd);

impl AsRawFd for Wake {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Serve with `transport` on 127.0.0.1, print the port, take calls until stdin closes; a line
/// on stdin asks for `used refused` (the budget's bytes held, the calls refused busy). `busy`:
/// the taker takes at most every 250 ms, as an event loop held up by other work.
fn serve(transport: &str, busy: bool) {
    let transport = match transport {
        "tonic" => Transport::Tonic,
        _ => Transport::H2,
    };
    let mut limits = Limits::new(MAX_MESSAGE, MAX_HELD);
    limits.max_inflated_bytes = MAX_INFLATED;
    let server = Server::bind(&[IpAddr::V4(Ipv4Addr::LOCALHOST)], 0, limits, &METHODS)
        .unwrap()
        .with_transport(transport);
    server.start().unwrap();
    let server = Arc::new(server);
    println!("{}", server.addresses()[0].port());
    std::io::stdout().flush().unwrap();
    let taker = Arc::clone(&server);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            // SAFETY: the server owns the descriptor and outlives this loop (`taker` holds it),
            // and nothing here closes or replaces it.
            let wake = unsafe { AsyncFd::register(Wake(taker.wake_fd())) }.unwrap();
            let mut engine = Engine::new(EngineLimits::default()).unwrap();
            let started = Instant::now();
            loop {
                let mut ready = wake.readable().await.unwrap();
                ready.clear_ready();
                for call in taker.take().calls {
                    if call.method == 0 {
                        let now = started.elapsed().as_secs_f64();
                        let _ = engine.ingest(&call.message.to_bytes(), now);
                    }
                    call.reply.send(Outcome::ok(Vec::new()));
                }
                if busy {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        });
    });
    let mut line = String::new();
    while std::io::stdin()
        .read_line(&mut line)
        .is_ok_and(|read| read > 0)
    {
        println!("{} {}", server.budget().used(), server.refused_busy());
        std::io::stdout().flush().unwrap();
        line.clear();
    }
    server.shutdown(Duration::ZERO);
}

// ---- the driver ----

struct Receiver {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    address: SocketAddr,
}

impl Receiver {
    fn start(arm: &str, busy: bool) -> Self {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new("taskset")
            .args(["-c", "1"])
            .arg(exe)
            .args(["serve", arm, if busy { "busy" } else { "take" }])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut port = String::new();
        stdout.read_line(&mut port).unwrap();
        let port: u16 = port.trim().parse().unwrap();
        Receiver {
            child,
            stdin,
            stdout,
            address: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
        }
    }

    /// (bytes held in the budget, calls refused busy)
    fn stats(&mut self) -> (usize, u64) {
        writeln!(self.stdin).unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let mut fields = line.split_whitespace().map(|f| f.parse::<u64>().unwrap());
        (
            fields.next().unwrap() as usize,
            fields.next().unwrap_or_default(),
        )
    }

    /// CPU seconds the process used so far (user + system).
    fn cpu(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
        ticks / 100.0
    }

    /// A `/proc/PID/status` figure in MiB (VmRSS, VmHWM, VmSize).
    fn memory(&self, field: &str) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|line| line.starts_with(field)).unwrap();
        let kib: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kib / 1024.0
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn client(address: SocketAddr) -> SendRequest<Bytes> {
    let socket = TcpStream::connect(address).await.unwrap();
    socket.set_nodelay(true).unwrap();
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(1 << 20)
        .initial_connection_window_size(2 << 20)
        .handshake(socket)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

fn framed(message: &[u8]) -> Bytes {
    let mut body = vec![0];
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(message);
    Bytes::from(body)
}

fn export_request() -> http::Request<()> {
    http::Request::post(format!("http://localhost{}", METHODS[0]))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

/// A call's grpc-status (0 OK), from the headers (trailers only) or the trailers.
async fn call(client: &mut SendRequest<Bytes>, body: Bytes) -> Option<u32> {
    let mut client = client.clone().ready().await.ok()?;
    let (response, mut stream) = client.send_request(export_request(), false).ok()?;
    stream.reserve_capacity(body.len());
    stream.send_data(body, true).ok()?;
    let response = response.await.ok()?;
    let status = |headers: &http::HeaderMap| {
        headers
            .get("grpc-status")
            .and_then(|value| value.to_str().ok()?.parse().ok())
    };
    if let Some(code) = status(response.headers()) {
        return Some(code);
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.ok()?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    status(&body.trailers().await.ok()??)
}

/// `guarded`-like requests: 40 traces of 13 spans, each hop carrying the guard's chain.
fn requests(count: u64) -> Vec<Bytes> {
    let agents = ["planner", "researcher", "writer", "critic"];
    (0..count)
        .map(|request| {
            let mut all = Vec::new();
            for trace in 0..TRACES {
                let id = request * TRACES + trace + 1;
                let mut chain: Vec<&str> = Vec::new();
                for at in 0..SPANS {
                    let agent = agents[(at as usize) % agents.len()];
                    chain.push(agent);
                    let parent = (at > 0).then_some(at);
                    let hop = span(
                        id,
                        at + 1,
                        parent,
                        &format!("invoke_agent {agent}"),
                        at * 10,
                    );
                    all.push(guarded(hop, &chain, "allow"));
                }
            }
            framed(&encode(&[("otel_guard", all)]))
        })
        .collect()
}

/// Calls sent and answered OK within `time`, `in_flight` at once over `connections`.
async fn drive(
    address: SocketAddr,
    requests: &Arc<Vec<Bytes>>,
    connections: usize,
    in_flight: usize,
    time: Duration,
) -> u64 {
    let ok = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + time;
    let mut tasks = tokio::task::JoinSet::new();
    for connection in 0..connections {
        let client = client(address).await;
        for lane in 0..in_flight / connections {
            let (mut client, requests, ok) =
                (client.clone(), Arc::clone(requests), Arc::clone(&ok));
            let mut next = connection * 7919 + lane * 104_729;
            tasks.spawn(async move {
                while Instant::now() < until {
                    let body = requests[next % requests.len()].clone();
                    next += 1;
                    if call(&mut client, body).await == Some(0) {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    }
    while tasks.join_next().await.is_some() {}
    ok.load(Ordering::Relaxed)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn compare(rounds: usize, time: Duration) {
    let requests = Arc::new(requests(64));
    let spans = (TRACES * SPANS) as f64;
    println!(
        "# {} spans a request ({} KB); {rounds} rounds of {} s, arms interleaved",
        TRACES * SPANS,
        requests[0].len() / 1000,
        time.as_secs()
    );
    let receivers: Vec<Receiver> = ARMS.iter().map(|arm| Receiver::start(arm, false)).collect();
    for receiver in &receivers {
        drive(receiver.address, &requests, 4, 64, Duration::from_secs(1)).await;
    }
    let (mut rate_ratios, mut cpu_ratios) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut figures = Vec::new();
        let order: Vec<usize> = if round % 2 == 0 {
            vec![0, 1]
        } else {
            vec![1, 0]
        };
        let mut by_arm = [(0.0, 0.0); 2];
        for arm in order {
            let receiver = &receivers[arm];
            let cpu = receiver.cpu();
            let started = Instant::now();
            let calls = drive(receiver.address, &requests, 4, 64, time).await;
            let wall = started.elapsed().as_secs_f64();
            let cpu = receiver.cpu() - cpu;
            let rate = calls as f64 * spans / wall;
            by_arm[arm] = (rate, calls as f64 * spans / cpu);
            figures.push(format!(
                "{}: {:.0} spans/s, {:.0} spans a CPU s, RSS {:.0} MiB",
                ARMS[arm],
                rate,
                calls as f64 * spans / cpu,
                receiver.memory("VmRSS")
            ));
        }
        rate_ratios.push(by_arm[1].0 / by_arm[0].0);
        cpu_ratios.push(by_arm[1].1 / by_arm[0].1);
        println!(
            "round {round}: {}; tonic/h2 spans/s {:.2}, spans a CPU s {:.2}",
            figures.join("; "),
            rate_ratios[round],
            cpu_ratios[round]
        );
    }
    println!(
        "throughput, median of {rounds}: tonic/h2 spans/s {:.2}, spans a CPU second {:.2}",
        median(rate_ratios),
        median(cpu_ratios)
    );
}

async fn attacks(rounds: usize) {
    for _ in 0..rounds {
        for arm in ARMS {
            unended(arm).await;
        }
        for arm in ARMS {
            busy(arm).await;
        }
    }
}

/// 4 connections × 48 streams, each declaring a 16 MiB message and sending 1 MiB of it, never
/// ended; then a well-behaved call (one `guarded` request, 147 KB) on a connection of its own.
async fn unended(arm: &str) {
    let mut receiver = Receiver::start(arm, false);
    let base = receiver.memory("VmRSS");
    let (mut held, mut clients) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        let client = client(receiver.address).await;
        for _ in 0..48 {
            let Ok(mut ready) = client.clone().ready().await else {
                break;
            };
            let Ok((response, mut stream)) = ready.send_request(export_request(), false) else {
                break;
            };
            let mut body = vec![0u8];
            body.extend_from_slice(&((16u32 << 20) - 64).to_be_bytes());
            body.resize(5 + (1 << 20), 0x0a);
            let _ = stream.send_data(Bytes::from(body), false);
            held.push((response, stream));
        }
        clients.push(client);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (used, refused) = receiver.stats();
    let mut probe = client(receiver.address).await;
    let started = Instant::now();
    let answer = call(&mut probe, requests(1).swap_remove(0)).await;
    println!(
        "unended {arm}: RSS {:.0} MiB over {:.0} at start, VmSize {:.0} MiB, budget held {:.0} MiB, \
         refused busy {refused}; a small call then: status {answer:?} in {:.1} ms",
        receiver.memory("VmRSS") - base,
        base,
        receiver.memory("VmSize"),
        used as f64 / 1048576.0,
        started.elapsed().as_secs_f64() * 1e3
    );
    drop((held, clients));
}

/// 8 MiB calls, 4 connections × 8 at once (twice the budget), for 5 s, while the taker takes
/// every 250 ms.
async fn busy(arm: &str) {
    let receiver = Receiver::start(arm, true);
    let base = receiver.memory("VmRSS");
    let large = Arc::new(vec![framed(&vec![0x0a; MAX_INFLATED - 64])]);
    let ok = drive(receiver.address, &large, 4, 32, Duration::from_secs(5)).await;
    let mut receiver = receiver;
    let (_, refused) = receiver.stats();
    println!(
        "busy {arm}: peak RSS {:.0} MiB (at start {:.0}), {ok} calls OK, {refused} refused busy",
        receiver.memory("VmHWM"),
        base
    );
}
