"""``count_wait``: a count waits for late spans that may change it, then is made once.

A loop is labelled from the return that started first. When a later turn of the loop arrives
before the earlier return (another process exporting late), the count waits ``count_wait`` seconds
(10 by default) so that the earlier return, arriving meanwhile, names it; made by the service's
sweep within about a second of the wait's end. With ``count_wait: 0`` a count is made at once, in
the request that makes it due. At stop, the counts still waiting are made: nothing later can
change them.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from otel_guard_processor.config import ConfigError, load_config
from processor_helpers import ProcessorFactory, export, scrape, series
from processor_spans import Trace, encode

FIRST_RETURN = ("planner>budget>planner", "cross_function")  # (cycle, kind), as series() gives them
LATER_TURN = ("budget>planner>budget", "cross_function")


def a_loop_whose_later_turn_comes_first() -> tuple[bytes, bytes]:
    """fx runs planner, which runs budget, which runs planner (the return that started first); and
    budget, which runs planner, which runs budget (a later turn): the later turn's request, then
    the earlier one's."""
    trace = Trace()
    fx = trace.agent("fx")
    planner = trace.agent("planner", fx)
    budget = trace.agent("budget", planner)
    trace.agent("planner", budget)  # the first return
    earlier = trace.spans[1:]
    later_budget = trace.agent("budget", fx)
    trace.agent("budget", trace.agent("planner", later_budget))
    later = [fx, *trace.spans[len(earlier) + 1 :]]
    for at, span in enumerate(trace.spans):
        span.start_time_unix_nano += at * 1_000_000  # each started a millisecond after the one before
    return encode(*later), encode(*earlier)


async def cycles_when_counted(processor: object, timeout: float) -> dict[tuple[str, ...], float]:
    deadline = time.monotonic() + timeout
    while True:
        cycles = series(await scrape(processor), "otel_guard_cycles_total")  # type: ignore[arg-type]
        if cycles or time.monotonic() > deadline:
            return cycles
        await asyncio.sleep(0.1)


async def test_a_late_earlier_return_names_the_loop_counted_once_after_the_wait(
    start_processor: ProcessorFactory,
) -> None:
    processor = await start_processor(count_wait=2.0)
    later, earlier = a_loop_whose_later_turn_comes_first()
    await export(processor, later)
    await processor.detection.settled()
    assert series(await scrape(processor), "otel_guard_cycles_total") == {}  # waiting
    await export(processor, earlier)
    sent = time.monotonic()
    assert await cycles_when_counted(processor, timeout=10.0) == {FIRST_RETURN: 1}
    # Made by the sweep within about a second of its due time, and once.
    assert time.monotonic() - sent < 2.0 + 3.0
    await asyncio.sleep(1.5)
    assert series(await scrape(processor), "otel_guard_cycles_total") == {FIRST_RETURN: 1}


async def test_with_no_wait_the_loop_is_counted_at_once_as_it_was_first_seen(
    start_processor: ProcessorFactory,
) -> None:
    processor = await start_processor(count_wait=0.0)
    later, earlier = a_loop_whose_later_turn_comes_first()
    await export(processor, later)
    await export(processor, earlier)
    await processor.detection.settled()
    assert series(await scrape(processor), "otel_guard_cycles_total") == {LATER_TURN: 1}


async def test_the_counts_still_waiting_are_made_at_stop(start_processor: ProcessorFactory) -> None:
    processor = await start_processor(count_wait=600.0)
    trace = Trace()
    trace.agent("planner", trace.agent("budget", trace.agent("planner")))
    await export(processor, encode(*trace.spans))
    await processor.detection.settled()
    assert processor.detector.cycles == {}
    await processor.stop()
    assert processor.detector.cycles == {("cross_function", "planner>budget>planner"): 1}
    assert processor.detector.delegations == {("planner", "budget"): 1, ("budget", "planner"): 1}


def test_count_wait_is_an_option_of_its_own() -> None:
    assert load_config({}, environ={}).count_wait == 10.0
    assert load_config({"count_wait": "0"}, environ={}).count_wait == 0.0
    assert load_config({}, environ={"OTEL_GUARD_PROCESSOR_COUNT_WAIT": "2.5"}).count_wait == 2.5
    with pytest.raises(ConfigError, match=r"count_wait \(from flag --count-wait\)"):
        load_config({"count_wait": "-1"}, environ={})
    with pytest.raises(ConfigError, match="count_wait"):
        load_config({"count_wait": "inf"}, environ={})
