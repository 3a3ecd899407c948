"""The processor's compiled engine, as the rest of the package imports it.

The engine is a Rust extension (``otel_guard_processor._engine``, built by maturin from
processor/src/); this module names what it offers and, where it was never built (a source tree on
``sys.path``), fails on import saying how to build it rather than with a bare missing-module error.
Its calls take a whole request's bytes: no Python runs per span.

- :func:`decode_counts` ``(request, keys)``: the spans, links and asked-for attributes a request
  holds.
- :func:`decode_summary` ``(request, keys)``: what the engine reads of a request as Python values
  (scopes, then spans with their ids, name, kind, start time, scope, links and the attributes of
  ``keys``), for tests and benchmarks.
- :class:`DecodeError` (a ``ValueError``): the bytes are not a readable OTLP
  ExportTraceServiceRequest; the message says at which byte, in which message, and why.
- :class:`EngineFault` (a ``RuntimeError``): the engine failed, a bug, never the input's fault
  (a Rust panic, caught before it reaches Python); the request is to be refused, nothing else.
"""

from __future__ import annotations

try:
    from otel_guard_processor._engine import DecodeError, EngineFault, decode_counts, decode_summary
except ImportError as exc:
    raise ImportError(
        f"otel_guard_processor's compiled engine is not built ({exc}); from a checkout, build it with "
        "pip install -e ./processor (it needs a Rust toolchain: https://rustup.rs)"
    ) from exc

__all__ = ["DecodeError", "EngineFault", "decode_counts", "decode_summary"]
