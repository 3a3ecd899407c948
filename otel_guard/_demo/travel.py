"""``otel-guard demo``: the Planner / Budget loop and an A -> A runaway, with the guard on.

Everything runs in this process with an in-memory OpenTelemetry SDK: the tables below are read back
from the spans the guard wrote, so what you see is what your tracing backend would get.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_guard import telemetry as names
from otel_guard.agentic import agentic
from otel_guard.errors import DelegationRefused
from otel_guard.settings import Settings, configure, current_settings, reset_settings

RESULTS = {"allow": "allowed", "refuse": "refused", "would_refuse": "would refuse"}


class TravelDesk:
    """Two agents that each do the reasonable thing, and together loop.

    Planner builds trip plans and asks Budget to price them; Budget needs the itinerary and asks
    Planner; Planner, still waiting on the price, asks Budget again. ``bounces`` stands in for the
    models' patience: the script stops by itself after that many hops, guard or no guard.
    """

    def __init__(self, bounces: int) -> None:
        self.hops_left = bounces
        self.told: list[str] = []

        @agentic(name="planner", skill="plan")
        def plan_trip(request: str) -> str:
            return f"plan for {request!r}, priced {self.ask(price_plan, 'draft v1')}"

        @agentic(name="budget", skill="price")
        def price_plan(draft: str) -> str:
            itinerary = self.ask(make_itinerary, draft, fallback=draft)
            return f"EUR 1,380 for {itinerary}"

        @agentic(name="planner", skill="itinerary")
        def make_itinerary(draft: str) -> str:
            self.ask(price_plan, draft)
            return f"day-by-day of {draft}"

        self.plan_trip = plan_trip

    def ask(self, agent: Callable[[str], str], task: str, fallback: str = "what I have") -> str:
        if self.hops_left <= 1:
            return fallback
        self.hops_left -= 1
        try:
            return agent(task)
        except DelegationRefused as refusal:
            # The caller answers with what it has: a refusal never gets better by retrying.
            self.told.append(f"{refusal.status} {refusal.code}: {refusal}")
            return fallback


@agentic
def wiki_agent(task: str) -> str:
    """Maintain a wiki vault: route to ingest, search or answer."""
    # The inner model sees its own tool description match the task, and calls itself again.
    return wiki_agent(task)


@contextmanager
def _sdk() -> Iterator[tuple[InMemorySpanExporter, InMemoryMetricReader]]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    with names.bound(tracer_provider, MeterProvider(metric_readers=[reader])):
        yield exporter, reader


def _chain(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> tuple[list[str], list[str]]:
    """The agents and skills of a hop span's chain: its lists, or (a lean span, nested in the
    previous hop's) its parent hop span's chain and its own hop."""
    attributes: Any = span.attributes
    if names.CHAIN_AGENTS in attributes:
        return list(attributes[names.CHAIN_AGENTS]), list(attributes[names.CHAIN_SKILLS])
    assert span.parent is not None
    agents, skills = _chain(by_id[span.parent.span_id], by_id)
    name = attributes.get(names.GEN_AI_AGENT_NAME, attributes.get(names.GEN_AI_TOOL_NAME))
    return [*agents, name], [*skills, attributes.get(names.SKILL, "")]


def _hop_rows(spans: list[ReadableSpan]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    by_id = {span.context.span_id: span for span in spans if span.context is not None}
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        attributes: Any = span.attributes
        agents, skills = _chain(span, by_id)
        caller = agents[-2] if len(agents) > 1 else "user"
        result = RESULTS[attributes[names.DECISION]]
        if names.REASON in attributes:
            result += f" ({attributes[names.REASON]})"
        rows.append(
            (
                str(attributes[names.CHAIN_DEPTH]),
                f"{caller} → {agents[-1]}",
                skills[-1] or "-",
                " → ".join(agents[:-1]) or "none",
                result,
            )
        )
    return rows


def _print_table(title: str, rows: list[tuple[str, ...]], notes: list[str]) -> None:
    header = ("Hop", "Call", "Skill", "Chain on arrival", "Result")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    for row in [header, *rows]:
        print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    for note in notes:
        print(f"  -> {note}")


def _configure(**settings: Any) -> None:
    """Start from the documented defaults, whatever OTEL_GUARD_* says, with a key made for this run."""
    defaults = {f.name: getattr(Settings(), f.name) for f in fields(Settings)}
    configure(**{**defaults, "keys": {"demo": secrets.token_bytes(32)}, **settings})


def _travel(title: str, bounces: int, **settings: Any) -> None:
    _configure(**settings)
    with _sdk() as (exporter, _reader):
        desk = TravelDesk(bounces)
        answer = desk.plan_trip("3-day Lisbon trip under EUR 1,500")
        notes = [f"the agent was told: {told}" for told in desk.told[:1]]
        notes.append(f"answer: {answer}")
        _print_table(title, _hop_rows(list(exporter.get_finished_spans())), notes)


def _runaway() -> None:
    _configure(cycle_rule="none")
    with _sdk() as (exporter, reader):
        try:
            wiki_agent("summarise the vault")
        except DelegationRefused as refusal:
            runs = sum(
                1
                for s in exporter.get_finished_spans()
                if s.attributes and s.attributes.get(names.DECISION) == "allow"
            )
            print(
                f"\nA -> A runaway (cycle_rule=none, max_name_depth={current_settings().max_name_depth}):"
                f"\n  wiki_agent called itself; its body ran {runs} times, then the guard raised"
                f"\n  {type(refusal).__name__}: {refusal}"
            )
        data = reader.get_metrics_data()
    counts: dict[str, int] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == names.METRIC_DECISIONS:
                    for point in metric.data.data_points:
                        key = str((point.attributes or {}).get(names.DECISION))
                        counts[key] = counts.get(key, 0) + int(point.value)  # type: ignore[union-attr]
    print(f"  metric {names.METRIC_DECISIONS}: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))


def run_demo() -> None:
    """Print the demo's tables. Restores the settings it changed."""
    print("otel-guard demo: Planner prices a trip with Budget; Budget asks Planner for the itinerary.")
    print("Every hop is an OpenTelemetry span; the tables are read back from those spans.")
    try:
        _travel("Default rule (cycle_rule=agent_skill: same agent and same skill)", 6, mode="enforce")
        _travel("Strict rule (cycle_rule=agent: same agent)", 6, mode="enforce", cycle_rule="agent")
        _travel(
            "Observe mode (default rule; nothing refused, every would-refuse recorded; the script "
            "stops after 6 hops)",
            6,
            mode="observe",
        )
        _runaway()
    finally:
        # Back to the environment's settings; the demo never used them, and a bad value there is
        # for the guard's start-up to report, not the demo's.
        with contextlib.suppress(ValueError):
            reset_settings()
