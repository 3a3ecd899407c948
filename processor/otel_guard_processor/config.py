"""Every option of the processor, its default, and where it may come from.

Each option can be set four ways; a later one wins:

1. its default (below),
2. a YAML file given with ``--config FILE`` (keys are the option names, e.g. ``max_traces: 20000``),
3. the environment variable ``OTEL_GUARD_PROCESSOR_<NAME>`` (e.g. ``OTEL_GUARD_PROCESSOR_FORWARD``),
4. its command-line flag (``--max-traces``).

``ProcessorConfig.validate()`` checks every value and raises :class:`ConfigError` naming the option
and where its value came from. Addresses are ``HOST:PORT`` (``[::1]:4317`` for IPv6; port 0 picks
a free port); the optional ones also take ``off``. Every number has a :class:`Range`, what the parts
it reaches take: counts up to ``sys.maxsize`` (the engine's ``usize``), ``max_request_bytes`` up to
2**31 - 1 (gRPC's message size, a C ``int``), seconds finite and up to 10**9 (gRPC takes a deadline
past 2**63 ns since 1970, about 7.4e9 s from now, as already past: every call would time out).
An integer is counted in digits before it is converted, so no value is too long to refuse.

The YAML file is one flat mapping of option names to single values, and it is read as exactly that:
event by event, not built by ``yaml.safe_load``. Anchors, aliases, nested values and a second
document are refused where they first appear, and the file is read to 1 MiB at most, so an alias
bomb, deep nesting or a huge number ends in one :class:`ConfigError` naming the file, not a hang or
a traceback.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from otel_guard_processor.dialects_file import DialectsError, Spec, read_dialects

__all__ = [
    "MAX_COUNT",
    "MAX_MESSAGE_BYTES",
    "MAX_SECONDS",
    "OPTIONS",
    "ConfigError",
    "Option",
    "ProcessorConfig",
    "Range",
    "UnreadableConfig",
    "load_config",
    "parse_address",
    "unknown_variables",
]

ENV_PREFIX = "OTEL_GUARD_PROCESSOR_"
MAX_CONFIG_BYTES = 1024 * 1024  # a config file's size, read no further
MAX_VALUE_CHARS = 4096  # one value's length: far past any address or number
MAX_COUNT = sys.maxsize  # the engine's counts are usize, Python's sizes ssize_t: both take this
MAX_MESSAGE_BYTES = 2**31 - 1  # gRPC's largest message (grpc.max_send_message_length is a C int)
MAX_SECONDS = 1e9  # about 31.7 years; see the module docstring
_MAX_DIGITS = len(str(MAX_COUNT))  # a decimal integer longer than this is refused unconverted
# The longest YAML 1.1 form of an integer any option takes: a sign, 0b and 63 binary digits. A longer
# one (a 4,094-digit hex number) is left as text and refused by the option's parser, unconverted.
_MAX_YAML_INTEGER_CHARS = 66
_YAML_INT = "tag:yaml.org,2002:int"
_DECIMAL = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*", re.ASCII)
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
# libyaml's parser where PyYAML was built with it; the reader walks its events either way.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the option and its source."""

    def __init__(self, option: str, message: str, source: str = "") -> None:
        self.option = option
        self.source = source
        where = f" (from {source})" if source else ""
        super().__init__(f"{option}{where}: {message}")


class UnreadableConfig(ConfigError):
    """The config file cannot be read at all (missing, a directory, no permission)."""


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
class Range:
    """The values a numeric option takes: integers, or seconds (finite), from ``low`` to ``high``."""

    low: float
    high: float
    integer: bool = True
    above_low: bool = False  # ``low`` itself is refused (a timeout of 0)

    def __contains__(self, value: object) -> bool:
        kinds: tuple[type, ...] = (int,) if self.integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        assert isinstance(value, int | float)
        return (value > self.low if self.above_low else value >= self.low) and value <= self.high

    def __str__(self) -> str:
        low, high = _number(self.low), _number(self.high)
        if self.integer:
            return f"an integer from {low} to {high}"
        return f"a number of seconds {'above' if self.above_low else 'from'} {low}, at most {high}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


