"""What the instrumented process records (docs/spec.md §5): spans, events, the two metrics -- and never
the token. Also: with no SDK the guard still decides, and the no-keys warning comes once."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import context, propagate
from opentelemetry.sdk.metrics.export import Histogram, HistogramDataPoint, Sum
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util.types import AttributeValue

import otel_guard
from otel_guard import DelegationRefused, delegate

PROGRAMS_TIMEOUT = 60


def attributes(span: Any) -> dict[str, Any]:
    return dict(span.attributes)


# -- spans ------------------------------------------------------------------------------------------


def test_agent_hop_span_has_exactly_the_contract_attributes_with_their_types(spans: Any) -> None:
    with delegate("planner", "plan") as planner, delegate("budget", "price") as budget:
        pass
    assert planner.chain is not None
    root = planner.chain.root
    span = spans.one("invoke_agent budget")
    assert attributes(span) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "budget",
        "otel_guard.skill": "price",
        "otel_guard.chain.root": root,
        "otel_guard.chain.depth": 2,
        "otel_guard.name_depth": 1,
        "otel_guard.decision": "allow",
        "otel_guard.mode": "enforce",
        "otel_guard.hop.kind": "call",
        "otel_guard.budget.hops": 2,  # the tree's hops so far, this one included (max_hops is on)
    }
    # Nested in planner's span, budget's span leaves the chain's lists out (its path is its
    # ancestors'); planner's, the chain's first hop, has them, with their types.
    first = attributes(spans.one("invoke_agent planner"))
    assert (first["otel_guard.chain.agents"], first["otel_guard.chain.skills"]) == (("planner",), ("plan",))
    for name in ("otel_guard.chain.agents", "otel_guard.chain.skills"):
        value = first[name]
        assert isinstance(value, tuple)
        assert all(type(item) is str for item in value)
    for name in ("otel_guard.chain.depth", "otel_guard.name_depth", "otel_guard.budget.hops"):
        assert type(span.attributes[name]) is int
    assert re.fullmatch(r"[0-9a-f]{32}", root)
    assert span.kind is SpanKind.INTERNAL
    assert span.events == ()
    assert span.status.status_code is StatusCode.UNSET
    assert span.parent is not None
    assert span.parent.span_id == spans.one("invoke_agent planner").context.span_id
    assert budget.span.get_span_context().span_id == span.context.span_id


def test_tool_hop_span_uses_the_tool_conventions(spans: Any) -> None:
    with delegate("planner", "plan"), delegate("web_search", kind="tool") as tool:
        assert tool.chain is not None
        assert tool.chain.agents == ("planner", "web_search")  # a tool is a hop like an agent
    span = spans.one("execute_tool web_search")
    assert attributes(span) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "web_search",
        "otel_guard.chain.root": span.attributes["otel_guard.chain.root"],
        "otel_guard.chain.depth": 2,
        "otel_guard.name_depth": 1,
        "otel_guard.decision": "allow",
        "otel_guard.mode": "enforce",
        "otel_guard.hop.kind": "call",
        "otel_guard.budget.hops": 2,
    }


def test_refused_span_has_the_reason_the_event_and_an_error_status(spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    with (
        delegate("planner", "plan"),
        delegate("budget", "price") as budget,
        pytest.raises(DelegationRefused) as refused,
        delegate("planner", "itinerary"),
    ):
        pass
    refused_span = next(
        s for s in spans.named("invoke_agent planner") if s.attributes["otel_guard.decision"] == "refuse"
    )
    found = attributes(refused_span)
    assert found.pop("error.type") == "DelegationRefused"  # the OpenTelemetry error convention
    assert budget.chain is not None
    assert found == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "planner",
        "otel_guard.skill": "itinerary",
        "otel_guard.chain.agents": ("planner", "budget", "planner"),
        "otel_guard.chain.skills": ("plan", "price", "itinerary"),
        "otel_guard.chain.root": budget.chain.root,
        "otel_guard.chain.depth": 3,
        "otel_guard.name_depth": 2,
        "otel_guard.decision": "refuse",
        "otel_guard.reason": "cycle",
        "otel_guard.mode": "enforce",
        "otel_guard.hop.kind": "call",
    }
    assert refused_span.status.status_code is StatusCode.ERROR
    [event] = refused_span.events
    assert event.name == "otel_guard.refused"
    assert event.attributes is not None
    assert event.attributes["otel_guard.reason"] == "cycle"
    assert event.attributes["otel_guard.message"] == str(refused.value)
    assert refused_span.parent is not None
    assert refused_span.parent.span_id == budget.span.get_span_context().span_id


def test_would_refuse_span_has_the_reason_and_the_event(spans: Any) -> None:
    otel_guard.configure(mode="observe", cycle_rule="agent")
    with delegate("planner"), delegate("budget"), delegate("planner"):
        pass
    flagged = next(
        s
        for s in spans.named("invoke_agent planner")
        if s.attributes["otel_guard.decision"] == "would_refuse"
    )
    assert flagged.attributes["otel_guard.reason"] == "cycle"
    assert flagged.attributes["otel_guard.mode"] == "observe"
    assert flagged.attributes["otel_guard.name_depth"] == 2
    assert "otel_guard.skill" not in flagged.attributes
    [event] = flagged.events
    assert event.name == "otel_guard.would_refuse"
    assert event.attributes is not None
    assert event.attributes["otel_guard.reason"] == "cycle"
    assert "planner" in str(event.attributes["otel_guard.message"])
    assert flagged.status.status_code is StatusCode.UNSET


def test_span_kind_and_extra_attributes_are_honoured(spans: Any) -> None:
    with delegate("budget", span_kind=SpanKind.CLIENT, attributes={"server.address": "127.0.0.1", "x.n": 3}):
        pass
    span = spans.one("invoke_agent budget")
    assert span.kind is SpanKind.CLIENT
    assert span.attributes["server.address"] == "127.0.0.1"
    assert span.attributes["x.n"] == 3
    assert span.attributes["otel_guard.decision"] == "allow"


def test_mode_attribute_follows_a_per_agent_override(spans: Any) -> None:
    otel_guard.configure(overrides={"legacy": {"mode": "observe"}})
    with delegate("planner"), delegate("legacy"):
        pass
    assert spans.one("invoke_agent planner").attributes["otel_guard.mode"] == "enforce"
    assert spans.one("invoke_agent legacy").attributes["otel_guard.mode"] == "observe"


def test_a_bad_chain_refusal_span_carries_what_is_known(spans: Any, chain_in_baggage: Any, key: Any) -> None:
    with chain_in_baggage("garbage"), pytest.raises(DelegationRefused), delegate("budget", "price"):
        pass
    span = spans.one("invoke_agent budget")
    assert span.attributes["otel_guard.decision"] == "refuse"
    assert span.attributes["otel_guard.reason"] == "bad_signature"
    assert span.attributes["otel_guard.chain.agents"] == ("budget",)
    assert span.attributes["otel_guard.chain.depth"] == 1
    assert [e.name for e in span.events] == ["otel_guard.refused"]


# -- metrics ----------------------------------------------------------------------------------------


def _metric(metric_reader: Any, name: str) -> Any:
    data = metric_reader.collect()
    for resource_metrics in data.resource_metrics if data else []:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == name:
                    return metric
    return None


def _decisions(metric_reader: Any, *names: str) -> dict[tuple[tuple[str, Any], ...], int]:
    metric = _metric(metric_reader, "otel_guard.decisions")
    assert metric is not None
    assert isinstance(metric.data, Sum)
    assert metric.data.is_monotonic
    found: dict[tuple[tuple[str, Any], ...], int] = {}
    for point in metric.data.data_points:
        point_attributes: dict[str, Any] = dict(point.attributes or {})
        if {point_attributes.get("gen_ai.agent.name"), point_attributes.get("gen_ai.tool.name")} & set(names):
            found[tuple(sorted(point_attributes.items()))] = int(point.value)
    return found


def test_decisions_counter_counts_each_decision_with_its_attributes(
    metric_reader: Any, unique: Callable[[str], str]
) -> None:
    planner, budget, tool = unique("planner"), unique("budget"), unique("search")
    with delegate(planner), delegate(budget):
        with pytest.raises(DelegationRefused), delegate(planner):
            pass
        with delegate(tool, kind="tool"):
            pass
    with delegate(planner):
        pass
    otel_guard.configure(mode="observe")
    with delegate(budget), delegate(budget):
        pass
    assert _decisions(metric_reader, planner, budget, tool) == {
        (("gen_ai.agent.name", planner), ("otel_guard.decision", "allow")): 2,
        (
            ("gen_ai.agent.name", planner),
            ("otel_guard.decision", "refuse"),
            ("otel_guard.reason", "cycle"),
        ): 1,
        (("gen_ai.agent.name", budget), ("otel_guard.decision", "allow")): 2,
        (
            ("gen_ai.agent.name", budget),
            ("otel_guard.decision", "would_refuse"),
            ("otel_guard.reason", "cycle"),
        ): 1,
        (("gen_ai.tool.name", tool), ("otel_guard.decision", "allow")): 1,
    }
    # Cumulative: a second collection reports the same totals, not zero.
    with delegate(tool, kind="tool"):
        pass
    assert _decisions(metric_reader, tool) == {
        (("gen_ai.tool.name", tool), ("otel_guard.decision", "allow")): 2
    }


def _depth_point(metric_reader: Any) -> HistogramDataPoint | None:
    metric = _metric(metric_reader, "otel_guard.chain.depth")
    if metric is None:
        return None
    assert isinstance(metric.data, Histogram)
    [point] = metric.data.data_points
    assert isinstance(point, HistogramDataPoint)
    return point


def test_depth_histogram_records_the_depth_of_every_hop(metric_reader: Any) -> None:
    before = _depth_point(metric_reader)
    with delegate("planner"), delegate("budget"), delegate("fx"):
        pass
    with pytest.raises(DelegationRefused), delegate("planner"), delegate("planner"):
        pass  # depth 1 allowed, depth 2 refused: both are hops that were decided
    after = _depth_point(metric_reader)
    assert after is not None
    count, total = (before.count, before.sum) if before is not None else (0, 0)
    assert after.count - count == 5
    assert after.sum - total == 1 + 2 + 3 + 1 + 2
    assert after.max >= 3
    bounds = list(after.explicit_bounds)
    buckets = [
        a - b for a, b in zip(after.bucket_counts, before.bucket_counts if before else [0] * 99, strict=False)
    ]
    assert buckets[bounds.index(1.0)] == 2  # depth 1 lands in the bucket (..., 1]
    assert buckets[bounds.index(2.0)] == 2
    assert buckets[bounds.index(3.0)] == 1


# -- the token is never recorded ----------------------------------------------------------------


def _recorded_text(spans: Any, metric_reader: Any) -> Iterator[str]:
    for span in spans.all():
        yield span.name
        yield str(span.status.description)
        for name, value in (span.attributes or {}).items():
            yield f"{name}={value}"
        for event in span.events:
            yield event.name
            for name, value in (event.attributes or {}).items():
                yield f"{name}={value}"
        for link in span.links:
            yield str(dict(link.attributes or {}))
    data = metric_reader.collect()
    for resource_metrics in data.resource_metrics if data else []:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    yield str(dict(point.attributes or {}))


def test_the_token_never_appears_in_a_span_event_metric_or_log(
    spans: Any, metric_reader: Any, caplog: pytest.LogCaptureFixture, chain_in_baggage: Any, key: Any
) -> None:
    caplog.set_level(logging.DEBUG)
    sent: list[str] = []

    def inject() -> dict[str, str]:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        member = next(m for m in carrier["baggage"].split(",") if m.startswith("otel_guard.chain="))
        sent.append(member.partition("=")[2])
        return carrier

    with delegate("planner", "plan"), delegate("budget", "price"):
        carrier = inject()
    attached = context.attach(propagate.extract(carrier))
    try:
        with delegate("budget", "price", receiving=True, span_kind=SpanKind.SERVER), delegate("fx"):
            inject()
        with pytest.raises(DelegationRefused), delegate("planner", "plan"):
            pass
        otel_guard.configure(mode="observe")
        with delegate("budget", "price"):
            pass
    finally:
        context.detach(attached)
    otel_guard.configure(mode="enforce")
    head, claims, signature = sent[0].split(".")
    tampered = f"{head}.{claims}.{signature[::-1]}"
    with chain_in_baggage(tampered), pytest.raises(DelegationRefused) as refused, delegate("fx"):
        pass
    secrets = [*sent, tampered]
    fragments = {part for token in secrets for part in token.split(".") if len(part) > 16}
    recorded = list(_recorded_text(spans, metric_reader))
    recorded += [record.getMessage() for record in caplog.records]
    recorded += [str(refused.value), repr(refused.value)]
    assert len(spans.all()) >= 7  # the scan saw what was made
    for text in recorded:
        for fragment in fragments:
            assert fragment not in text, f"a token fragment was recorded: {text[:200]!r}"


# -- without an SDK -------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("block_sdk", [False, True], ids=["no provider set", "SDK not importable"])
def test_without_an_sdk_spans_are_no_ops_and_decisions_still_hold(
    run_program: Callable[..., Any], block_sdk: bool
) -> None:
    report = run_program("no_sdk.py", {"block_sdk": block_sdk}, timeout=PROGRAMS_TIMEOUT)
    assert report == {
        "chain": ["planner", "budget"],
        "name_depth": 1,
        "carrier_has_chain": True,
        "refused": {
            "reason": "cycle",
            "code": "a2a_delegation_cycle",
            "message": "Delegation cycle: agent planner is already in chain planner → budget",
        },
        "recording": [False, False],
        "decisions": ["allow", "allow"],
        "body_runs": ["planner", "budget"],
        "after": True,
        "sdk_imported": report["sdk_imported"],
    }
    if block_sdk:
        assert report["sdk_imported"] is False


@pytest.mark.integration
def test_an_sdk_installed_after_the_first_hop_records_the_hops_after_it(
    run_program: Callable[..., Any],
) -> None:
    report = run_program("late_sdk.py", None, timeout=PROGRAMS_TIMEOUT)
    assert report["spans"] == ["invoke_agent later", "invoke_agent late"]
    assert ["otel_guard.decisions", "late", 1] in report["points"]
    assert ["otel_guard.decisions", "later", 1] in report["points"]
    assert ["otel_guard.chain.depth", None, 3] in report["points"]  # early, late, later: 3 hops


# -- the no-keys warning --------------------------------------------------------------------------


@pytest.fixture
def run_hops(run_command: Callable[..., Any]) -> Callable[..., Any]:
    def run(threads: int = 1, **env: str) -> Any:
        program = str(Path(__file__).parent / "programs" / "unsigned_warning.py")
        completed = run_command(
            [sys.executable, program], json.dumps({"threads": threads}), timeout=PROGRAMS_TIMEOUT, **env
        )
        assert completed.returncode == 0, completed.stderr
        assert json.loads(completed.stdout) == ["allow"] * 3 * threads
        return completed

    return run


@pytest.mark.integration
@pytest.mark.parametrize("threads", [1, 8])
def test_without_keys_a_warning_says_so_once(run_hops: Callable[..., Any], threads: int) -> None:
    completed = run_hops(threads)
    warnings = [line for line in completed.stderr.splitlines() if "OTEL_GUARD_KEYS" in line]
    assert len(warnings) == 1
    assert "unsigned" in warnings[0]
    assert "otel-guard keygen" in warnings[0]


@pytest.mark.integration
def test_with_keys_there_is_no_warning(run_hops: Callable[..., Any], make_key: Callable[[str], Any]) -> None:
    completed = run_hops(OTEL_GUARD_KEYS=make_key("k1").env)
    assert completed.stderr == ""


def test_extra_attributes_cannot_overwrite_the_guards_own(spans: Any) -> None:
    disguise: dict[str, AttributeValue] = {
        "otel_guard.decision": "allow",
        "otel_guard.chain.depth": 1,
        "gen_ai.agent.name": "someone",
    }
    with delegate("a"), delegate("b"), pytest.raises(DelegationRefused), delegate("a", attributes=disguise):
        pass
    refused = next(s for s in spans.named("invoke_agent a") if "otel_guard.reason" in s.attributes)
    assert refused.attributes["otel_guard.decision"] == "refuse"
    assert refused.attributes["otel_guard.chain.depth"] == 3
    assert refused.attributes["gen_ai.agent.name"] == "a"


def test_binding_the_same_providers_again_keeps_recording(metric_reader: Any) -> None:
    """A meter returns the instrument it already made for a name and ignores a second callback, so a
    second bind() to the global providers must reuse the first telemetry, or metrics stop."""

    def allowed(name: str) -> int:
        return sum(
            int(point.value)
            for attributes, point in metric_reader.points("otel_guard.decisions")
            if attributes.get("gen_ai.agent.name") == name
            and attributes.get("otel_guard.decision") == "allow"
        )

    first = otel_guard.telemetry.bind()
    assert otel_guard.telemetry.bind() is first
    before = allowed("rebound")
    with delegate("rebound"):
        pass
    assert allowed("rebound") == before + 1
