//! A dialects file's rows (`--dialects FILE`): the built-in [`Row`]'s fields, owned, checked once
//! when the file is read, and matched after the built-in rows of their group.
//!
//! What a reader would not guess: a file's row gets the [`RowId`] after the built-in rows' (its place
//! in the file plus `ROWS.len()`), so a call's form compares file rows and built-in rows alike; the
//! attribute keys only a file reads are indexed after [`Key::ALL`]'s.
#![forbid(unsafe_code)]

use super::Key::{A2aMethod, McpMethod, Operation};
use super::read::{by_operation, stem, subject};
use super::{Attributes, Call, KEY_COUNT, KIND_KEYS, Key, Kind, ROWS, RowId};

/// What a file's row matches on: the span name, or an attribute by its index in the engine's keys
/// ([`Key::ALL`], then the file's own keys; see [`FileRows::keys`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    SpanName,
    Attribute(u16),
}

/// Where a file's row takes a call's name from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    Subject,
    SpanName,
    Stem,
    Attribute(u16),
}

/// One row of a dialects file: a built-in [`Row`]'s fields, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRow {
    pub dialect: String,
    pub on: Match,
    pub value: String,
    pub kind: Option<Kind>,
    pub names: Vec<Named>,
    pub conditional: bool,
    pub scope: Option<String>,
}

/// A row as the binding and the Python side give it: (dialect, key, value, kind, names,
/// conditional, scope), `key` an attribute or [`SPAN_NAME`], `kind` `agent`, `tool` or None, each
/// name an attribute, [`SPAN_NAME`], [`SUBJECT`] or [`STEM`] (the tokens of `dialect_table()`).
pub type RowSpec = (
    String,
    String,
    String,
    Option<String>,
    Vec<String>,
    bool,
    Option<String>,
);

pub const SPAN_NAME: &str = "<the span name>";
pub const SUBJECT: &str = "<the span name's subject>";
pub const STEM: &str = "<the span name before its last dot>";

/// The rows a dialects file adds, read after the built-in rows of their group: span-name rows
/// after the built-in span-name rows; rows of `gen_ai.operation.name` after the operation rows;
/// rows of `a2a.method.name` / `mcp.method.name` after the protocol rows; every other key is a
/// kind key (after OpenInference's and Traceloop's), its rows after the built-in kind rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileRows {
    pub(super) rows: Vec<FileRow>,
    /// The attribute keys the file reads that the built-in table does not, in the order first
    /// read: their indices follow [`Key::ALL`]'s.
    pub(super) keys: Vec<String>,
    pub(super) kind_keys: Vec<u16>,
    pub(super) name_rows: Vec<u8>,
    pub(super) kind_rows: Vec<u8>,
    pub(super) operation_rows: Vec<u8>,
    pub(super) protocol_rows: Vec<u8>,
}

/// The most rows a file may add: a row's id is a byte, the built-in rows' first.
pub const MAX_FILE_ROWS: usize = u8::MAX as usize - ROWS.len();

