"""Detection state in bytes: what one held span can cost at worst, whatever the senders put in it.

The README bounds the processor's memory by its flags: ``--max-spans`` times the most a held span
can cost, plus the requests held (``--max-pending-bytes``). The most a span can cost is when every
name is new and as long as names are kept (``MAX_NAME_CHARS``) and every path as deep as paths go
(``MAX_PATH_NAMES``): this test builds that traffic and measures the Python heap per held span.
"""

from __future__ import annotations

import gc
import os
import tracemalloc

from otel_guard_processor.detector import MAX_NAME_CHARS, MAX_PATH_NAMES, Detector
from otel_guard_processor.otlp import parse_request
from processor_spans import Trace, encode

WORST_BYTES_PER_SPAN = 1536  # the README's figure; measured about 1,150 here
TRACES = 40


def hostile_trace() -> bytes:
    """A chain of MAX_PATH_NAMES + 16 agents, each named anew, every name longer than is kept."""
    trace = Trace()
    parent = None
    for _ in range(MAX_PATH_NAMES + 16):
        parent = trace.agent(os.urandom(MAX_NAME_CHARS).hex(), parent)
    return encode(*trace.spans)


def test_a_held_span_costs_at_most_the_documented_bytes_at_worst() -> None:
    requests = [hostile_trace() for _ in range(TRACES)]
    detector = Detector()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for raw in requests:
            detector.ingest(parse_request(raw), raw, 0.0)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    spans = detector.stored_spans
    assert spans == TRACES * (MAX_PATH_NAMES + 16)
    assert detector.truncated["name"] == spans  # every name was cut to MAX_NAME_CHARS
    per_span = held / spans
    assert per_span <= WORST_BYTES_PER_SPAN, per_span
    assert per_span >= WORST_BYTES_PER_SPAN / 3, per_span  # the traffic is as costly as it claims
