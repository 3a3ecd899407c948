//! A budget of bytes: what every holder of request bytes draws from before it holds them.
//!
//! A [`ByteBudget`] has a limit and counts what is taken; [`ByteBudget::try_take`] gives a
//! [`Taken`] that gives its bytes back when dropped, so no error path, cancelled task or panic can
//! leak them. What a reader would not guess: a budget may have a parent ([`ByteBudget::within`]),
//! and a take from it is a take from both: a connection's share is drawn from the receiver's
//! global budget, so neither can be overdrawn and one connection cannot take all of it. And a
//! [`Taken`] that holds every byte taken of a budget may grow past its limit: one request is
//! always taken when nothing else is held, so a limit below the largest request never refuses it
//! for ever (the most held is the larger of the limit and one request). A budget made with
//! [`ByteBudget::fair`] or [`ByteBudget::share`] also keeps room for the largest request refused
//! there ([`KeptRoom`]); a [`Taken`]'s *claim* ([`Taken::declare`]) says how large its request is.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::kept_room::{KeptCounts, KeptRoom};

/// The next [`Taken`]'s id (a kept room knows its owner by it).
static HOLDERS: AtomicU64 = AtomicU64::new(1);

/// A limit in bytes and what is taken of it now.
#[derive(Debug)]
pub struct ByteBudget {
    limit: usize,
    used: AtomicUsize,
    parent: Option<Arc<ByteBudget>>,
    kept: Option<KeptRoom>,
    /// The shares made of it ([`ByteBudget::share`]), to know when one keeps room.
    shares: Mutex<Vec<Weak<ByteBudget>>>,
}

impl ByteBudget {
    /// A budget of its own.
    pub fn new(limit: usize) -> Arc<Self> {
        Self::made(limit, None, None)
    }

    /// A budget of its own that keeps room for the largest request refused at it, for at most
    /// `keep_for` after that request's last refusal.
    pub fn fair(limit: usize, keep_for: Duration) -> Arc<Self> {
        Self::made(limit, None, Some(KeptRoom::new(keep_for)))
    }

    /// A budget of at most `limit` whose every byte is also taken from `parent`.
    pub fn within(parent: &Arc<ByteBudget>, limit: usize) -> Arc<Self> {
        Self::made(limit, Some(Arc::clone(parent)), None)
    }

    /// A share of `parent` (as [`ByteBudget::within`]) that keeps room for the largest request
    /// refused at it or above it, as [`ByteBudget::fair`]: a protocol's share of the processor's
    /// budget.
    pub fn share(parent: &Arc<ByteBudget>, limit: usize, keep_for: Duration) -> Arc<Self> {
        let share = Self::made(
            limit,
            Some(Arc::clone(parent)),
            Some(KeptRoom::new(keep_for)),
        );
        parent
            .shares
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(Arc::downgrade(&share));
        share
    }

