"""smolagents for ``bench/runtime_overhead.py``: one offline run that makes one tool call.

A ``ToolCallingAgent`` whose scripted model (a small subclass of ``smolagents.Model``) calls the tool
``lookup`` once on the task, then gives its final answer with the tool's result. Each arm has an agent
of its own, built once and run again each time (``run`` resets its memory): the step callback a guarded
run gives its agent stays on it (smolagents cannot remove one), and the bare arm's agent never has it.
Its logger is silenced (smolagents prints every step at its default verbosity).

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

    model = OneToolModel(model_id="bench")
    instrumentor = SmolagentsInstrumentor()
    agents: dict[bool, Any] = {}  # guarded or not -> the agent that arm runs

    def agent_of_this_arm() -> Any:
        guarded = instrumentor.is_instrumented_by_opentelemetry
        if guarded not in agents:
            agents[guarded] = ToolCallingAgent(
                tools=[lookup], model=model, name="planner", verbosity_level=LogLevel.OFF
            )
        return agents[guarded]

    async def run() -> str:
        return str(agent_of_this_arm().run("Plan a trip to Lisbon."))

    return runtime_class("smolagents", run, instrumentor, lambda out: "sunny" in out)
