"""Agents as services: FastAPI apps on uvicorn (127.0.0.1), each hosting a pydantic-ai agent under
``GuardMiddleware``, calling each other through tools with httpx, requests and aiohttp.

Each agent's model is scripted (pydantic-ai's ``FunctionModel``): it calls its tool once at the start
of a run and answers with the tool's result. Every service runs in this process, each on a uvicorn
thread of its own, so the chain crosses real HTTP between them; the guard's spans go to the suite's
in-memory SDK.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import aiohttp
import httpx
import pytest
import requests
from agents import Agent as OpenAIAgent
from agents import Runner, function_tool, set_tracing_disabled
from agents.items import TResponseOutputItem
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from fastapi import FastAPI
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from pydantic import BaseModel
from pydantic_ai import Agent, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import otel_guard
from otel_guard.asgi import GuardMiddleware
from otel_guard.instrumentation.http import HTTPClientsInstrumentor
from otel_guard.instrumentation.langgraph import LangGraphInstrumentor
from otel_guard.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from otel_guard.instrumentation.pydantic_ai import PydanticAIInstrumentor
from tests.core.asgi_server import serving
from tests.instrumentation.instrumentors import instrumentor_fixture

pytestmark = pytest.mark.integration

CALL_SECONDS = 30.0
DECISION = "otel_guard.decision"

pydantic_ai_guarded = instrumentor_fixture(PydanticAIInstrumentor)
http_guarded = instrumentor_fixture(HTTPClientsInstrumentor)


class Ask(BaseModel):
    question: str


@dataclass
class Service:
    """One agent behind HTTP: what its model read back from its tool, and the statuses it answered."""

    name: str
    url: str = ""
    tool_results: list[tuple[str, str]] = field(default_factory=list)  # (outcome, content)
    chains: list[tuple[str, ...]] = field(default_factory=list)  # the chain in force in its tool


def scripted(service: Service, tool: str | None) -> FunctionModel:
    """A model that calls ``tool`` once at the start of a run, then answers with what came back."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = [part for part in messages[-1].parts if isinstance(part, ToolReturnPart)]
        if returned:
            result = returned[0]
            service.tool_results.append((result.outcome, str(result.content)))
            return ModelResponse(parts=[TextPart(f"{service.name}: {result.content}")])
        if tool is None:
            return ModelResponse(parts=[TextPart(f"{service.name} answers on its own")])
        return ModelResponse(parts=[ToolCallPart(tool, {"question": f"asked by {service.name}"})])

    return FunctionModel(respond)


def chain_now() -> tuple[str, ...]:
    chain = otel_guard.current_chain()
    return () if chain is None else chain.agents


Client = str  # "httpx", "requests" or "aiohttp": how a tool calls the next service


def caller_tool(service: Service, callee: Service, client: Client) -> Tool[Any]:
    """The tool ``ask_<callee>``, which posts the question to the callee's ``/ask`` the usual way:
    ``raise_for_status()`` and read the JSON answer."""
    name = f"ask_{callee.name}"

    async def ask_async(question: str) -> str:
        service.chains.append(chain_now())
        if client == "aiohttp":
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{callee.url}/ask", json={"question": question}) as response,
            ):
                response.raise_for_status()
                return str((await response.json())["answer"])
        async with httpx.AsyncClient(timeout=CALL_SECONDS) as http:
            answer = await http.post(f"{callee.url}/ask", json={"question": question})
            answer.raise_for_status()
            return str(answer.json()["answer"])

    def ask_sync(question: str) -> str:
        service.chains.append(chain_now())
        answer = requests.post(f"{callee.url}/ask", json={"question": question}, timeout=CALL_SECONDS)
        answer.raise_for_status()
        return str(answer.json()["answer"])

    function = ask_sync if client == "requests" else ask_async
    function.__name__ = name
    return Tool(function, name=name)


def service_app(service: Service, agent: Agent[None, str]) -> FastAPI:
    app = FastAPI()

    @app.post("/ask")
    async def ask(body: Ask) -> dict[str, str]:
        return {"answer": (await agent.run(body.question)).output}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    app.add_middleware(GuardMiddleware, agent=service.name)
    return app


@pytest.fixture
def serve_asgi() -> Iterator[Callable[[Any], str]]:
    """Serve an ASGI app on uvicorn in a thread of this process; stopped at teardown."""
    with contextlib.ExitStack() as servers:
        yield lambda app: servers.enter_context(serving(app))


