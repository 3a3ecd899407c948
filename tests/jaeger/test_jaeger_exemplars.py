"""From the processor's cycle exemplar to the loop's spans in a real Jaeger (issue 42).

The inline guard's spans of a loop go app → ``otel-guard processor`` (a process of its own, ``--forward``
to Jaeger) → Jaeger v1.75.0 (memory storage). The processor's ``/metrics``, scraped as Prometheus
scrapes it (OpenMetrics), carries the loop as the exemplar of ``otel_guard_cycles_total``:

- a loop in one trace: the exemplar's ``trace_id`` opens that trace in Jaeger -- by API v3
  (``/api/v3/traces/{id}``, OTLP/JSON) and by the API v1 that Jaeger's UI (``/trace/{id}``) and
  Grafana's Jaeger data source read (``/api/traces/{id}``) -- with every hop span, the exemplar's
  ``span_id`` the refused return, and the ``otel_guard.chain.*`` attributes as the guard wrote them;
- a loop over three traces: the exemplar's trace holds the refused return alone; the exemplar's
  ``chain_root`` finds the rest through Jaeger's tag search (API v1 ``/api/traces?service=...&tags=
  {"otel_guard.chain.root": ...}``, the UI's *Tags* field), which leaves another tree's trace out.
  API v3's HTTP search takes no attributes in v1.75.0 (its gateway drops them), so it cannot.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from guarded_loops import (
    SERVICE,
    Processor,
    chain_root,
    cycle_exemplars,
    loop_in_one_trace,
    loop_over_three_traces,
    no_loop,
    send,
    spans_of,
)
from jaeger_store import ROOT, WAIT, JaegerStore, attributes

import otel_guard

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def exemplar_of(instance: Processor, series: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The series' exemplar, once the processor counted the loop (at most WAIT s)."""
    deadline = time.monotonic() + WAIT
    while (exemplar := (await cycle_exemplars(instance.metrics_port)).get(series)) is None:
        assert time.monotonic() < deadline, f"no exemplar on {series} within {WAIT} s"
        await asyncio.sleep(0.1)
    return exemplar


def provisioned(name: str) -> list[dict[str, Any]]:
    """The data sources of dashboards/grafana/provisioning/datasources/``name``."""
    path = ROOT / "dashboards" / "grafana" / "provisioning" / "datasources" / name
    return list(yaml.safe_load(path.read_text(encoding="utf-8"))["datasources"])


