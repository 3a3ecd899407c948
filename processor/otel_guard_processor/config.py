"""Every option of the processor, its default, and where it may come from.

Each option can be set four ways; a later one wins:

1. its default (below),
2. a YAML file given with ``--config FILE`` (keys are the option names, e.g. ``max_traces: 20000``),
3. the environment variable ``OTEL_GUARD_PROCESSOR_<NAME>`` (e.g. ``OTEL_GUARD_PROCESSOR_FORWARD``),
4. its command-line flag (``--max-traces``).

``ProcessorConfig.validate()`` checks every value and raises :class:`ConfigError` naming the option
and where its value came from. Addresses are ``HOST:PORT`` (``[::1]:4317`` for IPv6; port 0 picks
a free port); the optional ones also take ``off``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

__all__ = ["OPTIONS", "ConfigError", "Option", "ProcessorConfig", "load_config", "parse_address"]

ENV_PREFIX = "OTEL_GUARD_PROCESSOR_"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the option and its source."""

    def __init__(self, option: str, message: str, source: str = "") -> None:
        self.option = option
        where = f" (from {source})" if source else ""
        super().__init__(f"{option}{where}: {message}")


def parse_address(text: str, *, option: str = "address") -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[v6]:PORT`` for IPv6) into host and port."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ConfigError(option, f"expected HOST:PORT, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(port_text)
    if port > 65535:
        raise ConfigError(option, f"port {port} is out of range 0-65535")
    return host, port


@dataclass(frozen=True)
class Option:
    """One setting: its name (a ProcessorConfig field), flag, parser and help."""

    name: str
    parse: Callable[[str], Any]
    help: str
    metavar: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


def _optional_address(text: str) -> str | None:
    return None if text.strip().lower() in ("", "off", "none", "false") else text.strip()


def _address(text: str) -> str:
    return text.strip()


def _log_level(text: str) -> str:
    return text.strip().lower()


def _log_format(text: str) -> str:
    return text.strip().lower()


OPTIONS: tuple[Option, ...] = (
    Option("listen", _address, "OTLP/gRPC receiver address", "HOST:PORT"),
    Option(
        "http_listen",
        _optional_address,
        "OTLP/HTTP receiver address (POST /v1/traces, protobuf or JSON), or off",
        "HOST:PORT",
    ),
    Option(
        "forward",
        _optional_address,
        "downstream OTLP/gRPC endpoint; each request is sent there unchanged and acknowledged "
        "upstream only once the downstream acknowledged it; off makes the processor an analysis "
        "sink",
        "HOST:PORT",
    ),
    Option("prometheus", _optional_address, "Prometheus scrape address (/metrics), or off", "HOST:PORT"),
    Option("max_traces", int, "most traces held for detection; the least recently active goes", "N"),
    Option("max_spans", int, "most spans held for detection over all traces", "N"),
    Option("max_spans_per_trace", int, "most spans of one trace held; later ones skip detection", "N"),
    Option("trace_ttl", float, "seconds a trace is held after its latest span", "SECONDS"),
    Option(
        "max_request_bytes",
        int,
        "largest request accepted (after decompression); larger ones get RESOURCE_EXHAUSTED / 413",
        "BYTES",
    ),
    Option(
        "forward_timeout",
        float,
        "seconds to wait for the downstream; then RESOURCE_EXHAUSTED / 429",
        "SECONDS",
    ),
    Option(
        "max_inflight",
        int,
        "most requests forwarded at once; more get RESOURCE_EXHAUSTED / 429 with a retry delay",
        "N",
    ),
    Option(
        "max_pending_bytes",
        int,
        "most bytes of requests held (waiting for the downstream's answer or for detection); past it "
        "a request gets RESOURCE_EXHAUSTED / 429 with a retry delay and is not forwarded",
        "BYTES",
    ),
    Option("retry_after", float, "retry delay suggested to clients that are told to retry", "SECONDS"),
    Option(
        "read_timeout",
        float,
        "seconds an OTLP/HTTP request body may take to arrive; a slower one gets 408 and is closed",
        "SECONDS",
    ),
    Option(
        "drain_timeout",
        float,
        "seconds that SIGTERM waits for in-flight requests before stopping",
        "SECONDS",
    ),
    Option("log_level", _log_level, "log level: " + ", ".join(LOG_LEVELS), "LEVEL"),
    Option("log_format", _log_format, "log line format: text, or json (one object a line)", "FORMAT"),
)


