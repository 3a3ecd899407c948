"""``otel-guard processor`` as a command: help, usage errors, failures, and a SIGTERM drain."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import grpc.aio
import httpx
import pytest
from otel_guard_processor.cli import build_parser, main
from otel_guard_processor.config import OPTIONS, ProcessorConfig, parse_address
from processor_helpers import EXPORT, Sink, processor_process, ready_port
from processor_spans import Trace, encode


def test_help_documents_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: otel-guard processor")
    for option in OPTIONS:
        assert option.flag in text
        assert option.env in text
    assert "--config" in text
    # The contract's defaults are shown.
    for default in ("127.0.0.1:4317", "127.0.0.1:4390"):
        assert default in text


def test_every_option_is_a_flag() -> None:
    flags = {action.option_strings[0] for action in build_parser()._actions if action.option_strings}
    assert {option.flag for option in OPTIONS} <= flags


def test_unknown_flag_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--listen-to", "x"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --listen-to" in capsys.readouterr().err


def test_bad_value_is_usage_error_naming_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--max-traces", "zero"]) == 2
    assert "max_traces (from flag --max-traces)" in capsys.readouterr().err


def test_unreadable_config_file_is_failure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", "/nonexistent/processor.yaml"]) == 1
    assert "cannot read /nonexistent/processor.yaml" in capsys.readouterr().err


def _billion_laughs() -> str:
    """Nine anchors, each a list of nine aliases of the one before: 9**9 strings once expanded."""
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for before, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{before}'] * 9)}]")
    return "\n".join(lines) + "\n"


def _laughs_under_an_option() -> str:
    """The same bomb as the value of an option: read and turned into text, it never ends."""
    levels = ['&a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for before, name in zip("abcdefgh", "bcdefghi", strict=True):
        levels.append(f"&{name} [{', '.join([f'*{before}'] * 9)}]")
    return f"listen: [{', '.join(levels)}]\n"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (_billion_laughs(), r"line 1, column 4: anchors \(&a\) are not accepted"),
        (_laughs_under_an_option(), r"line 1, column 9: listen must be one value, not a list or a mapping"),
        ("max_traces: " + "[" * 100_000 + "]" * 100_000 + "\n", r"max_traces must be one value"),
        (
            "[" * 100_000 + "]" * 100_000 + "\n",
            r"not a mapping of option names|exceeded maximum nesting depth",
        ),
        ("max_traces: " + "1" * 10**7 + "\n", r"larger than 1048576 bytes"),
        ("max_traces: " + "1" * 10**5 + "\n", r"the value of max_traces is 100000 characters long"),
        (
            "max_traces: 10\n  listen: x\n",
            r"line 2, column 9: not valid YAML: mapping values are not allowed",
        ),
    ],
    ids=[
        "alias-bomb",
        "alias-bomb-in-an-option",
        "deep-nesting",
        "deep-document",
        "huge-integer",
        "long-integer",
        "syntax-error",
    ],
)
def test_a_hostile_config_file_is_one_line_and_usage_status(tmp_path: Path, text: str, error: str) -> None:
    config = tmp_path / "processor.yaml"
    config.write_text(text)
    started = time.monotonic()
    command = ["--config", str(config), "--listen", "127.0.0.1:0", "--prometheus", "off"]
    result = subprocess.run(
        [sys.executable, "-m", "otel_guard_processor", *command],
        check=False,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert time.monotonic() - started < 10
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"otel-guard processor: error: config: {config}")
    assert re.search(error, lines[0]), lines[0]
    assert len(lines[0]) < 600


def test_address_in_use_is_failure(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["--listen", "127.0.0.1:0", "--prometheus", f"127.0.0.1:{port}"]) == 1
    error = capsys.readouterr().err
    assert error == (
        f"otel-guard processor: cannot listen on 127.0.0.1:{port} for metrics (--prometheus): "
        "address already in use\n"
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    ("flag", "what"),
    [("--listen", "OTLP/gRPC"), ("--http-listen", "OTLP/HTTP"), ("--prometheus", "metrics")],
)
def test_a_taken_port_is_one_line_and_status_1(flag: str, what: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        ports = {"--listen": "127.0.0.1:0", "--http-listen": "127.0.0.1:0", "--prometheus": "127.0.0.1:0"}
        ports[flag] = address
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "otel_guard_processor",
                *(word for pair in ports.items() for word in pair),
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 1
    # One line: not gRPC's own log line before it, not a traceback.
    assert result.stderr == (
        f"otel-guard processor: cannot listen on {address} for {what} ({flag}): address already in use\n"
    )


_AGENT = """
from opentelemetry import metrics
metrics.get_meter("travel-agents").create_counter("agent_hops").add(3)
print("agent ready", flush=True)
import time
time.sleep(60)
"""


def _free_on_this_machine(port: int, whose: str) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as both servers bind
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            pytest.fail(
                f"127.0.0.1:{port} ({whose}) is taken by something else on this machine ({exc.strerror}); "
                "this test starts the defaults and needs it free"
            )


@pytest.mark.integration
@pytest.mark.slow
def test_the_default_metrics_port_is_not_the_opentelemetry_prometheus_exporters() -> None:
    """An agent serving its metrics with the OpenTelemetry SDK's Prometheus exporter on its default
    port, and the processor on its own default, run on one host and both serve."""
    sdk_default = 9464  # OTEL_EXPORTER_PROMETHEUS_PORT's default
    processor_default = parse_address(ProcessorConfig().prometheus or "")[1]
    _free_on_this_machine(sdk_default, "the OpenTelemetry Prometheus exporter's default")
    _free_on_this_machine(processor_default, "the processor's default metrics port")
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env.update(
        OTEL_METRICS_EXPORTER="prometheus",  # the port is left to the SDK's default
        OTEL_EXPORTER_PROMETHEUS_HOST="127.0.0.1",
        OTEL_TRACES_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
    )
    instrument = str(Path(sys.executable).parent / "opentelemetry-instrument")
    agent = subprocess.Popen(
        [instrument, sys.executable, "-c", _AGENT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert agent.stdout is not None
        assert agent.stdout.readline() == "agent ready\n", agent.stderr.read() if agent.stderr else ""
        # The processor, every listener on its default but OTLP/gRPC (4317 may serve something else).
        with processor_process() as (processor, ready):
            assert ready_port(ready, "metrics") == processor_default, ready
            agents = httpx.get(f"http://127.0.0.1:{sdk_default}/metrics", timeout=10)
            processors = httpx.get(f"http://127.0.0.1:{processor_default}/metrics", timeout=10)
            assert processor.poll() is None
    finally:
        agent.kill()
        agent.wait(10)
    assert agents.status_code == 200
    assert re.search(
        r"^agent_hops_total\{otel_scope_name=\"travel-agents\".*\} 3\.0$", agents.text, re.MULTILINE
    )
    assert processors.status_code == 200
    assert 'otel_guard_processor_spans_total{outcome="received"} 0.0' in processors.text


def test_the_otel_guard_command_runs_it() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from otel_guard.cli import main; raise SystemExit(main())",
            "processor",
            "--help",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert "usage: otel-guard processor" in result.stdout


@pytest.mark.integration
@pytest.mark.slow
async def test_sigterm_drains_requests_in_flight(sink: Sink) -> None:
    sink.delay = 1.5
    trace = Trace()
    trace.agent("planner", trace.agent("planner"))
    raw = encode(*trace.spans)
    args = ("--prometheus", "off", "--forward", sink.address, "--drain-timeout", "10")
    with processor_process(*args) as (process, ready):
        port = ready_port(ready, "ready: OTLP/gRPC")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            in_flight = asyncio.ensure_future(export(raw, timeout=20))
            await asyncio.wait_for(sink.arrived.wait(), 10)
            process.send_signal(signal.SIGTERM)
            # The request that was in flight is forwarded and acknowledged, not cut off.
            assert await in_flight == b""
        assert sink.received == [raw]
        assert await asyncio.to_thread(process.wait, 20) == 0
        assert process.stderr is not None
        rest = process.stderr.read()
        assert "draining" in rest
        assert "stopped" in rest
    # Once stopped it takes nothing more.
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await export(raw, timeout=2)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
