//! A span's attributes as the rules read them: [`Attributes`], the first value of each key.
//!
//! What a reader would not guess: the built-in keys are found through a table of where each
//! first stands (filled once a span), a dialects file's own keys by a scan of the span's kept
//! attributes; "first" is by place among the attributes, which decides the kind key read.
#![forbid(unsafe_code)]

use super::{KEY_COUNT, Key};
use crate::decode::{Attribute, Request, Span, Value};

/// A span's attributes as the rules read them: the first value of each key, and where it stood.
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'l, 'a> {
    list: &'l [Attribute<'a>],
    /// Key -> where its first value stands in `list` (ABSENT: nowhere).
    first: [u16; KEY_COUNT],
}

const ABSENT: u16 = u16::MAX;

impl<'l, 'a> Attributes<'l, 'a> {
    /// The attributes of one decoded span (the request decoded with the keys of [`Key::ALL`]).
    pub fn of(request: &'l Request<'a>, span: &Span<'a>) -> Attributes<'l, 'a> {
        Attributes::from_list(request.attributes_of(span))
    }

    pub fn from_list(list: &'l [Attribute<'a>]) -> Attributes<'l, 'a> {
        let mut first = [ABSENT; KEY_COUNT];
        // (A span with more than 65,534 of the keys asked for reads the first of them.)
        for (at, attribute) in list.iter().enumerate().take(usize::from(ABSENT)) {
            if let Some(slot) = first.get_mut(usize::from(attribute.key))
                && *slot == ABSENT
            {
                *slot = at as u16;
            }
        }
        Attributes { list, first }
    }

    pub fn value(&self, key: Key) -> Option<Value<'a>> {
        let at = self.first[key as usize];
        (at != ABSENT).then(|| self.list[usize::from(at)].value)
    }

    /// The key's string value; None when it is missing or of another type.
    pub fn text(&self, key: Key) -> Option<&'a str> {
        match self.value(key) {
            Some(Value::Str(text)) => Some(text),
            _ => None,
        }
    }

    pub fn integer(&self, key: Key) -> Option<i64> {
        match self.value(key) {
            Some(Value::Int(number)) => Some(number),
            _ => None,
        }
    }

    /// The string value of the key of index `key` (a file's own key past [`KEY_COUNT`]: the first
    /// of its values, found by a scan of the span's kept attributes).
    pub fn text_at(&self, key: u16) -> Option<&'a str> {
        let value = match key_at(key) {
            Some(key) => self.value(key),
            None => self
                .list
                .iter()
                .find(|attribute| attribute.key == key)
                .map(|attribute| attribute.value),
        };
        match value {
            Some(Value::Str(text)) => Some(text),
            _ => None,
        }
    }

    /// Of the keys of `keys` (indices), the one that stands first among the span's attributes.
    pub(super) fn first_index_of(&self, keys: impl Iterator<Item = u16>) -> Option<u16> {
        keys.filter_map(|key| {
            let at = match key_at(key) {
                Some(known) => self.first[known as usize],
                None => self
                    .list
                    .iter()
                    .position(|attribute| attribute.key == key)
                    .map_or(ABSENT, |at| at as u16),
            };
            (at != ABSENT).then_some((at, key))
        })
        .min_by_key(|&(at, _)| at)
        .map(|(_, key)| key)
    }

    /// Of `keys`, the one that stands first among the span's attributes.
    pub(super) fn first_of(&self, keys: &[Key]) -> Option<Key> {
        keys.iter()
            .map(|&key| (self.first[key as usize], key))
            .filter(|&(at, _)| at != ABSENT)
            .min_by_key(|&(at, _)| at)
            .map(|(_, key)| key)
    }
}

/// The built-in key of a key index below [`KEY_COUNT`] (None for a file's own key).
pub(super) fn key_at(index: u16) -> Option<Key> {
    Key::ALL.get(usize::from(index)).copied()
}
