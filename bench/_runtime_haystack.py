"""Haystack for ``bench/runtime_overhead.py``: one offline run that makes one tool call.

An ``Agent`` (run in a ``Pipeline`` as ``planner``, so its hop has a name) whose chat generator (a
small ``@component``) calls the tool ``lookup`` once on the task, then answers with the tool's
result. Haystack's telemetry is off (``HAYSTACK_TELEMETRY_ENABLED=False``): nothing leaves the process.

Run it with the Haystack environment: ``.venv-runtimes/haystack/bin/python
bench/runtime_overhead.py --runtime haystack``.
"""

from __future__ import annotations

import os
from typing import Any


def runtime(runtime_class: Any) -> Any:
    os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"
    from haystack import Pipeline, component
    from haystack.components.agents import Agent
    from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
    from haystack.tools import Tool

    from otel_guard.instrumentation.haystack import HaystackInstrumentor

    @component
    class OneToolGenerator:
        """Calls ``lookup`` on the task, answers from the tool's result."""

        @component.output_types(replies=list[ChatMessage])
        def run(self, messages: list[ChatMessage], tools: Any = None) -> dict[str, Any]:
            last = messages[-1]
            if last.is_from(ChatRole.TOOL) and last.tool_call_result is not None:
                return {
                    "replies": [
                        ChatMessage.from_assistant(f"planner answers: {last.tool_call_result.result}")
                    ]
                }
            call = ToolCall("lookup", {"city": "Lisbon"}, id="call_lookup")
            return {"replies": [ChatMessage.from_assistant(None, tool_calls=[call])]}

    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    lookup = Tool(
        name="lookup",
        description="Look up a city.",
        parameters=schema,
        function=lambda city: f"{city}: sunny",
    )
    pipeline = Pipeline()
    pipeline.add_component("planner", Agent(chat_generator=OneToolGenerator(), tools=[lookup]))
    messages = [ChatMessage.from_user("Plan a trip to Lisbon.")]

    async def run() -> str:
        return str(pipeline.run({"planner": {"messages": messages}})["planner"]["last_message"].text)

    return runtime_class("haystack", run, HaystackInstrumentor(), lambda out: "sunny" in out)
