//! The attribute keys a decode keeps: a small set looked up by length, then by a key's last word.
//!
//! What a reader would not guess: keys of one length mostly differ at their end
//! (`otel_guard.chain.agents`, `.depth`, `.skills`), so comparing the last 8 bytes as one word first
//! settles almost every lookup without a byte-by-byte compare.

use std::fmt;

/// The attribute keys a decode keeps, each with its index (the order they were given in, repeats
/// dropped). Looking a key up costs a length check and, for keys of a length asked for, a word
/// compare of their last 8 bytes with each of that length (then the whole key, when they match):
/// keys of one length mostly differ at their end (`otel_guard.chain.agents`, `.depth`, `.skills`).
#[derive(Debug, Clone, Default)]
pub struct Keys {
    names: Vec<String>,
    by_len: Vec<Vec<Known>>, // key length -> the keys of that length
}

/// A key asked for: its last 8 bytes (see [`tail`]), the key, its index.
type Known = (u64, Box<[u8]>, u16);

/// More keys than an attribute's key index can hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooManyKeys;

impl fmt::Display for TooManyKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at most {} attribute keys", usize::from(u16::MAX) + 1)
    }
}

impl std::error::Error for TooManyKeys {}

impl Keys {
    pub fn new<I, S>(keys: I) -> std::result::Result<Keys, TooManyKeys>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut set = Keys::default();
        let mut seen = std::collections::HashSet::new();
        for key in keys {
            let key = key.as_ref();
            if !seen.insert(key.to_owned()) {
                continue;
            }
            let index = u16::try_from(set.names.len()).map_err(|_| TooManyKeys)?;
            if set.by_len.len() <= key.len() {
                set.by_len.resize(key.len() + 1, Vec::new());
            }
            set.by_len[key.len()].push((tail(key.as_bytes()), key.as_bytes().into(), index));
            set.names.push(key.to_owned());
        }
        Ok(set)
    }

    /// The index of `key`, if it is one of the keys.
    #[inline]
    pub fn index(&self, key: &[u8]) -> Option<u16> {
        let bucket = self.by_len.get(key.len())?;
        if bucket.is_empty() {
            return None;
        }
        let tail = tail(key);
        bucket
            .iter()
            .find(|(last, name, _)| *last == tail && **name == *key)
            .map(|(_, _, index)| *index)
    }

    /// The key of an index [`Keys::index`] gave.
    pub fn name(&self, index: u16) -> &str {
        &self.names[usize::from(index)]
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// A key's last 8 bytes as a word (all of a shorter key, zero-padded).
#[inline(always)]
fn tail(key: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    let from = key.len().saturating_sub(8);
    word[..key.len() - from].copy_from_slice(&key[from..]);
    u64::from_le_bytes(word)
}
