//! A budget of bytes: what every holder of request bytes draws from before it holds them.
//!
//! A [`ByteBudget`] has a limit and counts what is taken; [`ByteBudget::try_take`] gives a
//! [`Taken`] that gives its bytes back when dropped, so no error path, cancelled task or panic can
//! leak them. What a reader would not guess: a budget may have a parent ([`ByteBudget::within`]),
//! and a take from it is a take from both: a connection's share is drawn from the receiver's
//! global budget, so neither can be overdrawn and one connection cannot take all of it. And a
//! [`Taken`] that holds every byte taken of a budget may grow past its limit: one request is
//! always taken when nothing else is held, so a limit below the largest request never refuses it
//! for ever (the most held is the larger of the limit and one request).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A limit in bytes and what is taken of it now.
#[derive(Debug)]
pub struct ByteBudget {
    limit: usize,
    used: AtomicUsize,
    parent: Option<Arc<ByteBudget>>,
}

impl ByteBudget {
    /// A budget of its own.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(ByteBudget {
            limit,
            used: AtomicUsize::new(0),
            parent: None,
        })
    }

    /// A budget of at most `limit` whose every byte is also taken from `parent`.
    pub fn within(parent: &Arc<ByteBudget>, limit: usize) -> Arc<Self> {
        Arc::new(ByteBudget {
            limit,
            used: AtomicUsize::new(0),
            parent: Some(Arc::clone(parent)),
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

    /// Take `bytes`, or nothing when this budget or a parent's would go past its limit.
    pub fn try_take(self: &Arc<Self>, bytes: usize) -> Option<Taken> {
        self.take_raw(bytes, 0).then(|| Taken {
            budget: Arc::clone(self),
            bytes,
        })
    }

    /// An empty [`Taken`] of this budget, to grow as bytes arrive.
    pub fn empty(self: &Arc<Self>) -> Taken {
        Taken {
            budget: Arc::clone(self),
            bytes: 0,
        }
    }

    /// Take `bytes` more for a holder that has `mine` already: within the limit, or past it when
    /// the holder has all that is taken (here and in every parent).
    fn take_raw(&self, bytes: usize, mine: usize) -> bool {
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes)
                    .filter(|after| *after <= self.limit || used == mine)
            })
            .is_ok();
        if !taken {
            return false;
        }
        if let Some(parent) = &self.parent
            && !parent.take_raw(bytes, mine)
        {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Whether a holder of `mine` bytes could take `bytes` more now (as [`Taken::try_grow`] would).
    fn could_take(&self, bytes: usize, mine: usize) -> bool {
        let used = self.used();
        let here = used == mine || used.saturating_add(bytes) <= self.limit;
        here && self
            .parent
            .as_ref()
            .is_none_or(|parent| parent.could_take(bytes, mine))
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
}

impl Taken {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// What can still be taken of its budget.
    pub fn available(&self) -> usize {
        self.budget.available()
    }

    /// Whether [`Taken::try_grow`] of `more` would succeed now.
    pub fn could_grow(&self, more: usize) -> bool {
        self.budget.could_take(more, self.bytes)
    }

    /// Take `more` bytes too; false (and nothing more taken) when the budget has not that much
    /// (and others hold some of it: a holder of all that is taken may pass the limit).
    pub fn try_grow(&mut self, more: usize) -> bool {
        let grown = self.budget.take_raw(more, self.bytes);
        if grown {
            self.bytes += more;
        }
        grown
    }

    /// The same bytes, held of the outermost budget only: a connection's share given back, the
    /// global budget's kept (for a holder that outlives the connection's reading).
    pub fn into_root(mut self) -> Taken {
        let bytes = std::mem::take(&mut self.bytes);
        let mut budget = Arc::clone(&self.budget);
        while let Some(parent) = budget.parent.clone() {
            budget.used.fetch_sub(bytes, Ordering::AcqRel);
            budget = parent;
        }
        Taken { budget, bytes }
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
}
