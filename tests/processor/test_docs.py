"""The processor's reference page (docs/processor.md) says what the processor really does."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from otel_guard_processor.config import OPTIONS
from processor_helpers import ProcessorFactory, export
from processor_spans import Trace, encode, guard_attributes

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "processor.md"


def documented_metrics(text: str) -> set[str]:
    """The metric names in the first column of the guide's metrics table."""
    start = text.index("| metric | type | labels | meaning |")
    table = text[start:].split("\n\n", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.MULTILINE))


async def test_documented_metrics_are_exactly_those_served(start_processor: ProcessorFactory) -> None:
    processor = await start_processor()
    trace = Trace()
    planner = trace.agent("planner", attributes=guard_attributes(["planner"]))
    trace.agent(
        "planner",
        planner,
        attributes=guard_attributes(["planner", "planner"], decision="refuse", reason="cycle"),
    )
    await export(processor, encode(*trace.spans))
    assert processor.prometheus is not None
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"http://127.0.0.1:{processor.prometheus.port}/metrics")).text
    served = set(re.findall(r"^# TYPE (\S+) ", text, flags=re.MULTILINE))
    assert documented_metrics(GUIDE.read_text(encoding="utf-8")) == served


def test_guide_documents_every_option() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    for option in OPTIONS:
        assert f"`{option.flag} " in text, option.flag
        assert f"`{option.env}`" in text, option.env
