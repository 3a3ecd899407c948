"""Run a generator or an iterator one step at a time inside a context it never leaks.

A hop around a stream (a generator decorated with ``@agentic``, a LangGraph stream, an A2A stream)
cannot be a ``with`` block inside a generator: the block would attach the hop's context at the first
step and keep it attached in the *consumer's* context between steps, and a generator closed from
elsewhere (early ``break``, garbage collection) would detach it in the wrong context. So the context
is attached around each step only and detached in that same step, as ``contextvars`` require;
between steps the consumer runs in its own context.

:func:`generator_in_context` and :func:`async_generator_in_context` turn ``make`` (anything that
returns an iterable, or an async iterable) into a generator function that behaves like ``make``
with every step run inside a context:

- ``enter()`` runs at the first step (a generator does nothing until it is iterated) and returns the
  context and a ``done(exc)`` callback; for :func:`async_generator_in_context` it is a coroutine
  function (:data:`AsyncEnter`), awaited there, so a hop that waits for its budget store (Redis)
  never blocks the event loop. If ``enter`` raises (a refused hop), nothing else runs.
- ``make(*args, **kwargs)`` is called with the context attached, so what it builds (headers to
  inject, tasks it starts) sees it. If it raises, ``done(exc)`` is called and the error re-raised.
- Every step (``next``/``send``/``throw``, or ``anext``/``asend``/``athrow``) runs with the context
  attached. Values sent and exceptions thrown by the consumer are forwarded when the inner object
  supports ``send``/``throw``. A plain iterator cannot take them: a thrown exception closes it and is
  re-raised, and a value sent into it closes it and raises :class:`TypeError`.
- When the consumer stops early (``close``/``aclose``, ``break``, garbage collection) the inner
  object's ``close``/``aclose`` runs inside the context, so its cleanup code sees it.
- ``done(exc)`` is called exactly once, when the steps end: ``None`` when they ran out or were
  closed, the exception when they failed (or closing them failed). A generator's return value is
  passed on.
- ``moved`` (optional) is asked after each step until it returns a context; the steps after that
  run in the context it returned (a hop whose span started during a step, under a span the step
  made).

Example::

    def enter() -> tuple[Context, Done]:
        hop = delegate("planner")
        return hop.start(), hop.finish

    for chunk in generator_in_context(enter, graph.stream)(inputs):
        ...

    async def aenter() -> tuple[Context, Done]:
        hop = delegate("planner")
        return await hop.astart(), hop.finish

    async for chunk in async_generator_in_context(aenter, graph.astream)(inputs):
        ...
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Generator, Iterable
from typing import Any, NoReturn, ParamSpec, TypeVar

from opentelemetry.context import Context, attach, detach

P = ParamSpec("P")
Y = TypeVar("Y")

Done = Callable[[BaseException | None], object]
"""Called once when the steps end: with ``None``, or with the exception they ended with."""

Enter = Callable[[], tuple[Context, Done]]
"""Called at the first step: the context to run every step in, and what to call when they end."""

AsyncEnter = Callable[[], Awaitable[tuple[Context, Done]]]
""":data:`Enter` for an async generator: awaited at the first step, in the consumer's task."""

Moved = Callable[[], Context | None]
"""Asked after a step: the context the next steps run in, or ``None`` to keep the one they have."""


def generator_in_context(
    enter: Enter, make: Callable[P, Iterable[Y]], moved: Moved | None = None
) -> Callable[P, Generator[Y, Any, Any]]:
    """A generator function running ``make(*args, **kwargs)``'s steps in the context ``enter()`` gives."""

    def steps(*args: P.args, **kwargs: P.kwargs) -> Generator[Y, Any, Any]:
        ctx, done = enter()
        token = attach(ctx)
        try:
            inner = iter(make(*args, **kwargs))
        except BaseException as exc:
            done(exc)
            raise
        finally:
            detach(token)
        next_step = inner.__next__
        step: Callable[[], Y] = next_step
        asking = moved
        while True:
            token = attach(ctx)
            try:
                item = step()
            except StopIteration as stop:
                done(None)
                return stop.value
            except BaseException as exc:
                done(exc)
                raise
            finally:
                detach(token)
            if asking is not None and (new_context := asking()) is not None:
                ctx, asking = new_context, None
            try:
                sent = yield item
            except GeneratorExit:
                _close_in(ctx, inner, done)
                raise
            except BaseException as exc:
                step = functools.partial(_thrower(inner), exc)
            else:
                # The common case (iteration) sends None: no allocation on that path.
                step = next_step if sent is None else functools.partial(_sender(inner), sent)

    return steps