@dataclass(frozen=True)
class ProcessorConfig:
    """All settings of one processor; see the module docstring for their sources."""

    listen: str = "127.0.0.1:4317"
    http_listen: str | None = None
    forward: str | None = None
    prometheus: str | None = "127.0.0.1:9464"
    max_traces: int = 50_000
    max_spans: int = 1_000_000
    max_spans_per_trace: int = 10_000
    trace_ttl: float = 120.0
    max_request_bytes: int = 8 * 1024 * 1024
    forward_timeout: float = 10.0
    max_inflight: int = 256
    max_pending_bytes: int = 32 * 1024 * 1024
    retry_after: float = 1.0
    read_timeout: float = 30.0
    drain_timeout: float = 15.0
    log_level: str = "info"
    log_format: str = "text"

    def validate(self) -> ProcessorConfig:
        """Check every value; raise ConfigError naming the first wrong option. Returns self."""
        parse_address(self.listen, option="listen")
        for name in ("http_listen", "forward", "prometheus"):
            value = getattr(self, name)
            if value is not None:
                parse_address(value, option=name)
        for name in (
            "max_spans",
            "max_spans_per_trace",
            "max_request_bytes",
            "max_inflight",
            "max_pending_bytes",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be at least 1, got {getattr(self, name)}")
        if self.max_traces < 2:
            raise ConfigError("max_traces", f"must be at least 2, got {self.max_traces}")
        for name in ("trace_ttl", "forward_timeout", "retry_after", "read_timeout", "drain_timeout"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(name, f"must be a positive number of seconds, got {value}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError("log_level", f"must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(
                "log_format", f"must be one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}"
            )
        return self


_OPTION_BY_NAME = {option.name: option for option in OPTIONS}
assert set(_OPTION_BY_NAME) == {f.name for f in fields(ProcessorConfig)}


def load_config(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: str | os.PathLike[str] | None = None,
) -> ProcessorConfig:
    """Build and validate the configuration from defaults, a YAML file, the environment and flags.

    ``flags`` maps option names to values already parsed (None = not given).
    """
    config = ProcessorConfig()
    if config_file is not None:
        config = _apply(config, _read_yaml(Path(config_file)), f"config file {config_file}")
    environ = os.environ if environ is None else environ
    from_env = {o.name: environ[o.env] for o in OPTIONS if o.env in environ}
    for name, text in from_env.items():
        config = _apply(config, {name: text}, f"environment variable {_OPTION_BY_NAME[name].env}")
    given = {name: value for name, value in (flags or {}).items() if value is not None}
    for name, value in given.items():
        config = _apply(config, {name: value}, f"flag {_OPTION_BY_NAME[name].flag}")
    try:
        return config.validate()
    except ConfigError as exc:
        source = _source_of(exc.option, given, from_env, config_file)
        raise ConfigError(exc.option, str(exc).split(": ", 1)[1], source) from None


def _source_of(name: str, given: Mapping[str, Any], from_env: Mapping[str, str], config_file: object) -> str:
    if name in given:
        return f"flag {_OPTION_BY_NAME[name].flag}"
    if name in from_env:
        return f"environment variable {_OPTION_BY_NAME[name].env}"
    return f"config file {config_file}" if config_file is not None else "default"


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError("config", f"{path} is not valid YAML: {exc}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError("config", f"{path} must hold a mapping of option names to values")
    unknown = sorted(str(key) for key in document if key not in _OPTION_BY_NAME)
    if unknown:
        known = ", ".join(sorted(_OPTION_BY_NAME))
        raise ConfigError("config", f"{path}: unknown option(s) {', '.join(unknown)}; known: {known}")
    return document


def _apply(config: ProcessorConfig, values: Mapping[str, Any], source: str) -> ProcessorConfig:
    changes: dict[str, Any] = {}
    for name, value in values.items():
        option = _OPTION_BY_NAME[name]
        try:
            changes[name] = option.parse(str(value)) if value is not None else None
        except (TypeError, ValueError):
            raise ConfigError(name, f"cannot read {value!r} as {option.metavar}", source) from None
    return replace(config, **changes)
