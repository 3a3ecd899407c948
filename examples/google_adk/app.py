"""Planner and budget: two Google ADK agents that ask each other, each with a scripted model.

The planner asks the budget agent what the offsite costs; the budget agent asks the planner what the
plan is; the planner asks the budget agent again, and so on. With a real model, that is the loop
that burns money. Here each agent's model is scripted (a small subclass of ADK's ``BaseLlm``, no
keys, no network): it calls its tool whenever a run starts, and answers in text once a function
response is back. The agents call each other as tools (ADK's ``AgentTool``). The scripts stop after
``MAX_TOOL_CALLS`` tool calls, so that the program ends even when nothing stops the loop.

Without the guard (``python examples/google_adk/app.py``) the agents bounce until the scripts give
up. Under the guard, with no change to this file::

    pip install '.[google-adk]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/google_adk/app.py

the budget agent's call back into the planner is refused (the planner is already on the path); the
budget agent reads the refusal as its tool's error and answers with what it has, and so does the
planner. The spans, the guard's and ADK's own, are printed as JSON when the program ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.adk.tools.agent_tool import AgentTool
from google.genai import types

MAX_TOOL_CALLS = 6  # in all, both agents: where the scripts give up when nothing else stops them
tool_calls = 0


class Scripted(BaseLlm):
    """A model that calls ``tool`` at the start of each run, then answers with what came back."""

    model: str = "scripted"
    agent: str
    tool: str

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        global tool_calls
        newest = llm_request.contents[-1].parts or []
        returned = [part.function_response for part in newest if part.function_response]
        if returned and returned[0].name:
            result = returned[0].response or {}
            outcome = "error" if "error" in result else "success"
            said = str(result.get("error", result.get("result", "")))
            print(f"  {self.agent} got {returned[0].name}'s {outcome} result: {said[:160]}")
            yield reply(
                types.Part.from_text(text=f"{self.agent}'s answer, from what {returned[0].name} said")
            )
        elif tool_calls < MAX_TOOL_CALLS:
            tool_calls += 1
            print(f"{self.agent} calls {self.tool} (tool call {tool_calls})")
            yield reply(
                types.Part.from_function_call(name=self.tool, args={"request": f"asked by {self.agent}"})
            )
        else:
            print(f"{self.agent}: the script gives up")
            yield reply(types.Part.from_text(text=f"{self.agent} gives up"))


def reply(part: types.Part) -> LlmResponse:
    usage = types.GenerateContentResponseUsageMetadata(prompt_token_count=10, candidates_token_count=5)
    return LlmResponse(content=types.Content(role="model", parts=[part]), usage_metadata=usage)


planner = LlmAgent(
    name="planner", description="Plans the offsite.", model=Scripted(agent="planner", tool="budget")
)
budget = LlmAgent(
    name="budget", description="Prices the plan.", model=Scripted(agent="budget", tool="planner")
)
planner.tools.append(AgentTool(budget))  # the agents call each other as tools
budget.tools.append(AgentTool(planner))


async def main() -> None:
    runner = InMemoryRunner(agent=planner, app_name="offsite")
    session = await runner.session_service.create_session(app_name="offsite", user_id="team")
    message = types.Content(role="user", parts=[types.Part.from_text(text="Plan the team offsite")])
    answer = ""
    async for event in runner.run_async(user_id="team", session_id=session.id, new_message=message):
        if event.is_final_response() and event.content and event.content.parts:
            answer = "".join(part.text or "" for part in event.content.parts)
    await runner.close()
    print(f"planner's final answer: {answer!r} after {tool_calls} tool calls")


if __name__ == "__main__":
    asyncio.run(main())