def async_generator_in_context(
    enter: AsyncEnter, make: Callable[P, AsyncIterable[Y]], moved: Moved | None = None
) -> Callable[P, AsyncGenerator[Y, Any]]:
    """The ``async`` form of :func:`generator_in_context`: ``await enter()`` at the first step."""

    async def steps(*args: P.args, **kwargs: P.kwargs) -> AsyncGenerator[Y, Any]:
        ctx, done = await enter()
        token = attach(ctx)
        try:
            inner = aiter(make(*args, **kwargs))
        except BaseException as exc:
            done(exc)
            raise
        finally:
            detach(token)
        next_step = inner.__anext__
        step: Callable[[], Awaitable[Y]] = next_step
        asking = moved
        while True:
            token = attach(ctx)
            try:
                item = await step()
            except StopAsyncIteration:
                done(None)
                return
            except BaseException as exc:
                done(exc)
                raise
            finally:
                detach(token)
            if asking is not None and (new_context := asking()) is not None:
                ctx, asking = new_context, None
            try:
                sent = yield item
            except GeneratorExit:
                await _aclose_in(ctx, inner, done)
                raise
            except BaseException as exc:
                step = functools.partial(_athrower(inner), exc)
            else:
                step = next_step if sent is None else functools.partial(_asender(inner), sent)

    return steps


# -- forwarding to the inner object, or what a plain iterator does instead -----------------------


def _thrower(inner: object) -> Callable[[BaseException], Any]:
    throw: Callable[[BaseException], Any] | None = getattr(inner, "throw", None)
    return throw if throw is not None else functools.partial(_close_then_raise, inner)


def _sender(inner: object) -> Callable[[Any], Any]:
    send: Callable[[Any], Any] | None = getattr(inner, "send", None)
    return send if send is not None else functools.partial(_refuse_value, inner)


def _close_then_raise(inner: object, exc: BaseException) -> NoReturn:
    close: Callable[[], object] | None = getattr(inner, "close", None)
    if close is not None:
        close()
    raise exc


def _refuse_value(inner: object, value: object) -> NoReturn:
    _close_then_raise(inner, _value_refused(inner, value))


def _close_in(ctx: Context, inner: object, done: Done) -> None:
    """Close ``inner`` inside ``ctx`` (its cleanup code sees the context), then call ``done``."""
    token = attach(ctx)
    try:
        close: Callable[[], object] | None = getattr(inner, "close", None)
        if close is not None:
            close()
    except BaseException as exc:
        done(exc)
        raise
    else:
        done(None)
    finally:
        detach(token)


def _athrower(inner: object) -> Callable[[BaseException], Awaitable[Any]]:
    athrow: Callable[[BaseException], Awaitable[Any]] | None = getattr(inner, "athrow", None)
    return athrow if athrow is not None else functools.partial(_aclose_then_raise, inner)


def _asender(inner: object) -> Callable[[Any], Awaitable[Any]]:
    asend: Callable[[Any], Awaitable[Any]] | None = getattr(inner, "asend", None)
    return asend if asend is not None else functools.partial(_arefuse_value, inner)


async def _aclose_then_raise(inner: object, exc: BaseException) -> NoReturn:
    aclose: Callable[[], Awaitable[object]] | None = getattr(inner, "aclose", None)
    if aclose is not None:
        await aclose()
    raise exc


async def _arefuse_value(inner: object, value: object) -> NoReturn:
    await _aclose_then_raise(inner, _value_refused(inner, value))


async def _aclose_in(ctx: Context, inner: object, done: Done) -> None:
    """The ``async`` form of :func:`_close_in`."""
    token = attach(ctx)
    try:
        aclose: Callable[[], Awaitable[object]] | None = getattr(inner, "aclose", None)
        if aclose is not None:
            await aclose()
    except BaseException as exc:
        done(exc)
        raise
    else:
        done(None)
    finally:
        detach(token)


def _value_refused(inner: object, value: object) -> TypeError:
    return TypeError(
        f"cannot send {value!r} into {type(inner).__name__}, a plain iterator, which takes no "
        "values (send None, or iterate it with next())"
    )