    fn made(limit: usize, parent: Option<Arc<ByteBudget>>, kept: Option<KeptRoom>) -> Arc<Self> {
        Arc::new(ByteBudget {
            limit,
            used: AtomicUsize::new(0),
            parent,
            kept,
            shares: Mutex::new(Vec::new()),
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The bytes taken now (of this budget; a parent's count includes its children's).
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// What can be taken now: the least of what is left here and in the parents.
    pub fn available(&self) -> usize {
        let here = self.limit.saturating_sub(self.used());
        match &self.parent {
            Some(parent) => here.min(parent.available()),
            None => here,
        }
    }

    /// The bytes of room kept now for a refused request (0 when this budget keeps none).
    pub fn kept_bytes(&self) -> usize {
        self.kept.as_ref().map_or(0, KeptRoom::left)
    }

    /// What this budget's kept room counted (all 0 when it keeps none).
    pub fn kept_counts(&self) -> KeptCounts {
        self.kept
            .as_ref()
            .map_or_else(KeptCounts::default, KeptRoom::counts)
    }

    /// Take `bytes`, or nothing when this budget or a parent's would go past its limit (or a
    /// kept room's: `bytes` is the request's claim).
    pub fn try_take(self: &Arc<Self>, bytes: usize) -> Option<Taken> {
        let mut taken = self.empty();
        taken.try_grow(bytes).then_some(taken)
    }

    /// An empty [`Taken`] of this budget, to grow as bytes arrive.
    pub fn empty(self: &Arc<Self>) -> Taken {
        Taken {
            budget: Arc::clone(self),
            bytes: 0,
            claim: 0,
            id: HOLDERS.fetch_add(1, Ordering::Relaxed),
            past_rooms: false,
        }
    }

    /// The budget that keeps room for takes from this one: the nearest that does, here or
    /// above, and how many steps up it is.
    fn home(&self) -> Option<(&ByteBudget, usize)> {
        let mut budget = self;
        let mut depth = 0;
        loop {
            if budget.kept.is_some() {
                return Some((budget, depth));
            }
            budget = budget.parent.as_deref()?;
            depth += 1;
        }
    }

    /// Whether a holder of `mine` bytes may pass this budget's limit: it holds all that is
    /// taken of it, and (for a share) of the whole too, and no other share refused a request
    /// within its `keep_for`: a share is held to its limit unless nothing else is held at all,
    /// and not even then while another share keeps room (taken or not) for a refused request.
    fn alone(&self, used: usize, mine: usize) -> bool {
        if used != mine {
            return false;
        }
        let Some(parent) = self.parent.as_deref().filter(|_| self.kept.is_some()) else {
            return true;
        };
        let mut root = parent;
        while let Some(above) = root.parent.as_deref() {
            root = above;
        }
        if root.used() != mine {
            return false;
        }
        let shares = parent
            .shares
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        !shares.iter().filter_map(Weak::upgrade).any(|share| {
            !std::ptr::eq(&*share, self) && share.kept.as_ref().is_some_and(KeptRoom::active)
        })
    }

    /// Take `bytes` more for a holder that has `mine` already: within the limit, or past it when
    /// the holder has all that is taken ([`ByteBudget::alone`], here and in every parent).
    /// Refused: how many steps up the budget that refused is.
    fn take_raw(&self, bytes: usize, mine: usize) -> Result<(), usize> {
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes)
                    .filter(|after| *after <= self.limit || self.alone(used, mine))
            })
            .is_ok();
        if !taken {
            return Err(0);
        }
        if let Some(parent) = &self.parent
            && let Err(depth) = parent.take_raw(bytes, mine)
        {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
            return Err(depth + 1);
        }
        Ok(())
    }

    /// Whether a holder of `mine` bytes could take `bytes` more now, as [`ByteBudget::take_raw`].
    fn could_take(&self, bytes: usize, mine: usize) -> Result<(), usize> {
        let used = self.used();
        if used.saturating_add(bytes) > self.limit && !self.alone(used, mine) {
            return Err(0);
        }
        match &self.parent {
            Some(parent) => parent.could_take(bytes, mine).map_err(|depth| depth + 1),
            None => Ok(()),
        }
    }

    /// A take of `wanted` bytes in all by a request of `claim` was refused `depth` steps up:
    /// noted by the budget that keeps room when the refusal was there or above it (a
    /// connection's share refusing is that connection's own doing).
    fn refused(&self, holder: u64, depth: usize, claim: usize, wanted: usize) {
        if let Some((home, at)) = self.home()
            && depth >= at
            && let Some(kept) = &home.kept
        {
            kept.refused(holder, claim, wanted, home.limit);
        }
    }