@pytest.fixture
def services(
    pydantic_ai_guarded: PydanticAIInstrumentor, http_guarded: HTTPClientsInstrumentor
) -> Iterator[Callable[..., list[Service]]]:
    """Start services ``names[0] → names[1] → ...`` (each calls the next; ``loop_back`` makes the
    last call the first again) with the given client; stopped at teardown."""
    with contextlib.ExitStack() as running:

        def start(*names: str, client: Client = "httpx", loop_back: bool = False) -> list[Service]:
            started = [Service(name) for name in names]
            callees: list[Service | None] = [*started[1:], started[0] if loop_back else None]
            # Each app needs its callee's URL in its tool: the servers are started last to first,
            # and a loop's last tool reads the first service's URL when it is called.
            for service, callee in reversed(list(zip(started, callees, strict=True))):
                tools = [] if callee is None else [caller_tool(service, callee, client)]
                tool = None if callee is None else f"ask_{callee.name}"
                agent = Agent(scripted(service, tool), name=service.name, tools=tools)
                service.url = running.enter_context(serving(service_app(service, agent)))
            return started

        yield start


def ask(service: Service, question: str = "Plan the offsite") -> httpx.Response:
    return httpx.post(f"{service.url}/ask", json={"question": question}, timeout=CALL_SECONDS)


class OpenHops(SpanProcessor):
    """Counts the guard's hop spans started and not ended yet (their attributes are set at start)."""

    def __init__(self) -> None:
        self.open: set[int] = set()
        self.lock = threading.Lock()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if span.attributes and DECISION in span.attributes:
            with self.lock:
                self.open.add(span.context.span_id)

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None:
            with self.lock:
                self.open.discard(span.context.span_id)


OPEN_HOPS = OpenHops()
cast(TracerProvider, trace.get_tracer_provider()).add_span_processor(OPEN_HOPS)


def hop_spans(spans: Any) -> list[ReadableSpan]:
    """The guard's hop spans, in the order they started, once none is still open: the middleware
    ends its span after the response is sent, so the client may get its answer a moment before."""
    deadline = time.monotonic() + CALL_SECONDS
    while OPEN_HOPS.open and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not OPEN_HOPS.open, "a hop span stayed open"
    return sorted(
        (s for s in spans.all() if s.attributes and DECISION in s.attributes), key=lambda s: s.start_time or 0
    )


def hops(spans: Any) -> list[tuple[str, str, tuple[str, ...]]]:
    return [
        (s.name, str(s.attributes[DECISION]), tuple(s.attributes["otel_guard.chain.agents"]))
        for s in hop_spans(spans)
        if s.attributes is not None
    ]


# -- one service, one agent: one place in the chain ---------------------------------------------


def test_a_service_hosting_its_own_agent_answers_and_is_one_hop(
    spans: Any, services: Callable[..., list[Service]]
) -> None:
    (concierge,) = services("concierge")

    response = ask(concierge)

    assert response.status_code == 200, response.text
    assert response.json() == {"answer": "concierge answers on its own"}
    # The middleware's hop and the agent run of the same name are one call: one span, one place.
    assert hops(spans) == [("invoke_agent concierge", "allow", ("concierge",))]


def test_the_agent_run_joins_the_request_only_directly_inside_it(
    spans: Any, serve_asgi: Callable[[Any], str]
) -> None:
    """Joined once: the agent of the same name once more inside the joined run is a re-entry, refused
    as one, and the refusal escaping the endpoint is answered 409 (not 500)."""
    entered: list[tuple[str, ...]] = []

    @otel_guard.agentic(name="concierge")
    def concierge(again: bool) -> str:
        entered.append(chain_now())
        return concierge(False) if again else "done"

    app = FastAPI()

    @app.post("/ask")
    def answer() -> dict[str, str]:
        return {"answer": concierge(True)}

    app.add_middleware(GuardMiddleware, agent="concierge")
    response = httpx.post(f"{serve_asgi(app)}/ask", timeout=CALL_SECONDS)

    assert entered == [("concierge",)]  # the first run is the request's hop; the second never ran
    assert response.status_code == 409
    assert response.json() == {
        "error": "a2a_delegation_cycle",
        "reason": "cycle",
        "message": "Delegation cycle: agent concierge is already in chain concierge",
        "agent": "concierge",
    }
    assert hops(spans) == [
        ("invoke_agent concierge", "allow", ("concierge",)),
        ("invoke_agent concierge", "refuse", ("concierge", "concierge")),
    ]


