"""Every number the processor takes is bounded to what the parts it reaches accept (issue 41).

The engine's counts are ``usize``, gRPC's message sizes a C ``int``, and gRPC turns a deadline past
2**63 ns since 1970 into DEADLINE_EXCEEDED at once; an integer of 4,300 digits and more cannot even be
printed. Each value the issue named (a traceback before) is tried through each of the three sources
-- the YAML file, a flag, an environment variable -- and must be one ConfigError naming the option,
the value (cut) and the range. The edges of each range are taken by the real engine and gRPC.
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from otel_guard_processor._engine import Engine
from otel_guard_processor.cli import main
from otel_guard_processor.config import (
    MAX_COUNT,
    MAX_MESSAGE_BYTES,
    MAX_SECONDS,
    OPTIONS,
    ConfigError,
    ProcessorConfig,
    load_config,
)
from otel_guard_processor.service import Processor
from processor_helpers import Sink, export
from processor_spans import Trace, encode

INTEGER_OPTIONS = [option.name for option in OPTIONS if option.range is not None and option.range.integer]
SECONDS_OPTIONS = [option.name for option in OPTIONS if option.range is not None and not option.range.integer]

# (option, the value as written, the range's text): the eight, and their neighbours.
HOSTILE = [
    ("max_traces", "0x" + "f" * 4094, "from 2 to"),  # 4,094 hex digits: 4,096 characters, the most read
    ("max_traces", "0b" + "1" * 4094, "from 2 to"),
    ("max_spans", "0b1" + "0" * 64, "from 1 to"),  # 2**64 in binary
    ("max_spans", ":".join(["59"] * 1365), "from 1 to"),  # sexagesimal: 60**1365
    ("max_spans_per_trace", "1:" + "0:" * 20 + "0", "from 1 to"),  # 60**21: 38 decimal digits
    ("max_spans", str(2**64), "from 1 to"),
    ("max_request_bytes", str(2**63), f"from 1 to {MAX_MESSAGE_BYTES}"),
    ("max_request_bytes", str(2**40), f"from 1 to {MAX_MESSAGE_BYTES}"),
    ("max_inflight", "9" * 4000, "from 1 to"),  # under int()'s own limit, refused by its length
    ("max_pending_bytes", str(2**63), "from 1 to"),
]
IDS = ["hex-4094", "binary-4094", "binary-2^64", "sexagesimal-long", "sexagesimal-60^21", "max_spans-2^64",
       "max_request_bytes-2^63", "max_request_bytes-2^40", "decimal-4000",
       "max_pending_bytes-2^63"]  # fmt: skip
SOURCES = ["yaml", "flag", "environment"]


def _load(source: str, option: str, text: str, tmp_path: Path) -> ProcessorConfig:
    if source == "yaml":
        file = tmp_path / "processor.yaml"
        file.write_text(f"{option}: {text}\n")
        return load_config({}, environ={}, config_file=file)
    if source == "flag":
        return load_config({option: text}, environ={})
    return load_config({}, environ={f"OTEL_GUARD_PROCESSOR_{option.upper()}": text})


def _where(source: str, option: str) -> str:
    return {
        "yaml": "config file",
        "flag": "flag --" + option.replace("_", "-"),
        "environment": f"environment variable OTEL_GUARD_PROCESSOR_{option.upper()}",
    }[source]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(("option", "text", "range_text"), HOSTILE, ids=IDS)
def test_an_integer_out_of_range_is_one_error_from_every_source(
    tmp_path: Path, source: str, option: str, text: str, range_text: str
) -> None:
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        _load(source, option, text, tmp_path)
    assert time.monotonic() - started < 1
    message = str(caught.value)
    assert caught.value.option == option
    assert message.startswith(f"{option} (from {_where(source, option)}")
    assert f"must be an integer {range_text}" in message
    assert "\n" not in message
    assert len(message) < 300  # the value is cut
    shown = message.split(", got ", 1)[1]
    if source != "yaml":  # YAML converts the short forms: their value is shown in decimal
        assert shown.startswith((repr(text)[:20], text[:20])), shown  # the value as written, cut


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0b1010", 10), ("0x1F", 31), ("017", 15), ("1:20", 80), ("1_000", 1000), ("+12", 12)],
)
def test_yaml_integer_forms_are_read_as_yaml_1_1_reads_them(tmp_path: Path, text: str, expected: int) -> None:
    assert _load("yaml", "max_traces", text, tmp_path).max_traces == expected


@pytest.mark.parametrize("source", ["flag", "environment"])
@pytest.mark.parametrize("text", ["0x1F", "0b1010", "1:20", "0o17", "1e3", "1.5", "١٢", "", "1__0"])
def test_a_flag_or_variable_takes_decimal_integers_only(tmp_path: Path, source: str, text: str) -> None:
    with pytest.raises(ConfigError, match=rf"max_traces .*must be an integer from 2 to {MAX_COUNT}, got"):
        _load(source, "max_traces", text, tmp_path)
    assert _load(source, "max_traces", " 1_000 ", tmp_path).max_traces == 1000


BAD_SECONDS = [("nan", ".nan"), ("inf", ".inf"), ("-inf", "-.inf"), ("-1", "-1"), ("1e10", "1e10"),
               ("1e400", "1.0e+400"), (str(2**64), str(2**64)), ("0x10", "0o10"),
               ("soon", "soon")]  # fmt: skip


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("option", SECONDS_OPTIONS)
@pytest.mark.parametrize(("text", "yaml_text"), BAD_SECONDS, ids=[text for text, _ in BAD_SECONDS])
def test_seconds_are_finite_positive_and_bounded(
    tmp_path: Path, source: str, option: str, text: str, yaml_text: str
) -> None:
    written = yaml_text if source == "yaml" else text
    with pytest.raises(ConfigError) as caught:
        _load(source, option, written, tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{option} (from {_where(source, option)}")
    low = "from 0" if option == "count_wait" else "above 0"
    assert f"must be a number of seconds {low}, at most {int(MAX_SECONDS)}, got" in message


def test_a_sexagesimal_float_past_a_float_is_one_error(tmp_path: Path) -> None:
    """YAML 1.1 reads ``1:59:...:59.5`` as a float in base 60; past a float's range PyYAML raises."""
    file = tmp_path / "processor.yaml"
    file.write_text("trace_ttl: 1" + ":59" * 1300 + ".5\n")
    with pytest.raises(ConfigError) as caught:
        load_config({}, environ={}, config_file=file)
    assert str(caught.value) == (
        f"config: {file}, line 1, column 12: cannot read the value of trace_ttl: int too large to convert "
        "to float; it must be a number of seconds above 0, at most 1000000000"
    )


