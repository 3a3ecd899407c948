"""Planner and budget, two Agent Framework agents that ask each other through tools, on scripted models.

:class:`ScriptedClient` is a chat client built the way Agent Framework's own test suite builds its
``MockBaseChatClient``: ``BaseChatClient`` under the function-invocation, chat-middleware and telemetry
layers, with ``_inner_get_response`` as the model. It decides each response from what it receives, as
a real model reacts to its input:

- a fresh user turn: call the configured tool, while the shared :class:`CallBudget` lasts; after
  that, answer in text;
- a tool result (a refusal included): answer in text, naming the result, so the model "reads" it
  and answers;
- the result of its own handoff, when a handoff workflow hands the conversation back to it: a fresh
  turn (it calls its tool again), so two agents handing off to each other ping-pong.

:class:`StepsClient` plays a script instead, one step a request (a tool call or an answer), as the
OpenAI Agents SDK's ``ScriptedModel`` does: the shape of a runtime's own example, step by step.

:func:`build_loop` makes the "tool that runs an agent" pattern: each agent has a ``@tool`` that runs the
other agent and returns its answer. Left alone, planner and budget bounce until the budget of tool
calls runs out.

:class:`Handoffs` is the same two agents in one ``HandoffBuilder`` workflow, handing off to each other.

Run as a program (``opentelemetry-instrument python agent_framework_loop.py``), it runs the planner
once (with ``handoffs``: the handoff workflow) and prints one line ``RESULT {json}`` of what happened;
settings come from the environment.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_framework import (
    Agent,
    BaseChatClient,
    ChatMiddlewareLayer,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    ContextProvider,
    FunctionInvocationLayer,
    Message,
    ResponseStream,
    WorkflowEvent,
    tool,
)
from agent_framework.observability import ChatTelemetryLayer

_call_ids = itertools.count(1)


class CallBudget:
    """How many tool calls all the models of one loop may still make (so every loop ends)."""

    def __init__(self, calls: int) -> None:
        self.left = calls
        self.made = 0

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        self.made += 1
        return True


@dataclass
class Request:
    """What one model request received."""

    messages: list[tuple[str, list[str]]]  # (role, the text of each text content), oldest first
    tool_names: list[str]
    instructions: str | None

    @property
    def last_role(self) -> str:
        return self.messages[-1][0]


class ScriptedClient(
    FunctionInvocationLayer[Any], ChatMiddlewareLayer[Any], ChatTelemetryLayer[Any], BaseChatClient[Any]
):
    """An agent's model: calls ``tool`` on each new turn, answers from each tool result."""

    OTEL_PROVIDER_NAME = "scripted"

    def __init__(
        self,
        me: str,
        tool: str | None,
        budget: CallBudget,
        *,
        tokens: tuple[int, int] = (10, 5),
        parallel: int = 1,
        tool_input: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.model = f"scripted-{me}"  # the model Agent Framework's chat spans name
        self.me = me
        self.tool = tool
        self.budget = budget
        self.tokens = tokens  # (input, output) reported per response
        self.parallel = parallel  # tool calls per response
        self.tool_input = tool_input
        self.requests: list[Request] = []
        self.tool_results: list[Content] = []

    @property
    def runs(self) -> int:
        """How many runs reached this model (a run's first request ends with the user's turn)."""
        return sum(1 for request in self.requests if request.last_role == "user")

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: dict[str, Any], **kwargs: Any
    ) -> Awaitable[ChatResponse[Any]] | ResponseStream[ChatResponseUpdate, ChatResponse[Any]]:
        tools = options.get("tools") or []
        texts = [(m.role, [c.text or "" for c in m.contents if c.type == "text"]) for m in messages]
        self.requests.append(Request(texts, [t.name for t in tools], options.get("instructions")))
        reply = self._respond(messages, options)
        usage = {"input_token_count": self.tokens[0], "output_token_count": self.tokens[1]}
        if stream:

            async def updates() -> AsyncIterator[ChatResponseUpdate]:
                yield ChatResponseUpdate(role="assistant", contents=reply.contents)
                yield ChatResponseUpdate(
                    role="assistant", contents=[Content.from_usage(usage)], finish_reason="stop"
                )

            return ResponseStream(updates(), finalizer=ChatResponse.from_updates)

        async def response() -> ChatResponse[Any]:
            return ChatResponse(messages=[reply], usage_details=usage, finish_reason="stop")

        return response()

    def _respond(self, messages: Sequence[Message], options: dict[str, Any]) -> Message:
        last = messages[-1]
        returned = [c for c in last.contents if c.type == "function_result" and not handed_off(c)]
        if returned:
            self.tool_results.extend(returned)
            seen = "; ".join(str(result.result) for result in returned)
            return Message(role="assistant", contents=[f"{self.me} answers after {seen}"])
        calls = (
            [self.tool] * self.parallel
            if self.tool is not None and options.get("tool_choice") != "none"
            else []
        )
        calls = [name for name in calls if self.budget.take()]
        if not calls:
            return Message(role="assistant", contents=[f"{self.me} answers without tools"])
        arguments = self.tool_input or {"question": f"from {self.me}"}
        return Message(
            role="assistant",
            contents=[
                Content.from_function_call(f"call_{next(_call_ids)}", name, arguments=arguments)
                for name in calls
            ],
        )


def handed_off(result: Content) -> bool:
    """Whether a function result is a handoff workflow's answer to a handoff call (``{"handoff_to":
    target}``, which ``HandoffBuilder``'s handoff middleware gives): no result a model answers from."""
    try:
        payload = json.loads(str(result.result))
    except ValueError:
        return False
    return isinstance(payload, dict) and "handoff_to" in payload


