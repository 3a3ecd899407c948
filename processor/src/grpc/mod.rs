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

mod h2_call;
mod h2_connections;
mod inbox;
pub mod message;
mod server;
#[cfg(feature = "tonic-receiver")]
mod tonic_receiver;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::budget::ByteBudget;
use inbox::Inbox;
pub use inbox::{Arrived, Call, Reply};
use message::{Body, Bounds, Message};
pub use message::{Encoding, Outcome, code};
pub use server::{Server, Transport};

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
