//! A span -> its call: [`call_of`] reads it by the built-in table, then by a dialects file's rows.
//!
//! What a reader would not guess: a row with no kind stops the kind rows (the span is then read
//! by its operation, as one without a kind key), and a call's row is kept with it: the row is part
//! of what the call is (its form, [`super::same_form_again`]).
#![forbid(unsafe_code)]

use super::Key::{A2aMethod, McpMethod, Operation};
use super::Source::{SpanName, Stem, Subject};
use super::attributes::key_at;
use super::{Attributes, FileRows, KIND_KEYS, Key, Kind, Match, On, ROWS, Row, RowId, Source};

/// What a span is as a call: the row that read it (a built-in row's index, then a file's rows),
/// what that row makes of it, and the name it gives (None: no name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call<'a> {
    pub row: RowId,
    pub(super) kind: Kind,
    /// Read by a row that makes a call only first below a tool call.
    pub conditional: bool,
    pub name: Option<&'a str>,
}

impl Call<'_> {
    pub fn kind(&self) -> Kind {
        self.kind
    }
}

/// The call a span records, by its name, its instrumentation scope and its attributes, read by the
/// built-in table and then by `more` (a dialects file's rows); None when it is none.
pub fn call_of<'a>(
    span_name: &'a str,
    scope: &str,
    attributes: &Attributes<'_, 'a>,
    more: &FileRows,
) -> Option<Call<'a>> {
    let rows = ROWS.iter().enumerate();
    for (at, row) in rows.clone().filter(|(_, row)| row.on == On::SpanName) {
        // (The scope first: of another length than a scoped row's, it differs at no cost.)
        if row.scope.is_none_or(|only| only == scope) && names(span_name, row.value) {
            return Some(call(at, row, span_name, attributes));
        }
    }
    if !more.name_rows.is_empty()
        && let Some(at) = more.name_rows.iter().copied().find(|&at| {
            let row = &more.rows[usize::from(at)];
            row.scope.as_deref().is_none_or(|only| only == scope) && names(span_name, &row.value)
        })
    {
        return Some(more.call(at, span_name, attributes));
    }
    let kind_key = if more.kind_keys.is_empty() {
        attributes.first_of(&KIND_KEYS).map(|key| key as u16)
    } else {
        attributes.first_index_of(
            KIND_KEYS
                .iter()
                .map(|&key| key as u16)
                .chain(more.kind_keys.iter().copied()),
        )
    };
    if let Some(kind_key) = kind_key {
        let value = attributes.text_at(kind_key);
        let on = key_at(kind_key).map(On::Attribute);
        for (at, row) in rows.clone() {
            if Some(row.on) == on
                && Some(row.value) == value
                && row.scope.is_none_or(|only| only == scope)
            {
                if row.kind.is_some() {
                    return Some(call(at, row, span_name, attributes));
                }
                return more.after_operation(span_name, attributes);
            }
        }
        for &at in &more.kind_rows {
            let row = &more.rows[usize::from(at)];
            if row.on == Match::Attribute(kind_key)
                && value == Some(row.value.as_str())
                && row.scope.as_deref().is_none_or(|only| only == scope)
            {
                if row.kind.is_some() {
                    return Some(more.call(at, span_name, attributes));
                }
                break;
            }
        }
    }
    more.after_operation(span_name, attributes)
}

/// Whether the span name is `value`, or `value`, a space and more.
fn names(span_name: &str, value: &str) -> bool {
    span_name
        .strip_prefix(value)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
}

/// The operation rows, then the protocol rows (each the built-in ones, then the file's): the first
/// whose key has its value.
pub(super) fn by_operation<'a>(
    span_name: &'a str,
    attributes: &Attributes<'_, 'a>,
    more: &FileRows,
) -> Option<Call<'a>> {
    let rows = ROWS.iter().enumerate();
    if more.operation_rows.is_empty() && more.protocol_rows.is_empty() {
        // The built-in rows alone: one pass, the operation rows standing before the protocol rows.
        return rows
            .filter(|(_, row)| matches!(row.on, On::Attribute(Operation | A2aMethod | McpMethod)))
            .find(|(_, row)| match row.on {
                On::Attribute(key) => attributes.text(key) == Some(row.value),
                On::SpanName => false,
            })
            .map(|(at, row)| call(at, row, span_name, attributes));
    }
    let operation = |keys: &[Key]| {
        rows.clone()
            .filter(|(_, row)| matches!(row.on, On::Attribute(key) if keys.contains(&key)))
            .find(|(_, row)| match row.on {
                On::Attribute(key) => attributes.text(key) == Some(row.value),
                On::SpanName => false,
            })
            .map(|(at, row)| call(at, row, span_name, attributes))
    };
    let file = |group: &[u8]| {
        group.iter().copied().find_map(|at| {
            let row = &more.rows[usize::from(at)];
            match row.on {
                Match::Attribute(key) if attributes.text_at(key) == Some(row.value.as_str()) => {
                    Some(more.call(at, span_name, attributes))
                }
                _ => None,
            }
        })
    };
    operation(&[Operation])
        .or_else(|| file(&more.operation_rows))
        .or_else(|| operation(&[A2aMethod, McpMethod]))
        .or_else(|| file(&more.protocol_rows))
}

fn call<'a>(at: usize, row: &Row, span_name: &'a str, attributes: &Attributes<'_, 'a>) -> Call<'a> {
    let name = row.names.iter().find_map(|source| {
        let name = match *source {
            Subject => subject(span_name),
            SpanName => span_name,
            Stem => stem(span_name),
            Source::Attribute(key) => attributes.text(key)?,
        };
        (!name.is_empty()).then_some(name)
    });
    Call {
        row: RowId(u8::try_from(at).unwrap_or(u8::MAX)),
        kind: row.kind.unwrap_or(Kind::Agent),
        conditional: row.conditional,
        name,
    }
}

pub(super) fn subject(span_name: &str) -> &str {
    span_name.split_once(' ').map_or("", |(_, subject)| subject)
}

pub(super) fn stem(span_name: &str) -> &str {
    span_name.rsplit_once('.').map_or("", |(stem, _)| stem)
}