impl FileRows {
    /// The rows of `specs`, in order; an error names the row (from 1) and what is wrong with it.
    pub fn new(specs: Vec<RowSpec>) -> Result<FileRows, String> {
        if specs.len() > MAX_FILE_ROWS {
            return Err(format!("{} rows; at most {MAX_FILE_ROWS}", specs.len()));
        }
        let mut more = FileRows::default();
        for (at, (dialect, key, value, kind, names, conditional, scope)) in
            specs.into_iter().enumerate()
        {
            let wrong = |what: &str| format!("row {}: {what}", at + 1);
            let kind = match kind.as_deref() {
                Some("agent") => Some(Kind::Agent),
                Some("tool") => Some(Kind::Tool),
                None => None,
                Some(other) => return Err(wrong(&format!("kind {other:?}: agent, tool or None"))),
            };
            if dialect.is_empty() || key.is_empty() || value.is_empty() {
                return Err(wrong("an empty dialect, key or value"));
            }
            if kind.is_some() == names.is_empty() {
                return Err(wrong(
                    "a row with a kind names it, one with none names nothing",
                ));
            }
            let on = match key.as_str() {
                SPAN_NAME => Match::SpanName,
                SUBJECT | STEM => return Err(wrong("a row matches the span name or an attribute")),
                _ => Match::Attribute(more.key(&key)),
            };
            let mut sources = Vec::with_capacity(names.len());
            for name in names {
                sources.push(match name.as_str() {
                    "" => return Err(wrong("an empty name source")),
                    SPAN_NAME => Named::SpanName,
                    SUBJECT => Named::Subject,
                    STEM => Named::Stem,
                    _ => Named::Attribute(more.key(&name)),
                });
            }
            let id = u8::try_from(ROWS.len() + at).map_err(|_| wrong("too many rows"))?;
            match on {
                Match::SpanName => more.name_rows.push(id),
                Match::Attribute(key) if key == Operation as u16 => more.operation_rows.push(id),
                Match::Attribute(key) if key == A2aMethod as u16 || key == McpMethod as u16 => {
                    more.protocol_rows.push(id)
                }
                Match::Attribute(key) => {
                    if !KIND_KEYS.iter().any(|&kind_key| kind_key as u16 == key)
                        && !more.kind_keys.contains(&key)
                    {
                        more.kind_keys.push(key);
                    }
                    more.kind_rows.push(id);
                }
            }
            more.rows.push(FileRow {
                dialect,
                on,
                value,
                kind,
                names: sources,
                conditional,
                scope,
            });
        }
        // The groups hold row ids; the rows are kept by their place in the file.
        for group in [
            &mut more.name_rows,
            &mut more.kind_rows,
            &mut more.operation_rows,
            &mut more.protocol_rows,
        ] {
            for id in group.iter_mut() {
                *id -= ROWS.len() as u8;
            }
        }
        Ok(more)
    }

