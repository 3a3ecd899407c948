"""A dialects file (``--dialects FILE``): more dialect rows, in the built-in table's own form.

A row says which spans are calls and what names them, with the columns of the dialect table in
docs/processor/dialects.md::

    rows:
      - dialect: Acme Agents           # a label (any text)
        key: acme.span.type            # an attribute, or "the span name" (its value, or it and a space)
        value: agent                   # the value, exactly: mlflow's is '"AGENT"', quotes and all
        kind: agent                    # agent, tool, or none (no call by this kind: read by the operation)
        named_by: [acme.agent.name, the span name]   # the first of these the span has
        only_first_below_a_tool: false # optional: a call only directly below a tool (Traceloop's task)
        only_in_scope: acme.tracer     # optional, kind and span-name rows: only in this scope

``named_by`` takes attributes and "the span name", "the span name's subject" (after its first
space), "the span name before its last dot". A row is read after the built-in rows of its group:
span-name rows after the span-name rows; ``gen_ai.operation.name`` rows after the operation rows;
``a2a.method.name`` / ``mcp.method.name`` rows after the protocol rows; any other key is a *kind key*
(read as OpenInference's and Traceloop's are: by the first of them a span carries), its rows after
the built-in kind rows. :func:`table_rows` gives the built-in table in this form.

What a reader would not guess: a row an earlier row always reads first can never match, and is
refused as such (``openinference.span.kind: AGENT`` is built-in row 6's), as is anything else
wrong, in one :class:`~otel_guard_processor.config.ConfigError` naming the file, the line, the
row and the field. The file is read event by event first (no anchors, aliases or deep nesting).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

__all__ = [
    "FIELDS",
    "MAX_ROWS",
    "SPAN_NAME",
    "DialectsError",
    "Spec",
    "read_dialects",
    "table_rows",
    "to_yaml",
]

MAX_BYTES: Final = 1024 * 1024
MAX_ROWS: Final = 128
_MAX_DEPTH: Final = 4  # the document, rows, a row, its named_by
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# The file's words for the span name's sources (the docs table's), and the engine's tokens for them.
SPAN_NAME: Final = "the span name"
SUBJECT: Final = "the span name's subject"
STEM: Final = "the span name before its last dot"
_TOKENS: Final = {
    SPAN_NAME: "<the span name>",
    SUBJECT: "<the span name's subject>",
    STEM: "<the span name before its last dot>",
}
_WORDS: Final = {token: word for word, token in _TOKENS.items()}
_GROUP_KEYS: Final = ("gen_ai.operation.name", "a2a.method.name", "mcp.method.name")

FIELDS: Final = (
    "dialect",
    "key",
    "value",
    "kind",
    "named_by",
    "only_first_below_a_tool",
    "only_in_scope",
)
_REQUIRED: Final = ("dialect", "key", "value", "kind")
KINDS: Final = ("agent", "tool", "none")

Spec = tuple[str, str, str, str | None, tuple[str, ...], bool, str | None]
"""A row as ``dialect_table()`` gives it and ``Engine(dialects=...)`` takes it: (dialect, key, value,
kind, names, conditional, scope), the span name's sources as the engine's ``<...>`` tokens."""


class DialectsError(ValueError):
    """The dialects file is wrong; the message names the file, the line, the row and the field."""


@dataclass(frozen=True)
class _Where:
    path: Path
    line: int | None = None
    row: int | None = None
    field: str | None = None

    def error(self, message: str) -> DialectsError:
        parts = [str(self.path)]
        if self.line is not None:
            parts.append(f"line {self.line}")
        if self.row is not None:
            parts.append(f"row {self.row}")
        if self.field is not None:
            parts.append(f"field {self.field}")
        return DialectsError(" ".join(f"{', '.join(parts)}: {message}".split())[:500])


def read_dialects(path: str | Path, builtin: Sequence[Spec]) -> tuple[Spec, ...]:
    """The rows of the dialects file at ``path``, checked against the ``builtin`` rows (the engine's
    ``dialect_table()``): DialectsError for a file that cannot be read or is wrong anywhere."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            data = file.read(MAX_BYTES + 1)
    except OSError as exc:
        raise _Where(path).error(f"cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise _Where(path).error(f"larger than {MAX_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Where(path).error(f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    try:
        _check_events(text, path)
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = ": ".join(part for part in (exc.context, exc.problem) if part)
        raise _Where(path, _line(mark)).error(f"not valid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise _Where(path).error(f"not valid YAML: {exc}") from None
    return tuple(_rows(node, path, builtin))


def _check_events(text: str, path: Path) -> None:
    """Refuse anchors, aliases and nesting deeper than a row's ``named_by`` before anything is built."""
    loader = _Loader(text)
    try:
        depth = 0
        while loader.check_event():
            event = loader.get_event()
            where = _Where(path, _line(event.start_mark))
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise where.error("anchors and aliases are not accepted")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > _MAX_DEPTH:
                    raise where.error("nested deeper than a row's named_by list")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    finally:
        loader.dispose()


def _line(mark: Any) -> int | None:
    return None if mark is None else int(mark.line) + 1


def _rows(node: Any, path: Path, builtin: Sequence[Spec]) -> Iterable[Spec]:
    top = _Where(path, _line(node.start_mark) if node is not None else None)
    if node is None or (isinstance(node, yaml.ScalarNode) and node.value in ("", "~", "null")):
        return ()
    if not isinstance(node, yaml.MappingNode):
        raise top.error("must be a mapping with one key, rows")
    rows_node = None
    for key, value in node.value:
        name = key.value if isinstance(key, yaml.ScalarNode) else "?"
        if name != "rows":
            raise _Where(path, _line(key.start_mark)).error(f"unknown key {name!r}; the file has rows only")
        rows_node = value
    if rows_node is None:
        raise top.error("no rows key")
    if not isinstance(rows_node, yaml.SequenceNode):
        raise _Where(path, _line(rows_node.start_mark), field="rows").error("must be a list of rows")
    if len(rows_node.value) > MAX_ROWS:
        raise _Where(path, _line(rows_node.start_mark), field="rows").error(
            f"{len(rows_node.value)} rows; at most {MAX_ROWS}"
        )
    read: list[Spec] = []
    for number, row_node in enumerate(rows_node.value, start=1):
        spec, value_line = _row(row_node, _Where(path, _line(row_node.start_mark), number))
        _reachable(spec, [*builtin, *read], len(builtin), _Where(path, value_line, number, "value"))
        read.append(spec)
    return read


def _row(node: Any, where: _Where) -> tuple[Spec, int | None]:
    """A row, and the line of its value."""
    if not isinstance(node, yaml.MappingNode):
        raise where.error("a row must be a mapping of " + ", ".join(FIELDS))
    values: dict[str, Any] = {}
    lines: dict[str, int | None] = {}
    for key, value in node.value:
        name = key.value if isinstance(key, yaml.ScalarNode) else "?"
        field = _Where(where.path, _line(key.start_mark), where.row, name)
        if name not in FIELDS:
            close = difflib.get_close_matches(name, FIELDS, n=1)
            hint = f"did you mean {close[0]}?" if close else "known: " + ", ".join(FIELDS)
            raise field.error(f"unknown field; {hint}")
        if name in values:
            raise field.error("given twice")
        values[name] = _value(value, field)
        lines[name] = _line(value.start_mark)
    for name in _REQUIRED:
        if name not in values:
            raise where.error(
                f"no {name} (a row has {', '.join(_REQUIRED)}, and named_by unless kind is none)"
            )

    def at(name: str) -> _Where:
        return _Where(where.path, lines.get(name, where.line), where.row, name)

    dialect, key, value = (_text(values[name], at(name)) for name in ("dialect", "key", "value"))
    if key in (SUBJECT, STEM):
        raise at("key").error(f"a row matches {SPAN_NAME!r} or an attribute, not {key!r}")
    kind = _text(values["kind"], at("kind"))
    if kind not in KINDS:
        raise at("kind").error(f"must be one of {', '.join(KINDS)}, got {kind!r}")
    names_value = values.get("named_by", [])
    if not isinstance(names_value, list):
        raise at("named_by").error(
            f"must be a list of attributes or {SPAN_NAME!r}-sources, got {_type(names_value)}"
        )
    names = tuple(_text(name, at("named_by")) for name in names_value)
    if kind == "none" and names:
        raise at("named_by").error("a row of kind none makes no call and names nothing")
    conditional = values.get("only_first_below_a_tool", False)
    if not isinstance(conditional, bool):
        raise at("only_first_below_a_tool").error(f"must be true or false, got {_type(conditional)}")
    scope = values.get("only_in_scope")
    if scope is not None:
        scope = _text(scope, at("only_in_scope"))
        if key in _GROUP_KEYS:
            raise at("only_in_scope").error(
                "only a span-name row or a kind row (an attribute other than "
                + ", ".join(_GROUP_KEYS)
                + ") is read by scope"
            )
    if kind != "none" and not names and scope is None:
        # In a scope a row may name nothing: that instrumentation names every such call alike.
        raise at("named_by").error(
            "a row of kind agent or tool names its call: give at least one source "
            "(or only_in_scope, for an instrumentation that names every call alike)"
        )
    spec = (
        dialect,
        _TOKENS.get(key, key),
        value,
        None if kind == "none" else kind,
        tuple(_TOKENS.get(name, name) for name in names),
        conditional,
        scope,
    )
    return spec, at("value").line


def _value(node: Any, where: _Where) -> Any:
    if isinstance(node, yaml.SequenceNode):
        return [_value(item, where) for item in node.value]
    if isinstance(node, yaml.MappingNode):
        return {}
    tag = node.tag
    if tag == "tag:yaml.org,2002:bool":
        return node.value.lower() in ("true", "yes", "on", "y")
    if tag == "tag:yaml.org,2002:null":
        return None
    if tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float"):
        return _Number(node.value)
    return node.value


class _Number(str):
    """A YAML number: a value a text field refuses (quote it to mean the text)."""


def _text(value: Any, where: _Where) -> str:
    if not isinstance(value, str) or isinstance(value, _Number):
        raise where.error(f"must be text, got {_type(value)} (quote it to mean the text)")
    if not value:
        raise where.error("must not be empty")
    return value


def _type(value: Any) -> str:
    if isinstance(value, _Number):
        return f"the number {value}"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if value is None:
        return "nothing"
    if isinstance(value, list):
        return "a list"
    return "a mapping" if isinstance(value, dict) else repr(value)


def _reachable(spec: Spec, earlier: Sequence[Spec], builtin: int, where: _Where) -> None:
    """Refuse a row that an earlier one always reads first: it could never match."""
    _, key, value, _, _, _, scope = spec
    for number, (dialect, other_key, other_value, _, _, _, other_scope) in enumerate(earlier, start=1):
        if other_key != key:
            continue
        if key == _TOKENS[SPAN_NAME]:
            covers = value == other_value or value.startswith(other_value + " ")
            shadows = covers and other_scope in (None, scope)
        elif key in _GROUP_KEYS:
            shadows = value == other_value
        else:
            shadows = value == other_value and other_scope in (None, scope)
        if shadows:
            which = f"built-in row {number}" if number <= builtin else f"row {number - builtin}"
            shown = _WORDS.get(other_key, other_key)
            raise where.error(
                f"can never match: {which} ({dialect}: {shown} {other_value!r}"
                f"{f' in scope {other_scope}' if other_scope else ''}) reads every span it would"
            )


def table_rows(specs: Iterable[Spec]) -> list[dict[str, Any]]:
    """Rows in the file's form (what ``rows:`` holds), from ``dialect_table()``'s."""
    out = []
    for dialect, key, value, kind, names, conditional, scope in specs:
        row: dict[str, Any] = {
            "dialect": dialect,
            "key": _WORDS.get(key, key),
            "value": value,
            "kind": kind or "none",
        }
        if names:
            row["named_by"] = [_WORDS.get(name, name) for name in names]
        if conditional:
            row["only_first_below_a_tool"] = True
        if scope is not None:
            row["only_in_scope"] = scope
        out.append(row)
    return out


def to_yaml(specs: Iterable[Spec]) -> str:
    """A dialects file holding ``specs``."""
    return yaml.safe_dump({"rows": table_rows(specs)}, sort_keys=False, allow_unicode=True, width=110)