COUNT = Range(1, MAX_COUNT)
SECONDS = Range(0, MAX_SECONDS, integer=False, above_low=True)


@dataclass(frozen=True)
class Option:
    """One setting: its name (a ProcessorConfig field), flag, parser, help and, for a number, its
    range."""

    name: str
    parse: Callable[[str], Any]
    help: str
    metavar: str
    range: Range | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def refusal(self, value: object) -> str:
        """Why ``value`` is not taken: the range it must be in, or the form it must have."""
        if self.range is not None:
            return f"must be {self.range}, got {_shown(value)}"
        return f"cannot read {_shown(value)} as {self.metavar}"


def _optional_address(text: str) -> str | None:
    return None if text.strip().lower() in ("", "off", "none", "false") else text.strip()


def _address(text: str) -> str:
    return text.strip()


def _log_level(text: str) -> str:
    return text.strip().lower()


def _log_format(text: str) -> str:
    return text.strip().lower()


def _integer(text: str) -> int:
    """A decimal integer (``1_000_000`` too), its digits counted before ``int()``: one longer than the
    largest any option takes is refused unconverted (``int()`` of 4,300 digits and more raises)."""
    text = text.strip()
    if not _DECIMAL.fullmatch(text):
        raise ValueError("not a decimal integer")
    if len(text.lstrip("+-").replace("_", "").lstrip("0")) > _MAX_DIGITS:
        raise ValueError("more digits than any option takes")
    return int(text)


def _seconds(text: str) -> float:
    return float(text.strip())


# A header name a client may send and the forwarder may set as gRPC metadata: lowercase letters,
# digits and "-_." (gRPC's metadata keys). Those gRPC or HTTP/2 themselves use are refused: they
# describe the call, not the tenant, and gRPC sets them on each call of its own.
_HEADER_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*", re.ASCII)
_RESERVED_HEADERS = frozenset(
    ("content-type", "content-length", "content-encoding", "te", "host", "connection", "user-agent",
     "transfer-encoding", "keep-alive", "upgrade", "accept-encoding")
)  # fmt: skip
MAX_FORWARD_HEADERS = 16


class _Refused(ValueError):
    """A parser's own refusal, its message said as it is (not the option's generic one)."""


def _header_names(text: str) -> tuple[str, ...] | None:
    """Comma-separated header names, lowercased and each once; ``off`` or nothing: None."""
    if _optional_address(text) is None:
        return None
    names = tuple(dict.fromkeys(name.strip().lower() for name in text.split(",") if name.strip()))
    if not names or len(names) > MAX_FORWARD_HEADERS:
        raise _Refused(f"must be between 1 and {MAX_FORWARD_HEADERS} header names, got {len(names)}")
    for name in names:
        if not _HEADER_NAME.fullmatch(name) or len(name) > 128:
            raise _Refused(f"{name[:40]!r} is not a header name (letters, digits, '-', '_', '.')")
        if name in _RESERVED_HEADERS or name.startswith("grpc-") or name.endswith("-bin"):
            raise _Refused(f"{name!r} is gRPC's or HTTP's own header, not one to forward")
    return names


