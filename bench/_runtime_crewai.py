"""CrewAI's run for bench/runtime_overhead.py: an ``Agent`` whose scripted model calls ``lookup`` once.

The model is a small subclass of CrewAI's ``BaseLLM`` speaking native function calling: it asks for
the tool on the user turn and answers from the tool's result. The run is ``Agent.kickoff_async`` (the
bench runs in an event loop), which builds a fresh executor each time, so each arm runs with exactly
the hooks it has. CrewAI's own telemetry and trace collection are off, and its console panels too.

CrewAI hands every event to its handlers in a pool of up to ten threads, and runs parts of a run in
the loop's default executor (``asyncio.to_thread``); how many threads each pool starts, and how
often the handlers' threads take the interpreter from the run's, depends on timing, so runs of the
same arm did not do the same work (Python calls a run varied by up to 30). Here the event handlers
run at once in the thread that emits, and the default executor has one thread: the same work as
before, in the same order, run after run (22,954 Python calls a bare run, 23,485 a guarded one).
Run it with the CrewAI environment's interpreter::

    .venv-runtimes/crewai/bin/python bench/runtime_overhead.py --runtime crewai --rounds 20
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any


class InlineExecutor(Executor):
    """Runs each task at once in the submitting thread (CrewAI's event handlers, for the bench)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # as a pool's worker would: the future holds it
            future.set_exception(exc)
        return future


def runtime(runtime_class: Any) -> Any:
    os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")  # before CrewAI loads: it would send
    os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
    from crewai import Agent
    from crewai.events.event_bus import crewai_event_bus
    from crewai.events.event_listener import event_listener
    from crewai.llms.base_llm import BaseLLM
    from crewai.tools import tool

    from otel_guard.instrumentation.crewai import CrewAIInstrumentor

    event_listener.formatter.verbose = False
    # The handlers inline (see the module docstring): CrewAI's own pool, made first, is replaced.
    crewai_event_bus._ensure_executor_initialized()
    crewai_event_bus._sync_executor.shutdown(wait=True)
    crewai_event_bus._sync_executor = InlineExecutor()

    class OneToolModel(BaseLLM):
        """Calls ``lookup`` on the user turn, answers from a tool result."""

        def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
            last = messages[-1]
            if last["role"] == "tool":
                return f"planner answers: {last['content']}"
            arguments = json.dumps({"city": "Lisbon"})
            return [{"id": "call_1", "function": {"name": "lookup", "arguments": arguments}}]

        def supports_function_calling(self) -> bool:
            return True

        def get_input_tokens_count(self, messages: Any, *args: Any, **kwargs: Any) -> int:
            return len(str(messages)) // 4

    @tool("lookup")
    def lookup(city: str) -> str:
        """Look up a city."""
        return f"{city}: sunny"

    agent = Agent(
        role="planner",
        goal="Plan a trip",
        backstory="Plans trips.",
        llm=OneToolModel(model="scripted"),
        tools=[lookup],
    )

    loops: list[asyncio.AbstractEventLoop] = []

    async def run() -> str:
        loop = asyncio.get_running_loop()
        if loop not in loops:  # the loop the bench runs in: one thread for asyncio.to_thread
            loops.append(loop)
            loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        return str((await agent.kickoff_async("Plan a trip to Lisbon.")).raw)

    built: Any = runtime_class("crewai", run, CrewAIInstrumentor(), lambda out: "sunny" in out)
    return built
