"""LlamaIndex for ``bench/runtime_overhead.py``: one offline run that makes one tool call.

A ``FunctionAgent`` whose model is LlamaIndex's own offline ``MockFunctionCallingLLM``, scripted to
call the tool ``lookup`` once on the user's turn and then answer with the tool's result. The agent is
built once; each run starts a fresh workflow run (``agent.run(...)``) with a fresh memory, as a
request to a service would. LlamaIndex makes no OpenTelemetry spans of its own here (that takes an
integration), so the guarded arm's spans are the guard's two: the run and the tool call.

Run it with the LlamaIndex environment: ``.venv-runtimes/llama-index/bin/python
bench/runtime_overhead.py --runtime llama-index``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any


def runtime(runtime_class: Any) -> Any:
    # LlamaIndex imports numpy, whose OpenBLAS threads wait by spinning: under callgrind they add
    # instructions that depend on the scheduler, not on the run. One thread: none of them.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
    from llama_index.core.llms import MockFunctionCallingLLM

    from otel_guard.instrumentation.llama_index import LlamaIndexInstrumentor

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        last = messages[-1]
        if last.role == MessageRole.TOOL:
            return ChatMessage(role="assistant", content=f"planner answers: {last.content}")
        call = ToolCallBlock(tool_call_id="call_1", tool_name="lookup", tool_kwargs={"city": "Lisbon"})
        return ChatMessage(role="assistant", blocks=[call])

    def lookup(city: str) -> str:
        """Look up a city."""
        return f"{city}: sunny"

    agent = FunctionAgent(
        name="planner",
        description="Plans trips.",
        llm=MockFunctionCallingLLM(response_generator=respond),
        tools=[lookup],
    )

    async def run() -> str:
        return str(await agent.run(user_msg="Plan a trip to Lisbon."))

    return runtime_class("llama-index", run, LlamaIndexInstrumentor(), lambda out: "sunny" in out)
