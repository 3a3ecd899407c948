"""The one pure function that decides a hop, and the checks an arriving chain must pass.

:func:`decide` is a pure function of (chain on arrival, hop, settings, now): no I/O, no environment,
no globals. The rules are those of docs/spec.md §3; the settings come from :mod:`otel_guard.settings`.

The cycle rule looks only at the agents still *waiting* in the chain (:func:`waiting`): an agent
that handed off (a transfer, :class:`~otel_guard.chain.TransferHop`) waits for nothing, so control
coming back to it is no cycle. The depth limits count every place, transfers included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from otel_guard.chain import Chain, Hop, TransferHop, quoted
from otel_guard.settings import Settings

Outcome = Literal["allow", "refuse", "would_refuse"]

INTEGRITY_REASONS: Final = frozenset({"bad_signature", "expired", "foreign_workspace"})
"""Reasons that mean the chain itself cannot be trusted: refused in observe mode too (fail closed)."""

CLOCK_SKEW: Final = 30.0
"""Seconds of clock difference between hosts a chain's times may show (see :func:`integrity`)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :func:`decide` says about one hop."""

    outcome: Outcome
    reason: str | None = None
    message: str = ""


ALLOW: Final = Verdict("allow")


def decide(arrival: Chain | None, hop: Hop, settings: Settings, now: float) -> Verdict:
    """Decide whether ``hop`` may run, given the chain it arrives with.

    Checks, in order: the chain's workspace and lifetime (integrity: refused in observe mode too),
    then the cycle rule, the per-name depth and the chain depth. Observe mode lets those last three
    through, up to ``observe_max_depth`` hops. In ``off`` mode everything is allowed.
    """
    return decide_for_agent(arrival, hop, settings.for_agent(hop.agent), now)


def decide_for_agent(arrival: Chain | None, hop: Hop, settings: Settings, now: float) -> Verdict:
    """:func:`decide`, with ``settings`` already ``for_agent(hop.agent)`` (as the guard holds them)."""
    if settings.mode == "off":
        return ALLOW
    verdict = _check(arrival, hop, settings, now)
    if verdict is None:
        return ALLOW
    reason, message = verdict
    if settings.mode != "observe" or reason in INTEGRITY_REASONS:
        return Verdict("refuse", reason, message)
    if arrival is not None and len(arrival.hops) >= settings.observe_max_depth:
        return Verdict(
            "refuse",
            "observe_ceiling",
            f"Delegation observe ceiling: calling agent {hop.agent} would make chain {arrival.path()} "
            f"{len(arrival.hops) + 1} hops long; observe mode refuses past observe_max_depth "
            f"{settings.observe_max_depth} (enforce mode would have refused it for {reason})",
        )
    return Verdict("would_refuse", reason, message)


def integrity(
    chain: Chain, settings: Settings, now: float, agent: str | None = None
) -> tuple[str, str] | None:
    """Why an arriving chain cannot be trusted here, as (reason, message), or None.

    Its workspace must be this one; it must not have expired, nor claim a lifetime longer than this
    guard's ``ttl``, nor have been issued in the future, each beyond ``CLOCK_SKEW`` seconds of clock
    difference between hosts (every process of a workspace needs the same ``ttl``, as it needs the
    same keys). The guard refuses such a chain in every mode; ``otel-guard inspect`` reports it.
    """
    lifetime = chain.expires_at - chain.issued_at
    if chain.workspace != settings.workspace:
        reason = "foreign_workspace"
        message = (
            f"Delegation chain belongs to workspace {quoted(chain.workspace)}, not {settings.workspace!r}"
        )
    elif now >= chain.expires_at:
        reason = "expired"
        message = (
            f"Delegation chain expired {now - chain.expires_at:.0f} s ago "
            f"(lifetime {lifetime:.0f} s from its first hop)"
        )
    elif lifetime > settings.ttl + CLOCK_SKEW:
        reason = "expired"
        message = (
            f"Delegation chain claims a lifetime of {lifetime:.0f} s, longer than the ttl here "
            f"({settings.ttl:.0f} s)"
        )
    elif chain.issued_at > now + CLOCK_SKEW:
        reason = "expired"
        message = (
            f"Delegation chain was issued {chain.issued_at - now:.0f} s in the future "
            f"(more than the {CLOCK_SKEW:.0f} s of clock skew allowed)"
        )
    else:
        return None  # the common case: no message is built
    if agent is not None:
        message += f"; agent {agent} refused in chain {chain.path() or '(empty)'}"
    return reason, message


def waiting(hops: tuple[Hop, ...], hop: Hop) -> tuple[Hop, ...]:
    """The places of ``hops`` whose agents still wait for an answer when ``hop`` arrives.

    In a chain ``h0 … hn`` arriving at a new hop ``h``, the agent of place i is waiting unless place
    i+1 is a transfer (it handed off), and the agent of the last place is waiting unless ``h``
    itself is a transfer. A chain of calls only (every chain before transfers existed) waits
    whole: ``waiting(hops, call) is hops``.
    """
    following = (*hops[1:], hop)
    if type(hop) is Hop and all(type(h) is Hop for h in following):
        return hops
    return tuple([h for h, after in zip(hops, following, strict=True) if type(after) is not TransferHop])


def _check(arrival: Chain | None, hop: Hop, settings: Settings, now: float) -> tuple[str, str] | None:
    if arrival is None:
        return None  # a first hop: nothing to repeat, depth 1
    problem = integrity(arrival, settings, now, hop.agent)
    if problem is not None:
        return problem
    hops = arrival.hops
    # Every place counts for the name depth; only waiting ones for the cycle rule (see waiting()).
    standing = [h[0] for h in hops].count(hop.agent)
    if standing and settings.cycle_rule != "none":
        waits = waiting(hops, hop)
        if settings.cycle_rule == "agent" and hop.agent in [h[0] for h in waits]:
            return "cycle", f"Delegation cycle: agent {hop.agent} is already in chain {arrival.path()}"
        if settings.cycle_rule == "agent_skill" and hop in waits:
            skill = f" with skill {hop.skill}" if hop.skill is not None else ""
            return "cycle", f"Delegation cycle: agent {hop.agent}{skill} is already in chain {arrival.path()}"
    if standing >= settings.max_name_depth:
        return (
            "name_depth",
            f"Delegation name depth: agent {hop.agent} already stands {standing} times in chain "
            f"{arrival.path()}; the limit (max_name_depth) is {settings.max_name_depth} "
            "- possible runaway recursion",
        )
    if len(hops) >= settings.max_depth:
        return (
            "depth",
            f"Delegation depth: calling agent {hop.agent} would make chain {arrival.path()} "
            f"{len(hops) + 1} hops long; the limit (max_depth) is {settings.max_depth}",
        )
    return None
