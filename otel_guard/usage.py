"""A tree's model requests, tokens and money: checked before each model request, counted after it.

``max_model_requests``, ``max_tokens`` (docs/spec.md §2) and ``max_cost`` (§9, "Money") bound what one
delegation tree (one chain ``root``) spends on models, over every branch and process. The
instrumentors call these where their runtime makes a model request (the runtime's own hooks: a
pydantic-ai capability, ...):

* :func:`before_model_request` (or :func:`abefore_model_request` in async code) before each request:
  it counts the request, and says why not when the tree has made its ``max_model_requests`` or spent
  its ``max_tokens`` or ``max_cost`` (or, with ``budget_unpriced=refuse``, had a response no price
  covers). The caller then ends the run the way its runtime ends one on its own usage limit. In
  observe mode the request goes on and the hop's span gets a would-refuse event;
* :func:`after_model_request` (:func:`aafter_model_request`) with what the response used: a
  :class:`~otel_guard._pricing.ModelUsage` (model name, tokens, a cost the provider reported), or
  only its tokens (input + output, as the runtime reports them). Its tokens and its price
  (:mod:`otel_guard._pricing`) are added to the tree in one take.

Outside a guarded hop (no chain in the context), in ``off`` mode, or with every model budget off, both
do nothing. A store that cannot answer is counted in ``otel_guard.budget.store_errors``; then
``budget_on_error`` decides whether the request goes on.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from opentelemetry import trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from otel_guard import telemetry as names
from otel_guard._pricing import ModelUsage, spent
from otel_guard.budget import Meter, spend_meters, store_failure, store_for, usage_meters, usage_spent
from otel_guard.chain import Chain
from otel_guard.guard import current_chain
from otel_guard.settings import Settings, current_settings

__all__ = [
    "ModelUsage",
    "aafter_model_request",
    "abefore_model_request",
    "after_model_request",
    "before_model_request",
    "model_requests_counted",
]


def model_requests_counted() -> bool:
    """Whether an instrumentor checks and counts model requests now: a model budget is on and
    instrumentation is not suppressed (the instrumentors ask before each model call)."""
    return current_settings().model_budgets_on and is_instrumentation_enabled()


class _Request(NamedTuple):
    """A model request made in a guarded hop: the settings, the hop's chain and its mode."""

    settings: Settings
    chain: Chain
    observe: bool


def before_model_request() -> str | None:
    """Count a model request against the current tree; the refusal message when it may not be made."""
    request = _request()
    meters = _request_meters(request)
    if request is None or not meters:
        return None
    try:
        taken = store_for(request.settings).take(meters, time.time())
    except Exception as exc:  # the store's failure never becomes the request's
        return _store_failed(request, exc)
    return _verdict(request, meters, taken)


async def abefore_model_request() -> str | None:
    """:func:`before_model_request` for async code (awaits a store with an asyncio API)."""
    request = _request()
    meters = _request_meters(request)
    if request is None or not meters:
        return None
    try:
        taken = await store_for(request.settings).atake(meters, time.time())
    except Exception as exc:  # the store's failure never becomes the request's
        return _store_failed(request, exc)
    return _verdict(request, meters, taken)


def after_model_request(usage: ModelUsage | int) -> None:
    """Add what a model response used (its tokens, and with ``max_cost`` on its price) to the
    current tree; ``usage`` a bare number is its tokens, from a runtime that names no model."""
    spent = _spent(usage)
    if spent is None:
        return
    settings, meters = spent
    try:
        store_for(settings).take(meters, time.time())
    except Exception as exc:  # counted, never raised
        names.count_store_error(exc)


async def aafter_model_request(usage: ModelUsage | int) -> None:
    """:func:`after_model_request` for async code."""
    spent = _spent(usage)
    if spent is None:
        return
    settings, meters = spent
    try:
        await store_for(settings).atake(meters, time.time())
    except Exception as exc:  # counted, never raised
        names.count_store_error(exc)


def _request() -> _Request | None:
    """The request's settings and chain, or ``None`` outside a guarded hop or in ``off`` mode."""
    chain = current_chain()
    if chain is None:
        return None
    settings = current_settings()
    mode = settings.for_agent(chain.hops[-1].agent).mode
    return None if mode == "off" else _Request(settings, chain, mode == "observe")


def _request_meters(request: _Request | None) -> tuple[Meter, ...]:
    if request is None:
        return ()
    chain = request.chain
    return usage_meters(request.settings, chain.root, chain.expires_at, 1)


def _spent(usage: ModelUsage | int) -> tuple[Settings, tuple[Meter, ...]] | None:
    """The settings and the meters that add ``usage`` to the current tree (``None``: nothing to add)."""
    settings = current_settings()
    if not (settings.max_tokens or settings.max_cost):
        return None
    chain = current_chain()
    if chain is None or settings.for_agent(chain.hops[-1].agent).mode == "off":
        return None
    if isinstance(usage, int):
        usage = ModelUsage(None, usage)
    cost = spent(usage, settings) if settings.max_cost else 0
    meters = spend_meters(settings, chain.root, chain.expires_at, usage.tokens, cost)
    return (settings, meters) if meters else None


def _verdict(request: _Request, meters: tuple[Meter, ...], taken: tuple[int, ...] | int) -> str | None:
    if not isinstance(taken, int):
        return None
    meter = meters[taken]
    message = f"{usage_spent(meter, request.chain.root, request.settings)}; the model request is refused"
    return _refused(request, message, meter.budget)


def _store_failed(request: _Request, exc: Exception) -> str | None:
    names.count_store_error(exc)
    if request.settings.budget_on_error == "allow":
        return None
    message = (
        f"Delegation budget: {store_failure(exc)} and budget_on_error is refuse; the model request is refused"
    )
    return _refused(request, message, None)


def _refused(request: _Request, message: str, exhausted: str | None) -> str | None:
    """Record the refusal (or, in observe mode, the would-refuse) on the current hop's span."""
    attributes: dict[str, str] = {names.REASON: "budget", names.EVENT_MESSAGE: message}
    if exhausted is not None:
        attributes[names.BUDGET_EXHAUSTED] = exhausted
    event = names.EVENT_WOULD_REFUSE if request.observe else names.EVENT_REFUSED
    trace.get_current_span().add_event(event, attributes)
    return None if request.observe else message
