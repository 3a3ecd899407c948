"""A tree's model requests, tokens and cost in the Claude Agent SDK: counted as the CLI reports them.

The CLI makes every model request itself; what the SDK sees is each reply, as an assistant message
(one per content block, all with the reply's ``message.id``; a sub-agent's with the
``parent_tool_use_id`` of the Agent call that started it), and the run's ``result`` message with
the run's ``usage``. As the run's read loop reads them (:mod:`._replies`), each new reply is counted
as one model request of the tree of the agent that made it (the run's, or the sub-agent's hop), and
the result's ``input_tokens + output_tokens`` are the run's tokens.

With ``max_cost`` on, the run is priced when its result arrives, model by model, from the result's
``modelUsage`` (each model's input, output and prompt-cache tokens over the run, its sub-agents'
included; Anthropic's input count leaves the cached tokens out, so they are added for the price).
What a reader would not guess: neither the result's ``total_cost_usd`` nor a model's ``costUSD`` is
read. The CLI computes both from a price table bundled in it (it prices a model it does not know
too), so they are a runtime's estimate, not a charge the provider reported. Nor is a reply's own
``usage``: the CLI passes on the streamed reply's first snapshot (``message_start``: one output token).

A reply is counted after it was made: the guard cannot refuse a request it does not see. The CLI
writes a sub-agent's reply and the ``PreToolUse`` request of a call in it within milliseconds, in
either order: a call waits (a second at most) for its reply to be counted before it is decided. A reply
past ``max_model_requests`` (or ``max_tokens`` spent) spends the run (:mod:`._runs`): every later
tool call of the run and its sub-agents is denied with the refusal and the turn ends, so the tree
ends up at most one request per agent past its budget. The refusal (in observe mode, the
would-refuse) is an event on the span of the hop that made the request.
"""

from __future__ import annotations

from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry.context import Context

from otel_guard.usage import ModelUsage, aafter_model_request, abefore_model_request, model_requests_counted


class CountedRun(Protocol):
    """What the counting needs of a run (:class:`._runs.Run`, which imports this module)."""

    counted: set[str]
    spent: str | None
    context: Context

    def context_of_reply(self, parent_tool_use_id: Any) -> Context: ...


async def count_reply(run: CountedRun, message: dict[str, Any]) -> None:
    """An assistant message read: its reply, if new, counted as a model request of its agent's tree
    (a refusal spends the run)."""
    reply = message.get("message")
    reply_id = reply.get("id") if isinstance(reply, dict) else None
    if not isinstance(reply_id, str) or reply_id in run.counted or not model_requests_counted():
        return
    run.counted.add(reply_id)
    token = otel_context.attach(run.context_of_reply(message.get("parent_tool_use_id")))
    try:
        refused = await abefore_model_request()
    finally:
        otel_context.detach(token)
    if refused is not None and run.spent is None:
        run.spent = refused


async def count_result(run: CountedRun, message: dict[str, Any]) -> None:
    """The run's result read: its tokens counted, and its models priced."""
    usage = message.get("usage")
    if not isinstance(usage, dict) or not model_requests_counted():
        return
    tokens = sum(v for v in (usage.get("input_tokens"), usage.get("output_tokens")) if isinstance(v, int))
    token = otel_context.attach(run.context)
    try:
        # The run's tokens, for max_tokens; priced below, model by model.
        await aafter_model_request(ModelUsage(None, counted_tokens=tokens))
        for used in models_used(message.get("modelUsage")):
            await aafter_model_request(used)
    finally:
        otel_context.detach(token)


def models_used(model_usage: Any) -> list[ModelUsage]:
    """What each model of a run used, from its result's ``modelUsage`` (``{model: {"inputTokens":
    ..., "outputTokens": ..., "cacheReadInputTokens": ..., "cacheCreationInputTokens": ...}}``), for
    its price only (its tokens are the result's ``usage``, counted already)."""
    if not isinstance(model_usage, dict):
        return []
    used = []
    for model, counts in model_usage.items():
        if not isinstance(model, str) or not isinstance(counts, dict):
            continue
        read, written = (
            _count(counts.get("cacheReadInputTokens")),
            _count(counts.get("cacheCreationInputTokens")),
        )
        used.append(
            ModelUsage(
                model,
                _count(counts.get("inputTokens")) + read + written,
                _count(counts.get("outputTokens")),
                read,
                written,
                provider="anthropic",
                counted_tokens=0,
            )
        )
    return used


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
