r"""Which spans are calls: the dialects agent telemetry is written in, mapped to one question.

The detector asks of a span "is this a call, of which kind, named what?" and knows no dialect; this
module answers. A *call* is an agent run (kind ``AGENT``) or a tool call (kind ``TOOL``); a span
that is neither is an unnamed link in the ancestry (HTTP spans, model calls, graph nodes, ...).

========================  ==========================================  =====  ===========================
dialect                   the span                                    kind   name
========================  ==========================================  =====  ===========================
OpenTelemetry GenAI       span name ``invoke_agent X``                AGENT  ``X``
\                         span name ``invoke_workflow X``             AGENT  ``X``
\                         span name ``execute_tool X``                TOOL   ``X``
\                         ``gen_ai.operation.name`` ``invoke_agent``  AGENT  ``gen_ai.agent.name``
\                         ... ``invoke_workflow``                     AGENT  ``gen_ai.workflow.name``
\                         ... ``execute_tool``                        TOOL   ``gen_ai.tool.name``
OpenInference             ``openinference.span.kind`` ``AGENT``       AGENT  ``agent.name``, else
                                                                             ``graph.node.id``
\                         ``openinference.span.kind`` ``TOOL``        TOOL   ``tool.name``, else the
                                                                             span name
OpenInference, LangChain  ``CHAIN`` first below a tool, or with no    AGENT  the span name (a LangGraph
                          call above it                                      graph run: the agent)
OpenLLMetry / Traceloop   ``traceloop.span.kind`` ``agent``,          AGENT  ``traceloop.entity.name``
                          ``workflow``
\                         ``traceloop.span.kind`` ``tool``            TOOL   ``traceloop.entity.name``
\                         ``task`` first below a tool (the run of     AGENT  ``traceloop.entity.name``
                          an agent called as a tool)
========================  ==========================================  =====  ===========================

A span named in the GenAI form is read by its name. Otherwise a dialect's own kind comes first: a
span that carries it and GenAI attributes too (Traceloop's ``X.workflow``) is read by its dialect,
and by ``gen_ai.operation.name`` when its dialect's kind says it is no call. A call
whose name is missing or empty is an unnamed call: a link like any other span.

LangChain's ``AGENT`` kind in OpenInference is a guess from the run's name (``"agent" in name``), and
its name is a graph node's (``agent``), not the agent's; so for that scope the graph run is the call
and ``AGENT`` spans are links. Rows marked "first below a tool" are *conditional*: the detector counts
such a span as a call only where its nearest named ancestor is a tool call, or where it has none.

Reading stays lazy, because this runs at line rate: a span named in the GenAI form is a call by its
name alone (:data:`CALL_PREFIXES`); attributes are read (:func:`call_by_attributes`, or
:func:`read_call` for the detector: the same answer as a plain tuple) only for spans of requests
that hold one of :data:`MARKERS` at all. A call span that starts a trace and names its caller
(``gen_ai.caller.agent.name``, set by agent-to-agent servers) continues that caller's path.

Encoders write a KeyValue's key before its value, except the OpenTelemetry Collector (Go's pdata
writes the value first). Both are read in place where the KeyValue has the common short layout (a
kind by one lookup of its whole KeyValue, a string by its one-byte lengths, every length checked);
any other layout is re-encoded key first (:func:`~otel_guard_processor.otlp.key_first`) and read so.
"""

from __future__ import annotations

from types import EllipsisType
from typing import Final, NamedTuple

from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv_ai import SpanAttributes as TraceloopAttributes
from opentelemetry.semconv_ai import TraceloopSpanKindValues

from otel_guard_processor.otlp import (
    ATTRIBUTE_TAG,
    Attributes,
    attribute_key,
    encoded_attribute,
    key_first,
    string_at,
    string_before,
    string_of,
    string_of_value_first,
)

__all__ = [
    "AGENT",
    "CALLER_AGENT_NAME",
    "CALL_PREFIXES",
    "MARKERS",
    "TOOL",
    "Call",
    "call_by_attributes",
    "name_of_named_call",
    "read_call",
]

AGENT: Final = 1
TOOL: Final = 2


class Call(NamedTuple):
    """What a span is as a call: its kind, its name (``None``: an unnamed call), how it was read."""

    kind: int
    name: str | None
    # Which row of the table matched: two spans of one instrumentation with the same call name but
    # read by different rows (Traceloop's ``invoke_agent X`` and ``X.workflow``) record one call.
    form: int
    # Only a call when first below a tool, or with no call above it (see the module docstring).
    conditional: bool = False


