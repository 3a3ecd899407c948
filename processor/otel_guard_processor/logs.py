"""The processor's log lines: their two formats, and the line each counted loop gets.

:class:`LoopLog` writes one warning per counted cycle -- its kind, its label, the trace and span id of
the span where the name returned, and the chain root (``otel_guard.chain.root``) when the loop's
guard spans name one -- and at most one a label per ``period`` (a minute): a
loop storm counts one cycle per trace, thousands a second under one label. The next line of a
label says how many were left out since its last (``suppressed``), and a label whose period ended
with loops left out gets that line from the service's sweep (:meth:`LoopLog.flush`), so a storm's
tail is reported even when the label never comes back. The line holds nothing read from a span's
attributes: never a prompt, never a token.

Memory: one entry per label logged within the last period, and labels are the cycle series of the
detector, which folds past ``MAX_SERIES`` into one; so at most that many entries.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable
from typing import Any, Final

from otel_guard_processor.bounds import CountedCycle

__all__ = ["FIELDS", "JsonFormatter", "LoopLog", "TextFormatter", "configure_logging"]

_log = logging.getLogger("otel_guard_processor")

FIELDS: Final = "otel_guard"
"""The attribute of a log record (``extra={FIELDS: {...}}``) holding its structured fields."""
LOOP_MESSAGE: Final = "otel-guard processor: loop counted"
LOOP_LOG_SECONDS: Final = 60.0
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(message)s"
_BARE: Final = re.compile(r"[A-Za-z0-9_.-]+")


class TextFormatter(logging.Formatter):
    """The processor's line, ``TEXT_FORMAT``, then a record's fields as ``key=value``; strings are
    quoted and escaped as JSON strings, so no value can break the line or fake another field."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        fields = getattr(record, FIELDS, None)
        if not isinstance(fields, dict):
            return line
        return line + ": " + " ".join(f"{key}={_text_value(value)}" for key, value in fields.items())


def _text_value(value: Any) -> str:
    if isinstance(value, int) or (isinstance(value, str) and _BARE.fullmatch(value)):
        return str(value)  # kinds, ids and counts need no quotes
    return json.dumps(value)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, a
    record's fields, and ``exception`` when there is one. Non-ASCII is escaped: a line is ASCII."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def _utc(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


def configure_logging(level: str, log_format: str) -> None:
    """Log to stderr at ``level``, each line in ``log_format`` (``text`` or ``json``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler])


class LoopLog:
    """One line per counted loop, at most one a label per ``period``; see the module docstring."""

    def __init__(
        self,
        period: float = LOOP_LOG_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = _log,
    ) -> None:
        self.period = period
        self._clock = clock
        self._logger = logger
        # (kind, label) -> [when its last line was written, loops left out since, the latest of them]
        self._labels: dict[tuple[str, str], list[Any]] = {}

    def counted(self, cycle: CountedCycle) -> None:
        """A cycle was counted: its line now, or counted as left out until the label's next."""
        now = self._clock()
        key = (cycle.kind, cycle.cycle)
        entry = self._labels.get(key)
        if entry is None:
            self._labels[key] = [now, 0, None]
            self._write(cycle, 0)
        elif now - entry[0] >= self.period:
            self._write(cycle, entry[1])
            entry[:] = [now, 0, None]
        else:
            entry[1] += 1
            entry[2] = cycle

    def flush(self, everything: bool = False) -> None:
        """Write the line of each label whose period ended with loops left out (the latest of them,
        and how many more), and forget the labels quiet for a period; ``everything``: each label's
        left-out loops now, whatever its period (at stop)."""
        now = self._clock()
        for key, entry in list(self._labels.items()):
            if not everything and now - entry[0] < self.period:
                continue
            if entry[1]:
                self._write(entry[2], entry[1] - 1)
                entry[:] = [now, 0, None]
            else:
                del self._labels[key]

    def __len__(self) -> int:
        return len(self._labels)

    def _write(self, cycle: CountedCycle, suppressed: int) -> None:
        fields = {
            "kind": cycle.kind,
            "cycle": cycle.cycle,
            "trace_id": cycle.trace_id.hex(),
            "span_id": cycle.span_id.hex(),
            "suppressed": suppressed,
        }
        if cycle.chain_root is not None:
            fields["chain_root"] = cycle.chain_root
        self._logger.warning(LOOP_MESSAGE, extra={FIELDS: fields})