    /// Whether the room kept here or above lets a take of `bytes` by holder `holder` of a
    /// request of `claim` stand, `wanted` its bytes once taken, `pending` of them not yet
    /// counted as taken (a claimant's take is drawn from the room).
    fn room_allows(
        &self,
        holder: u64,
        claim: usize,
        taking: (usize, usize),
        pending: usize,
        past_rooms: bool,
    ) -> bool {
        match self.home() {
            Some((home, _)) => home.kept.as_ref().is_none_or(|kept| {
                let free = home.available().saturating_sub(pending);
                kept.allows(holder, claim, taking, free, home.limit)
            }),
            None => past_rooms || self.shares_allow(holder, pending),
        }
    }

    /// Whether a take straight from this budget (the forwarder's joins, a request's own bytes
    /// once moved out of its receiver's share) leaves every share's kept room free, or is the
    /// room's owner: else the forwarder's joins would eat the room a refused request was
    /// promised (seen under load: a 6 MiB call beside eight busy senders refused eight times).
    fn shares_allow(&self, holder: u64, pending: usize) -> bool {
        let shares = self
            .shares
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        shares.iter().filter_map(Weak::upgrade).all(|share| {
            share.kept.as_ref().is_none_or(|kept| {
                let left = kept.left_for(holder);
                left == 0 || share.available().saturating_sub(pending) >= left || {
                    kept.note_refused();
                    false
                }
            })
        })
    }

    /// `holder` is done: a room it owned here or above goes to the next claimant.
    fn disown(&self, holder: u64) {
        if let Some((home, _)) = self.home()
            && let Some(kept) = &home.kept
        {
            kept.disown(holder);
        }
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        if let Some(parent) = &self.parent {
            parent.give_back(bytes);
        }
    }
}

/// Bytes taken from a budget, given back when dropped.
#[derive(Debug)]
pub struct Taken {
    budget: Arc<ByteBudget>,
    bytes: usize,
    /// The size of its request as sent, which a kept room is claimed by (0: none declared).
    claim: usize,
    id: u64,
    /// Whether its takes straight from the whole may use the rooms its shares keep.
    past_rooms: bool,
}

impl Taken {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// What can still be taken of its budget.
    pub fn available(&self) -> usize {
        self.budget.available()
    }

    /// Say how large its request is as sent (the largest said counts): a room kept for a refused
    /// request of that size or less is this holder's to take. Say it before the first take, and
    /// the same on every try, so that a retry is known.
    pub fn declare(&mut self, size: usize) {
        self.claim = self.claim.max(size);
    }

    /// Its claim: the size declared, or (none declared) what it holds once `more` is taken.
    fn claim_after(&self, more: usize) -> usize {
        if self.claim > 0 {
            self.claim
        } else {
            self.bytes.saturating_add(more)
        }
    }

    /// Whether [`Taken::try_grow`] of `more` would succeed now. A no is a refusal: noted as one
    /// where room is kept (the caller refuses its request).
    pub fn could_grow(&self, more: usize) -> bool {
        let claim = self.claim_after(more);
        let wanted = self.bytes.saturating_add(more);
        if let Err(depth) = self.budget.could_take(more, self.bytes) {
            self.budget.refused(self.id, depth, claim, wanted);
            return false;
        }
        self.budget
            .room_allows(self.id, claim, (0, wanted), more, self.past_rooms)
    }

    /// Take `more` bytes too; false (and nothing more taken) when the budget has not that much
    /// (and others hold some of it: a holder of all that is taken may pass the limit), or it
    /// would leave less than the room kept for a larger request free.
    pub fn try_grow(&mut self, more: usize) -> bool {
        let claim = self.claim_after(more);
        let wanted = self.bytes.saturating_add(more);
        if let Err(depth) = self.budget.take_raw(more, self.bytes) {
            self.budget.refused(self.id, depth, claim, wanted);
            return false;
        }
        if !self
            .budget
            .room_allows(self.id, claim, (more, wanted), 0, self.past_rooms)
        {
            self.budget.give_back(more);
            return false;
        }
        self.bytes += more;
        true
    }

