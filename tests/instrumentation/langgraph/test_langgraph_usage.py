"""A tree's model requests and tokens in LangGraph / LangChain (issue 11).

Planner (a graph) has the tool ``budget`` that runs the budget graph; budget answers on its own. The
tree's model requests: planner's tool call, budget's answer, planner's answer: three, in two graphs.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.outputs import ChatResult
from langgraph.errors import GraphRecursionError
from langgraph_app import Script, ScriptedToolModel, agent_graph, agent_tool

import otel_guard
from otel_guard.instrumentation.langgraph import LangGraphInstrumentor
from otel_guard.instrumentation.langgraph._usage import TreeBudgetExceeded
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumented = instrumentor_fixture(LangGraphInstrumentor)
TOKENS_A_RESPONSE = 15


class BilledModel(ScriptedToolModel):
    """A scripted model whose every reply reports usage, as a real model's does."""

    def _generate(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        result = super()._generate(messages, stop, run_manager, **kwargs)
        message = result.generations[0].message
        assert isinstance(message, AIMessage)
        message.usage_metadata = {"input_tokens": 10, "output_tokens": 5, "total_tokens": TOKENS_A_RESPONSE}
        return result


def tree(model: type[ScriptedToolModel] = ScriptedToolModel) -> tuple[Any, Script]:
    script = Script(max_tool_calls=1)  # planner calls budget once; budget answers on its own
    graphs: dict[str, Any] = {}
    graphs["budget"] = agent_graph("budget", model(agent="budget", script=script), [])
    tool = agent_tool("budget", lambda: graphs["budget"])
    graphs["planner"] = agent_graph("planner", model(agent="planner", script=script), [tool])
    return graphs["planner"], script


def question() -> dict[str, Any]:
    return {"messages": [HumanMessage("plan the offsite")]}


@pytest.mark.parametrize("use_async", [False, True], ids=["invoke", "ainvoke"])
async def test_a_tree_that_made_its_model_requests_ends_the_run_as_langgraph_ends_one(
    instrumented: LangGraphInstrumentor, spans: Any, use_async: bool
) -> None:
    otel_guard.configure(max_model_requests=2)
    planner, script = tree()
    with pytest.raises(GraphRecursionError, match=r"has made its 2 model requests") as ended:
        await planner.ainvoke(question()) if use_async else planner.invoke(question())
    assert isinstance(ended.value, TreeBudgetExceeded)
    assert script.runs == {"planner": 1, "budget": 1}  # planner's answer was never asked for
    events = [e for s in spans.all() for e in s.events if e.name == "otel_guard.refused"]
    assert [e.attributes["otel_guard.budget.exhausted"] for e in events] == ["model_requests"]


async def test_with_room_for_them_every_request_is_made(instrumented: LangGraphInstrumentor) -> None:
    otel_guard.configure(max_model_requests=3)
    planner, _script = tree()
    state = planner.invoke(question())
    assert state["messages"][-1].content.startswith("planner answers")


async def test_the_tokens_of_every_response_count(instrumented: LangGraphInstrumentor) -> None:
    otel_guard.configure(max_tokens=2 * TOKENS_A_RESPONSE)
    planner, _script = tree(BilledModel)
    with pytest.raises(TreeBudgetExceeded, match=r"has spent its 30 model tokens \(max_tokens 30\)"):
        await planner.ainvoke(question())
    otel_guard.configure(max_tokens=3 * TOKENS_A_RESPONSE + 1)
    planner, _script = tree(BilledModel)
    state = await planner.ainvoke(question())
    assert state["messages"][-1].content.startswith("planner answers")


async def test_observe_mode_lets_every_request_through(
    instrumented: LangGraphInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=1, mode="observe")
    planner, _script = tree()
    state = planner.invoke(question())
    assert state["messages"][-1].content.startswith("planner answers")
    events = [e.attributes.get("otel_guard.budget.exhausted") for s in spans.all() for e in s.events]
    assert events.count("model_requests") == 2
