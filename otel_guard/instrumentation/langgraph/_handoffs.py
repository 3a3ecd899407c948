"""Handoffs: a tool's ``Command(goto=..., graph=Command.PARENT)`` is a transfer into the node it names.

LangGraph's handoff tools (its docs' ``create_handoff_tool``, langgraph-swarm's and
langgraph-supervisor's) return ``Command(goto=agent, graph=Command.PARENT)``: the graph that runs the
calling agent as a node moves on to the node ``agent``, and the calling agent's run is over. That is
a transfer (docs/spec.md §9), decided where the handoff is made and carried to the run it
starts:

* the tool's call returns the command; the transfer into each node it names is decided then, in the
  calling agent's context (its chain), so a refused handoff is the tool's own error, handed to the
  model, and the command is dropped (the agent stays in charge and answers);
* an allowed transfer waits in the :class:`Handoffs` of the graph run that receives the command (the
  run around the calling agent's graph) until that graph starts the node's run: a named graph run
  there takes the decided hop instead of making a call hop of its own, so its chain is the calling
  agent's chain plus the transfer, and a ping-pong of handoffs grows one chain (stopped by
  ``max_name_depth`` and ``max_depth``), where every node run used to start a chain of its own.

Every graph run, named or not, keeps a :class:`Handoffs` in its steps' context, inside the one of the
run around it. What a reader would not guess: only ``Command.PARENT`` gotos are transfers; a
``Command(goto=...)`` inside one graph moves between its own nodes, which are no agents' runs. A
transfer whose node never starts a named graph run (a plain function node) ends with the graph run
that received it, as a hop that ran nothing.
"""

from __future__ import annotations

from typing import Any, Final

from langgraph.types import Command, Send
from opentelemetry import baggage, context

from otel_guard.guard import Delegation, delegate
from otel_guard.instrumentation.langgraph._waiting import finish

HANDOFFS: Final = context.create_key("otel_guard.langgraph.handoffs")
"""Context key of the :class:`Handoffs` of the graph run whose steps are running."""


class Handoffs:
    """The transfers decided for one graph run's next nodes (node name -> decided hop), and the
    :class:`Handoffs` of the run around it (where a ``Command.PARENT`` of this run's tools goes)."""

    __slots__ = ("_pending", "parent")

    def __init__(self, parent: object) -> None:
        self.parent = parent if type(parent) is Handoffs else None
        self._pending: dict[str, Delegation] = {}

    def offer(self, node: str, hop: Delegation) -> None:
        """``hop``, decided, is the transfer into ``node``'s next run (an older one, never taken, ends)."""
        older = self._pending.pop(node, None)
        self._pending[node] = hop
        if older is not None:
            finish(older)

    def take(self, *nodes: str | None) -> Delegation | None:
        """The transfer waiting for the first of ``nodes`` that has one, now taken; or ``None``."""
        if not self._pending:  # the usual case: no handoff waits
            return None
        for node in nodes:
            if node is not None and (hop := self._pending.pop(node, None)) is not None:
                return hop
        return None

    def close(self, exc: BaseException | None = None) -> None:
        """The graph run ended: end the transfers no node run took (decided, they are recorded)."""
        while self._pending:
            finish(self._pending.popitem()[1])


def in_run(ctx: context.Context) -> tuple[context.Context, Handoffs]:
    """``ctx`` with a new graph run's :class:`Handoffs` (inside the one in force), and that."""
    handoffs = Handoffs(ctx.get(HANDOFFS))
    return context.Context({**ctx, HANDOFFS: handoffs}), handoffs


def _targets(command: Command[Any]) -> list[str]:
    """The nodes a command hands over to: its ``goto`` names and ``Send`` targets."""
    goto = command.goto
    items = goto if isinstance(goto, list | tuple) else [goto]
    nodes = [item.node if isinstance(item, Send) else item for item in items]
    return [node for node in nodes if isinstance(node, str) and node and not node.startswith("__")]


def _receiver(command: object, arrival: context.Context) -> tuple[Handoffs, list[str]] | None:
    """Where a tool's result hands over, and to which nodes; ``None`` when it is no handoff."""
    if not isinstance(command, Command) or command.graph != Command.PARENT:
        return None
    handoffs = arrival.get(HANDOFFS)
    receiver = handoffs.parent if type(handoffs) is Handoffs else None
    targets = _targets(command)
    return (receiver, targets) if receiver is not None and targets else None


def hand_over(result: object, arrival: context.Context) -> None:
    """Decide the transfers a tool's ``result`` asks for, in ``arrival`` (the calling agent's context),
    and leave them for the graph run that receives the command; raises
    :class:`~otel_guard.errors.DelegationRefused` (nothing handed over) when one is refused."""
    found = _receiver(result, arrival)
    if found is None:
        return
    receiver, targets = found
    decided: list[tuple[str, Delegation]] = []
    token = context.attach(arrival)
    try:
        for node in targets:
            hop = delegate(node, transfer=True)
            hop.decide()
            decided.append((node, hop))
    except BaseException:
        for _, hop in decided:
            finish(hop)
        raise
    finally:
        context.detach(token)
    for node, hop in decided:
        receiver.offer(node, hop)


async def ahand_over(result: object, arrival: context.Context) -> None:
    """:func:`hand_over` in async code: each transfer is decided with ``adecide``."""
    found = _receiver(result, arrival)
    if found is None:
        return
    receiver, targets = found
    decided: list[tuple[str, Delegation]] = []
    token = context.attach(arrival)
    try:
        for node in targets:
            hop = delegate(node, transfer=True)
            await hop.adecide()
            decided.append((node, hop))
    except BaseException:
        for _, hop in decided:
            finish(hop)
        raise
    finally:
        context.detach(token)
    for node, hop in decided:
        receiver.offer(node, hop)


def with_chain_of(ctx: context.Context, hop: Delegation) -> context.Context:
    """``ctx`` (the receiving graph's node run: its span, its run) with the baggage of ``hop``, a
    transfer decided in the agent that handed off: the chain the node's run goes on in."""
    decided = hop.context
    if decided is None:
        return ctx
    carried = baggage.clear(ctx)
    for key, value in baggage.get_all(decided).items():
        carried = baggage.set_baggage(key, value, carried)
    return carried