@pytest.mark.parametrize("source", SOURCES)
def test_zero_is_a_count_wait_and_no_timeout(tmp_path: Path, source: str) -> None:
    assert _load(source, "count_wait", "0", tmp_path).count_wait == 0
    with pytest.raises(ConfigError, match=r"read_timeout .*above 0, at most 1000000000, got"):
        _load(source, "read_timeout", "0", tmp_path)
    assert _load(source, "read_timeout", "1e9", tmp_path).read_timeout == MAX_SECONDS


@pytest.mark.parametrize(
    "changes",
    [
        {"max_spans": 2**64},
        {"max_traces": 10**5000},  # repr() of it raises: the message must not need it
        {"max_request_bytes": MAX_MESSAGE_BYTES + 1},
        {"max_inflight": True},
        {"max_pending_bytes": "5"},
        {"trace_ttl": math.nan},
        {"drain_timeout": 10**400},  # an int too large for a float
        {"count_wait": -0.5},
    ],
    ids=lambda changes: next(iter(changes)),
)
def test_validate_refuses_what_a_program_passes(changes: dict[str, Any]) -> None:
    """A ProcessorConfig built in code (not by load_config) is checked too: Processor validates it."""
    config = replace(ProcessorConfig(), **changes)
    name = next(iter(changes))
    with pytest.raises(ConfigError, match=rf"^{name}: must be ") as caught:
        Processor(config)
    assert len(str(caught.value)) < 300


def test_the_largest_counts_are_taken_by_the_engine() -> None:
    """The ranges are what the engine takes: each count's upper bound builds an Engine, one past it
    (where the range was the engine's own) does not."""
    Engine(max_traces=MAX_COUNT, max_spans=MAX_COUNT, max_spans_per_trace=MAX_COUNT)
    with pytest.raises(OverflowError):
        Engine(max_spans=2**64)


@pytest.mark.integration
async def test_the_edges_of_every_range_run(sink: Sink) -> None:
    """A processor with every number at its upper bound starts, forwards and answers: gRPC takes
    2**31 - 1 as a message size, and a forward_timeout of MAX_SECONDS is a deadline in the future
    (at 1e10 s, accepted before, gRPC failed every call at once with DEADLINE_EXCEEDED)."""
    edges: dict[str, Any] = {option.name: option.range.high for option in OPTIONS if option.range}
    config = ProcessorConfig(
        listen="127.0.0.1:0", http_listen="127.0.0.1:0", prometheus="127.0.0.1:0", forward=sink.address
    )
    processor = Processor(replace(config, **edges))
    assert processor.config.forward_timeout == MAX_SECONDS
    await processor.start()
    try:
        trace = Trace()
        trace.agent("planner")
        raw = encode(*trace.spans)
        assert await export(processor, raw) == b""
        assert sink.received == [raw]
    finally:
        await asyncio.wait_for(processor.stop(), 10)  # nothing in flight: the drain ends at once


def _command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "otel_guard_processor", "--listen", "127.0.0.1:0", "--prometheus", "off"]
    return subprocess.run([*command, *args], check=False, capture_output=True, text=True, timeout=20, env=env)


@pytest.mark.integration
def test_the_command_refuses_each_in_one_line_and_status_2(tmp_path: Path) -> None:
    """The real CLI: status 2, the reason one line (after the usage for a flag), never a traceback."""
    file = tmp_path / "processor.yaml"
    file.write_text("max_traces: 0x" + "f" * 4094 + "\n")
    environ = {**os.environ, "OTEL_GUARD_PROCESSOR_MAX_REQUEST_BYTES": str(2**40)}
    runs = {
        "yaml": (_command("--config", str(file)), "max_traces (from config file"),
        "flag": (_command("--max-spans", str(2**64)), "max_spans (from flag --max-spans)"),
        "environment": (
            _command(env=environ),
            "max_request_bytes (from environment variable OTEL_GUARD_PROCESSOR_MAX_REQUEST_BYTES)",
        ),
        "timeout": (_command("--forward-timeout", "nan"), "forward_timeout (from flag --forward-timeout)"),
    }
    for source, (result, named) in runs.items():
        assert result.returncode == 2, (source, result.stderr[-2000:])
        assert "Traceback" not in result.stderr
        lines = result.stderr.splitlines()
        if source in ("yaml", "environment"):
            assert len(lines) == 1, result.stderr  # no usage: no flag was wrong
        else:
            assert lines[0].startswith("usage: otel-guard processor")
        assert lines[-1].startswith(f"otel-guard processor: error: {named}"), lines[-1]
        assert "): must be " in lines[-1]
        assert len(lines[-1]) < 300


def test_help_gives_every_range(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option in OPTIONS:
        if option.range is not None:
            assert f"{option.range}; env {option.env}" in text, option.name