    /// The same bytes (and claim), held of `target` (the budget itself or one above it) and
    /// those above it only: a connection's share given back, the receiver's kept (for a holder
    /// that outlives the connection's reading). Past the top, held of the top.
    pub fn into_budget(mut self, target: &Arc<ByteBudget>) -> Taken {
        let bytes = std::mem::take(&mut self.bytes);
        // This one's drop lets go of neither the bytes nor a room it owns: the new one holds both.
        let id = std::mem::take(&mut self.id);
        let mut budget = Arc::clone(&self.budget);
        while !Arc::ptr_eq(&budget, target)
            && let Some(parent) = budget.parent.clone()
        {
            budget.used.fetch_sub(bytes, Ordering::AcqRel);
            budget = parent;
        }
        Taken {
            budget,
            bytes,
            claim: self.claim,
            id,
            past_rooms: self.past_rooms,
        }
    }

    /// This holder finishes a request already taken (the forwarder's split parts of it): its takes
    /// straight from the whole may use the room a share keeps for a refused request, which other
    /// takes from the whole leave free. It gives them back when its request is answered, where
    /// refusing it would waste the request's whole work and bring it back.
    pub fn finishing(mut self) -> Taken {
        self.past_rooms = true;
        self
    }

    /// The same bytes, held of the outermost budget only.
    pub fn into_root(self) -> Taken {
        let mut root = Arc::clone(&self.budget);
        while let Some(parent) = root.parent.clone() {
            root = parent;
        }
        self.into_budget(&root)
    }