    /// The index of an attribute key: a built-in key's, else the file's own (added once).
    fn key(&mut self, name: &str) -> u16 {
        if let Some(key) = Key::ALL.iter().find(|key| key.name() == name) {
            return *key as u16;
        }
        let at = match self.keys.iter().position(|known| known == name) {
            Some(at) => at,
            None => {
                self.keys.push(name.to_owned());
                self.keys.len() - 1
            }
        };
        (KEY_COUNT + at) as u16
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn rows(&self) -> &[FileRow] {
        &self.rows
    }

    /// The attribute keys the file reads beyond the built-in ones ([`Key::ALL`]'s come first).
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The file's row of a [`RowId`] past the built-in rows.
    pub fn row(&self, id: RowId) -> Option<&FileRow> {
        self.rows.get(usize::from(id.0).checked_sub(ROWS.len())?)
    }

    pub(super) fn after_operation<'a>(
        &self,
        span_name: &'a str,
        attributes: &Attributes<'_, 'a>,
    ) -> Option<Call<'a>> {
        by_operation(span_name, attributes, self)
    }

    /// The call the file's row `at` (its place in the file) makes of a span.
    pub(super) fn call<'a>(
        &self,
        at: u8,
        span_name: &'a str,
        attributes: &Attributes<'_, 'a>,
    ) -> Call<'a> {
        let row = &self.rows[usize::from(at)];
        let name = row.names.iter().find_map(|source| {
            let name = match *source {
                Named::Subject => subject(span_name),
                Named::SpanName => span_name,
                Named::Stem => stem(span_name),
                Named::Attribute(key) => attributes.text_at(key)?,
            };
            (!name.is_empty()).then_some(name)
        });
        Call {
            row: RowId((ROWS.len() + usize::from(at)) as u8),
            kind: row.kind.unwrap_or(Kind::Agent),
            conditional: row.conditional,
            name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Key::*;
    use super::super::{Attributes, KEY_COUNT, ROWS, call_of};
    use super::*;
    use crate::decode::{Attribute, Value};

    fn spec(key: &str, value: &str, kind: Option<&str>, names: &[&str]) -> RowSpec {
        (
            "Acme".to_owned(),
            key.to_owned(),
            value.to_owned(),
            kind.map(str::to_owned),
            names.iter().map(|name| (*name).to_owned()).collect(),
            false,
            None,
        )
    }

    #[test]
    fn a_files_rows_read_after_the_built_in_rows_of_their_group() {
        let more = FileRows::new(vec![
            spec(
                "acme.type",
                "\"AGENT\"",
                Some("agent"),
                &["acme.entity", STEM],
            ),
            spec("acme.type", "\"LLM\"", None, &[]),
            spec(SPAN_NAME, "Running", Some("tool"), &[SUBJECT]),
            spec(
                "gen_ai.operation.name",
                "invoke_team",
                Some("agent"),
                &["acme.entity"],
            ),
        ])
        .expect("rows");
        assert_eq!(more.keys(), ["acme.type", "acme.entity"]);
        let (type_key, entity) = (KEY_COUNT as u16, KEY_COUNT as u16 + 1);
        let read = |name: &'static str, pairs: &[(u16, &'static str)]| {
            let list: Vec<_> = pairs
                .iter()
                .map(|&(key, text)| Attribute {
                    key,
                    value: Value::Str(text),
                })
                .collect();
            let attributes = Attributes::from_list(&list);
            call_of(name, "s", &attributes, &more).map(|call| (call.kind(), call.name, call.row.0))
        };
        let rows = ROWS.len() as u8;
        assert_eq!(
            read("run", &[(type_key, "\"AGENT\""), (entity, "planner")]),
            Some((Kind::Agent, Some("planner"), rows))
        );
        assert_eq!(
            read("planner.run", &[(type_key, "\"AGENT\"")]),
            Some((Kind::Agent, Some("planner"), rows))
        );
        // Without its quotes the value is another.
        assert_eq!(
            read("run", &[(type_key, "AGENT"), (entity, "planner")]),
            None
        );
        // A kind of no call falls through to the operation, the file's operation rows included.
        let team = [
            (type_key, "\"LLM\""),
            (Operation as u16, "invoke_team"),
            (entity, "crew"),
        ];
        assert_eq!(
            read("x", &team),
            Some((Kind::Agent, Some("crew"), rows + 3))
        );
        assert_eq!(
            read("Running search", &[]),
            Some((Kind::Tool, Some("search"), rows + 2))
        );
        // The built-in rows come first: a span name of theirs, an OpenInference kind.
        assert_eq!(
            read("invoke_agent a", &[(type_key, "\"AGENT\""), (entity, "b")]),
            Some((Kind::Agent, Some("a"), 1)) // row 0 is DSPy's scope's
        );
        let both = [
            (OiKind as u16, "TOOL"),
            (type_key, "\"AGENT\""),
            (OiToolName as u16, "t"),
        ];
        assert_eq!(read("x", &both).map(|call| call.1), Some(Some("t")));
        // The first kind key a span carries wins, a file's as a built-in one.
        let first = [
            (type_key, "\"AGENT\""),
            (entity, "p"),
            (OiKind as u16, "TOOL"),
        ];
        assert_eq!(read("x", &first).map(|call| call.1), Some(Some("p")));
    }

    #[test]
    fn a_malformed_row_is_an_error_naming_it() {
        let error = |specs: Vec<RowSpec>| FileRows::new(specs).expect_err("refused");
        assert_eq!(
            error(vec![
                spec("k", "v", Some("agent"), &["n"]),
                spec("k", "v", Some("robot"), &["n"])
            ]),
            "row 2: kind \"robot\": agent, tool or None"
        );
        assert!(error(vec![spec("k", "", Some("agent"), &["n"])]).starts_with("row 1: an empty"));
        assert!(
            error(vec![spec("k", "v", Some("agent"), &[])]).starts_with("row 1: a row with a kind")
        );
        assert!(
            error(vec![spec(SUBJECT, "v", Some("agent"), &["n"])])
                .starts_with("row 1: a row matches")
        );
        assert!(
            error(vec![spec("k", "v", Some("tool"), &[""])]).starts_with("row 1: an empty name")
        );
        let many = vec![spec("k", "v", None, &[]); MAX_FILE_ROWS + 1];
        assert!(error(many).contains("rows; at most"));
        assert!(FileRows::new(vec![spec("k", "v", None, &[]); MAX_FILE_ROWS]).is_ok());
    }
}
