"""Carry the context, and with it the delegation chain, into the work handed to a pool.

Work given to ``multiprocessing.Pool``, ``multiprocessing.pool.ThreadPool`` or a
``ProcessPoolExecutor`` (``loop.run_in_executor`` with one included) runs in the context it was handed
over in: a thread pool's in that very context, a process pool's in the context it carried across the
process boundary as W3C context (a carrier dict, as a remote call carries it), extracted in the worker
onto an empty context, where the chain is verified as any arriving chain. Work handed over outside any
context runs in none. (``ThreadPoolExecutor`` is otel_guard/_threads.py's.)

What a reader would not guess: a pool's workers and its own threads are started (and a forked worker
is copied) in an empty context, whatever context the call that starts them runs in. A worker started
lazily inside a hop would otherwise keep that hop's chain under all the work it does later, and every
hop in it would be refused ``expired`` once that chain outlived ``ttl``.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry import baggage, context, propagate
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context

from otel_guard._carriers import context_from_carrier, propagator_reads_baggage
from otel_guard._in_context import call_in
from otel_guard.telemetry import CHAIN_BAGGAGE_KEY

if TYPE_CHECKING:
    from concurrent import futures

_BAGGAGE_ONLY = W3CBaggagePropagator()
_thread_pool: type[Any] = type(None)  # multiprocessing.pool.ThreadPool, from the start of carrying

# The Pool methods that hand work (their first argument, ``func``) to the queue; ``apply`` is not
# one of them: it calls ``apply_async``, and its work would be wrapped twice.
_POOL_METHODS = ("apply_async", "map", "map_async", "starmap", "starmap_async", "imap", "imap_unordered")


def carry_into_pools() -> None:
    """Wrap the pools' constructors and the calls that hand them work (once, from _threads)."""
    global _thread_pool
    import multiprocessing.pool
    from concurrent import futures

    import wrapt

    _thread_pool = multiprocessing.pool.ThreadPool
    pool = multiprocessing.pool.Pool
    wrapt.wrap_function_wrapper(pool, "__init__", _started_empty)
    for name in _POOL_METHODS:
        wrapt.wrap_function_wrapper(pool, name, _pool_work)
    wrapt.wrap_function_wrapper(futures.ProcessPoolExecutor, "submit", _process_submit)


def _started_empty(
    init: Callable[..., None], pool: object, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """``Pool.__init__``: the pool's workers and threads start (forked ones are copied) in no context."""
    if not context.get_current():
        return init(*args, **kwargs)
    return contextvars.Context().run(init, *args, **kwargs)


def _pool_work(
    method: Callable[..., Any], pool: object, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """A ``Pool`` method given work: the work runs in the context it is given in."""
    ctx = context.get_current()
    if not ctx:
        return method(*args, **kwargs)  # the workers' own context is empty: nothing to carry
    work = args[0] if args else kwargs.get("func")
    if work is None:
        return method(*args, **kwargs)  # no work given: the pool's own error
    if isinstance(pool, _thread_pool):
        carried = functools.partial(call_in, ctx, work)
    else:
        carrier = carrier_of(ctx)
        if not carrier:
            return method(*args, **kwargs)
        carried = functools.partial(_call_carried, carrier, work)
    if args:
        return method(carried, *args[1:], **kwargs)
    return method(*args, **{**kwargs, "func": carried})


def _process_submit(
    submit: Callable[..., futures.Future[Any]],
    executor: futures.ProcessPoolExecutor,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> futures.Future[Any]:
    """``ProcessPoolExecutor.submit`` (``map`` submits each chunk): the call runs in the context
    carried from here; the processes and the thread it may start begin in no context."""
    ctx = context.get_current()
    if not ctx or not args:
        return submit(*args, **kwargs)
    carrier = carrier_of(ctx)
    fn = functools.partial(_call_carried, carrier, args[0]) if carrier else args[0]
    return contextvars.Context().run(submit, fn, *args[1:], **kwargs)


# The context last made into a carrier, the propagator that made it, and the carrier: work handed over
# in a loop, or an executor's map (a submit per chunk), comes from one context.
_last_carrier: tuple[Context | None, object, dict[str, str]] = (None, None, {})


def carrier_of(ctx: Context) -> dict[str, str]:
    """``ctx`` as W3C context: the global propagator's fields, and the chain's baggage member even
    where ``OTEL_PROPAGATORS`` leaves baggage out (a loop through the pool would go unseen).

    The carrier is only read (pickled) afterwards: the one made last is handed out again for the
    same context.
    """
    global _last_carrier
    textmap = propagate.get_global_textmap()
    known, made_by, carrier = _last_carrier
    if known is ctx and made_by is textmap:
        return carrier
    carrier = {}
    propagate.inject(carrier, context=ctx)
    if not propagator_reads_baggage():
        chain = baggage.get_baggage(CHAIN_BAGGAGE_KEY, ctx)
        if chain is not None:
            _BAGGAGE_ONLY.inject(carrier, context=baggage.set_baggage(CHAIN_BAGGAGE_KEY, chain, Context()))
    _last_carrier = (ctx, textmap, carrier)
    return carrier


def context_from(carrier: dict[str, str]) -> Context:
    """The context a carrier from :func:`carrier_of` holds, extracted onto an empty one."""
    return context_from_carrier(carrier, Context())


# The carrier last extracted in this worker and its context: a map's calls come with one carrier each.
_last: tuple[dict[str, str] | None, Context] = (None, Context())


def _call_carried(carrier: dict[str, str], fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """In the worker process: run ``fn`` in the context ``carrier`` holds."""
    global _last
    known, ctx = _last
    if known != carrier:
        ctx = context_from(carrier)
        _last = (carrier, ctx)
    token = context.attach(ctx)
    try:
        return fn(*args, **kwargs)
    finally:
        context.detach(token)
