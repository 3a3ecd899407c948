"""A request is checked on the event loop while detection works on the engine in a worker thread:
the check must not need the engine (a method of it raised ``RuntimeError: Already mutably borrowed``,
answered UNKNOWN to the sender, whenever the two met)."""

from __future__ import annotations

import threading

from otel_guard_processor.engine import EngineDetector
from processor_spans import Trace, encode


def big_request(agents: int) -> bytes:
    trace = Trace()
    parent = trace.agent("planner")
    for n in range(agents):
        parent = trace.agent(f"agent-{n % 50}", parent)
    return encode(*trace.spans)


def test_a_request_is_checked_while_the_engine_ingests_another() -> None:
    detector = EngineDetector()
    big, small = big_request(20_000), big_request(3)
    errors: list[BaseException] = []
    ingesting = threading.Event()

    def ingest() -> None:
        ingesting.set()
        for round_ in range(5):
            detector.ingest(big, float(round_))

    worker = threading.Thread(target=ingest)
    worker.start()
    ingesting.wait(5)
    checked = 0
    while worker.is_alive():
        try:
            assert detector.check(small) == 4
            checked += 1
        except RuntimeError as error:  # "Already mutably borrowed"
            errors.append(error)
            break
    worker.join(30)
    assert not errors, errors
    assert checked > 0  # the checks ran while the engine was ingesting
