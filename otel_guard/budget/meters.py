"""The meters of a tree (its hops, model requests, tokens and spend) and of the workspace's current window.

Their keys are the wire format of a shared store: ``tree:{workspace}:{root}`` (and ``...:model_requests``,
``...:tokens``, ``...:cost`` in micro-units of ``cost_currency``, ``...:unpriced``),
``workspace:{workspace}:{window}:{index}``; every process of a fleet must make the same.
"""

from __future__ import annotations

from decimal import Decimal

from otel_guard.budget._store import COST, HOPS, MODEL_REQUESTS, TOKENS, WORKSPACE_HOPS, Meter
from otel_guard.policy import CLOCK_SKEW
from otel_guard.settings import Settings


def tree_meter(settings: Settings, root: str, expires_at: float) -> Meter | None:
    """The meter of a tree's hops, or ``None`` when ``max_hops`` is off."""
    if not settings.max_hops:
        return None
    return Meter(f"tree:{settings.workspace}:{root}", settings.max_hops, expires_at + CLOCK_SKEW, HOPS)


def usage_meters(settings: Settings, root: str, expires_at: float, requests: int) -> tuple[Meter, ...]:
    """The meters of a tree's model requests and tokens that are on: ``requests`` (1 before a model
    request, 0 before a hop) is what the request meter adds; the token meter only checks."""
    if not (settings.max_model_requests or settings.max_tokens or settings.max_cost):
        return ()  # none on (the default): every hop's plan asks, so nothing is built
    meters: list[Meter] = []
    expires = expires_at + CLOCK_SKEW
    if settings.max_model_requests:
        key = f"tree:{settings.workspace}:{root}:model_requests"
        meters.append(Meter(key, settings.max_model_requests, expires, MODEL_REQUESTS, requests))
    if settings.max_tokens:
        meters.append(
            Meter(f"tree:{settings.workspace}:{root}:tokens", settings.max_tokens, expires, TOKENS, 0)
        )
    if settings.max_cost:
        tree = f"tree:{settings.workspace}:{root}"
        meters.append(Meter(tree + COST_SUFFIX, _micros(settings.max_cost), expires, COST, 0))
        if settings.budget_unpriced == "refuse":  # refused once one response went unpriced
            meters.append(Meter(tree + UNPRICED_SUFFIX, 1, expires, COST, 0))
    return tuple(meters)


COST_SUFFIX = ":cost"
UNPRICED_SUFFIX = ":unpriced"


def _micros(amount: Decimal, _known: dict[Decimal, int] = {}) -> int:  # noqa: B006  # a cache
    """``max_cost`` in micro-units (an exact whole number: the setting is at most a millionth fine)."""
    micros = _known.get(amount)
    if micros is None:
        if len(_known) > 64:
            _known.clear()
        micros = _known[amount] = int(amount.scaleb(6))
    return micros


def usage_spent(meter: Meter, root: str, settings: Settings) -> str:
    """What a refusal says of a tree whose model requests, tokens or money are spent."""
    if meter.budget == COST:
        if meter.key.endswith(UNPRICED_SUFFIX):
            return (
                f"Delegation budget: tree {root} had a model response that no price covers "
                "(budget_unpriced refuse), so its spend against max_cost is unknown"
            )
        limit = Decimal(meter.limit).scaleb(-6).normalize()
        currency = settings.cost_currency
        return f"Delegation budget: tree {root} has spent its {limit:f} {currency} (max_cost {limit:f})"
    if meter.budget == MODEL_REQUESTS:
        return (
            f"Delegation budget: tree {root} has made its {meter.limit} model requests "
            f"(max_model_requests {meter.limit})"
        )
    return (
        f"Delegation budget: tree {root} has spent its {meter.limit} model tokens (max_tokens {meter.limit})"
    )


def tokens_meter(settings: Settings, root: str, expires_at: float, tokens: int) -> Meter:
    """The meter that adds a model response's ``tokens`` to its tree (no limit: the check is before)."""
    return Meter(f"tree:{settings.workspace}:{root}:tokens", 0, expires_at + CLOCK_SKEW, TOKENS, tokens)


def spend_meters(
    settings: Settings, root: str, expires_at: float, tokens: int, cost: int | None
) -> tuple[Meter, ...]:
    """The meters that add a model response to its tree, in one take (no limit: the check is
    before): its ``tokens`` when ``max_tokens`` is on; with ``max_cost`` on, its ``cost`` in
    micro-units, or, when no price covered it (``cost`` ``None``) and ``budget_unpriced`` is
    ``refuse``, one unpriced response."""
    meters = []
    expires = expires_at + CLOCK_SKEW
    tree = f"tree:{settings.workspace}:{root}"
    if settings.max_tokens and tokens > 0:
        meters.append(Meter(tree + ":tokens", 0, expires, TOKENS, tokens))
    if settings.max_cost:
        if cost is None:
            if settings.budget_unpriced == "refuse":
                meters.append(Meter(tree + UNPRICED_SUFFIX, 0, expires, COST, 1))
        elif cost > 0:
            meters.append(Meter(tree + COST_SUFFIX, 0, expires, COST, cost))
    return tuple(meters)


class _WorkspaceWindows:
    """The meter of the workspace's current window, made once a window (hops ask it every time)."""

    def __init__(self) -> None:
        self._last: tuple[str, float, int, Meter] | None = None  # workspace, window, limit, meter

    def meter(self, settings: Settings, now: float) -> Meter | None:
        limit = settings.workspace_max_hops
        if not limit:
            return None
        window = settings.workspace_window
        index = int(now // window)
        last = self._last
        if last is not None and last[0] == settings.workspace and last[1] == window and last[2] == limit:
            meter = last[3]
            if meter.key.endswith(f":{index}"):
                return meter
        meter = Meter(
            f"workspace:{settings.workspace}:{window:g}:{index}",
            limit,
            (index + 1) * window + CLOCK_SKEW,
            WORKSPACE_HOPS,
        )
        self._last = (settings.workspace, window, limit, meter)
        return meter


workspace_meter = _WorkspaceWindows().meter