def by_id(spans: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {span["spanId"]: span for span in spans}


async def test_the_exemplar_opens_the_loops_trace_in_jaeger(
    tmp_path: Path, spans: Any, jaeger: JaegerStore
) -> None:
    otel_guard.configure(mode="enforce", cycle_rule="agent")
    other = no_loop(spans)  # another tree's trace of the same service, for the search by chain root
    (raw,) = loop_in_one_trace(spans)
    sent = spans_of(raw)
    root = chain_root(raw)
    processor = Processor(tmp_path, 0, jaeger.otlp)
    processor.start()
    try:
        await processor.ready()
        await send(processor.address, [*other, raw])
        exemplar = await exemplar_of(
            processor, (("cycle", "planner>budget>planner"), ("kind", "cross_function"))
        )
        await jaeger.wait_for_spans(spans_of(other[0])[0].trace_id.hex(), len(spans_of(other[0])))
        found = await jaeger.wait_for_spans(exemplar["trace_id"], len(sent))
        v1 = await jaeger.get(f"/api/traces/{exemplar['trace_id']}")
        by_root = await jaeger.find_by_tag(SERVICE, "otel_guard.chain.root", exemplar["chain_root"])
    finally:
        processor.stop()

    assert processor.status == 0  # a graceful stop
    assert exemplar == {
        "trace_id": sent[0].trace_id.hex(),
        "span_id": sent[2].span_id.hex(),
        "chain_root": root,
    }
    # API v3: the trace, every hop span once, as the guard wrote it.
    spans_by_id = by_id(found)
    assert len(found) == len(sent)
    assert set(spans_by_id) == {span.span_id.hex() for span in sent}
    assert {span["traceId"] for span in found} == {exemplar["trace_id"]}
    hops = {span_id: attributes(span["attributes"]) for span_id, span in spans_by_id.items()}
    assert {hop["otel_guard.chain.root"] for hop in hops.values()} == {exemplar["chain_root"]}
    assert sorted(hop["otel_guard.chain.depth"] for hop in hops.values()) == [1, 2, 3]
    returned = spans_by_id[exemplar["span_id"]]
    assert returned["name"] == "invoke_agent planner"
    expected = {
        "otel_guard.decision": "refuse",
        "otel_guard.reason": "cycle",
        "otel_guard.mode": "enforce",
        "otel_guard.chain.agents": ["planner", "budget", "planner"],
    }
    assert {key: hops[exemplar["span_id"]].get(key) for key in expected} == expected
    first = next(hop for hop in hops.values() if hop["otel_guard.chain.depth"] == 1)
    assert first["otel_guard.chain.agents"] == ["planner"]
    # API v1 (Jaeger's UI, Grafana's Jaeger data source): the same spans, the chain root a tag.
    (trace,) = v1["data"]
    assert trace["traceID"] == exemplar["trace_id"]
    assert {span["spanID"] for span in trace["spans"]} == set(spans_by_id)
    for span in trace["spans"]:
        assert {"key": "otel_guard.chain.root", "type": "string", "value": root} in span["tags"]
    (service,) = {process["serviceName"] for process in trace["processes"].values()}
    assert service == SERVICE
    # Its chain root finds the same trace, and no other.
    assert [found_trace["traceID"] for found_trace in by_root] == [exemplar["trace_id"]]
    # Grafana's exemplar links as provisioned: they read the label the exemplar carries the trace id
    # in, and the Jaeger one opens it with a Jaeger data source (whose /api/traces/{id} is above).
    (prometheus,) = provisioned("prometheus.yaml")
    links = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert {link["name"] for link in links} == {"trace_id"}
    types = {source["uid"]: source["type"] for source in provisioned("traces.yaml")}
    assert {link["datasourceUid"]: types[link["datasourceUid"]] for link in links} == {
        "otel-guard-jaeger": "jaeger",
        "otel-guard-tempo": "tempo",
    }


async def test_a_cross_trace_loop_is_found_by_the_exemplars_chain_root(
    tmp_path: Path, spans: Any, jaeger: JaegerStore
) -> None:
    otel_guard.configure(mode="enforce", cycle_rule="agent")
    other = no_loop(spans)  # another tree of the same service: the search must leave it out
    tree = loop_over_three_traces(spans)
    root = chain_root(b"".join(tree))
    assert chain_root(b"".join(other)) != root
    processor = Processor(tmp_path, 0, jaeger.otlp)
    processor.start()
    try:
        await processor.ready()
        await send(processor.address, [*other, *tree])
        exemplar = await exemplar_of(
            processor, (("cycle", "planner>budget>planner"), ("kind", "cross_trace"))
        )
        for raw in [*other, *tree]:
            await jaeger.wait_for_spans(spans_of(raw)[0].trace_id.hex(), len(spans_of(raw)))
        alone = await jaeger.trace_spans(exemplar["trace_id"])
        found = await jaeger.find_by_tag(SERVICE, "otel_guard.chain.root", exemplar["chain_root"])
    finally:
        processor.stop()

    assert processor.status == 0
    refused = spans_of(tree[-1])
    assert exemplar == {
        "trace_id": refused[0].trace_id.hex(),
        "span_id": refused[0].span_id.hex(),
        "chain_root": root,
    }
    # The exemplar's own trace is the refused return alone: not where the loop began.
    assert [span["spanId"] for span in alone] == [exemplar["span_id"]]
    # Its chain root finds the loop's three traces, and only those, with every span of them.
    assert {trace["traceID"] for trace in found} == {spans_of(raw)[0].trace_id.hex() for raw in tree}
    stored = {span["spanID"]: span for trace in found for span in trace["spans"]}
    assert set(stored) == {span.span_id.hex() for raw in tree for span in spans_of(raw)}
    tags = {span_id: {tag["key"]: tag["value"] for tag in span["tags"]} for span_id, span in stored.items()}
    hops = sorted(
        (tag["otel_guard.chain.depth"], stored[span_id]["operationName"], tag["otel_guard.chain.root"])
        for span_id, tag in tags.items()
        if "otel_guard.chain.root" in tag
    )
    assert hops == [  # the whole loop, each hop naming the chain root
        (1, "invoke_agent planner", root),
        (2, "invoke_agent budget", root),
        (3, "invoke_agent planner", root),
        (3, "invoke_agent writer", root),
    ]
    # And the model call under budget, which names no chain, came with its trace.
    assert [
        stored[span_id]["operationName"]
        for span_id, tag in tags.items()
        if "otel_guard.chain.root" not in tag
    ] == ["chat"]