# What read_call answers: a Call's fields as a plain tuple (a NamedTuple costs four times as much
# to make, and this runs for every span of the scopes that name calls otherwise).
CallFields = tuple[int, str | None, int, bool]

# Forms: one per row of the table (the span-name rows share one per kind).
FORM_NAME: Final = 1
FORM_GENAI: Final = 2
FORM_OPENINFERENCE: Final = 3
FORM_OPENINFERENCE_CHAIN: Final = 4
FORM_TRACELOOP: Final = 5
FORM_TRACELOOP_TASK: Final = 6

_INVOKE_AGENT: Final = gen_ai.GenAiOperationNameValues.INVOKE_AGENT.value
_INVOKE_WORKFLOW: Final = gen_ai.GenAiOperationNameValues.INVOKE_WORKFLOW.value
_EXECUTE_TOOL: Final = gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value

# Span-name prefixes of the GenAI form, and the kind each names.
_NAME_FORMS: Final = (
    (_INVOKE_AGENT + " ", AGENT),
    (_EXECUTE_TOOL + " ", TOOL),
    (_INVOKE_WORKFLOW + " ", AGENT),
)
CALL_PREFIXES: Final = tuple(prefix for prefix, _ in _NAME_FORMS)


# --- attributes, bound once -----------------------------------------------------------------

# Each dialect is one key to look up on a span, and a table of its values. OpenInference's and
# Traceloop's keys end alike, so one search of the span's encoding finds either.
_OPERATION: Final = attribute_key(gen_ai.GEN_AI_OPERATION_NAME)
_OPERATION_FIELD: Final = _OPERATION[:-1]  # the key alone, in whichever order the KeyValue is written
# The agent that called this one, where a remote agent's server span names it (the GenAI caller
# attributes of agent-to-agent calls, ``gen_ai.caller.agent.*``): a trace root that carries it
# continues its caller's path.
CALLER_AGENT_NAME: Final = attribute_key("gen_ai.caller.agent.name")
_NAME_KEYS: Final = {
    _INVOKE_AGENT: attribute_key(gen_ai.GEN_AI_AGENT_NAME),
    _EXECUTE_TOOL: attribute_key(gen_ai.GEN_AI_TOOL_NAME),
    _INVOKE_WORKFLOW: attribute_key(gen_ai.GEN_AI_WORKFLOW_NAME),
}
_BARE_NAMES: Final = {_INVOKE_AGENT: AGENT, _EXECUTE_TOOL: TOOL, _INVOKE_WORKFLOW: AGENT}

_OI_KIND_NAME: Final = SpanAttributes.OPENINFERENCE_SPAN_KIND
_OI_KIND: Final = attribute_key(_OI_KIND_NAME)
_OI_AGENT: Final = OpenInferenceSpanKindValues.AGENT.value
_OI_TOOL: Final = OpenInferenceSpanKindValues.TOOL.value
_OI_CHAIN: Final = OpenInferenceSpanKindValues.CHAIN.value
_OI_AGENT_NAME: Final = attribute_key(SpanAttributes.AGENT_NAME)
_OI_GRAPH_NODE: Final = attribute_key(SpanAttributes.GRAPH_NODE_ID)
_OI_TOOL_NAME: Final = attribute_key(SpanAttributes.TOOL_NAME)
# OpenInference's LangChain instrumentation (the only scope whose CHAIN spans name agents).
OPENINFERENCE_LANGCHAIN_SCOPE: Final = "openinference.instrumentation.langchain"

_TL_KIND_NAME: Final = TraceloopAttributes.TRACELOOP_SPAN_KIND
_TL_KIND: Final = attribute_key(_TL_KIND_NAME)
_TL_NAME: Final = attribute_key(TraceloopAttributes.TRACELOOP_ENTITY_NAME)
_TL_FORMS: Final = {  # value -> (kind, form, conditional)
    TraceloopSpanKindValues.AGENT.value: (AGENT, FORM_TRACELOOP, False),
    TraceloopSpanKindValues.WORKFLOW.value: (AGENT, FORM_TRACELOOP, False),
    TraceloopSpanKindValues.TOOL.value: (TOOL, FORM_TRACELOOP, False),
    TraceloopSpanKindValues.TASK.value: (AGENT, FORM_TRACELOOP_TASK, True),
}

