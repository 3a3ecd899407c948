"""Google ADK for bench/runtime_overhead.py: one offline run that makes one tool call.

An ``LlmAgent`` whose scripted model (a small ``BaseLlm`` subclass) calls the function tool ``lookup``
once, then answers; each run is one user turn in a new session of an ``InMemoryRunner``. The runner is
made per round, once the arm's instrument state is set (the guard's plugin goes on a runner as it is
made), outside the timing. ADK's own tracing goes to the bench's global tracer provider in both arms.
Run with ``.venv-runtimes/google-adk/bin/python bench/runtime_overhead.py --runtime google-adk``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.genai import types

from otel_guard.instrumentation.google_adk import GoogleADKInstrumentor


class OneToolModel(BaseLlm):
    """Calls ``lookup`` on a user turn, answers from its function response."""

    model: str = "scripted"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        returned = [p.function_response for p in llm_request.contents[-1].parts or [] if p.function_response]
        if returned:
            part = types.Part.from_text(text=f"planner answers: {(returned[0].response or {}).get('result')}")
        else:
            part = types.Part.from_function_call(name="lookup", args={"city": "Lisbon"})
        usage = types.GenerateContentResponseUsageMetadata(prompt_token_count=10, candidates_token_count=5)
        yield LlmResponse(content=types.Content(role="model", parts=[part]), usage_metadata=usage)


def lookup(city: str) -> str:
    """Look up a city."""
    return f"{city}: sunny"


def runtime(runtime_class: Any) -> Any:
    """The bench's ``Runtime`` (its dataclass, passed in) for one ADK run with one tool call."""
    agent = LlmAgent(name="planner", model=OneToolModel(), tools=[lookup])
    runners: list[InMemoryRunner] = []
    message = types.Content(role="user", parts=[types.Part.from_text(text="Plan a trip to Lisbon.")])

    async def open_runner() -> None:
        runners.append(InMemoryRunner(agent=agent, app_name="bench"))

    async def close_runner() -> None:
        await runners.pop().close()

    async def run() -> str:
        runner = runners[-1]
        session = await runner.session_service.create_session(app_name="bench", user_id="user")
        answer = ""
        async for event in runner.run_async(user_id="user", session_id=session.id, new_message=message):
            if event.content and event.content.parts and event.content.parts[0].text:
                answer = event.content.parts[0].text
        return answer

    return runtime_class(
        "google-adk", run, GoogleADKInstrumentor(), lambda out: "sunny" in str(out), open_runner, close_runner
    )
