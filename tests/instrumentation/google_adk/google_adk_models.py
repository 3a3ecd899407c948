"""Real Google ADK agents driven by an offline model: a small subclass of ADK's ``BaseLlm``.

ADK ships no offline model, so :class:`ScriptedModel` is one: when a request's newest content is a
function response it answers in text from that response; otherwise it calls its tool, while the
:class:`ToolCalls` it shares with the other agents' models has calls left, and then answers without
one. So an unguarded loop still ends. Each model keeps every request it received (what the model saw)
and every function response it was given.

The models keep what each request showed (:class:`Seen`), not the request: a request holds the tools,
and a remote agent's tool holds an HTTP client that cannot be copied.

:func:`agents_as_tools` and :func:`transferring_agents` build planner and budget, two agents that ask
each other (as ``AgentTool``\\ s, or by ``transfer_to_agent``); :func:`run` runs an agent in a fresh
``InMemoryRunner`` and returns its events.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from google.adk.agents import BaseAgent, LlmAgent, RunConfig
from google.adk.events.event import Event
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.adk.tools.agent_tool import AgentTool
from google.genai import types
from pydantic import Field

USER_TURN = "Plan the team offsite"
TOKENS_PER_RESPONSE = 7  # prompt and output tokens each: 14 a response


@dataclass
class Seen:
    """What one request showed the model: its contents (copied), system instruction and tools."""

    contents: list[types.Content]
    system_instruction: str
    tools: list[str]

    @classmethod
    def of(cls, request: LlmRequest) -> Seen:
        instruction = request.config.system_instruction if request.config else None
        return cls(
            [c.model_copy(deep=True) for c in request.contents],
            str(instruction or ""),
            list(request.tools_dict),
        )


@dataclass
class ToolCalls:
    """The tool calls the scripts may still make, in all (shared by the models of one test)."""

    left: int

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True


class ScriptedModel(BaseLlm):
    """Calls ``tool`` (with ``tool_args``) on a user turn while ``tool_calls`` lasts, else answers."""

    model: str = "scripted"
    agent: str
    tool: str = ""
    tool_args: dict[str, Any] = Field(default_factory=lambda: {"request": "what does it cost?"})
    tool_calls: Any = Field(default_factory=lambda: ToolCalls(0))
    parallel: int = 1  # function calls per tool-calling response
    requests: list[Seen] = Field(default_factory=list)
    function_responses: list[types.FunctionResponse] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(Seen.of(llm_request))
        newest = llm_request.contents[-1] if llm_request.contents else None
        returned = (
            [part.function_response for part in (newest.parts or []) if part.function_response]
            if newest
            else []
        )
        if returned:
            self.function_responses.extend(returned)
            said = "; ".join(
                f"{r.name} {'error' if 'error' in (r.response or {}) else 'ok'}" for r in returned
            )
            yield _response(types.Part.from_text(text=f"{self.agent} answers after {said}"))
        elif self.tool and self.tool_calls.take():
            calls = [types.Part.from_function_call(name=self.tool, args=dict(self.tool_args))] * self.parallel
            yield _response(*calls)
        else:
            yield _response(types.Part.from_text(text=f"{self.agent} answers without tools"))

    @property
    def user_texts(self) -> list[list[str]]:
        """The text parts of the newest user message of each request, in order."""
        seen = []
        for request in self.requests:
            users = [
                c
                for c in request.contents
                if c.role == "user" and not any(p.function_response for p in c.parts or [])
            ]
            seen.append([part.text or "" for part in users[-1].parts or []] if users else [])
        return seen

    @property
    def errors(self) -> list[str]:
        """The ``error`` text of each function response it was given that carried one."""
        return [
            str((r.response or {})["error"]) for r in self.function_responses if "error" in (r.response or {})
        ]


class StepsModel(ScriptedModel):
    """Makes the next call of ``steps`` (tool name, arguments) on each request that answers no call,
    and answers in text once they are done; from a function response it answers with the response
    itself (``"{agent} answers after {name}: {response}"``), so what a tool returned reaches the end."""

    steps: list[tuple[str, dict[str, Any]]] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(Seen.of(llm_request))
        newest = llm_request.contents[-1] if llm_request.contents else None
        returned = (
            [p.function_response for p in (newest.parts or []) if p.function_response] if newest else []
        )
        if returned:
            self.function_responses.extend(returned)
            said = "; ".join(f"{r.name}: {r.response}" for r in returned)
            yield _response(types.Part.from_text(text=f"{self.agent} answers after {said}"))
        elif self.steps:
            name, args = self.steps.pop(0)
            yield _response(types.Part.from_function_call(name=name, args=dict(args)))
        else:
            yield _response(types.Part.from_text(text=f"{self.agent} answers without tools"))


def _response(*parts: types.Part) -> LlmResponse:
    usage = types.GenerateContentResponseUsageMetadata(
        prompt_token_count=TOKENS_PER_RESPONSE,
        candidates_token_count=TOKENS_PER_RESPONSE,
        total_token_count=2 * TOKENS_PER_RESPONSE,
    )
    return LlmResponse(content=types.Content(role="model", parts=list(parts)), usage_metadata=usage)


@dataclass
class Pair:
    """Planner and budget, their models, and the tool calls their scripts may make in all."""

    planner: LlmAgent
    budget: LlmAgent
    tool_calls: ToolCalls

    @property
    def planner_model(self) -> ScriptedModel:
        model: ScriptedModel = self.planner.model  # type: ignore[assignment]
        return model

    @property
    def budget_model(self) -> ScriptedModel:
        model: ScriptedModel = self.budget.model  # type: ignore[assignment]
        return model


def agents_as_tools(max_tool_calls: int = 6) -> Pair:
    """Planner has budget as a tool (``AgentTool``), budget has planner: each call asks the other."""
    budget_calls = ToolCalls(max_tool_calls)
    planner = LlmAgent(
        name="planner",
        description="Plans team events.",
        model=ScriptedModel(agent="planner", tool="budget", tool_calls=budget_calls),
    )
    budget = LlmAgent(
        name="budget",
        description="Prices plans.",
        model=ScriptedModel(agent="budget", tool="planner", tool_calls=budget_calls),
    )
    planner.tools.append(AgentTool(budget))
    budget.tools.append(AgentTool(planner))
    return Pair(planner, budget, budget_calls)


def transferring_agents(max_tool_calls: int = 6) -> Pair:
    """Budget is planner's sub-agent; each transfers to the other (``transfer_to_agent``)."""
    tool_calls = ToolCalls(max_tool_calls)
    budget = LlmAgent(
        name="budget",
        description="Prices plans.",
        model=ScriptedModel(
            agent="budget",
            tool="transfer_to_agent",
            tool_args={"agent_name": "planner"},
            tool_calls=tool_calls,
        ),
    )
    planner = LlmAgent(
        name="planner",
        description="Plans team events.",
        model=ScriptedModel(
            agent="planner",
            tool="transfer_to_agent",
            tool_args={"agent_name": "budget"},
            tool_calls=tool_calls,
        ),
        sub_agents=[budget],
    )
    return Pair(planner, budget, tool_calls)


async def run(
    agent: BaseAgent, text: str = USER_TURN, *, run_config: RunConfig | None = None, **runner: Any
) -> list[Event]:
    """Run ``agent`` on one user turn in a fresh ``InMemoryRunner`` (under ``run_config``, if given);
    its events."""
    runner_ = InMemoryRunner(agent=agent, app_name="offsite", **runner)
    session = await runner_.session_service.create_session(app_name="offsite", user_id="user")
    message = types.Content(role="user", parts=[types.Part.from_text(text=text)])
    events = [
        event
        async for event in runner_.run_async(
            user_id="user", session_id=session.id, new_message=message, run_config=run_config
        )
    ]
    await runner_.close()
    return events


def final_text(events: list[Event]) -> str:
    """The text of the last event that has some."""
    texts = [
        "".join(p.text or "" for p in e.content.parts or []) for e in events if e.content and e.content.parts
    ]
    return [text for text in texts if text][-1]