_KIND_ENDING: Final = b"span.kind\x12"
_KIND_TEXT: Final = _KIND_ENDING[:-1]

# A request that holds none of these bytes has no span that is a call by its attributes: what the
# GenAI operations start with, as string values or bare span names ("invoke_agent" and
# "invoke_workflow" share "invoke_"), and what the dialects' kind keys end with. Few, because a
# request of spans that are no calls (HTTP, databases: most of what a pipeline carries) is searched
# once a marker, end to end; a marker that also stands elsewhere only has the request read closer.
MARKERS: Final = (
    _INVOKE_AGENT[: _INVOKE_AGENT.index("_") + 1].encode(),
    _EXECUTE_TOOL.encode(),
    _KIND_TEXT,
)
assert all(operation.encode().startswith(MARKERS[:2]) for operation in _BARE_NAMES)


def name_of_named_call(span_name: str, attributes: Attributes) -> str | None:
    """The name of a call whose GenAI span name has no subject (``invoke_agent``), if it has one."""
    key = _NAME_KEYS.get(span_name.partition(" ")[0])
    return (attributes.string(key) or None) if key is not None else None


_OI_KIND_START: Final = len(_OI_KIND) - len(_KIND_ENDING)
_TL_KIND_START: Final = len(_TL_KIND) - len(_KIND_ENDING)
assert _OI_KIND.endswith(_KIND_ENDING)
assert _TL_KIND.endswith(_KIND_ENDING)
assert _OI_KIND_START > _TL_KIND_START


def _value_first(key_value: bytes) -> bytes:
    """A KeyValue of :func:`encoded_attribute`'s (a short string) written value first."""
    key_end = key_value.index(b"\x12")  # the value's tag: a short key's field holds no 0x12
    return key_value[key_end:] + key_value[:key_end]


# What a dialect's kind makes of a span, by the kind's whole KeyValue as encoders write it (key
# first, the value a short string): (kind, form, conditional, naming), ``naming`` saying where the
# call's name is (_BY_SPAN_NAME, _BY_TOOL_NAME: OpenInference's tool.name else the span name,
# _BY_AGENT_NAME: agent.name else graph.node.id, _BY_ENTITY_NAME: Traceloop's entity name), or
# _NOT_A_CALL for a kind that is no call (the span is then read by its GenAI operation). One table
# for OpenInference's LangChain scope, one for every other scope. One slice of the encoding and one
# lookup read the common cases; a kind written otherwise is read field by field (_call_by_kind).
_BY_SPAN_NAME: Final = 0
_BY_TOOL_NAME: Final = 1
_BY_AGENT_NAME: Final = 2
_BY_ENTITY_NAME: Final = 3
_NOT_A_CALL: Final = (0, 0, False, 0)
_OI_ROWS: Final = {
    **{encoded_attribute(_OI_KIND_NAME, kind.value): _NOT_A_CALL for kind in OpenInferenceSpanKindValues},
    encoded_attribute(_OI_KIND_NAME, _OI_TOOL): (TOOL, FORM_OPENINFERENCE, False, _BY_TOOL_NAME),
}
_TL_ROWS: Final = {
    **{encoded_attribute(_TL_KIND_NAME, kind.value): _NOT_A_CALL for kind in TraceloopSpanKindValues},
    **{
        encoded_attribute(_TL_KIND_NAME, value): (kind_of, form, conditional, _BY_ENTITY_NAME)
        for value, (kind_of, form, conditional) in _TL_FORMS.items()
    },
}
_KIND_ROWS: Final[dict[bytes, tuple[int, int, bool, int]]] = {
    **_OI_ROWS,
    encoded_attribute(_OI_KIND_NAME, _OI_AGENT): (AGENT, FORM_OPENINFERENCE, False, _BY_AGENT_NAME),
    **_TL_ROWS,
}
_LANGCHAIN_KIND_ROWS: Final[dict[bytes, tuple[int, int, bool, int]]] = {
    **_OI_ROWS,
    encoded_attribute(_OI_KIND_NAME, _OI_CHAIN): (AGENT, FORM_OPENINFERENCE_CHAIN, True, _BY_SPAN_NAME),
    **_TL_ROWS,
}
# The same tables by each kind's KeyValue written value first (the OpenTelemetry Collector's
# encoding): found by the kind's text, which ends it, and the value's tag before it.
_KIND_ROWS_VALUE_FIRST: Final = {_value_first(kv): row for kv, row in _KIND_ROWS.items()}
_LANGCHAIN_KIND_ROWS_VALUE_FIRST: Final = {_value_first(kv): row for kv, row in _LANGCHAIN_KIND_ROWS.items()}
_LONGEST_VALUE_FIRST_KIND: Final = max(map(len, _KIND_ROWS_VALUE_FIRST | _LANGCHAIN_KIND_ROWS_VALUE_FIRST))
_KIND_TEXT_LENGTH: Final = len(_KIND_TEXT)
_KIND_ENDING_LENGTH: Final = len(_KIND_ENDING)


