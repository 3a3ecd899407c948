//! Room a budget keeps for the largest request it refused, so that a stream of small requests
//! cannot keep a large one refused for ever.
//!
//! A request refused at a budget that keeps room ([`ByteBudget::share`]) leaves a note: its
//! *claim* (its size as sent: a gRPC message's length prefix, an HTTP body's `Content-Length`) and
//! the bytes it wanted. Until it comes back, or for `keep_for` at most, a take by a request of a
//! smaller claim is refused when it would leave less than that room free, and a request of that
//! claim or larger (the one refused, or one as large) takes the room. What a reader would not
//! guess: the room grows when the same claim is refused again (to the larger of what it wanted and
//! twice the room, at most the budget's limit): a request whose need grows while it is read (gzip
//! inflating, the forwarder's copy) gets through in a few tries, not one try a step. Only one
//! request's room is kept at a time, so others lose at most the largest request's bytes, for at
//! most `keep_for` after its last refusal.
//!
//! [`ByteBudget::share`]: crate::budget::ByteBudget::share

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What a budget that keeps room counted, ever.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeptCounts {
    /// Rooms begun: a refused request larger than any whose room was kept.
    pub kept: u64,
    /// Rooms taken whole by a request of their claim.
    pub claimed: u64,
    /// Rooms let go of because nobody of their claim came back within `keep_for`.
    pub expired: u64,
    /// Takes refused because they would have left less than the room free.
    pub refused: u64,
}

#[derive(Debug, Default)]
struct Room {
    /// The claim it is kept for; 0: no room is kept.
    claim: usize,
    /// Its bytes, and those of them no claimant took yet.
    bytes: usize,
    left: usize,
    until: Option<Instant>,
}

/// The room one budget keeps (see the module docs).
#[derive(Debug)]
pub struct KeptRoom {
    keep_for: Duration,
    room: Mutex<Room>,
    kept: AtomicU64,
    claimed: AtomicU64,
    expired: AtomicU64,
    refused: AtomicU64,
}

impl KeptRoom {
    pub fn new(keep_for: Duration) -> Self {
        KeptRoom {
            keep_for,
            room: Mutex::new(Room::default()),
            kept: AtomicU64::new(0),
            claimed: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// The room, let go of first when its time is up.
    fn room(&self) -> MutexGuard<'_, Room> {
        let mut room = self
            .room
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if room.until.is_some_and(|until| until <= Instant::now()) {
            if room.left > 0 {
                self.expired.fetch_add(1, Ordering::Relaxed);
            }
            *room = Room::default();
        }
        room
    }

    /// A request of `claim` was refused at the budget (of `limit`) wanting `wanted` bytes there.
    pub fn refused(&self, claim: usize, wanted: usize, limit: usize) {
        let mut room = self.room();
        let bytes = if room.claim == 0 || claim > room.claim {
            self.kept.fetch_add(1, Ordering::Relaxed);
            wanted
        } else if claim == room.claim {
            wanted.max(room.bytes.saturating_mul(2))
        } else {
            return;
        };
        let bytes = bytes.min(limit);
        *room = Room {
            claim,
            bytes,
            left: bytes,
            until: Instant::now().checked_add(self.keep_for),
        };
    }

    /// Whether a take of `bytes` by a request of `claim` may stand, `free` the bytes the budget
    /// has free once it is taken; a claimant's take is drawn from the room.
    pub fn allows(&self, claim: usize, bytes: usize, free: usize) -> bool {
        let mut room = self.room();
        if room.left == 0 {
            return true;
        }
        if claim >= room.claim {
            room.left = room.left.saturating_sub(bytes);
            if room.left == 0 {
                self.claimed.fetch_add(1, Ordering::Relaxed);
            }
            return true;
        }
        if free >= room.left {
            return true;
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// The bytes kept now (of the room, those no claimant took yet).
    pub fn left(&self) -> usize {
        self.room().left
    }

    pub fn counts(&self) -> KeptCounts {
        // An expired room is counted when it is next looked at: look now.
        drop(self.room());
        KeptCounts {
            kept: self.kept.load(Ordering::Relaxed),
            claimed: self.claimed.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_smaller_claim_must_leave_the_room_and_a_claimant_takes_it() {
        let kept = KeptRoom::new(Duration::from_secs(60));
        assert!(kept.allows(10, 10, 0), "no room kept: anything goes");
        kept.refused(600, 600, 1000);
        assert_eq!(kept.left(), 600);
        assert!(!kept.allows(10, 10, 599), "it would leave 599 of the 600 kept");
        assert!(kept.allows(10, 10, 600));
        kept.refused(300, 300, 1000);
        assert_eq!(kept.left(), 600, "a smaller refusal changes nothing");
        assert!(kept.allows(600, 400, 0), "the claimant takes the room");
        assert_eq!(kept.left(), 200);
        assert!(!kept.allows(10, 10, 100));
        assert!(kept.allows(700, 200, 0), "one as large takes it too");
        assert_eq!(kept.left(), 0);
        assert!(kept.allows(10, 10, 0), "taken whole: nothing kept");
        assert_eq!(
            kept.counts(),
            KeptCounts {
                kept: 1,
                claimed: 1,
                expired: 0,
                refused: 2
            }
        );
    }

    #[test]
    fn the_same_claim_refused_again_doubles_the_room_up_to_the_limit() {
        let kept = KeptRoom::new(Duration::from_secs(60));
        kept.refused(100, 100, 1000);
        kept.refused(100, 150, 1000);
        assert_eq!(kept.left(), 200);
        kept.refused(100, 700, 1000);
        assert_eq!(kept.left(), 700);
        kept.refused(100, 100, 1000);
        assert_eq!(kept.left(), 1000, "at most the limit");
        kept.refused(2000, 1500, 1000);
        assert_eq!(kept.left(), 1000, "a larger claim, at most the limit");
        assert_eq!(kept.counts().kept, 2);
    }

    #[test]
    fn a_room_nobody_comes_back_for_is_let_go_of() {
        let kept = KeptRoom::new(Duration::from_millis(30));
        kept.refused(600, 600, 1000);
        assert!(!kept.allows(10, 10, 0));
        std::thread::sleep(Duration::from_millis(40));
        assert!(kept.allows(10, 10, 0));
        assert_eq!(kept.left(), 0);
        assert_eq!(kept.counts().expired, 1);
        kept.refused(50, 50, 1000);
        assert_eq!((kept.left(), kept.counts().kept), (50, 2));
    }
}
