"""Swarm handoffs as hops: a handoff is a transfer into the node it hands off to.

A Strands ``Swarm`` gives each node's agent a ``handoff_to_agent`` tool ("Transfer control to another
agent"). The tool only records the target; when the node's run ends, the swarm runs the target node
next, from the swarm's own loop, so nothing in the call stack links the target's run to the node that
chose it. The guard links them:

* the handoff call is a hop ``invoke_agent {target}`` of kind transfer, decided in the handing-off
  node's run (:mod:`._calls`): the chain is then ``… → planner ⇒ budget``. A refused handoff is the
  tool's error result, so the swarm does not take it, the model reads the refusal and answers, and
  the swarm ends with that node;
* an allowed handoff stays open, kept on the swarm invocation (:class:`SwarmRun`, in the
  invocation state Strands passes to every node and tool of one swarm invocation), until the target
  node's agent runs: its run takes the handoff's chain (the target already ends it, so the run adds
  no hop of its own) and the handoff's hop ends with that run.

The node handing off waits for nothing (its run is over once the swarm takes the handoff), so
``budget`` handing back to ``planner`` is no cycle (triage ⇒ faq ⇒ triage runs), but every handoff
is a place in one chain: a ping-pong stops at ``max_name_depth`` / ``max_depth`` (with the defaults,
at the eighth handoff, before the swarm's own ``max_handoffs`` of 20), or at ``max_handoffs`` where a
swarm sets it lower. A handoff to an agent that still waits (one that called, as a tool, whatever
runs this swarm) is a cycle.

The swarm's own hooks (added to every ``Swarm`` as it is built) open the :class:`SwarmRun` when an
invocation starts and end what is left of it (a handoff whose target never ran) when it ends.
"""

from __future__ import annotations

from typing import Any, Final

from opentelemetry import baggage
from opentelemetry.context import Context

from otel_guard.guard import Delegation
from otel_guard.instrumentation.strands._scope import SwarmRun, guarding
from otel_guard.telemetry import CHAIN_BAGGAGE_KEY

HANDOFF_TOOL: Final = "handoff_to_agent"
"""The tool Strands' ``Swarm`` gives every node's agent."""

_RUNS_KEY: Final = "otel_guard.strands.swarm_runs"
"""Where the swarm invocations running on one invocation state keep their :class:`SwarmRun` (by
swarm): nodes of a graph share theirs, so two swarms of one graph may run on the same one."""


def install(swarm: Any) -> None:
    """Add the guard's hooks to a newly built ``Swarm``."""
    from strands.hooks import AfterMultiAgentInvocationEvent, BeforeMultiAgentInvocationEvent, HookOrder

    swarm.add_hook(_swarm_started, BeforeMultiAgentInvocationEvent, order=HookOrder.SDK_FIRST)
    swarm.add_hook(_swarm_ended, AfterMultiAgentInvocationEvent, order=HookOrder.SDK_LAST)


def _runs(state: object) -> dict[int, SwarmRun] | None:
    runs = state.get(_RUNS_KEY) if isinstance(state, dict) else None
    return runs if isinstance(runs, dict) else None


def _swarm_started(event: Any) -> None:
    state = event.invocation_state
    if guarding() and isinstance(state, dict):
        state.setdefault(_RUNS_KEY, {})[id(event.source)] = SwarmRun(event.source)


def _swarm_ended(event: Any) -> None:
    runs = _runs(event.invocation_state)
    run = runs.pop(id(event.source), None) if runs is not None else None
    if run is not None and run.handoff is not None:
        run.handoff.finish()  # the swarm stopped before the target ran
        run.handoff = run.target = None


def handoff_target(tool_use: Any, invocation_state: object, agent: Any) -> tuple[str, SwarmRun] | None:
    """(target agent, swarm run) when ``agent``'s tool call ``tool_use`` is a handoff to another node
    of the swarm the agent runs in."""
    if tool_use.get("name") != HANDOFF_TOOL:
        return None
    tool_input = tool_use.get("input")
    target = tool_input.get("agent_name") if isinstance(tool_input, dict) else None
    runs = _runs(invocation_state)
    if runs is None or not isinstance(target, str):
        return None
    for run in runs.values():
        nodes = run.swarm.nodes
        caller = nodes.get(getattr(agent, "name", None))
        if caller is not None and caller.executor is agent:
            name = getattr(getattr(nodes.get(target), "executor", None), "name", None)
            # A target that is not a node is the tool's own error ("not found"): a plain tool call.
            return (name, run) if isinstance(name, str) and name else None
    return None


def keep_handoff(run: SwarmRun, target: str, hop: Delegation) -> None:
    """Keep an allowed handoff open until ``target`` runs (the newest handoff of a turn wins, as in
    the swarm)."""
    if run.handoff is not None:
        run.handoff.finish()  # replaced: the swarm takes the last handoff only
    run.handoff, run.target = hop, target


def take_handoff(invocation_state: object, agent: Any) -> Delegation | None:
    """The open handoff into ``agent`` whose run is starting, taken off its swarm run."""
    runs = _runs(invocation_state)
    if runs is None:
        return None
    for run in runs.values():
        node = run.swarm.nodes.get(run.target) if run.target is not None else None
        if run.handoff is not None and node is not None and node.executor is agent:
            hop, run.handoff, run.target = run.handoff, None, None
            return hop
    return None


def in_handoff_chain(hop: Delegation, ctx: Context) -> Context:
    """``ctx`` carrying the chain of the handoff ``hop`` (its span and other baggage left as they are)."""
    assert hop.context is not None
    return baggage.set_baggage(CHAIN_BAGGAGE_KEY, baggage.get_baggage(CHAIN_BAGGAGE_KEY, hop.context), ctx)
