"""Fixtures of the processor tests: a real downstream sink and processors on ephemeral ports.

Everything listens on 127.0.0.1 port 0 and is stopped by the fixture that started it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from otel_guard_processor.config import ProcessorConfig
from otel_guard_processor.service import Processor
from processor_helpers import ProcessorFactory, Sink


@pytest.fixture
async def sink() -> AsyncIterator[Sink]:
    downstream = Sink()
    await downstream.start()
    yield downstream
    await downstream.stop()


@pytest.fixture
async def start_processor() -> AsyncIterator[ProcessorFactory]:
    """Start processors on ephemeral ports (OTLP/gRPC, OTLP/HTTP, Prometheus); all stopped after.

    ``count_wait`` is 0 unless a test sets it: a count is made in the request that makes it due, so
    a scrape right after sending reads it (``test_count_wait.py`` holds the default's wait); and
    ``metrics_grace`` is 0: a stop does not wait for a last scrape (``test_fleet_stop.py`` does)."""
    started: list[Processor] = []

    async def start(**settings: Any) -> Processor:
        config = replace(
            ProcessorConfig(),
            listen="127.0.0.1:0",
            http_listen="127.0.0.1:0",
            prometheus="127.0.0.1:0",
            drain_timeout=5.0,
            **{"count_wait": 0.0, "metrics_grace": 0.0, **settings},
        )
        processor = Processor(config)
        await processor.start()
        started.append(processor)
        return processor

    yield start
    for processor in started:
        await processor.stop()