Step = str | tuple[str, dict[str, Any]]
"""One response of a :class:`StepsClient`: a call ``(tool, arguments)``, or an answer whose
``{result}`` is the text of the function results it received."""


def call(tool: str, **arguments: Any) -> Step:
    return tool, arguments


class StepsClient(ScriptedClient):
    """A model that plays ``steps``, one a request; a request past its script fails the run."""

    def __init__(self, me: str, steps: Sequence[Step]) -> None:
        super().__init__(me, None, CallBudget(0))
        self.steps = list(steps)

    def _respond(self, messages: Sequence[Message], options: dict[str, Any]) -> Message:
        returned = [c for c in messages[-1].contents if c.type == "function_result" and not handed_off(c)]
        self.tool_results.extend(returned)
        if not self.steps:
            raise AssertionError(f"{self.me}'s model was asked once more than its script says")
        step = self.steps.pop(0)
        if isinstance(step, str):
            seen = "; ".join(str(result.result) for result in returned)
            return Message(role="assistant", contents=[step.format(result=seen)])
        name, arguments = step
        return Message(
            role="assistant",
            contents=[Content.from_function_call(f"call_{next(_call_ids)}", name, arguments=arguments)],
        )


@dataclass
class Loop:
    """Planner and budget: each agent's tool runs the other agent."""

    planner_client: ScriptedClient
    budget_client: ScriptedClient
    calls: CallBudget
    tool_bodies: Counter[str] = field(default_factory=Counter)
    agents: dict[str, Agent[Any]] = field(default_factory=dict)

    @property
    def planner(self) -> Agent[Any]:
        return self.agents["planner"]

    @property
    def budget(self) -> Agent[Any]:
        return self.agents["budget"]


def build_loop(
    *, planner_tool: str = "ask_budget", budget_tool: str = "ask_planner", max_tool_calls: int = 6
) -> Loop:
    """Planner and budget, each with a tool (named as given) that runs the other."""
    calls = CallBudget(max_tool_calls)
    loop = Loop(
        ScriptedClient("planner", planner_tool, calls), ScriptedClient("budget", budget_tool, calls), calls
    )

    @tool(name=planner_tool)
    async def ask_budget(question: str) -> str:
        """Ask the budget agent what a plan costs."""
        loop.tool_bodies[planner_tool] += 1
        return (await loop.budget.run(question)).text

    @tool(name=budget_tool)
    async def ask_planner(question: str) -> str:
        """Ask the planner agent what the plan is."""
        loop.tool_bodies[budget_tool] += 1
        return (await loop.planner.run(question)).text

    loop.agents["planner"] = Agent(
        client=loop.planner_client, name="planner", instructions="You plan.", tools=[ask_budget]
    )
    loop.agents["budget"] = Agent(
        client=loop.budget_client, name="budget", instructions="You price plans.", tools=[ask_planner]
    )
    return loop


class Handoffs:
    """Planner and budget in one ``HandoffBuilder`` workflow: each model hands off to the other (or,
    given no tool, answers at once), and hands off again when the conversation comes back to it, until
    the calls run out. Interactive mode (the builder's default): after an answer that hands off to no
    one, the workflow asks the user and its run ends."""

    def __init__(
        self,
        *,
        planner_tool: str | None = "handoff_to_budget",
        budget_tool: str | None = "handoff_to_planner",
        max_tool_calls: int = 6,
        context_provider: bool = False,
        budget_tools: list[Any] | None = None,
        planner_middleware: list[Any] | None = None,
        start: str = "planner",
    ) -> None:
        self.calls = CallBudget(max_tool_calls)
        self.planner_client = ScriptedClient("planner", planner_tool, self.calls)
        self.budget_client = ScriptedClient("budget", budget_tool, self.calls)
        providers = [ContextProvider("app")] if context_provider else None
        planner = Agent(
            client=self.planner_client,
            name="planner",
            instructions="You plan.",
            context_providers=providers,
            middleware=planner_middleware,
            require_per_service_call_history_persistence=True,
        )
        budget = Agent(
            client=self.budget_client,
            name="budget",
            instructions="You price plans.",
            tools=budget_tools,
            require_per_service_call_history_persistence=True,
        )
        from agent_framework_orchestrations import HandoffBuilder  # not needed by the other tests

        self.agents = {"planner": planner, "budget": budget}  # the participants (the workflow clones them)
        self.workflow = (
            HandoffBuilder(participants=[planner, budget]).with_start_agent(self.agents[start]).build()
        )

    async def run(self, text: str, *, streamed: bool = False) -> list[WorkflowEvent[Any]]:
        if streamed:
            return [event async for event in self.workflow.run(text, stream=True)]
        return list(await self.workflow.run(text))


async def run_handoffs() -> dict[str, Any]:
    team = Handoffs()
    events = await team.run("Plan the team offsite")
    return {
        "handoffs": [(e.data.source, e.data.target) for e in events if e.type == "handoff_sent"],
        "tool_calls": team.calls.made,
        "budget_saw": [str(r.result) for r in team.budget_client.tool_results],
        "answers": [e.data.text for e in events if e.type == "output" and e.data.text],
        "asks_the_user": any(e.type == "request_info" for e in events),
    }


def main() -> None:
    if sys.argv[1:] == ["handoffs"]:
        print("RESULT " + json.dumps(asyncio.run(run_handoffs())), flush=True)
        return
    loop = build_loop()
    result = asyncio.run(loop.planner.run("Plan the team offsite"))
    report = {
        "output": result.text,
        "planner_runs": loop.planner_client.runs,
        "budget_runs": loop.budget_client.runs,
        "tool_calls": loop.calls.made,
        "tool_bodies": dict(loop.tool_bodies),
        "budget_saw": [str(r.result) for r in loop.budget_client.tool_results],
    }
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
