//! A keyed slab in order of last use: the engine's traces and delegation trees.
//!
//! Entries live in slots; a slot's generation changes each time it is reused, so that a
//! [`Handle`] kept elsewhere (a span waiting in another trace, a tool call another trace's agent
//! ran below) tells a live entry from a later one in the same slot. Oldest first; touching an entry
//! makes it the newest, in constant time.
#![forbid(unsafe_code)]

use std::borrow::Borrow;
use std::hash::Hash;

use crate::ids::Map;

const NIL: u32 = u32::MAX;

/// An entry of an [`Lru`]: its slot, and the slot's generation when the entry was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle {
    pub slot: u32,
    pub generation: u32,
}

#[derive(Debug)]
struct Slot<K, V> {
    item: Option<(K, V)>,
    generation: u32,
    prev: u32,
    next: u32,
}

#[derive(Debug)]
pub struct Lru<K, V> {
    slots: Vec<Slot<K, V>>,
    free: Vec<u32>,
    index: Map<K, u32>,
    oldest: u32,
    newest: u32,
}

impl<K: Hash + Eq + Clone, V> Default for Lru<K, V> {
    fn default() -> Self {
        Lru {
            slots: Vec::new(),
            free: Vec::new(),
            index: Map::default(),
            oldest: NIL,
            newest: NIL,
        }
    }
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn find<Q>(&self, key: &Q) -> Option<Handle>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.index.get(key).map(|&slot| self.handle(slot))
    }

    fn handle(&self, slot: u32) -> Handle {
        Handle {
            slot,
            generation: self.slots[slot as usize].generation,
        }
    }

    /// Whether the entry `handle` names is still here.
    pub fn alive(&self, handle: Handle) -> bool {
        self.slots
            .get(handle.slot as usize)
            .is_some_and(|slot| slot.generation == handle.generation && slot.item.is_some())
    }

    pub fn get(&self, handle: Handle) -> Option<&V> {
        let slot = self.slots.get(handle.slot as usize)?;
        match &slot.item {
            Some((_, value)) if slot.generation == handle.generation => Some(value),
            _ => None,
        }
    }

    pub fn get_mut(&mut self, handle: Handle) -> Option<&mut V> {
        let slot = self.slots.get_mut(handle.slot as usize)?;
        match &mut slot.item {
            Some((_, value)) if slot.generation == handle.generation => Some(value),
            _ => None,
        }
    }

    pub fn key(&self, handle: Handle) -> Option<&K> {
        let slot = self.slots.get(handle.slot as usize)?;
        match &slot.item {
            Some((key, _)) if slot.generation == handle.generation => Some(key),
            _ => None,
        }
    }

    /// Add an entry (its key not here yet) as the newest.
    pub fn insert(&mut self, key: K, value: V) -> Handle {
        let slot = match self.free.pop() {
            Some(slot) => {
                let entry = &mut self.slots[slot as usize];
                entry.generation = entry.generation.wrapping_add(1);
                entry.item = Some((key.clone(), value));
                slot
            }
            None => {
                let slot = u32::try_from(self.slots.len()).expect("fewer than 4 billion entries");
                self.slots.push(Slot {
                    item: Some((key.clone(), value)),
                    generation: 0,
                    prev: NIL,
                    next: NIL,
                });
                slot
            }
        };
        self.index.insert(key, slot);
        self.link_newest(slot);
        self.handle(slot)
    }

    /// Make the entry the newest.
    pub fn touch(&mut self, handle: Handle) {
        if self.alive(handle) && self.newest != handle.slot {
            self.unlink(handle.slot);
            self.link_newest(handle.slot);
        }
    }

    pub fn oldest(&self) -> Option<Handle> {
        (self.oldest != NIL).then(|| self.handle(self.oldest))
    }

    /// The entry after `handle` in age, newer.
    pub fn newer(&self, handle: Handle) -> Option<Handle> {
        let next = self.slots.get(handle.slot as usize)?.next;
        (next != NIL).then(|| self.handle(next))
    }

    pub fn remove(&mut self, handle: Handle) -> Option<(K, V)> {
        if !self.alive(handle) {
            return None;
        }
        self.unlink(handle.slot);
        let (key, value) = self.slots[handle.slot as usize].item.take()?;
        self.index.remove(&key);
        self.free.push(handle.slot);
        Some((key, value))
    }

    fn unlink(&mut self, slot: u32) {
        let (prev, next) = {
            let entry = &self.slots[slot as usize];
            (entry.prev, entry.next)
        };
        match prev {
            NIL => self.oldest = next,
            prev => self.slots[prev as usize].next = next,
        }
        match next {
            NIL => self.newest = prev,
            next => self.slots[next as usize].prev = prev,
        }
    }

    fn link_newest(&mut self, slot: u32) {
        let newest = self.newest;
        {
            let entry = &mut self.slots[slot as usize];
            entry.prev = newest;
            entry.next = NIL;
        }
        match newest {
            NIL => self.oldest = slot,
            newest => self.slots[newest as usize].next = slot,
        }
        self.newest = slot;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(lru: &Lru<u32, &str>) -> Vec<u32> {
        let mut out = Vec::new();
        let mut at = lru.oldest();
        while let Some(handle) = at {
            out.push(*lru.key(handle).expect("alive"));
            at = lru.newer(handle);
        }
        out
    }

    #[test]
    fn entries_keep_their_order_of_use_and_a_reused_slot_is_another_entry() {
        let mut lru = Lru::default();
        let a = lru.insert(1, "a");
        let b = lru.insert(2, "b");
        lru.insert(3, "c");
        assert_eq!(order(&lru), [1, 2, 3]);
        lru.touch(a);
        assert_eq!(order(&lru), [2, 3, 1]);
        assert_eq!(lru.remove(b), Some((2, "b")));
        assert!(!lru.alive(b));
        assert_eq!(lru.get(b), None);
        let d = lru.insert(4, "d");
        assert_eq!(d.slot, b.slot);
        assert_ne!(d, b);
        assert_eq!(lru.get(d), Some(&"d"));
        assert_eq!(order(&lru), [3, 1, 4]);
        assert_eq!(lru.find(&1), Some(a));
        assert_eq!(lru.len(), 3);
        while let Some(oldest) = lru.oldest() {
            lru.remove(oldest);
        }
        assert_eq!(lru.len(), 0);
        assert_eq!(order(&lru), Vec::<u32>::new());
    }
}
