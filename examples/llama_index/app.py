"""Planner and budget: two LlamaIndex agents that ask each other, each with a scripted model.

The planner asks the budget agent what the offsite costs; the budget agent asks the planner what the
plan is; the planner asks the budget agent again, and so on. With a real model, that is the loop
that burns money. Each agent's tool runs the other agent (the "agents as tools" pattern of
LlamaIndex's multi-agent docs), so every bounce is a fresh ``run()`` and LlamaIndex's own limit, 20
iterations per run, never meets the loop. Each agent's model is LlamaIndex's offline
``MockFunctionCallingLLM`` with a script: it calls its tool whenever a run starts, and answers in
text once a tool result is back. The scripts stop after ``MAX_TOOL_CALLS`` tool calls, so that the
program ends even when nothing stops the loop.

Without the guard (``python examples/llama_index/app.py``) the agents bounce until the scripts give
up. Under the guard, with no change to this file::

    pip install '.[llama-index]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/llama_index/app.py

the budget agent's call back into the planner is refused (the planner is already on the path); the
budget agent reads the refusal as its tool's error and answers with what it has, and so does the
planner. The guard's spans are printed as JSON when the program ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms import MockFunctionCallingLLM

MAX_TOOL_CALLS = 6  # in all, both agents: where the scripts give up when nothing else stops them
tool_calls = 0


def scripted(agent: str, tool: str) -> Callable[..., ChatMessage]:
    """A model's script: call ``tool`` at the start of each run, then answer with what came back."""

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        global tool_calls
        last = messages[-1]
        if last.role == MessageRole.TOOL:
            name = tool_name_of(messages, last.additional_kwargs.get("tool_call_id"))
            print(f"  {agent} got {name}'s result: {(last.content or '')[:160]}")
            return ChatMessage(role="assistant", content=f"{agent}'s answer, from what {name} said")
        if tool_calls < MAX_TOOL_CALLS:
            tool_calls += 1
            print(f"{agent} calls {tool} (tool call {tool_calls})")
            call = ToolCallBlock(
                tool_call_id=f"call_{tool_calls}",
                tool_name=tool,
                tool_kwargs={"question": f"asked by {agent}"},
            )
            return ChatMessage(role="assistant", blocks=[call])
        print(f"{agent}: the script gives up")
        return ChatMessage(role="assistant", content=f"{agent} gives up")

    return respond


def tool_name_of(messages: Sequence[ChatMessage], tool_call_id: object) -> str:
    """The name of the tool the model called with ``tool_call_id``."""
    for message in messages:
        for block in message.blocks:
            if isinstance(block, ToolCallBlock) and block.tool_call_id == tool_call_id:
                return block.tool_name
    return "a tool"


async def ask_budget(question: str) -> str:
    """Ask the budget agent what the plan costs."""
    return str(await budget().run(user_msg=question))


async def ask_planner(question: str) -> str:
    """Ask the planner agent what the plan is."""
    return str(await planner().run(user_msg=question))


def planner() -> FunctionAgent:
    return FunctionAgent(
        name="planner",
        description="Plans the team offsite.",
        llm=MockFunctionCallingLLM(response_generator=scripted("planner", "ask_budget")),
        tools=[ask_budget],
    )


def budget() -> FunctionAgent:
    return FunctionAgent(
        name="budget",
        description="Prices a plan.",
        llm=MockFunctionCallingLLM(response_generator=scripted("budget", "ask_planner")),
        tools=[ask_planner],
    )


async def main() -> None:
    answer = str(await planner().run(user_msg="Plan the team offsite"))
    print(f"planner's final answer: {answer!r} after {tool_calls} tool calls")


if __name__ == "__main__":
    asyncio.run(main())
