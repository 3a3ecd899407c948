"""The guard's hop spans checked against the GenAI semantic conventions (tests/semconv/genai-v0.1.yaml).

Each hop span is checked as the GenAI span of its call (``gen_ai.invoke_agent.client`` or
``.internal``, ``gen_ai.execute_tool.internal``, chosen by its operation and kind) and, for a
protocol hop, against the attribute requirements of the protocol's span too (``a2a.client``,
``a2a.server``, ``mcp.client``, ``mcp.server``). What a reader would not guess: the name is checked
against the contract's ``invoke_agent {agent}`` / ``execute_tool {tool}`` (the GenAI rule), never the
protocol's ``{a2a.method.name}`` / ``{mcp.method.name} {target}``, and the kind against the GenAI
span only: the protocol's own span is the SDK's (docs/spec.md §5 says why).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

MODEL = Path(__file__).resolve().parent / "semconv" / "genai-v0.1.yaml"

NAMESPACES = ("gen_ai.", "a2a.", "mcp.", "jsonrpc.", "server.", "error.")
"""Attribute prefixes the conventions own: a hop attribute under one must be in the model."""

WAIVED = {"gen_ai.provider.name": "the model provider: the guard sees hops, not the models behind them"}
"""Required attributes the guard does not set, and why (docs/spec.md §5)."""

_KINDS = {"client": SpanKind.CLIENT, "server": SpanKind.SERVER, "internal": SpanKind.INTERNAL}


@dataclass(frozen=True)
class SpanType:
    type: str
    kind: SpanKind
    levels: Mapping[str, str]  # attribute -> "required", "conditionally_required", "recommended", ...


@dataclass(frozen=True)
class Model:
    spans: Mapping[str, SpanType]
    types: Mapping[str, Any]  # attribute -> "string", "int", "string[]", or the members of an enum


def _level(requirement: Any) -> str:
    return requirement if isinstance(requirement, str) else next(iter(requirement))


@cache
def model() -> Model:
    raw = yaml.safe_load(MODEL.read_text(encoding="utf-8"))
    groups = {group["id"]: group["attributes"] for group in raw["attribute_groups"]}

    def levels(entries: Iterable[Mapping[str, Any]]) -> dict[str, str]:
        found: dict[str, str] = {}
        for entry in entries:
            if "ref_group" in entry:
                found.update(levels(groups[entry["ref_group"]]))
            else:
                found[entry["ref"]] = _level(entry.get("requirement_level", "recommended"))
        return found

    spans = {
        span["type"]: SpanType(span["type"], _KINDS[span["kind"]], levels(span["attributes"]))
        for span in raw["spans"]
    }
    types = {entry["key"]: entry["type"] for entry in raw["attributes"]}
    return Model(spans, types)


def genai_type(span: ReadableSpan) -> str:
    """The GenAI span type a hop span stands for, by its operation and kind."""
    operation = (span.attributes or {}).get("gen_ai.operation.name")
    if operation == "execute_tool":
        return "gen_ai.execute_tool.internal"
    if operation == "invoke_agent":
        return (
            "gen_ai.invoke_agent.client" if span.kind is SpanKind.CLIENT else "gen_ai.invoke_agent.internal"
        )
    raise AssertionError(f"{span.name}: gen_ai.operation.name {operation!r} is not a hop's")


def _type_problem(key: str, value: object, expected: Any) -> str | None:
    if isinstance(expected, Mapping):  # an enum: a string, one of its members
        if not isinstance(value, str) or value not in expected["members"]:
            return f"{key}={value!r} is not one of {expected['members']}"
        return None
    ok = {
        "string": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "string[]": isinstance(value, tuple) and all(isinstance(item, str) for item in value),
    }[expected]
    return None if ok else f"{key}={value!r} is not of type {expected}"


def problems(span: ReadableSpan, protocol: str | None = None, available: Collection[str] = ()) -> list[str]:
    """What in ``span`` breaks the conventions (empty: nothing).

    ``protocol`` is the protocol span type whose attributes the hop also carries (``a2a.client``,
    ...); ``available`` the conditionally required attributes the test's call made available (the
    agent card has a version, the request a context id, ...): each must be on the span.
    """
    found: list[str] = []
    attributes = dict(span.attributes or {})
    genai = model().spans[genai_type(span)]
    types = [genai] + ([model().spans[protocol]] if protocol else [])
    subject = attributes.get(
        "gen_ai.tool.name" if genai.type.startswith("gen_ai.execute_tool") else "gen_ai.agent.name"
    )
    operation = attributes["gen_ai.operation.name"]
    if span.name != f"{operation} {subject}":
        found.append(
            f"name {span.name!r} is not {operation} {{{'tool' if operation == 'execute_tool' else 'agent'}}}"
        )
    if span.kind is not genai.kind:
        found.append(f"{span.name}: kind {span.kind.name} is not {genai.type}'s {genai.kind.name}")
    for span_type in types:
        for key, level in span_type.levels.items():
            if level == "required" and key not in attributes and key not in WAIVED:
                found.append(f"{span.name}: {key} is required by {span_type.type}")
            if level == "conditionally_required" and key in available and key not in attributes:
                found.append(f"{span.name}: {key} was available and {span_type.type} requires it then")
    defined = model().types
    for key, value in attributes.items():
        if key in defined:
            problem = _type_problem(key, value, defined[key])
            if problem:
                found.append(f"{span.name}: {problem}")
        elif key.startswith(NAMESPACES):
            found.append(f"{span.name}: {key} is not in the conventions")
    return found


def assert_follows(span: ReadableSpan, protocol: str | None = None, available: Collection[str] = ()) -> None:
    found = problems(span, protocol, available)
    assert not found, "\n".join(found)
