//! Requests damaged as a wire may damage them: bytes flipped, inserted, removed, cut short.

use proptest::prelude::*;

#[derive(Debug, Clone)]
pub enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Cut(usize),
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Flip(at, byte)),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert(at, byte)),
        1 => any::<usize>().prop_map(Mutation::Remove),
        1 => any::<usize>().prop_map(Mutation::Cut),
    ]
}

pub fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for mutation in mutations {
        let n = bytes.len();
        match *mutation {
            Mutation::Flip(at, byte) if n > 0 => bytes[at % n] ^= byte | 1,
            Mutation::Insert(at, byte) => bytes.insert(at % (n + 1), byte),
            Mutation::Remove(at) if n > 0 => drop(bytes.remove(at % n)),
            Mutation::Cut(at) => bytes.truncate(at % (n + 1)),
            _ => {}
        }
    }
    bytes
}