OPTIONS: tuple[Option, ...] = (
    Option("listen", _address, "OTLP/gRPC receiver address", "HOST:PORT"),
    Option(
        "http_listen",
        _optional_address,
        "OTLP/HTTP receiver address (POST /v1/traces, /v1/metrics, /v1/logs, protobuf or JSON), or off",
        "HOST:PORT",
    ),
    Option(
        "forward",
        _optional_address,
        "downstream OTLP/gRPC endpoint; each request (traces, metrics, logs) is sent there unchanged "
        "and acknowledged upstream only once the downstream acknowledged it; off makes the processor "
        "an analysis sink",
        "HOST:PORT",
    ),
    Option(
        "forward_headers",
        _header_names,
        "comma-separated names of request headers (gRPC metadata, HTTP headers) that travel with the "
        "request's spans, metrics and logs to the downstream (x-scope-orgid,authorization); their "
        "values are never logged; or off",
        "NAME,...",
    ),
    Option("prometheus", _optional_address, "Prometheus scrape address (/metrics), or off", "HOST:PORT"),
    Option(
        "metrics_forward",
        _optional_address,
        "OTLP/gRPC endpoint the processor pushes its own metrics to (those /metrics serves, the same "
        "names and labels), every metrics_interval seconds and once more when it drains; or off",
        "HOST:PORT",
    ),
    Option(
        "metrics_interval",
        _seconds,
        "seconds between two pushes of the processor's own metrics to metrics_forward",
        "SECONDS",
        SECONDS,
    ),
    Option(
        "metrics_grace",
        _seconds,
        "seconds /metrics keeps serving after the drain made the last counts, so that the next scrape "
        "reads them: it closes at the first scrape after the drain, 1.5 times the interval seen "
        "between the last two scrapes, or this, whichever comes first (at once when never scraped)",
        "SECONDS",
        Range(0, MAX_SECONDS, integer=False),
    ),
    Option(
        "max_traces",
        _integer,
        "most traces held for detection; the least recently active goes",
        "N",
        Range(2, MAX_COUNT),
    ),
    Option("max_spans", _integer, "most spans held for detection over all traces", "N", COUNT),
    Option(
        "max_spans_per_trace", _integer, "most spans of one trace held; later ones skip detection", "N", COUNT
    ),
    Option(
        "max_held_bytes",
        _integer,
        "most bytes of detection state held over all traces, as --max-spans bounds their number; "
        "past it the least recently active trace goes (one of a single name before one that delegates)",
        "BYTES",
        COUNT,
    ),
    Option("trace_ttl", _seconds, "seconds a trace is held after its latest span", "SECONDS", SECONDS),
    Option(
        "count_wait",
        _seconds,
        "seconds a count waits for late spans that may change it (an earlier return naming a loop, "
        "an agent run taking a tool call's place); 0 counts at once",
        "SECONDS",
        Range(0, MAX_SECONDS, integer=False),
    ),
    Option(
        "max_request_bytes",
        _integer,
        "largest request accepted (after decompression); larger ones get RESOURCE_EXHAUSTED / 413",
        "BYTES",
        Range(1, MAX_MESSAGE_BYTES),
    ),
    Option(
        "forward_timeout",
        _seconds,
        "seconds to wait for the downstream; then RESOURCE_EXHAUSTED / 429",
        "SECONDS",
        SECONDS,
    ),
    Option(
        "max_inflight",
        _integer,
        "most requests forwarded at once; more get RESOURCE_EXHAUSTED / 429 with a retry delay",
        "N",
        COUNT,
    ),
    Option(
        "max_pending_bytes",
        _integer,
        "the one memory budget of requests: most bytes held by the receivers (being received, "
        "inflated or converted from JSON), waiting for detection or the downstream, and being "
        "forwarded; past it a request gets RESOURCE_EXHAUSTED / 429 with a retry delay, never held",
        "BYTES",
        COUNT,
    ),
    Option(
        "retry_after",
        _seconds,
        "retry delay suggested to clients that are told to retry",
        "SECONDS",
        SECONDS,
    ),
    Option(
        "read_timeout",
        _seconds,
        "seconds an OTLP/HTTP request body may take to arrive; a slower one gets 408 and is closed",
        "SECONDS",
        SECONDS,
    ),
    Option(
        "drain_timeout",
        _seconds,
        "seconds that SIGTERM waits for in-flight requests before stopping",
        "SECONDS",
        SECONDS,
    ),
    Option(
        "dialects",
        _optional_address,
        "YAML file of more dialect rows, in the built-in table's form (docs/processor.md, "
        "'Teaching it a dialect'), read after the built-in rows; or off",
        "FILE",
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
    forward_headers: tuple[str, ...] | None = None
    prometheus: str | None = "127.0.0.1:4390"
    metrics_forward: str | None = None
    metrics_interval: float = 15.0
    metrics_grace: float = 15.0
    max_traces: int = 50_000
    max_spans: int = 1_000_000
    max_spans_per_trace: int = 10_000
    max_held_bytes: int = 256 * 1024 * 1024
    trace_ttl: float = 120.0
    count_wait: float = 10.0
    max_request_bytes: int = 8 * 1024 * 1024
    forward_timeout: float = 10.0
    max_inflight: int = 256
    max_pending_bytes: int = 128 * 1024 * 1024
    retry_after: float = 1.0
    read_timeout: float = 30.0
    drain_timeout: float = 15.0
    dialects: str | None = None
    log_level: str = "info"
    log_format: str = "text"

    def validate(self) -> ProcessorConfig:
        """Check every value; raise ConfigError naming the first wrong option. Returns self."""
        parse_address(self.listen, option="listen")
        for name in ("http_listen", "forward", "prometheus", "metrics_forward"):
            value = getattr(self, name)
            if value is not None:
                parse_address(value, option=name)
        for option in OPTIONS:
            value = getattr(self, option.name)
            if option.range is not None and value not in option.range:
                raise ConfigError(option.name, option.refusal(value))
        self.dialect_rows()
        if self.log_level not in LOG_LEVELS:
            raise ConfigError("log_level", f"must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(
                "log_format", f"must be one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}"
            )
        return self

    def dialect_rows(self) -> tuple[Spec, ...]:
        """The rows of the dialects file (none without one); ConfigError when it is wrong."""
        if self.dialects is None:
            return ()
        from otel_guard_processor.engine import dialect_table  # the compiled engine's table

        try:
            return read_dialects(self.dialects, dialect_table()[0])
        except DialectsError as exc:
            raise ConfigError("dialects", str(exc)) from None


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
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise UnreadableConfig("config", f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise _bad_file(path, f"larger than {MAX_CONFIG_BYTES} bytes (the options fit in far less)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad_file(path, f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    try:
        loader = _Loader(text)
        try:
            document = _options_of(loader, path)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        what = ": ".join(part for part in (exc.context, exc.problem) if part)
        raise _bad_file(path, f"not valid YAML: {what}", exc.problem_mark or exc.context_mark) from None
    except yaml.reader.ReaderError as exc:
        raise _bad_file(path, f"not valid YAML: character {exc.position}: {exc.reason}") from None
    except yaml.YAMLError as exc:
        raise _bad_file(path, f"not valid YAML: {exc}") from None
    unknown = sorted(str(key) for key in document if key not in _OPTION_BY_NAME)
    if unknown:
        listed = ", ".join(_cut(key) for key in unknown[:5])
        if len(unknown) > 5:
            listed += f" and {len(unknown) - 5} more"
        known = ", ".join(sorted(_OPTION_BY_NAME))
        raise _bad_file(path, f"unknown option(s) {listed}; known: {known}")
    return document


def _options_of(loader: Any, path: Path) -> dict[str, Any]:
    """The file's mapping of option names to single values, read event by event.

    The options are one flat mapping of scalars, so nothing else is taken: a list or a mapping as a
    value, an alias, an anchor, a second document are refused at the first event that shows one,
    before anything is built. Nothing can nest, expand or recurse.
    """
    loader.get_event()  # the stream's start
    if loader.check_event(yaml.StreamEndEvent):
        return {}  # an empty file
    loader.get_event()  # the document's start
    event = _next(loader, path)
    options: dict[str, Any] = {}
    if isinstance(event, yaml.ScalarEvent) and _scalar(loader, event, path, "the document") is None:
        pass  # only comments, or "~"
    elif not isinstance(event, yaml.MappingStartEvent):
        raise _bad_file(path, "not a mapping of option names to values", event.start_mark)
    else:
        while not loader.check_event(yaml.MappingEndEvent):
            key = _next(loader, path)
            if not isinstance(key, yaml.ScalarEvent):
                raise _bad_file(
                    path, "an option name must be a word, not a list or a mapping", key.start_mark
                )
            name = _cut(key.value)
            if key.value in options:
                raise _bad_file(path, f"option {name} is given twice", key.start_mark)
            value = _next(loader, path)
            if not isinstance(value, yaml.ScalarEvent):
                raise _bad_file(path, f"{name} must be one value, not a list or a mapping",
                                value.start_mark)  # fmt: skip
            options[key.value] = _scalar(loader, value, path, name)
        loader.get_event()  # the mapping's end
    loader.get_event()  # the document's end
    if not loader.check_event(yaml.StreamEndEvent):
        raise _bad_file(path, "more than one YAML document", loader.peek_event().start_mark)
    return options


def _next(loader: Any, path: Path) -> Any:
    """The next event; an alias or an anchor is refused (a config has no use for either)."""
    event = loader.get_event()
    if isinstance(event, yaml.AliasEvent):
        raise _bad_file(path, f"aliases (*{_cut(event.anchor or '')}) are not accepted", event.start_mark)
    anchor = getattr(event, "anchor", None)
    if anchor is not None:
        raise _bad_file(path, f"anchors (&{_cut(anchor)}) are not accepted", event.start_mark)
    return event


def _scalar(loader: Any, event: Any, path: Path, what: str) -> Any:
    """One scalar's value, typed as YAML reads it (a bare ``off`` is false, ``~`` is None)."""
    if len(event.value) > MAX_VALUE_CHARS:
        raise _bad_file(path, f"the value of {what} is {len(event.value)} characters long; at most "
                        f"{MAX_VALUE_CHARS}", event.start_mark)  # fmt: skip
    tag = event.tag
    if tag is None or tag == "!":
        tag = loader.resolve(yaml.ScalarNode, event.value, event.implicit)
    if tag == _YAML_INT and len(event.value.replace("_", "")) > _MAX_YAML_INTEGER_CHARS:
        return event.value  # out of every option's range: left as text, for its parser to refuse
    node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, style=event.style)
    try:
        return loader.construct_object(node)
    except (ValueError, OverflowError) as exc:  # e.g. a timestamp of month 13, 60**1300 as a float
        option = _OPTION_BY_NAME.get(what)
        wanted = f"; it must be {option.range}" if option is not None and option.range is not None else ""
        raise _bad_file(path, f"cannot read the value of {what}: {exc}{wanted}", event.start_mark) from None


def _bad_file(path: Path, message: str, mark: Any = None) -> ConfigError:
    """A config file's content is wrong: one line naming the file, where, and what."""
    where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return ConfigError("config", " ".join(f"{path}{where}: {message}".split())[:500])


def _shown(value: object) -> str:
    """A value as an error shows it: cut, and never converted whole (``repr`` of an integer of
    4,300 digits and more raises)."""
    if isinstance(value, int) and value.bit_length() > 256:
        return f"an integer of {value.bit_length()} bits"
    shown = _cut(repr(value))
    if isinstance(value, str) and len(shown) < len(repr(value)):
        shown += f" ({len(value)} characters)"
    return shown


def _cut(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _apply(config: ProcessorConfig, values: Mapping[str, Any], source: str) -> ProcessorConfig:
    changes: dict[str, Any] = {}
    for name, value in values.items():
        option = _OPTION_BY_NAME[name]
        try:
            changes[name] = option.parse(str(value)) if value is not None else None
        except _Refused as exc:
            raise ConfigError(name, str(exc), source) from None
        except (TypeError, ValueError):
            raise ConfigError(name, option.refusal(value), source) from None
    return replace(config, **changes)


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """Each ``OTEL_GUARD_PROCESSOR_*`` variable of ``environ`` (in any case) that names no option,
    sorted, with the closest option's variable (or None when none is close): the processor reads
    only its options' variables, so a misspelt one would be silently ignored."""
    known = {option.env for option in OPTIONS}
    candidates = {option.name.upper(): option.env for option in OPTIONS}
    unknown = []
    for variable in sorted(environ):
        upper = variable.upper()
        if variable in known or not upper.startswith(ENV_PREFIX):
            continue
        close = difflib.get_close_matches(upper[len(ENV_PREFIX) :], list(candidates), n=1)
        unknown.append((variable, candidates[close[0]] if close else None))
    return unknown
