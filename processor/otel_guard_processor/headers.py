"""``--forward-headers``: the request headers that travel with a request's spans to the downstream.

A multi-tenant back end (Tempo, Mimir, Loki) files what it receives under the tenant a header names
(``x-scope-orgid``) and checks ``authorization``; a processor in front of it passes on the headers
named by ``--forward-headers`` as the gRPC metadata of the downstream call that carries the
request -- gRPC metadata of an OTLP/gRPC request, headers of an OTLP/HTTP one, each value as it
came, a name sent more than once with every value.

What a reader would not guess: the values are credentials. They are never logged, never put in an
error message, and requests are joined into one downstream send only when their forwarded headers
are equal (:mod:`otel_guard_processor.forwarder`), so no request travels under another's tenant.
A value gRPC cannot carry as metadata (other than printable ASCII) is refused with the request:
INVALID_ARGUMENT / 400, naming the header, not its value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

__all__ = ["BadHeader", "Headers", "pick"]

Headers = tuple[tuple[str, str], ...]
"""(name, value) pairs, in the order of ``--forward-headers``, a name's values in their order."""


class BadHeader(ValueError):
    """A forwarded header's value cannot travel as gRPC metadata; the message names the header only."""


def pick(names: Sequence[str], values_of: Callable[[str], Iterable[str | bytes]]) -> Headers:
    """The forwarded headers of one request: for each of ``names``, ``values_of(name)``. Raises
    :class:`BadHeader` for a value that is not printable ASCII."""
    picked: list[tuple[str, str]] = []
    for name in names:
        for value in values_of(name):
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            if not text.isascii() or not text.isprintable():
                raise BadHeader(
                    f"the header {name} has a value gRPC metadata cannot carry (printable ASCII only)"
                )
            picked.append((name, text))
    return tuple(picked)