def call_by_attributes(span_name: str, scope: str, encoded: bytes) -> Call | None:
    """The call a span records by its attributes (``encoded``: the span's encoding), or None."""
    fields = read_call(span_name, scope, encoded)
    return None if fields is None else Call(*fields)


def read_call(span_name: str, scope: str, encoded: bytes) -> CallFields | None:
    """:func:`call_by_attributes`, its answer a plain tuple of the Call's fields.

    Runs for every span of the scopes that name calls otherwise, so it searches the encoding once
    for either dialect's kind (their keys end alike) before anything else, and reads the kind's
    common encodings by one lookup.
    """
    bare = _BARE_NAMES.get(span_name)
    if bare is not None:
        return (bare, name_of_named_call(span_name, Attributes.of(encoded)), FORM_NAME, False)
    at = encoded.find(_KIND_ENDING)
    if at < 0:
        return _call_by_operation(span_name, scope, encoded)
    end = at + _KIND_ENDING_LENGTH
    try:
        stop = end + 1 + encoded[end]  # the KeyValue's end, when its value is short
    except IndexError:
        stop = end
    rows = _LANGCHAIN_KIND_ROWS if scope == OPENINFERENCE_LANGCHAIN_SCOPE else _KIND_ROWS
    row = rows.get(encoded[at - _OI_KIND_START : stop]) if at >= _OI_KIND_START else None
    if row is None and at >= _TL_KIND_START:
        row = rows.get(encoded[at - _TL_KIND_START : stop])
    if row is None:
        return _call_by_kind(span_name, scope, encoded, at)
    kind_of, form, conditional, naming = row
    if not kind_of:
        operation_at = encoded.find(_OPERATION)
        return None if operation_at < 0 else _call_by_genai_operation(encoded, operation_at)
    if naming == _BY_SPAN_NAME:  # (the most common row, read here without a call)
        return (kind_of, span_name or None, form, conditional)
    return (kind_of, _name_by(naming, span_name, encoded), form, conditional)


def _name_by(naming: int, span_name: str, encoded: bytes) -> str | None:
    """A call's name where its row of the table says it is (``naming``), in either field order."""
    if naming == _BY_SPAN_NAME:
        return span_name or None
    if naming == _BY_ENTITY_NAME:
        return string_of(encoded, _TL_NAME) or None
    if naming == _BY_TOOL_NAME:
        return string_of(encoded, _OI_TOOL_NAME) or span_name or None
    return _oi_agent_name(encoded) or None


def _oi_agent_name(encoded: bytes) -> str | None:
    """An OpenInference agent's ``agent.name``, else its ``graph.node.id``."""
    at = encoded.find(_OI_AGENT_NAME)
    if at >= 0:
        agent = string_at(encoded, at + len(_OI_AGENT_NAME))
        if agent:
            return agent
        # The name was found written key first: so is the node id looked for, as Attributes does.
        at = encoded.find(_OI_GRAPH_NODE)
        return string_at(encoded, at + len(_OI_GRAPH_NODE)) if at >= 0 else None
    return string_of_value_first(encoded, _OI_AGENT_NAME) or string_of(encoded, _OI_GRAPH_NODE)


def _call_by_operation(span_name: str, scope: str, encoded: bytes) -> CallFields | None:
    """:func:`call_by_attributes` of a span with no dialect's kind written key first."""
    operation_at = encoded.find(_OPERATION)
    if operation_at >= 0:
        return _call_by_genai_operation(encoded, operation_at)
    # Written value first (the OpenTelemetry Collector's encoding): read so where the layout is
    # the common one, else re-encoded key first.
    at = encoded.find(_KIND_TEXT)
    read = _value_first_kind(span_name, scope, encoded, at) if at >= 0 else _value_first_operation(encoded)
    if read is not ...:
        return read
    if at >= 0 or encoded.find(_OPERATION_FIELD) >= 0:
        encoded = key_first(encoded)
        at = encoded.find(_KIND_ENDING)
        if at >= 0:
            return _call_by_kind(span_name, scope, encoded, at, encoded.find(_OPERATION))
        operation_at = encoded.find(_OPERATION)
    return _call_by_genai_operation(encoded, operation_at)


