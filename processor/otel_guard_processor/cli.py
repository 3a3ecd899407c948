"""``otel-guard processor``: run the collector-side processor until SIGTERM or SIGINT.

Exit status: 0 after a clean stop, 2 on bad usage (an unknown flag, a wrong value, a config file
that is not a flat YAML mapping of options), 1 when the processor cannot run (an address in use, a
config file that cannot be read); the reason goes to stderr, one line (after the usage for a flag).

SIGTERM and SIGINT are taken from before the listeners start, so a stop sent the moment ``ready:``
is read drains like any other; a misspelt ``OTEL_GUARD_PROCESSOR_*`` variable is warned of at start.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from otel_guard_processor.config import (
    OPTIONS,
    ConfigError,
    ProcessorConfig,
    UnreadableConfig,
    load_config,
    unknown_variables,
)
from otel_guard_processor.logs import configure_logging
from otel_guard_processor.service import Processor

__all__ = ["build_parser", "main"]

_DESCRIPTION = """\
Reads OpenTelemetry traces (OTLP/gRPC, and OTLP/HTTP when enabled), finds agent delegation cycles
(A -> A, A -> B -> A, and across traces through span links and otel_guard.chain.root), and serves
them as Prometheus metrics. With --forward it sits inline: each request goes downstream unchanged
and is acknowledged only once the downstream acknowledged it. OTLP metrics and logs are taken too,
unread: forwarded as they came, or answered OK without --forward.

Every option can also be set in a YAML file (--config, keys are the option names with
underscores) or in the environment (OTEL_GUARD_PROCESSOR_<OPTION>, e.g.
OTEL_GUARD_PROCESSOR_FORWARD); flags win over the environment, which wins over the file.
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; ``--help`` documents every option with its default and variable."""
    parser = _Parser(
        prog="otel-guard processor",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = ProcessorConfig()
    parser.add_argument(
        "--config", metavar="FILE", help="YAML file of options (keys: the option names below)"
    )
    for option in OPTIONS:
        default = getattr(defaults, option.name)
        shown = "off" if default is None else default
        bounds = "" if option.range is None else f"; {option.range}"
        parser.add_argument(
            option.flag,
            dest=option.name,
            metavar=option.metavar,
            default=None,
            help=f"{option.help} (default: {shown}{bounds}; env {option.env})",
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``otel-guard processor`` with ``argv`` (default: ``sys.argv[1:]``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    flags = {option.name: getattr(args, option.name) for option in OPTIONS}
    try:
        config = load_config(flags, config_file=args.config)
    except UnreadableConfig as exc:
        print(f"otel-guard processor: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        if exc.source.startswith("flag "):  # a wrong flag: say how the command is used
            parser.print_usage(sys.stderr)
        print(f"otel-guard processor: error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level, config.log_format)
    for variable, closest in unknown_variables(os.environ):
        hint = f"did you mean {closest}?" if closest else "no option's variable is close to it"
        logging.getLogger("otel_guard_processor").warning(
            "otel-guard processor: %s names no option and is ignored; %s", variable, hint
        )
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(_run(config))
    except OSError as exc:
        print(f"otel-guard processor: {exc}", file=sys.stderr)
        return 1


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (a dependency but on Windows): with gRPC's and
    uvicorn's sockets on it the processor spends about 7% less CPU a span
    (``bench/processor_throughput.py``); else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _run(config: ProcessorConfig) -> int:
    # The handlers first: a stop that comes while the listeners start, or the moment ``ready:`` is
    # read, drains (once they run) instead of killing the process with requests in flight.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    processor = Processor(config)
    await processor.start()
    # Detection keeps many small long-lived objects. Leaving what exists at start out of every
    # collection, and collecting the young generation less often, keeps the garbage collector
    # off the per-span cost (it measured at about 1 µs a span with default thresholds).
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    print(f"otel-guard processor: ready: {processor.describe()}", file=sys.stderr, flush=True)
    await stop.wait()
    print("otel-guard processor: draining", file=sys.stderr, flush=True)
    await processor.stop()
    print("otel-guard processor: stopped", file=sys.stderr, flush=True)
    return 0
