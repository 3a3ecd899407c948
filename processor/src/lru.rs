//! A keyed slab in order of last use: the engine's traces and delegation trees.
//!
//! Entries live in slots; a slot's generation changes each time it is reused, so that a
//! [`Handle`] kept elsewhere (a span waiting in another trace, a tool call another trace's agent
//! ran below) tells a live entry from a later one in the same slot. Oldest first; touching an entry
//! makes it the newest, in constant time.
//!
//! Entries are of two classes, each in its own order of use: [`Lru::oldest`] is the oldest of
//! class 0 while there is one, so that what is evicted first is what matters least (the engine's
//! traces of one name, before those with a delegation path: see the graph's module docstring).
//! A tracked Lru also notes the slots of the entries changed ([`Lru::take_changed`]), so that
//! what an entry weighs is reckoned again only where it may have changed.
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
    class: u8,
    changed: bool,
}

#[derive(Debug)]
pub struct Lru<K, V> {
    slots: Vec<Slot<K, V>>,
    free: Vec<u32>,
    index: Map<K, u32>,
    /// Per class, its oldest and newest slot.
    oldest: [u32; 2],
    newest: [u32; 2],
    /// Per class, its entries.
    counts: [usize; 2],
    tracked: bool,
    changed: Vec<u32>,
}

impl<K: Hash + Eq + Clone, V> Default for Lru<K, V> {
    fn default() -> Self {
        Lru {
            slots: Vec::new(),
            free: Vec::new(),
            index: Map::default(),
            oldest: [NIL; 2],
            newest: [NIL; 2],
            counts: [0; 2],
            tracked: false,
            changed: Vec::new(),
        }
    }
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    /// An Lru that notes the entries changed (see the module docstring).
    pub fn tracked() -> Self {
        Lru {
            tracked: true,
            ..Lru::default()
        }
    }

    #[inline]
    fn note(&mut self, slot: u32) {
        if self.tracked {
            let entry = &mut self.slots[slot as usize];
            if !entry.changed {
                entry.changed = true;
                self.changed.push(slot);
            }
        }
    }

    /// The entries changed (made, or lent out mutably) since the last call, each once: those
    /// still here.
    pub fn take_changed(&mut self, out: &mut Vec<Handle>) {
        out.clear();
        for slot in self.changed.drain(..) {
            let entry = &mut self.slots[slot as usize];
            entry.changed = false;
            if entry.item.is_some() {
                out.push(Handle {
                    slot,
                    generation: entry.generation,
                });
            }
        }
    }

    /// Entries of a class.
    pub fn len_of(&self, class: u8) -> usize {
        self.counts[usize::from(class)]
    }

    /// The entry's value, not noted as changed (for the one who reads the changes).
    pub fn get_mut_unnoted(&mut self, handle: Handle) -> Option<&mut V> {
        let slot = self.slots.get_mut(handle.slot as usize)?;
        match &mut slot.item {
            Some((_, value)) if slot.generation == handle.generation => Some(value),
            _ => None,
        }
    }

    /// The entry's class.
    pub fn class(&self, handle: Handle) -> Option<u8> {
        self.alive(handle)
            .then(|| self.slots[handle.slot as usize].class)
    }

    /// Move the entry into class 1, as its newest.
    pub fn promote(&mut self, handle: Handle) {
        if self.alive(handle) && self.slots[handle.slot as usize].class == 0 {
            self.unlink(handle.slot);
            self.slots[handle.slot as usize].class = 1;
            self.link_newest(handle.slot);
        }
    }
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
        if !self.alive(handle) {
            return None;
        }
        self.note(handle.slot);
        let slot = &mut self.slots[handle.slot as usize];
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
                entry.class = 0;
                slot
            }
            None => {
                let slot = u32::try_from(self.slots.len()).expect("fewer than 4 billion entries");
                self.slots.push(Slot {
                    item: Some((key.clone(), value)),
                    generation: 0,
                    prev: NIL,
                    next: NIL,
                    class: 0,
                    changed: false,
                });
                slot
            }
        };
        self.index.insert(key, slot);
        self.link_newest(slot);
        self.note(slot);
        self.handle(slot)
    }

    /// Make the entry the newest.
    pub fn touch(&mut self, handle: Handle) {
        if self.alive(handle) && !self.newest.contains(&handle.slot) {
            self.unlink(handle.slot);
            self.link_newest(handle.slot);
        }
    }

    /// The oldest entry of class 0, else of class 1.
    pub fn oldest(&self) -> Option<Handle> {
        self.oldest
            .iter()
            .find(|&&slot| slot != NIL)
            .map(|&slot| self.handle(slot))
    }

    /// The oldest entry of a class.
    pub fn oldest_of(&self, class: u8) -> Option<Handle> {
        let slot = self.oldest[usize::from(class)];
        (slot != NIL).then(|| self.handle(slot))
    }

    /// The entry after `handle` in age, newer, of its class.
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
        let (prev, next, class) = {
            let entry = &self.slots[slot as usize];
            (entry.prev, entry.next, usize::from(entry.class))
        };
        self.counts[class] -= 1;
        match prev {
            NIL => self.oldest[class] = next,
            prev => self.slots[prev as usize].next = next,
        }
        match next {
            NIL => self.newest[class] = prev,
            next => self.slots[next as usize].prev = prev,
        }
    }

    fn link_newest(&mut self, slot: u32) {
        let class = usize::from(self.slots[slot as usize].class);
        let newest = self.newest[class];
        self.counts[class] += 1;
        {
            let entry = &mut self.slots[slot as usize];
            entry.prev = newest;
            entry.next = NIL;
        }
        match newest {
            NIL => self.oldest[class] = slot,
            newest => self.slots[newest as usize].next = slot,
        }
        self.newest[class] = slot;
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

    #[test]
    fn class_0_goes_first_and_changed_entries_are_noted_once() {
        let mut lru = Lru::tracked();
        let a = lru.insert(1, "a");
        let b = lru.insert(2, "b");
        let c = lru.insert(3, "c");
        let mut changed = Vec::new();
        lru.take_changed(&mut changed);
        assert_eq!(changed, [a, b, c]);
        lru.promote(a);
        assert_eq!(lru.class(a), Some(1));
        assert_eq!(lru.oldest(), Some(b));
        assert_eq!(lru.oldest_of(1), Some(a));
        assert_eq!((lru.len_of(0), lru.len_of(1)), (2, 1));
        assert_eq!(lru.newer(a), None);
        lru.touch(b);
        assert_eq!(order(&lru), [3, 2]);
        if let Some(value) = lru.get_mut(c) {
            *value = "C";
        }
        lru.get_mut(c);
        lru.remove(b);
        let d = lru.insert(4, "d");
        lru.take_changed(&mut changed);
        assert_eq!(changed, [c, d]);
        lru.remove(c);
        lru.remove(d);
        assert_eq!(lru.oldest(), Some(a));
        lru.take_changed(&mut changed);
        assert!(changed.is_empty());
    }
}
