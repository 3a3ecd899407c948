"""The guard's hop spans as the runtimes' tests read them, and the check of observe mode they share.

``spans`` is the session's in-memory span exporter and ``metric_reader`` its metric reader
(``tests/conftest.py``). Every runtime's environment imports this module (``tests`` is a package).
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

DECISION = "otel_guard.decision"
AGENTS = "otel_guard.chain.agents"
SKILLS = "otel_guard.chain.skills"


def guard_spans(spans: Any) -> list[ReadableSpan]:
    """The hop spans (those carrying the contract's attributes), in the order the hops started."""
    found = [s for s in spans.all() if s.attributes and DECISION in s.attributes]
    return sorted(found, key=lambda s: s.start_time or 0)


def chain_of(span: ReadableSpan, spans: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The (agents, skills) of the chain including ``span``'s hop: its ``otel_guard.chain.agents`` /
    ``.skills``, or for a lean hop span (without them: a hop nested in the previous hop's span) its
    parent hop span's chain and its own hop, checked against the depth and root it names."""
    attributes = dict(span.attributes or {})
    agents = attributes.get(AGENTS)
    if agents is not None:
        skills = attributes[SKILLS]
        assert isinstance(agents, tuple), attributes
        assert isinstance(skills, tuple), attributes
        return tuple(str(agent) for agent in agents), tuple(str(skill) for skill in skills)
    assert SKILLS not in attributes, attributes
    assert attributes[DECISION] == "allow", attributes  # refused and would-refuse hops name their chain
    parent = span.parent
    assert parent is not None, f"a lean hop span with no parent: {span.name}"
    [above] = [s for s in spans.all() if s.context is not None and s.context.span_id == parent.span_id]
    above_attributes = dict(above.attributes or {})
    assert DECISION in above_attributes, f"{span.name}: a lean hop span directly under {above.name}"
    assert above_attributes["otel_guard.chain.root"] == attributes["otel_guard.chain.root"]
    agents, skills = chain_of(above, spans)
    name = attributes.get("gen_ai.agent.name", attributes.get("gen_ai.tool.name"))
    agents, skills = (*agents, str(name)), (*skills, str(attributes.get("otel_guard.skill", "")))
    assert len(agents) == attributes["otel_guard.chain.depth"], (span.name, agents)
    return agents, skills


def decisions(spans: Any) -> list[tuple[str, str, tuple[str, ...]]]:
    """(span name, decision, chain agents) of every hop, in the order the hops started."""
    return [
        (span.name, str(dict(span.attributes or {})[DECISION]), chain_of(span, spans)[0])
        for span in guard_spans(spans)
    ]


def refused(spans: Any) -> list[ReadableSpan]:
    """The hop spans of refused hops."""
    return [s for s in guard_spans(spans) if s.attributes and s.attributes[DECISION] == "refuse"]


def assert_observe_mode_recorded_the_loop(spans: Any, metric_reader: Any, agent: str = "planner") -> None:
    """Observe mode let a loop through and recorded it: the first would-refuse is the hop back into
    ``agent``, for a cycle, with its event; no hop was refused; the decisions metric counted it."""
    would = [s for s in guard_spans(spans) if s.attributes and s.attributes[DECISION] == "would_refuse"]
    assert would, decisions(spans)
    first = would[0]
    assert first.name == f"invoke_agent {agent}", decisions(spans)
    assert first.attributes is not None
    assert first.attributes["otel_guard.reason"] == "cycle"
    assert first.attributes["otel_guard.mode"] == "observe"
    assert [event.name for event in first.events] == ["otel_guard.would_refuse"]
    assert refused(spans) == []
    points = metric_reader.points("otel_guard.decisions")
    assert any(
        attributes.get(DECISION) == "would_refuse"
        and attributes.get("gen_ai.agent.name") == agent
        and attributes.get("otel_guard.reason") == "cycle"
        for attributes, _ in points
    ), points


def hop_named(spans: Any, name: str) -> ReadableSpan:
    """The one hop span named ``name`` (``invoke_agent budget``); fails if there is none or more."""
    found = [s for s in guard_spans(spans) if s.name == name]
    assert len(found) == 1, (name, decisions(spans))
    return found[0]


def budget_events(spans: Any) -> list[tuple[str, str]]:
    """(hop span name, the budget it found spent or ``""``) of every event on the hop spans, sorted."""
    return sorted(
        (s.name, str((e.attributes or {}).get("otel_guard.budget.exhausted") or ""))
        for s in guard_spans(spans)
        for e in s.events
    )


# Planner asks budget through the tool ask_budget under ``max_model_requests=1`` in observe mode:
# planner's first request is the tree's one; the tool call and budget's run (hops) would have been
# refused (their own events; their spans say which budget), and so would budget's request and
# planner's answer (events on the hop the request is made in).
OVER_ONE_REQUEST = [
    ("execute_tool ask_budget", ""),
    ("invoke_agent budget", ""),
    ("invoke_agent budget", "model_requests"),
    ("invoke_agent planner", "model_requests"),
]


def assert_observe_mode_recorded_the_spent_requests(spans: Any, hops: tuple[str, ...] = ()) -> None:
    """Observe mode let planner -> ask_budget -> budget through past a budget of one model request and
    recorded what it would have refused (:data:`OVER_ONE_REQUEST`); each of ``hops`` is a would-refuse
    hop whose span names the spent budget."""
    assert budget_events(spans) == OVER_ONE_REQUEST
    for name in hops:
        attributes = hop_named(spans, name).attributes or {}
        assert attributes["otel_guard.decision"] == "would_refuse"
        assert attributes["otel_guard.budget.exhausted"] == "model_requests"


def assert_observe_mode_recorded_the_ping_pong(spans: Any, metric_reader: Any = None) -> None:
    """Observe mode, with ``max_name_depth=2``, let a planner ⇄ budget ping-pong of handoffs run and
    recorded it: planner stands at places 1, 3, 5, 7 and budget at 2, 4, 6, so from the third time on
    each is past 2 (would-refuse ``name_depth`` at depths 5, 6, 7, each with its event); nothing was
    refused; with ``metric_reader``, the decisions metric counted planner's would-refuse."""
    would = [s for s in guard_spans(spans) if s.attributes and s.attributes[DECISION] == "would_refuse"]
    assert [(s.name, dict(s.attributes or {})["otel_guard.chain.depth"]) for s in would] == [
        ("invoke_agent planner", 5),
        ("invoke_agent budget", 6),
        ("invoke_agent planner", 7),
    ]
    assert all(dict(s.attributes or {})["otel_guard.reason"] == "name_depth" for s in would)
    assert all([e.name for e in s.events] == ["otel_guard.would_refuse"] for s in would)
    assert refused(spans) == []
    if metric_reader is not None:
        points = metric_reader.points("otel_guard.decisions")
        assert any(
            attributes.get(DECISION) == "would_refuse"
            and attributes.get("otel_guard.reason") == "name_depth"
            and attributes.get("gen_ai.agent.name") == "planner"
            for attributes, _ in points
        ), points