def test_an_async_agent_run_joins_the_request_under_its_name_as_the_guard_takes_it(
    spans: Any, serve_asgi: Callable[[Any], str]
) -> None:
    """``@agentic`` on a coroutine joins too, and compares names in the form the guard takes them
    (NFKC: the full-width name is ``concierge``); once joined, the same name inside is a re-entry."""
    entered: list[tuple[str, ...]] = []

    @otel_guard.agentic(name="\uff43oncierge")  # FULLWIDTH LATIN SMALL LETTER C, then "oncierge"
    async def concierge(again: bool) -> str:
        entered.append(chain_now())
        return await concierge(False) if again else "done"

    app = FastAPI()

    @app.post("/ask")
    async def answer() -> dict[str, str]:
        return {"answer": await concierge(True)}

    app.add_middleware(GuardMiddleware, agent="concierge")
    response = httpx.post(f"{serve_asgi(app)}/ask", timeout=CALL_SECONDS)

    assert entered == [("concierge",)]
    assert response.status_code == 409
    assert response.json()["reason"] == "cycle"
    assert hops(spans) == [
        ("invoke_agent concierge", "allow", ("concierge",)),
        ("invoke_agent concierge", "refuse", ("concierge", "concierge")),
    ]


# -- a loop between services: refused, and read by the model -------------------------------------


@pytest.mark.parametrize("client", ["httpx", "requests", "aiohttp"])
def test_a_loop_between_two_services_is_a_tool_error_and_the_user_gets_an_answer(
    spans: Any, services: Callable[..., list[Service]], client: Client
) -> None:
    planner, budget = services("planner", "budget", client=client, loop_back=True)

    response = ask(planner)

    # Budget's call back into Planner was refused (409 from Planner's middleware); the HTTP client
    # raised it in Budget's tool, pydantic-ai handed it to Budget's model as a failed tool result,
    # and both runs answered: the user gets a 200, not a 500.
    assert response.status_code == 200, response.text
    ((outcome, content),) = budget.tool_results
    assert outcome == "failed"
    assert "Refused by otel-guard (a2a_delegation_cycle, reason: cycle)" in content
    assert "agent planner is already in chain planner → ask_budget → budget → ask_planner" in content
    assert planner.tool_results == [("success", f"budget: {content}")]
    # The chain crossed both calls: each service's tool saw the whole path so far.
    assert planner.chains == [("planner", "ask_budget")]
    assert budget.chains == [("planner", "ask_budget", "budget", "ask_planner")]
    assert hops(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool ask_budget", "allow", ("planner", "ask_budget")),
        ("invoke_agent budget", "allow", ("planner", "ask_budget", "budget")),
        ("execute_tool ask_planner", "allow", ("planner", "ask_budget", "budget", "ask_planner")),
        ("invoke_agent planner", "refuse", ("planner", "ask_budget", "budget", "ask_planner", "planner")),
    ]


def test_the_remote_refusal_is_raised_with_the_refusals_own_fields(
    spans: Any, services: Callable[..., list[Service]]
) -> None:
    (planner,) = services("planner")
    otel_guard.configure(cycle_rule="agent")
    with (
        otel_guard.delegate("planner"),
        otel_guard.delegate("ask_budget", kind="tool"),
        pytest.raises(otel_guard.DelegationRefused) as refused,
    ):
        httpx.post(f"{planner.url}/ask", json={"question": "q"}, timeout=CALL_SECONDS)
    err = refused.value
    assert err.remote is True
    assert (err.reason, err.code, err.hop.agent, err.chain) == (
        "cycle",
        "a2a_delegation_cycle",
        "planner",
        None,
    )
    assert str(err) == "Delegation cycle: agent planner is already in chain planner → ask_budget"
    assert planner.tool_results == []  # the app never ran


# -- depth: a healthy pipeline fits the default max_depth ----------------------------------------


def test_a_healthy_four_service_pipeline_is_allowed_with_the_default_depth(
    spans: Any, services: Callable[..., list[Service]]
) -> None:
    concierge, pricing, fx, _tax = services("concierge", "pricing", "fx", "tax")

    response = ask(concierge)

    assert response.status_code == 200, response.text
    assert response.json() == {"answer": "concierge: pricing: fx: tax answers on its own"}
    # Each service is one place and each call one more: 2n - 1 = 7 hops for 4 services (max_depth 8).
    assert fx.chains == [("concierge", "ask_pricing", "pricing", "ask_fx", "fx", "ask_tax")]
    assert max(len(chain) for _, _, chain in hops(spans)) == 7
    assert {decision for _, decision, _ in hops(spans)} == {"allow"}
    assert all(outcome == "success" for s in (concierge, pricing, fx) for outcome, _ in s.tool_results)


# -- health checks: no hop -----------------------------------------------------------------------


