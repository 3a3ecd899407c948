//! The hand-over to Python: the calls read whole ([`Call`]), how each is answered ([`Reply`]),
//! and the [`Inbox`] they wait in until [`super::Server::take`].
//!
//! What a reader would not guess: the runtime wakes Python's event loop with one byte on a socket
//! pair only when the inbox was empty, so under load one wake-up brings many calls; and a reply
//! dropped unanswered answers the call UNAVAILABLE (its channel closes).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::{Message, Outcome};

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
pub struct Reply(pub(super) oneshot::Sender<Outcome>);

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

pub(super) struct Inbox {
    pub(super) arrived: Mutex<Arrived>,
    pub(super) wake: UnixStream,
    pub(super) next_id: AtomicU64,
}

impl Inbox {
    pub(super) fn lock(&self) -> MutexGuard<'_, Arrived> {
        self.arrived
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn add(&self, add: impl FnOnce(&mut Arrived)) {
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
