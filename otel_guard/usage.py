"""A tree's model requests and tokens: checked before each model request, counted after it.

``max_model_requests`` and ``max_tokens`` (CONTRACT §2) bound what one delegation tree (one chain
``root``) spends on models, over every branch and process. The instrumentors call these where their
runtime makes a model request (the runtime's own hooks: a pydantic-ai capability, ...):

* :func:`before_model_request` (or :func:`abefore_model_request` in async code) before each request:
  it counts the request, and says why not when the tree has made its ``max_model_requests`` or spent
  its ``max_tokens``. The caller then ends the run the way its runtime ends one on its own usage
  limit. In observe mode the request goes on and the hop's span gets a would-refuse event;
* :func:`after_model_request` (:func:`aafter_model_request`) with the tokens the response used
  (input + output, as the runtime reports them).

Outside a guarded hop (no chain in the context), in ``off`` mode, or with both budgets off, both do
nothing. A store that cannot answer is counted in ``otel_guard.budget.store_errors``; then
``budget_on_error`` decides whether the request goes on.
"""

from __future__ import annotations

import time

from opentelemetry import trace

from otel_guard import telemetry as names
from otel_guard.budget import Meter, store_for, tokens_meter, usage_meters, usage_spent
from otel_guard.guard import current_chain
from otel_guard.policy import Settings, current_settings


def before_model_request() -> str | None:
    """Count a model request against the current tree; the refusal message when it may not be made."""
    asked = _asked()
    if asked is None:
        return None
    settings, root, meters = asked
    try:
        taken = store_for(settings).take(meters, time.time())
    except Exception as exc:  # the store's failure never becomes the request's
        return _store_failed(settings, exc)
    return _verdict(settings, root, meters, taken)


async def abefore_model_request() -> str | None:
    """:func:`before_model_request` for async code (awaits a store with an asyncio API)."""
    asked = _asked()
    if asked is None:
        return None
    settings, root, meters = asked
    store = store_for(settings)
    try:
        atake = getattr(store, "atake", None)
        now = time.time()
        taken = await atake(meters, now) if atake is not None else store.take(meters, now)
    except Exception as exc:  # the store's failure never becomes the request's
        return _store_failed(settings, exc)
    return _verdict(settings, root, meters, taken)


def after_model_request(tokens: int) -> None:
    """Add the ``tokens`` a model response used to the current tree (when ``max_tokens`` is on)."""
    meter = _tokens(tokens)
    if meter is None:
        return
    settings, tokens_used = meter
    try:
        store_for(settings).take((tokens_used,), time.time())
    except Exception as exc:  # counted, never raised
        names.current().store_errors.add(1, {names.ERROR_TYPE: type(exc).__qualname__})


async def aafter_model_request(tokens: int) -> None:
    """:func:`after_model_request` for async code."""
    meter = _tokens(tokens)
    if meter is None:
        return
    settings, tokens_used = meter
    store = store_for(settings)
    try:
        atake = getattr(store, "atake", None)
        now = time.time()
        if atake is not None:
            await atake((tokens_used,), now)
        else:
            store.take((tokens_used,), now)
    except Exception as exc:  # counted, never raised
        names.current().store_errors.add(1, {names.ERROR_TYPE: type(exc).__qualname__})


def _asked() -> tuple[Settings, str, tuple[Meter, ...]] | None:
    chain = current_chain()
    if chain is None:
        return None
    settings = current_settings()
    if settings.for_agent(chain.hops[-1].agent).mode == "off":
        return None
    meters = usage_meters(settings, chain.root, chain.expires_at, 1)
    return (settings, chain.root, meters) if meters else None


def _tokens(tokens: int) -> tuple[Settings, Meter] | None:
    if tokens <= 0:
        return None
    settings = current_settings()
    if not settings.max_tokens:
        return None
    chain = current_chain()
    if chain is None:
        return None
    return settings, tokens_meter(settings, chain.root, chain.expires_at, tokens)


def _verdict(
    settings: Settings, root: str, meters: tuple[Meter, ...], taken: tuple[int, ...] | int
) -> str | None:
    if not isinstance(taken, int):
        return None
    meter = meters[taken]
    return _refused(settings, f"{usage_spent(meter, root)}; the model request is refused", meter.budget)


def _store_failed(settings: Settings, exc: Exception) -> str | None:
    names.current().store_errors.add(1, {names.ERROR_TYPE: type(exc).__qualname__})
    if settings.budget_on_error == "allow":
        return None
    message = (
        f"Delegation budget: the budget store could not be reached ({type(exc).__name__}) and "
        "budget_on_error is refuse; the model request is refused"
    )
    return _refused(settings, message, None)


def _refused(settings: Settings, message: str, exhausted: str | None) -> str | None:
    """Record the refusal (or, in observe mode, the would-refuse) on the current hop's span."""
    chain = current_chain()
    observe = chain is not None and settings.for_agent(chain.hops[-1].agent).mode == "observe"
    attributes: dict[str, str] = {names.REASON: "budget", names.EVENT_MESSAGE: message}
    if exhausted is not None:
        attributes[names.BUDGET_EXHAUSTED] = exhausted
    event = names.EVENT_WOULD_REFUSE if observe else names.EVENT_REFUSED
    trace.get_current_span().add_event(event, attributes)
    return None if observe else message