def test_excluded_urls_pass_through_as_no_hop(spans: Any, services: Callable[..., list[Service]]) -> None:
    (concierge,) = services("concierge")
    health = f"{concierge.url}/health"
    assert httpx.get(health, timeout=CALL_SECONDS).status_code == 200
    assert [name for name, _, _ in hops(spans)] == ["invoke_agent concierge"]  # a hop without it
    spans.clear()

    otel_guard.configure(excluded_urls="^/health$")
    for _ in range(3):
        assert httpx.get(health, timeout=CALL_SECONDS).json() == {"status": "ok"}
    # A chain that would be refused here arrives with a health check all the same: still no hop.
    with otel_guard.delegate("concierge"), otel_guard.delegate("ask_concierge", kind="tool"):
        assert httpx.get(health, timeout=CALL_SECONDS).status_code == 200
    spans.clear()
    assert hops(spans) == []
    # Every other path is guarded as before.
    assert ask(concierge).status_code == 200
    assert [name for name, _, _ in hops(spans)] == ["invoke_agent concierge"]


# -- a runtime whose run reads the arriving chain itself (LangGraph) ------------------------------

langgraph_guarded = instrumentor_fixture(LangGraphInstrumentor)


def test_a_langgraph_run_joins_the_request_under_fastapis_own_spans(
    spans: Any, serve_asgi: Callable[[Any], str], langgraph_guarded: LangGraphInstrumentor
) -> None:
    """FastAPI's own telemetry puts its endpoint span between the middleware's hop and the graph
    run; LangGraph's adapter takes the chain for one its caller sent and makes a receiving hop, which
    joins the request's hop all the same: one span, one place."""

    def answer(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [AIMessage(f"fx: {otel_guard.current_chain().path()}")]}  # type: ignore[union-attr]

    builder = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    fx = builder.compile(name="fx")
    app = FastAPI()

    @app.post("/ask")
    def ask_fx() -> dict[str, str]:
        state = fx.invoke({"messages": [HumanMessage("a rate")]})
        return {"answer": str(state["messages"][-1].content)}

    app.add_middleware(GuardMiddleware, agent="fx")
    response = httpx.post(f"{serve_asgi(app)}/ask", timeout=CALL_SECONDS)

    assert response.json() == {"answer": "fx: fx"}
    assert hops(spans) == [("invoke_agent fx", "allow", ("fx",))]


# -- the refusal in another runtime's tool (the OpenAI Agents SDK) --------------------------------

openai_agents_guarded = instrumentor_fixture(OpenAIAgentsInstrumentor)


def test_a_refusal_from_another_service_is_an_openai_agents_tool_error(
    spans: Any,
    services: Callable[..., list[Service]],
    serve_asgi: Callable[[Any], str],
    openai_agents_guarded: OpenAIAgentsInstrumentor,
) -> None:
    """planner (pydantic-ai) → budget (the OpenAI Agents SDK) → planner: refused at planner, raised in
    budget's function tool by httpx, and read by budget's model as that tool's output."""
    set_tracing_disabled(True)  # the SDK's own tracing exports to OpenAI: off
    (planner,) = services("planner")
    seen: list[str] = []

    def respond(call: ModelCall) -> list[TResponseOutputItem]:
        last = call.input[-1] if isinstance(call.input, list) else {}
        if last.get("type") == "function_call_output":
            seen.append(str(last["output"]))
            return [assistant_message("budget: priced with what it had")]
        return [function_call("ask_planner", {"question": "the plan?"}, call_id="call_1")]

    @function_tool
    async def ask_planner(question: str) -> str:
        """Ask the planner service for the plan."""
        async with httpx.AsyncClient(timeout=CALL_SECONDS) as http:
            answer = await http.post(f"{planner.url}/ask", json={"question": question})
            answer.raise_for_status()
            return str(answer.json()["answer"])

    budget = OpenAIAgent(name="budget", instructions="Price the plan.", tools=[ask_planner])
    app = FastAPI()

    @app.post("/ask")
    async def ask_budget(body: Ask) -> dict[str, str]:
        script = ScriptedModel([ModelStep.respond(respond), ModelStep.respond(respond)])
        return {"answer": str((await Runner.run(budget.clone(model=script), body.question)).final_output)}

    app.add_middleware(GuardMiddleware, agent="budget")
    budget_url = serve_asgi(app)

    # The planner's own tool is replaced by a call from this test, inside the planner's hop.
    with otel_guard.delegate("planner"), otel_guard.delegate("ask_budget", kind="tool"):
        response = httpx.post(f"{budget_url}/ask", json={"question": "price it"}, timeout=CALL_SECONDS)

    assert response.status_code == 200, response.text
    assert response.json() == {"answer": "budget: priced with what it had"}
    (output,) = seen
    assert "a2a_delegation_cycle" in output
    assert "agent planner is already in chain planner → ask_budget → budget → ask_planner" in output
    assert planner.tool_results == []  # the planner's app never ran for the bounce