def _value_first_kind(
    span_name: str, scope: str, encoded: bytes, at: int
) -> CallFields | EllipsisType | None:
    """:func:`read_call` of a span whose first dialect's kind text, at ``at``, ends a KeyValue
    written value first; ``...`` when that is not the common layout of a known kind."""
    end = at + _KIND_TEXT_LENGTH
    tag = encoded.rfind(b"\x12", max(2, end - _LONGEST_VALUE_FIRST_KIND), at)
    if tag < 0 or encoded[tag - 1] != end - tag or encoded[tag - 2] != ATTRIBUTE_TAG:
        return ...  # not an attribute's whole KeyValue (the text in another value, say)
    rows = (
        _LANGCHAIN_KIND_ROWS_VALUE_FIRST if scope == OPENINFERENCE_LANGCHAIN_SCOPE else _KIND_ROWS_VALUE_FIRST
    )
    row = rows.get(encoded[tag:end])
    if row is None:
        return ...
    kind_of, form, conditional, naming = row
    if not kind_of:
        return _value_first_operation(encoded)  # (the caller found none written key first)
    return (kind_of, _name_by(naming, span_name, encoded), form, conditional)


def _value_first_operation(encoded: bytes) -> CallFields | EllipsisType | None:
    """The call of a span by its ``gen_ai.operation.name`` written value first, as
    :func:`_call_by_genai_operation` reads it key first; ``...`` when not in the common layout."""
    at = encoded.find(_OPERATION_FIELD)
    if at < 0:
        return None
    operation = string_before(encoded, at, at + len(_OPERATION_FIELD))
    if operation is ...:
        return ...
    key = _NAME_KEYS.get(operation or "")
    if key is None:
        return None
    return (_BARE_NAMES[operation], _name(encoded, key), FORM_GENAI, False)  # type: ignore[index]


def _call_by_kind(
    span_name: str, scope: str, encoded: bytes, at: int, operation_at: int | None = None
) -> CallFields | None:
    """:func:`call_by_attributes` from the first dialect's kind at ``at``, field by field."""
    while at >= 0:
        end = at + len(_KIND_ENDING)
        if encoded.startswith(_OI_KIND, at - _OI_KIND_START):
            kind = string_at(encoded, end)
            if kind == _OI_TOOL:
                tool = Attributes.of(encoded).string(_OI_TOOL_NAME) or span_name
                return (TOOL, tool or None, FORM_OPENINFERENCE, False)
            if scope == OPENINFERENCE_LANGCHAIN_SCOPE:
                if kind == _OI_CHAIN:
                    return (AGENT, span_name or None, FORM_OPENINFERENCE_CHAIN, True)
            elif kind == _OI_AGENT:
                attributes = Attributes.of(encoded)
                agent = attributes.string(_OI_AGENT_NAME) or attributes.string(_OI_GRAPH_NODE)
                return (AGENT, agent or None, FORM_OPENINFERENCE, False)
            break
        if encoded.startswith(_TL_KIND, at - _TL_KIND_START):
            row = _TL_FORMS.get(string_at(encoded, end) or "")
            if row is not None:
                kind_of, form, conditional = row
                return (kind_of, _name(encoded, _TL_NAME), form, conditional)
            break
        at = encoded.find(_KIND_ENDING, end)
    return _call_by_genai_operation(
        encoded, encoded.find(_OPERATION) if operation_at is None else operation_at
    )


def _call_by_genai_operation(encoded: bytes, operation_at: int) -> CallFields | None:
    """The call of a span by its ``gen_ai.operation.name`` (its KeyValue at ``operation_at``)."""
    if operation_at >= 0:
        operation = string_at(encoded, operation_at + len(_OPERATION)) or ""
        key = _NAME_KEYS.get(operation)
        if key is not None:
            return (_BARE_NAMES[operation], _name(encoded, key), FORM_GENAI, False)
    return None


def _name(encoded: bytes, key: bytes) -> str | None:
    """A call's name from one attribute of the span's encoding; empty or absent is no name."""
    return string_of(encoded, key) or None