    /// Give back `fewer` of the bytes (at most all of them) and keep the rest.
    pub fn shrink(&mut self, fewer: usize) {
        let fewer = fewer.min(self.bytes);
        self.budget.give_back(fewer);
        self.bytes -= fewer;
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.give_back(self.bytes);
        }
        if self.id != 0 {
            self.budget.disown(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_stop_at_the_limit_and_drops_give_back() {
        let budget = ByteBudget::new(10);
        let first = budget.try_take(6).unwrap();
        assert!(budget.try_take(5).is_none());
        let mut second = budget.try_take(4).unwrap();
        assert_eq!((budget.used(), budget.available()), (10, 0));
        assert!(!second.try_grow(1));
        assert!(!second.could_grow(1));
        drop(first);
        assert!(second.try_grow(6));
        second.shrink(100);
        assert_eq!(second.bytes(), 0);
        drop(second);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_child_takes_from_its_parent_and_is_held_to_its_own_share() {
        let global = ByteBudget::new(10);
        let left = ByteBudget::within(&global, 6);
        let right = ByteBudget::within(&global, 6);
        let mut held = left.try_take(5).unwrap();
        let beside = left.try_take(1).unwrap();
        assert!(
            !held.try_grow(1),
            "the child's share is 6 (and another holds some)"
        );
        assert_eq!(global.used(), 6);
        assert!(right.try_take(5).is_none(), "the parent has 4 left");
        assert_eq!(
            right.used(),
            0,
            "a refused take takes nothing from the child"
        );
        let other = right.try_take(4).unwrap();
        assert_eq!((right.available(), left.available()), (0, 0));
        drop(held);
        drop(beside);
        drop(other);
        assert_eq!((global.used(), left.used(), right.used()), (0, 0, 0));
    }

    #[test]
    fn the_only_holder_may_pass_the_limit_and_then_nobody_else_takes() {
        let global = ByteBudget::new(10);
        let share = ByteBudget::within(&global, 5);
        let mut alone = share.empty();
        assert!(alone.could_grow(30));
        assert!(
            alone.try_grow(30),
            "nothing else is held: one request is always taken"
        );
        assert_eq!(global.used(), 30);
        assert!(global.try_take(1).is_none());
        let mut other = share.empty();
        assert!(!other.try_grow(1));
        alone.shrink(26);
        assert!(!other.try_grow(2), "the share is 5 and 4 are held");
        assert!(other.try_grow(1));
        assert!(
            !alone.try_grow(1),
            "no longer the only holder: held to the limit"
        );
        let moved = other.into_root();
        assert_eq!((global.used(), share.used(), moved.bytes()), (5, 4, 1));
        drop(moved);
        let other = share.empty();
        drop(alone);
        drop(other);
        assert_eq!((global.used(), share.used()), (0, 0));
    }

    #[test]
    fn each_share_is_held_to_its_limit_so_the_other_keeps_its_quarter() {
        let whole = ByteBudget::new(100);
        let grpc = ByteBudget::share(&whole, 75, Duration::from_millis(100));
        let http = ByteBudget::share(&whole, 75, Duration::from_secs(60));
        let flood: Vec<Taken> = (0..10).filter_map(|_| http.try_take(10)).collect();
        assert_eq!(
            (flood.len(), http.used()),
            (7, 70),
            "HTTP stops at its share"
        );
        let calls: Vec<Taken> = (0..3).filter_map(|_| grpc.try_take(10)).collect();
        assert_eq!(calls.len(), 3, "gRPC has the rest: its quarter and more");
        assert!(grpc.try_take(1).is_none(), "the whole is full");
        drop(flood);
        let mut big = http.empty();
        assert!(
            !big.try_grow(90),
            "alone in its share but not in the budget: held to its share"
        );
        assert_eq!(
            http.kept_counts().kept,
            1,
            "no room would let it in: none kept"
        );
        let mut refused = grpc.empty();
        refused.declare(50);
        assert!(!refused.try_grow(50), "gRPC's share has 75, 30 held");
        drop(calls);
        assert!(
            !big.try_grow(90),
            "alone in the budget, but gRPC keeps room for a request: held to its share"
        );
        assert!(refused.try_grow(50), "that request comes back");
        drop(refused);
        assert!(
            !big.try_grow(90),
            "nothing held, but gRPC's room is kept for its keep_for, taken or not"
        );
        std::thread::sleep(Duration::from_millis(120));
        assert!(
            big.try_grow(90),
            "alone in the budget: one request past its share is taken"
        );
        let rest = grpc.try_take(10);
        assert!(rest.is_some(), "what the whole has left");
        assert!(grpc.try_take(1).is_none());
    }

    #[test]
    fn a_refused_request_has_room_kept_until_it_comes_back() {
        let whole = ByteBudget::new(100);
        let grpc = ByteBudget::share(&whole, 100, Duration::from_secs(60));
        let small: Vec<Taken> = (0..8).filter_map(|_| grpc.try_take(10)).collect();
        let mut large = grpc.empty();
        large.declare(40);
        assert!(
            !large.could_grow(40),
            "80 of 100 held: refused at its prefix"
        );
        assert_eq!(grpc.kept_bytes(), 40);
        drop(small);
        // Small requests come back first: each must leave the 40 free.
        let small: Vec<Taken> = (0..8).filter_map(|_| grpc.try_take(10)).collect();
        assert_eq!(small.len(), 6);
        assert_eq!(grpc.kept_counts().refused, 2);
        // Its retry, a chunk at a time: the room is its own.
        let mut retry = grpc.empty();
        retry.declare(40);
        assert!(retry.could_grow(40));
        for _ in 0..4 {
            assert!(retry.try_grow(10));
        }
        assert_eq!((grpc.used(), grpc.kept_bytes()), (100, 0));
        let counts = grpc.kept_counts();
        assert_eq!((counts.kept, counts.claimed), (1, 1));
        drop(retry);
        assert!(grpc.try_take(10).is_some(), "taken whole: nothing kept now");
        drop(small);
    }

    /// A whole budget of 100 and a share of it that keeps 40 for a call refused while eight
    /// others held it (nothing held now).
    fn a_share_keeping_40_for_a_refused_call() -> (Arc<ByteBudget>, Arc<ByteBudget>) {
        let whole = ByteBudget::new(100);
        let grpc = ByteBudget::share(&whole, 100, Duration::from_secs(60));
        let held: Vec<Taken> = (0..8).filter_map(|_| grpc.try_take(10)).collect();
        let mut large = grpc.empty();
        large.declare(40);
        assert!(!large.could_grow(40));
        drop(held);
        assert_eq!(grpc.kept_bytes(), 40);
        (whole, grpc)
    }

    #[test]
    fn a_finishing_take_of_the_whole_may_use_a_kept_room() {
        let (whole, grpc) = a_share_keeping_40_for_a_refused_call();
        assert!(
            whole.try_take(70).is_none(),
            "a join leaves the 40 kept free"
        );
        assert_eq!(whole.used(), 0);
        let mut parts = whole.empty().finishing();
        assert!(parts.try_grow(70), "a taken request's parts may use it");
        assert_eq!(
            grpc.kept_bytes(),
            40,
            "the room is still kept for its request"
        );
    }

    #[test]
    fn a_take_of_the_whole_leaves_a_shares_kept_room_free() {
        let (whole, grpc) = a_share_keeping_40_for_a_refused_call();
        // The forwarder joins from the whole: it must leave the 40 kept for the refused call.
        let joins: Vec<Taken> = (0..8).filter_map(|_| whole.try_take(10)).collect();
        assert_eq!(joins.len(), 6, "the room kept is left free");
        let mut retry = grpc.empty();
        retry.declare(40);
        assert!(retry.try_grow(40), "the room is its own when it comes back");
        let root = retry.into_root();
        drop(root);
        assert!(
            whole.try_take(10).is_some(),
            "the room was taken: nothing kept now"
        );
        drop(joins);
    }

    #[test]
    fn a_request_refused_again_after_it_grew_gets_a_room_twice_as_large() {
        let budget = ByteBudget::fair(100, Duration::from_secs(60));
        let held: Vec<Taken> = (0..9).filter_map(|_| budget.try_take(10)).collect();
        let mut large = budget.empty();
        large.declare(20);
        assert!(!large.could_grow(20));
        drop(held);
        let _small: Vec<Taken> = (0..10).filter_map(|_| budget.try_take(10)).collect();
        assert_eq!(budget.used(), 80, "20 kept");
        let mut retry = budget.empty();
        retry.declare(20);
        assert!(retry.try_grow(20), "the room is its own");
        assert!(
            !retry.try_grow(20),
            "the forwarder's copy: the budget is full"
        );
        assert_eq!(
            budget.kept_bytes(),
            40,
            "the same claim refused again: twice the room"
        );
    }

    #[test]
    fn a_connections_own_share_refusing_keeps_no_room() {
        let whole = ByteBudget::fair(100, Duration::from_secs(60));
        let connection = ByteBudget::within(&whole, 50);
        let _held = connection.try_take(45).unwrap();
        let mut call = connection.empty();
        call.declare(10);
        assert!(!call.could_grow(10));
        assert_eq!(
            whole.kept_bytes(),
            0,
            "the connection's own calls hold its share"
        );
        let mut other = whole.empty();
        assert!(other.try_grow(55));
        assert!(!call.try_grow(1), "the whole is full now: refused above");
        assert_eq!(whole.kept_bytes(), 1);
    }

    #[test]
    fn a_take_moved_out_of_a_connections_share_keeps_its_claim() {
        let whole = ByteBudget::new(100);
        let grpc = ByteBudget::share(&whole, 75, Duration::from_secs(60));
        let connection = ByteBudget::within(&grpc, 50);
        let mut taken = connection.empty();
        taken.declare(30);
        assert!(taken.try_grow(30));
        let moved = taken.into_budget(&grpc);
        assert_eq!((connection.used(), grpc.used(), whole.used()), (0, 30, 30));
        assert_eq!(moved.claim, 30);
        let root = moved.into_root();
        assert_eq!((grpc.used(), whole.used()), (0, 30));
        drop(root);
        assert_eq!(whole.used(), 0);
    }
}
