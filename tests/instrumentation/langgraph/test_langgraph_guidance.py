"""Situational guidance in LangChain agents: a ``create_agent`` agent that can call an agent on its call
path is told so at the start of its user turn, and the messages its model receives show it.

Planner and budget are ``create_agent`` agents with an offline scripted model. Planner calls its tool
``budget``, which runs the budget agent (one hop: ``planner → budget``); budget sees a ``planner``
tool, an agent on its path, calls ``search`` once and answers. Planner, at the top, sees only
``budget``, which is not on its path.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

import langchain.agents
import pytest
import wrapt
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool, StructuredTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import START, MessagesState, StateGraph
from pydantic import Field

import otel_guard
from otel_guard.instrumentation._base import resolve
from otel_guard.instrumentation.langgraph import (
    AGENT_PATCH_TARGETS,
    LangGraphInstrumentor,
    guidance_middleware,
    guided_messages,
)
from otel_guard.instrumentation.langgraph._guidance import tool_docs
from otel_guard.prompt import situational_prefix
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumented = instrumentor_fixture(LangGraphInstrumentor)

QUESTION = "Plan a three-day trip to Lisbon."
ASKED = "What does the Lisbon trip cost?"
BUDGET_SYSTEM = "You price plans."
# What budget, called by planner, is told: the path, and that planner is refused as well.
GUIDANCE = situational_prefix("budget", "", path=["planner", "budget"])


class ScriptedModel(GenericFakeChatModel):
    """LangChain's fake chat model, able to bind tools, recording the messages of every call."""

    calls: list[list[BaseMessage]] = Field(default_factory=list)

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.calls.append(list(messages))
        return super()._generate(messages, *args, **kwargs)

    async def _agenerate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        return self._generate(messages, *args, **kwargs)


def create_agent(*args: Any, **kwargs: Any) -> Any:
    """``create_agent`` as the module has it now: the test module was imported before the fixture
    instrumented (an app under ``opentelemetry-instrument`` imports it after, see the last test)."""
    return langchain.agents.create_agent(*args, **kwargs)


def tool_call(name: str, call_id: str, **args: Any) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id}])


def search(query: str) -> str:
    """Search the web."""
    return f"results for {query}"


class Agents:
    """Planner and budget (see the module docstring), built the way the test asks."""

    def __init__(self, *, planner_tool_name: str = "planner", middleware: Sequence[Any] = ()) -> None:
        self.planner_model = ScriptedModel(
            messages=iter([tool_call("budget", "call_1", question=ASKED), "planner: the plan, priced."])
        )
        self.budget_model = ScriptedModel(
            messages=iter([tool_call("search", "call_2", query="Lisbon hotels"), "budget: 1200 EUR."])
        )
        self.budget_states: list[dict[str, Any]] = []
        self.budget = create_agent(
            self.budget_model,
            [ask_tool(planner_tool_name, lambda: self.planner), StructuredTool.from_function(search)],
            system_prompt=BUDGET_SYSTEM,
            name="budget",
            middleware=middleware,
        )
        self.planner = create_agent(
            self.planner_model, [ask_tool("budget", lambda: self.budget, self.budget_states)], name="planner"
        )


def ask_tool(name: str, agent: Any, states: list[dict[str, Any]] | None = None) -> BaseTool:
    """A tool named ``name`` that asks the agent ``agent()`` (one hop when named like the agent)."""

    def ask(question: str) -> str:
        state = agent().invoke({"messages": [HumanMessage(question)]})
        if states is not None:
            states.append(state)
        return str(state["messages"][-1].content)

    async def aask(question: str) -> str:
        state = await agent().ainvoke({"messages": [HumanMessage(question)]})
        if states is not None:
            states.append(state)
        return str(state["messages"][-1].content)

    return StructuredTool.from_function(
        func=ask, coroutine=aask, name=name, description=f"Ask the {name} agent a question."
    )


def human_turns(calls: list[list[BaseMessage]]) -> list[str]:
    """The content of the human message of every call (each call has exactly one)."""
    turns = []
    for messages in calls:
        (human,) = [m for m in messages if isinstance(m, HumanMessage)]
        assert isinstance(human.content, str)
        turns.append(human.content)
    return turns


def assert_budget_was_guided(agents: Agents) -> None:
    # Both of budget's model calls (before and after its search) lead the user turn with the
    # guidance, once; the system message is budget's own, first, unchanged.
    calls = agents.budget_model.calls
    assert len(calls) == 2
    assert human_turns(calls) == [f"{GUIDANCE}\n\n{ASKED}"] * 2
    for messages in calls:
        assert messages[0] == SystemMessage(BUDGET_SYSTEM)
        assert sum(isinstance(m, SystemMessage) for m in messages) == 1
    assert "planner → budget" in GUIDANCE
    assert "do NOT call `planner`" in GUIDANCE
    # Only the request was changed: budget's state keeps the question as it was asked.
    (state,) = agents.budget_states
    assert state["messages"][0].content == ASKED
    # Planner, at the top, sees no agent of its path among its tools: nothing for it.
    assert human_turns(agents.planner_model.calls) == [QUESTION] * 2


