//! Room a budget keeps for the largest request it refused, so that a stream of small requests
//! cannot keep a large one refused for ever.
//!
//! A request refused at a budget that keeps room ([`ByteBudget::share`]) leaves a note: its
//! *claim* (its size as sent: a gRPC message's length prefix, an HTTP body's `Content-Length`) and
//! the bytes it wanted. Until it comes back, or for `keep_for` at most, a take by a request of a
//! smaller claim is refused when it would leave less than that room free, and a request of that
//! claim or larger (the one refused, or one as large) takes the room: the first such to come owns
//! it until it is done with it, so requests of one size racing for it do not keep each other out
//! (each holding part and none all). What a reader would not guess: the room grows when the same claim is refused again (to the larger of what it wanted and
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
    /// The holder that draws from it now (a claimant that came first).
    owner: Option<u64>,
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

    /// A new room of `bytes` for `claim`, counted.
    fn begin(&self, claim: usize, bytes: usize, owner: Option<u64>) -> Room {
        self.kept.fetch_add(1, Ordering::Relaxed);
        self.renewed(claim, bytes, owner)
    }

    fn renewed(&self, claim: usize, bytes: usize, owner: Option<u64>) -> Room {
        Room {
            claim,
            bytes,
            left: bytes,
            until: Instant::now().checked_add(self.keep_for),
            owner,
        }
    }

    /// Holder `holder` of a request of `claim` was refused at the budget (of `limit`), wanting
    /// `wanted` bytes there in all.
    /// A request that wants more than the limit gets no room: no room would let it in (it is
    /// taken only when nothing else is held, the budget's rule for a request larger than it).
    pub fn refused(&self, holder: u64, claim: usize, wanted: usize, limit: usize) {
        if wanted > limit {
            return;
        }
        let mut room = self.room();
        if claim == room.claim && room.owner == Some(holder) {
            // The request it was kept for took it and needs more (its need grew while it was
            // read): twice the room, for its next try.
            let bytes = wanted.max(room.bytes.saturating_mul(2)).min(limit);
            *room = self.renewed(claim, bytes, None);
        } else if room.left == 0 || claim > room.claim {
            // None kept (or the last one taken whole), or a larger request's.
            *room = self.begin(claim, wanted, None);
        } else if claim == room.claim {
            // Another as large was refused: kept longer, and at least as large as it wanted.
            room.until = Instant::now().checked_add(self.keep_for);
            if wanted > room.bytes {
                room.left += wanted - room.bytes;
                room.bytes = wanted;
            }
        }
    }

    /// Whether a take of `bytes` by holder `holder` of a request of `claim`, which holds
    /// `wanted` once it is taken, may stand, `free` the bytes the budget (of `limit`) has free
    /// once it is taken. A claimant's take is drawn from the room, which is then its own until it
    /// lets go of it; a larger claimant than its owner takes the room over.
    pub fn allows(
        &self,
        holder: u64,
        claim: usize,
        taking: (usize, usize),
        free: usize,
        limit: usize,
    ) -> bool {
        let (bytes, wanted) = taking;
        let mut room = self.room();
        if room.left == 0 {
            return true;
        }
        let claimant = claim >= room.claim
            && match room.owner {
                None => true,
                Some(owner) if owner == holder => true,
                Some(_) if claim > room.claim => {
                    *room = self.begin(claim, wanted.min(limit), None);
                    true
                }
                Some(_) => false,
            };
        if claimant {
            room.owner = Some(holder);
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

    /// `holder` lets go of the room it owned (if it did): the next claimant may take it.
    pub fn disown(&self, holder: u64) {
        let mut room = self.room();
        if room.owner == Some(holder) {
            room.owner = None;
        }
    }

    /// Whether a room is kept now, taken whole or not (until `keep_for` after the last
    /// refusal).
    pub fn active(&self) -> bool {
        self.room().claim > 0
    }

    /// The bytes a take by `holder` must leave free for the room: none for its owner.
    pub fn left_for(&self, holder: u64) -> usize {
        let room = self.room();
        if room.owner == Some(holder) {
            0
        } else {
            room.left
        }
    }

    /// A take was refused to leave the room free (counted).
    pub fn note_refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
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

    const LIMIT: usize = 1000;

    /// A take of `bytes` by `holder` of `claim` that holds `bytes` once taken.
    fn take(kept: &KeptRoom, holder: u64, claim: usize, bytes: usize, free: usize) -> bool {
        kept.allows(holder, claim, (bytes, bytes), free, LIMIT)
    }

    #[test]
    fn a_smaller_claim_must_leave_the_room_and_a_claimant_takes_it() {
        let kept = KeptRoom::new(Duration::from_secs(60));
        assert!(take(&kept, 1, 10, 10, 0), "no room kept: anything goes");
        kept.refused(9, 600, 600, LIMIT);
        assert_eq!(kept.left(), 600);
        assert!(
            !take(&kept, 2, 10, 10, 599),
            "it would leave 599 of the 600 kept"
        );
        assert!(take(&kept, 2, 10, 10, 600));
        kept.refused(3, 300, 300, LIMIT);
        assert_eq!(kept.left(), 600, "a smaller refusal changes nothing");
        assert!(take(&kept, 4, 600, 400, 0), "the claimant takes the room");
        assert_eq!(kept.left(), 200);
        assert!(!take(&kept, 2, 10, 10, 100));
        assert!(
            !take(&kept, 5, 600, 200, 0),
            "one as large waits for the owner"
        );
        kept.disown(4);
        assert!(
            take(&kept, 5, 600, 200, 0),
            "and takes it once the owner let go"
        );
        assert_eq!(kept.left(), 0);
        assert!(take(&kept, 2, 10, 10, 0), "taken whole: nothing kept");
        assert_eq!(
            kept.counts(),
            KeptCounts {
                kept: 1,
                claimed: 1,
                expired: 0,
                refused: 3
            }
        );
    }

    #[test]
    fn its_owner_refused_again_gets_twice_the_room_up_to_the_limit() {
        let kept = KeptRoom::new(Duration::from_secs(60));
        kept.refused(1, 100, 100, LIMIT);
        kept.refused(2, 100, 150, LIMIT);
        assert_eq!(kept.left(), 150, "another as large: what it wanted");
        assert!(take(&kept, 3, 100, 150, 0));
        kept.refused(3, 100, 200, LIMIT);
        assert_eq!(kept.left(), 300, "its owner refused: twice the room");
        assert!(take(&kept, 4, 100, 10, 0));
        kept.refused(4, 100, 700, LIMIT);
        assert_eq!(kept.left(), 700);
        assert!(take(&kept, 5, 100, 10, 0));
        kept.refused(5, 100, 100, LIMIT);
        assert_eq!(kept.left(), LIMIT, "at most the limit");
        kept.refused(6, 2000, 1500, LIMIT);
        assert_eq!(
            kept.left(),
            LIMIT,
            "one larger than the limit: no room for it"
        );
        kept.refused(6, 2000, 900, LIMIT);
        assert_eq!(kept.left(), 900, "a larger claim");
        assert_eq!(kept.counts().kept, 2);
    }

    #[test]
    fn a_larger_claim_takes_the_room_over_from_its_owner() {
        let kept = KeptRoom::new(Duration::from_secs(60));
        kept.refused(1, 100, 200, LIMIT);
        assert!(take(&kept, 2, 100, 50, 0), "one of a kind owns it");
        assert!(!take(&kept, 3, 100, 50, 0), "the others of its size wait");
        assert!(
            kept.allows(4, 600, (0, 600), 0, LIMIT),
            "a larger one (at its prefix) takes it over"
        );
        assert_eq!(kept.left(), 600);
        assert!(
            !take(&kept, 2, 100, 50, 0),
            "its first owner no longer has it"
        );
        assert_eq!(kept.counts().kept, 2);
    }

    #[test]
    fn a_room_taken_whole_is_kept_again_for_the_next_refused() {
        let kept = KeptRoom::new(Duration::from_secs(60));
        kept.refused(1, 100, 100, LIMIT);
        assert!(take(&kept, 2, 100, 100, 0));
        assert_eq!(kept.left(), 0);
        kept.refused(3, 100, 100, LIMIT);
        assert_eq!(kept.left(), 100, "another of its size, refused later");
        assert_eq!((kept.counts().kept, kept.counts().claimed), (2, 1));
    }

    #[test]
    fn a_room_nobody_comes_back_for_is_let_go_of() {
        let kept = KeptRoom::new(Duration::from_millis(30));
        kept.refused(1, 600, 600, LIMIT);
        assert!(!take(&kept, 2, 10, 10, 0));
        std::thread::sleep(Duration::from_millis(40));
        assert!(take(&kept, 2, 10, 10, 0));
        assert_eq!(kept.left(), 0);
        assert_eq!(kept.counts().expired, 1);
        kept.refused(3, 50, 50, LIMIT);
        assert_eq!((kept.left(), kept.counts().kept), (50, 2));
    }
}
