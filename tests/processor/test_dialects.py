"""The dialects table (otel_guard_processor.dialects), row by row, on real OTLP span encodings."""

from __future__ import annotations

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from otel_guard_processor.dialects import (
    AGENT,
    CALL_PREFIXES,
    MARKERS,
    OPENINFERENCE_LANGCHAIN_SCOPE,
    TOOL,
    Call,
    call_by_attributes,
)
from otel_guard_processor.dialects import FORM_GENAI as GENAI
from otel_guard_processor.dialects import FORM_NAME as NAME
from otel_guard_processor.dialects import FORM_OPENINFERENCE as OI
from otel_guard_processor.dialects import FORM_OPENINFERENCE_CHAIN as OI_CHAIN
from otel_guard_processor.dialects import FORM_TRACELOOP as TL
from otel_guard_processor.dialects import FORM_TRACELOOP_TASK as TL_TASK


def encoded(name: str, **attributes: str | int) -> bytes:
    span = Span(trace_id=b"t" * 16, span_id=b"s" * 8, name=name)
    for key, value in attributes.items():
        any_value = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
        span.attributes.append(KeyValue(key=key.replace("__", "."), value=any_value))
    return span.SerializeToString()


def read(name: str, scope: str = "any", **attributes: str | int) -> Call | None:
    return call_by_attributes(name, scope, encoded(name, **attributes))


ROWS = [
    # GenAI operations (the span named otherwise)
    (("agent run", "any"), {"gen_ai__operation__name": "invoke_agent", "gen_ai__agent__name": "a"}, Call(AGENT, "a", GENAI)),
    (("tool run", "any"), {"gen_ai__operation__name": "execute_tool", "gen_ai__tool__name": "t"}, Call(TOOL, "t", GENAI)),
    (("crew", "any"), {"gen_ai__operation__name": "invoke_workflow", "gen_ai__workflow__name": "w"}, Call(AGENT, "w", GENAI)),
    (("invoke_agent", "any"), {"gen_ai__agent__name": "a"}, Call(AGENT, "a", NAME)),
    (("chat gpt-4o", "any"), {"gen_ai__operation__name": "chat"}, None),
    # OpenInference
    (("planner", "oi.x"), {"openinference__span__kind": "AGENT", "agent__name": "planner"}, Call(AGENT, "planner", OI)),
    (("planner", "oi.x"), {"openinference__span__kind": "AGENT", "graph__node__id": "p"}, Call(AGENT, "p", OI)),
    (("ask", "oi.x"), {"openinference__span__kind": "TOOL", "tool__name": "ask_budget"}, Call(TOOL, "ask_budget", OI)),
    (("ask_budget", "oi.x"), {"openinference__span__kind": "TOOL"}, Call(TOOL, "ask_budget", OI)),
    (("turn", "oi.x"), {"openinference__span__kind": "CHAIN"}, None),
    (("Agent workflow", "oi.x"), {"openinference__span__kind": "AGENT"}, Call(AGENT, None, OI)),
    (("ChatModel", "oi.x"), {"openinference__span__kind": "LLM"}, None),
    # OpenInference for LangChain: the graph run (CHAIN) is the agent, its AGENT guess is not
    (("budget", OPENINFERENCE_LANGCHAIN_SCOPE), {"openinference__span__kind": "CHAIN"}, Call(AGENT, "budget", OI_CHAIN, True)),
    (("agent", OPENINFERENCE_LANGCHAIN_SCOPE), {"openinference__span__kind": "AGENT"}, None),
    # OpenLLMetry / Traceloop
    (("planner.workflow", "tl"), {"traceloop__span__kind": "workflow", "traceloop__entity__name": "planner"}, Call(AGENT, "planner", TL)),
    (("x.agent", "tl"), {"traceloop__span__kind": "agent", "traceloop__entity__name": "x"}, Call(AGENT, "x", TL)),
    (("lookup.tool", "tl"), {"traceloop__span__kind": "tool", "traceloop__entity__name": "lookup"}, Call(TOOL, "lookup", TL)),
    (("execute_task budget", "tl"), {"traceloop__span__kind": "task", "traceloop__entity__name": "budget", "gen_ai__operation__name": "execute_task"}, Call(AGENT, "budget", TL_TASK, True)),
    # a dialect's kind first: Traceloop's workflow span carries a GenAI operation as well
    (("planner.workflow", "tl"), {"gen_ai__operation__name": "invoke_agent", "gen_ai__agent__name": "planner", "traceloop__span__kind": "workflow", "traceloop__entity__name": "planner"}, Call(AGENT, "planner", TL)),
]  # fmt: skip


@pytest.mark.parametrize(("span", "attributes", "expected"), ROWS)
def test_each_row_of_the_table(
    span: tuple[str, str], attributes: dict[str, str], expected: Call | None
) -> None:
    assert read(span[0], span[1], **attributes) == expected


def test_values_of_another_type_or_undecodable_read_as_no_call() -> None:
    assert read("x", "oi.x", openinference__span__kind=7) is None
    span = Span(name="x")
    span.attributes.append(KeyValue(key="traceloop.span.kind", value=AnyValue(bytes_value=b"\xff\xfe")))
    assert call_by_attributes("x", "tl", span.SerializeToString()) is None
    # A key that only looks like the dialect's (a longer name ending the same) is not it.
    assert read("x", "oi.x", my_openinference__span__kind="TOOL") is None


def test_every_call_by_attributes_is_announced_by_a_marker() -> None:
    for (name, _scope), attributes, expected in ROWS:
        if expected is not None and expected.form != NAME:
            assert any(marker in encoded(name, **attributes) for marker in MARKERS), (name, attributes)
    assert any(marker in encoded("invoke_agent", gen_ai__agent__name="a") for marker in MARKERS)
    assert CALL_PREFIXES == ("invoke_agent ", "execute_tool ", "invoke_workflow ")