def test_a_create_agent_agent_is_told_at_the_start_of_its_user_turn(instrumented: Any) -> None:
    otel_guard.configure(situational_prompt=True)
    agents = Agents()

    state = agents.planner.invoke({"messages": [HumanMessage(QUESTION)]})

    assert state["messages"][-1].content == "planner: the plan, priced."
    assert_budget_was_guided(agents)


async def test_an_async_create_agent_agent_is_told_too(instrumented: Any) -> None:
    otel_guard.configure(situational_prompt=True)
    agents = Agents()

    state = await agents.planner.ainvoke({"messages": [HumanMessage(QUESTION)]})

    assert state["messages"][-1].content == "planner: the plan, priced."
    assert_budget_was_guided(agents)


def test_nothing_is_added_while_the_setting_is_off(instrumented: Any) -> None:
    agents = Agents()  # situational_prompt is off by default
    agents.planner.invoke({"messages": [HumanMessage(QUESTION)]})
    assert human_turns(agents.budget_model.calls) == [ASKED] * 2

    # Switched off after the agents were built: the middleware adds nothing either.
    otel_guard.configure(situational_prompt=True)
    agents = Agents()
    otel_guard.configure(situational_prompt=False)
    agents.planner.invoke({"messages": [HumanMessage(QUESTION)]})
    assert human_turns(agents.budget_model.calls) == [ASKED] * 2


def test_nothing_is_added_when_no_tool_is_named_after_an_agent_on_the_path(instrumented: Any) -> None:
    otel_guard.configure(situational_prompt=True)
    agents = Agents(planner_tool_name="ask_planner")  # runs planner, but is not named after it
    agents.planner.invoke({"messages": [HumanMessage(QUESTION)]})
    assert human_turns(agents.budget_model.calls) == [ASKED] * 2


def test_a_turn_that_carries_the_guidance_already_gets_it_once(instrumented: Any) -> None:
    otel_guard.configure(situational_prompt=True)
    # The app's own guidance middleware beside the instrumentor's: one of them, not two (LangChain
    # refuses two middleware of one name), and the turn carries the guidance once.
    agents = Agents(middleware=[guidance_middleware("budget")])
    agents.planner.invoke({"messages": [HumanMessage(QUESTION)]})
    assert_budget_was_guided(agents)

    # A human message that already starts with the guidance is left as it is.
    messages: list[BaseMessage] = [HumanMessage(f"{GUIDANCE}\n\n{ASKED}")]
    tools = [ask_tool("planner", lambda: None)]
    with otel_guard.delegate("planner"), otel_guard.delegate("budget"):
        assert guided_messages(messages, tools, agent="budget") == messages


def test_uninstrument_removes_it() -> None:
    otel_guard.configure(situational_prompt=True)
    instrumentor = LangGraphInstrumentor()
    instrumentor.instrument()
    assert all(isinstance(resolve(t), wrapt.FunctionWrapper) for t in AGENT_PATCH_TARGETS)
    try:
        built_while_instrumented = self_caller()
        built_while_instrumented[0].invoke({"messages": [HumanMessage(ASKED)]})
    finally:
        instrumentor.uninstrument()
    # While instrumented: budget, which can see a `budget` tool, was told (its path is itself).
    expected = situational_prefix("budget", "Ask the budget agent a question.", path=["budget"])
    assert human_turns(built_while_instrumented[1].calls) == [f"{expected}\n\n{ASKED}"]

    assert not any(isinstance(resolve(t), wrapt.FunctionWrapper) for t in AGENT_PATCH_TARGETS)
    # The agent built meanwhile keeps its middleware, which does nothing now; a new agent has none.
    for agent, model in (built_while_instrumented, self_caller()):
        model.calls.clear()
        agent.invoke({"messages": [HumanMessage(ASKED)]})
        assert human_turns(model.calls) == [ASKED]


def self_caller() -> tuple[Any, ScriptedModel]:
    """A budget agent that can see a tool of its own name, and its model, which answers at once."""
    model = ScriptedModel(messages=iter(["budget: 1200 EUR."] * 2))
    agent = create_agent(
        model, [ask_tool("budget", lambda: None)], system_prompt=BUDGET_SYSTEM, name="budget"
    )
    return agent, model


