"""smolagents for ``bench/runtime_overhead.py``: one offline run that makes one tool call.

A ``ToolCallingAgent`` whose scripted model (a small subclass of ``smolagents.Model``) calls the tool
``lookup`` once on the task, then gives its final answer with the tool's result. The agent is built
once and run again each time (``run`` resets its memory); its logger is silenced (smolagents prints
every step at its default verbosity). Unguarded means the instrumentor's patches are off; the step
callback the guarded arm gave the agent stays and does nothing in the bare arm.

Run it with the smolagents environment: ``.venv-runtimes/smolagents/bin/python
bench/runtime_overhead.py --runtime smolagents``.
"""

from __future__ import annotations

from typing import Any


def runtime(runtime_class: Any) -> Any:
    from smolagents import ChatMessage, LogLevel, MessageRole, Model, ToolCallingAgent, tool
    from smolagents.models import ChatMessageToolCall, ChatMessageToolCallFunction

    from otel_guard.instrumentation.smolagents import SmolagentsInstrumentor

    def call(name: str, arguments: dict[str, Any]) -> ChatMessage:
        function = ChatMessageToolCallFunction(name=name, arguments=arguments)
        tool_call = ChatMessageToolCall(id=f"call_{name}", type="function", function=function)
        return ChatMessage(role=MessageRole.ASSISTANT, content="", tool_calls=[tool_call])

    class OneToolModel(Model):
        """Calls ``lookup`` on the task, answers from the tool's observation."""

        def generate(self, messages: list[Any], **kwargs: Any) -> ChatMessage:
            last = messages[-1]
            if last.role == MessageRole.TOOL_RESPONSE:
                text = "".join(block.get("text", "") for block in last.content or [])
                return call("final_answer", {"answer": f"planner answers: {text}"})
            return call("lookup", {"city": "Lisbon"})

    @tool
    def lookup(city: str) -> str:
        """Look up a city.

        Args:
            city: the city
        """
        return f"{city}: sunny"

    agent = ToolCallingAgent(
        tools=[lookup], model=OneToolModel(model_id="bench"), name="planner", verbosity_level=LogLevel.OFF
    )

    async def run() -> str:
        return str(agent.run("Plan a trip to Lisbon."))

    return runtime_class("smolagents", run, SmolagentsInstrumentor(), lambda out: "sunny" in out)
