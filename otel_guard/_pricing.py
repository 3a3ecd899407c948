"""The price of one model response, in micro-units of ``cost_currency`` (docs/spec.md, "Money").

In this order: a cost the provider itself reported in its response (an actual charge, such as
OpenRouter's ``usage.cost``; never a runtime's own estimate from a price table); then the ``prices``
file; then genai-prices' bundled table (the ``prices`` extra; USD only). A response none of them
covers is *unpriced*: counted in ``otel_guard.budget.unpriced``, warned of once per model, and with
``budget_unpriced=refuse`` the tree's next request is refused. A priced response that cost anything
is counted in ``otel_guard.budget.spend`` (:func:`spent`).

What a reader would not guess: genai-prices is only ever asked for its *bundled* snapshot. Its
``UpdatePrices`` fetches newer prices over the network; nothing here starts it, so the prices are
those of the installed release, and no model response waits on a download.
"""

from __future__ import annotations

import logging
import threading
from decimal import Decimal, InvalidOperation
from typing import Any, Final, NamedTuple

from otel_guard import telemetry as names
from otel_guard._prices import micros
from otel_guard.settings import Settings

_log = logging.getLogger("otel_guard")

MAX_MODEL_NAME: Final = 256
"""A model name is cut to this many characters in the metric's attribute and the warning."""

UNKNOWN_MODEL: Final = "unknown"
"""``gen_ai.request.model`` of an unpriced response whose runtime reported no model name."""


class ModelUsage(NamedTuple):
    """What one model response used, as the runtime reported it.

    ``input_tokens`` counts every input token, the cached ones included (``cache_read_tokens``,
    ``cache_write_tokens`` are the part read from or written to the provider's prompt cache), as
    OpenAI and genai-prices count them. ``reported_cost`` is a charge the provider itself reported in
    the response, in ``reported_currency``; ``provider`` helps genai-prices find the model.
    """

    model: str | None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reported_cost: Decimal | None = None
    reported_currency: str = "USD"
    provider: str | None = None
    counted_tokens: int | None = None
    """What ``max_tokens`` counts, when it is not ``input_tokens + output_tokens`` (a runtime whose
    own input count leaves the cached tokens out)."""

    @property
    def tokens(self) -> int:
        """Input + output tokens: what ``max_tokens`` counts."""
        counted = self.counted_tokens
        return self.input_tokens + self.output_tokens if counted is None else counted


def reported_cost(value: object) -> Decimal | None:
    """A cost a provider reported (a number or a decimal string), or ``None`` when it is not one."""
    if value is None or isinstance(value, bool):
        return None
    try:
        cost = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None
    return cost if cost.is_finite() and cost >= 0 else None


def charged_in(response: object) -> Decimal | None:
    """The cost an OpenAI-compatible provider reported in a raw response's ``usage`` (OpenRouter's
    ``usage.cost``, an actual charge), read from an object or a mapping; ``None`` when there is none."""
    usage = response.get("usage") if isinstance(response, dict) else getattr(response, "usage", None)
    cost = usage.get("cost") if isinstance(usage, dict) else getattr(usage, "cost", None)
    return reported_cost(cost)


def spent(usage: ModelUsage, settings: Settings) -> int | None:
    """:func:`price`, and a priced response that cost anything counted in ``otel_guard.budget.spend``
    (the cost its tree takes)."""
    cost = price(usage, settings)
    if cost:
        names.count_spend(cost, settings.cost_currency, (usage.model or UNKNOWN_MODEL)[:MAX_MODEL_NAME])
    return cost


def price(usage: ModelUsage, settings: Settings) -> int | None:
    """The micro-units ``usage`` cost, or ``None`` when no price covers it (recorded as unpriced)."""
    if usage.reported_cost is not None and usage.reported_currency == settings.cost_currency:
        return micros(usage.reported_cost)
    if usage.input_tokens <= 0 and usage.output_tokens <= 0:
        return 0  # nothing used: nothing to pay, whatever the model
    model = usage.model
    if model:
        prices = settings.prices
        entry = prices.find(model) if prices is not None else None
        if entry is not None:
            return entry.cost(
                usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_write_tokens
            )
        if settings.cost_currency == "USD":
            cost = _table_price(usage, model)
            if cost is not None:
                return cost
    _unpriced(model)
    return None


_table: Any = None  # genai_prices, once imported; False when it is not installed

_NOT_IN_TABLE: dict[tuple[str, str | None], None] = {}
"""The (model, provider) pairs genai-prices' bundled table has no price for (emptied at 1024): its
failing look-up walks every provider's patterns, 150 k instructions a response of such a model."""


def _table_price(usage: ModelUsage, model: str) -> int | None:
    """The price in genai-prices' bundled table (USD), or ``None`` when it has none (or is absent)."""
    global _table
    if _table is None:
        try:
            import genai_prices
        except ImportError:
            _table = False
        else:
            _table = genai_prices
    if _table is False:
        return None
    providers = (usage.provider, None) if usage.provider else (None,)
    if all((model, provider) in _NOT_IN_TABLE for provider in providers):
        return None
    counted = _table.Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
    )
    for provider in providers:
        if (model, provider) in _NOT_IN_TABLE:
            continue
        try:
            found = _table.calc_price(counted, model, provider_id=provider)
        except LookupError:
            if len(_NOT_IN_TABLE) >= 1024:
                _NOT_IN_TABLE.clear()
            _NOT_IN_TABLE[model, provider] = None
            continue
        return micros(found.total_price)
    return None


_warned: set[str] = set()
_warned_lock = threading.Lock()
_MAX_WARNED: Final = 1024


def _unpriced(model: str | None) -> None:
    """Count an unpriced response, and warn once per model (at most :data:`_MAX_WARNED` names)."""
    name = (model or UNKNOWN_MODEL)[:MAX_MODEL_NAME]
    names.count_unpriced(name)
    with _warned_lock:
        if name in _warned or len(_warned) >= _MAX_WARNED:
            return
        _warned.add(name)
    _log.warning(
        "otel-guard: no price covers model %s (no cost in its response, no entry in prices, none in "
        "genai-prices' table); its responses do not count against max_cost, see "
        "otel_guard.budget.unpriced, or set budget_unpriced=refuse",
        name,
    )


def forget_warnings() -> None:
    """Warn again of every model (for tests)."""
    with _warned_lock:
        _warned.clear()