def test_an_agent_built_without_the_instrumentor_gets_it_from_guidance_middleware() -> None:
    otel_guard.configure(situational_prompt=True)
    agents = Agents(middleware=[guidance_middleware("budget")])
    # Not instrumented: no hops, so the path is the one the app's own hops make.
    with otel_guard.delegate("planner"):
        agents.planner.invoke({"messages": [HumanMessage(QUESTION)]})
    budget_path = situational_prefix("budget", "", path=["planner", "budget"])
    assert human_turns(agents.budget_model.calls) == [f"{budget_path}\n\n{ASKED}"] * 2


def hand_built_budget(model: ScriptedModel, tools: list[BaseTool]) -> Any:
    """A hand-built graph whose model node wraps its messages with ``guided_messages``."""
    bound = model.bind_tools(tools)

    def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        messages = [SystemMessage(BUDGET_SYSTEM), *guided_messages(state["messages"], tools, agent="budget")]
        return {"messages": [bound.invoke(messages)]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_edge(START, "model")
    return builder.compile(name="budget")


def test_a_hand_built_graph_gets_it_with_guided_messages(instrumented: Any) -> None:
    otel_guard.configure(situational_prompt=True)
    budget_model = ScriptedModel(messages=iter(["budget: 1200 EUR."]))
    budget = hand_built_budget(budget_model, [ask_tool("planner", lambda: None)])
    planner_model = ScriptedModel(messages=iter([tool_call("budget", "call_1", question=ASKED), "planned."]))
    planner = create_agent(planner_model, [ask_tool("budget", lambda: budget)], name="planner")

    planner.invoke({"messages": [HumanMessage(QUESTION)]})

    (messages,) = budget_model.calls
    assert [(type(m), m.content) for m in messages] == [
        (SystemMessage, BUDGET_SYSTEM),
        (HumanMessage, f"{GUIDANCE}\n\n{ASKED}"),
    ]
    # Off, the helper hands the messages back as they are.
    otel_guard.configure(situational_prompt=False)
    plain: list[BaseMessage] = [HumanMessage(ASKED)]
    with otel_guard.delegate("planner"), otel_guard.delegate("budget"):
        assert guided_messages(plain, [ask_tool("planner", lambda: None)]) == plain


def test_a_user_turn_of_content_blocks_gets_a_text_block_first() -> None:
    otel_guard.configure(situational_prompt=True)
    image = {"type": "image", "url": "https://example.test/lisbon.png"}
    messages: list[BaseMessage] = [
        HumanMessage([{"type": "text", "text": ASKED}, image], id="h1"),
        AIMessage("Which dates?"),
    ]
    with otel_guard.delegate("planner"), otel_guard.delegate("budget"):
        # Without agent=, the agent is the hop in force (budget).
        guided = guided_messages(messages, [ask_tool("planner", lambda: None)])
    assert guided[0].content == [{"type": "text", "text": GUIDANCE}, {"type": "text", "text": ASKED}, image]
    assert guided[0].id == "h1"
    assert guided[1] is messages[1]
    assert messages[0].content == [{"type": "text", "text": ASKED}, image]  # the app's message unchanged


def test_tool_docs_reads_tools_and_tool_dicts() -> None:
    tools: list[Any] = [
        StructuredTool.from_function(search),
        {"type": "function", "function": {"name": "planner", "description": "Plans."}},
        {"name": "budget", "description": "Prices."},
        {"type": "web_search"},  # a provider tool without a name
    ]
    assert tool_docs(tools) == {"search": "Search the web.", "planner": "Plans.", "budget": "Prices."}


def test_create_agent_patch_targets_exist() -> None:
    for target in AGENT_PATCH_TARGETS:
        assert callable(resolve(target))


LAZY_PROGRAM = textwrap.dedent(
    """
    import json, sys
    import wrapt
    import otel_guard
    from otel_guard.instrumentation.langgraph import LangGraphInstrumentor

    otel_guard.configure(situational_prompt=True)
    LangGraphInstrumentor().instrument()
    loaded_before = sorted(m for m in ("langchain", "langchain_core", "langgraph.pregel") if m in sys.modules)
    from langchain.agents import create_agent
    from langchain.agents.factory import create_agent as defined

    print(json.dumps({
        "loaded_before": loaded_before,
        "patched": [isinstance(f, wrapt.FunctionWrapper) for f in (create_agent, defined)],
    }))
    """
)


@pytest.mark.integration
def test_create_agent_is_patched_when_the_app_first_imports_it() -> None:
    """Instrumented before anything of LangChain is imported (as under ``opentelemetry-instrument``),
    the ``create_agent`` the app imports is the patched one."""
    completed = subprocess.run(
        [sys.executable, "-c", LAZY_PROGRAM], capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout) == {"loaded_before": [], "patched": [True, True]}
