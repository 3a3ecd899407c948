"""The requests the ASGI middleware lets through as no hop: the ``excluded_urls`` setting.

Regular expressions, each searched for (``re.search``) in a request's path, as OpenTelemetry's
``OTEL_PYTHON_*_EXCLUDED_URLS`` are (``opentelemetry.util.http.ExcludeList``): ``health`` excludes
``/health`` and ``/v1/healthz`` alike; ``^/health$`` only the first. The variable's text is split at
commas, so a pattern cannot hold one (write ``{2}`` for ``{2,2}``).

What a reader would not guess: an empty item is dropped, not kept. OpenTelemetry keeps it, and its
alternation then matches every URL (``OTEL_PYTHON_EXCLUDED_URLS="health,"`` excludes everything); a
trailing comma here excludes nothing more.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

__all__ = ["ExcludedUrls"]

_Search = Callable[[str], object]
_NUMBERED_REFERENCE = re.compile(r"\\\d|\(\?\(\d")  # \1, (?(1)...)


class ExcludedUrls:
    """Immutable: the patterns, and :meth:`excludes` to ask about a path (one compiled alternation)."""

    __slots__ = ("_patterns", "_search")

    _patterns: tuple[str, ...]
    _search: _Search | None

    def __init__(self, patterns: Iterable[str] = ()) -> None:
        kept = tuple(pattern.strip() for pattern in patterns if pattern.strip())
        compiled = []
        for pattern in kept:
            try:
                compiled.append(re.compile(pattern))
            except re.error as exc:
                raise ValueError(f"excluded_urls: {pattern!r} is not a regular expression ({exc})") from None
        object.__setattr__(self, "_patterns", kept)
        object.__setattr__(self, "_search", _searcher(compiled))

    @property
    def patterns(self) -> tuple[str, ...]:
        """The patterns, as given (stripped, the empty ones dropped)."""
        return self._patterns

    @classmethod
    def parse(cls, text: str) -> ExcludedUrls:
        """Read ``OTEL_GUARD_EXCLUDED_URLS``: comma-separated patterns (empty items dropped)."""
        return cls(text.split(","))

    def excludes(self, path: str) -> bool:
        """Whether a request for ``path`` is let through as no hop (some pattern is found in it)."""
        search = self._search
        return search is not None and search(path) is not None

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"ExcludedUrls is immutable: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExcludedUrls) and other.patterns == self.patterns

    def __hash__(self) -> int:
        return hash(self.patterns)

    def __repr__(self) -> str:
        return f"ExcludedUrls({list(self.patterns)!r})"

    def __str__(self) -> str:
        """The patterns as ``OTEL_GUARD_EXCLUDED_URLS`` writes them."""
        return ",".join(self.patterns)


def _searcher(compiled: list[re.Pattern[str]]) -> _Search | None:
    """One search for all the patterns: their alternation compiled once, as OpenTelemetry does.

    Patterns that would not mean the same in it are searched one after another instead: a global
    flag such as ``(?i)`` anywhere but at the start (an error), or a pattern after the first that
    refers to its own groups by number (in the alternation its groups are numbered after the earlier
    patterns', and ``\\1`` would name another pattern's group).
    """
    if not compiled:
        return None
    renumbered = any(p.groups and _NUMBERED_REFERENCE.search(p.pattern) for p in compiled[1:])
    if not renumbered:
        try:
            return re.compile("|".join(f"(?:{p.pattern})" for p in compiled)).search
        except re.error:
            pass
    return lambda path: next((m for p in compiled if (m := p.search(path)) is not None), None)
