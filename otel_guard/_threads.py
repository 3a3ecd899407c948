"""Carry the OpenTelemetry context, and with it the delegation chain, into the threads a hop starts.

A new thread starts with an empty context: a hop handed to one would start a new chain, and a loop
through it would never be refused. From the guard's first start (see :func:`carry_context`),
``threading.Thread.start`` and ``ThreadPoolExecutor.submit`` take the context they are called in
with them: the thread's ``run`` and each submitted call run in it, so a thread or task started
outside any hop runs in an empty one (parallel branches never share a chain). A pool's worker thread
is no branch of the call that happened to start it: it starts in an empty context, and the other
pools (processes included) are otel_guard/_pools.py's.

What a reader would not guess: ``run`` is wrapped on the thread itself when it starts, not on the
class, so a ``Thread`` subclass with a ``run`` of its own (``Timer`` is one) is carried too.
OpenTelemetry's ``ThreadingInstrumentor`` (Strands turns it on) does the same work: on when the guard
starts, this module leaves threads to it; turned on later, its wrappers go around these and its
``uninstrument`` takes off its own. Nothing here is ever undone.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import context
from opentelemetry.context import Context

from otel_guard._in_context import call_in

if TYPE_CHECKING:
    from concurrent import futures

_log = logging.getLogger("otel_guard")

DISABLED_INSTRUMENTATIONS: Final = "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"
"""OpenTelemetry's variable: ``threading`` (or ``*``) in it leaves threads and pools as they are."""

_CONTRIB: Final = "opentelemetry.instrumentation.threading"

_lock = threading.Lock()
_started = False
# Python 3.14's InterpreterPoolExecutor is a ThreadPoolExecutor that pickles what it is given for
# another interpreter: a call wrapped here could not be pickled, so it is left alone.
_interpreter_pool: type[futures.Executor] | None = None


def carry_context() -> None:
    """Start carrying the context into threads and pools, once per process; later calls return at once.

    Called where the guard's settings come into force (the first hop, :func:`~otel_guard.configure`,
    an instrumentor's ``instrument()``), never on import. Does nothing when
    ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` names ``threading`` (or is ``*``) at that moment; leaves
    threads (not pools) to OpenTelemetry's ``ThreadingInstrumentor`` when it already carries the context.
    """
    global _started
    if _started:
        return
    with _lock:
        if not _started:
            _carry()
            _started = True


def _carry() -> None:
    global _interpreter_pool
    if _disabled():
        _log.debug(
            "otel-guard: %s names threading; threads and pools do not carry the context",
            DISABLED_INSTRUMENTATIONS,
        )
        return
    # Imported here, not on import: `import otel_guard` patches nothing and loads no more.
    from otel_guard._pools import carry_into_pools

    carry_into_pools()  # no OpenTelemetry instrumentation carries the context into these
    if _carried_by_threading_instrumentor():
        _log.debug("otel-guard: ThreadingInstrumentor carries the context into threads")
        return
    from concurrent import futures

    import wrapt

    _interpreter_pool = getattr(futures, "InterpreterPoolExecutor", None)
    wrapt.wrap_function_wrapper(threading.Thread, "start", _start)
    wrapt.wrap_function_wrapper(futures.ThreadPoolExecutor, "submit", _submit)


def _disabled() -> bool:
    names = {name.strip() for name in os.environ.get(DISABLED_INSTRUMENTATIONS, "").split(",")}
    return not names.isdisjoint({"threading", "*"})


def _carried_by_threading_instrumentor() -> bool:
    """Whether OpenTelemetry's ``ThreadingInstrumentor`` is imported and instrumented now."""
    instrumentor = getattr(sys.modules.get(_CONTRIB), "ThreadingInstrumentor", None)
    return instrumentor is not None and bool(instrumentor().is_instrumented_by_opentelemetry)


def _start(
    start: Callable[..., None], thread: threading.Thread, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """``Thread.start``: the thread's ``run`` runs in the context ``start`` is called in."""
    own = thread.__dict__.get("run")  # a ``run`` set on the thread itself, put back afterwards
    thread.run = functools.partial(_run_in, context.get_current(), thread.run, thread, own)  # type: ignore[method-assign]
    try:
        start(*args, **kwargs)
    except BaseException:
        _put_back(thread, own)  # not started (started already, or no thread to be had)
        raise


def _run_in(ctx: Context, run: Callable[[], None], thread: threading.Thread, own: object) -> None:
    token = context.attach(ctx)
    try:
        run()
    finally:
        context.detach(token)
        # The thread object often outlives its run (joined, kept): it no longer holds the context.
        _put_back(thread, own)


def _put_back(thread: threading.Thread, own: object) -> None:
    if own is None:
        thread.__dict__.pop("run", None)
    else:
        thread.__dict__["run"] = own


def _submit(
    submit: Callable[..., futures.Future[Any]],
    executor: futures.ThreadPoolExecutor,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> futures.Future[Any]:
    """``ThreadPoolExecutor.submit``: the call runs in the context it was submitted in; a worker
    thread it starts begins in no context (it would otherwise keep this one for all its later work)."""
    pool = _interpreter_pool
    if not args or (pool is not None and isinstance(executor, pool)):
        return submit(*args, **kwargs)
    ctx = context.get_current()
    work = functools.partial(call_in, ctx, args[0])
    if not ctx:
        return submit(work, *args[1:], **kwargs)
    return contextvars.Context().run(submit, work, *args[1:], **kwargs)
