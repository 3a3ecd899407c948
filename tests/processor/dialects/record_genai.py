"""Two agents asking each other, traced by the official OpenTelemetry GenAI instrumentations.

Records the ``corpus/runtimes/`` fixtures of ``opentelemetry-instrumentation-genai-*`` (1.3b0;
smolagents 1.2b0, all on ``opentelemetry-util-genai`` 1.3b0) and of OpenLLMetry's LlamaIndex
instrumentation, with nothing of otel-guard's in the process: the programs of
``record_runtime_telemetry.py`` (planner and budget, each with a tool that runs the other, on the
runtimes' offline models), each in an environment of its own made from the requirements file of
``genai/`` (the instrumentations pin different SDKs)::

    python3 -m venv .venv-dialects-NAME
    .venv-dialects-NAME/bin/pip install -r tests/processor/dialects/genai/requirements-NAME.txt
    .venv-dialects-NAME/bin/python record_genai.py RUNTIME SCENARIO FILE

RUNTIME (its environment NAME): ``openai_agents_genai`` (openai-agents), ``langgraph_genai``
(langchain), ``llama_index_genai`` and ``llama_index_openllmetry`` (llama-index), ``agno_genai``
(agno), ``smolagents_genai`` (smolagents), ``dspy_genai`` (dspy). SCENARIO ``loop`` or ``control``
as in ``record_runtime_telemetry.py``; ``handoff`` (OpenAI Agents and LlamaIndex's official
instrumentation): planner hands off to budget and budget hands back, by the runtime's own handoffs
(the SDK's ``handoffs``, an ``AgentWorkflow``), once each. It prints one line ``RESULT {json}``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from record_runtime_telemetry import (
    RUNTIMES,
    Runners,
    agno_program,
    llama_index_program,
    main,
    smolagents_program,
    tool_calls,
)

SCENARIOS = ("loop", "control", "handoff")


def _only_loops(runtime: str, scenario: str) -> None:
    if scenario == "handoff":
        raise SystemExit(f"{runtime} records no handoff scenario")


def run_openai_agents(scenario: str) -> int:
    sys.path.insert(0, str(RUNTIMES / "openai_agents"))
    from agents import Agent, Runner
    from openai_agents_models import CallBudget, LoopModel, agents_handing_off_to_each_other
    from opentelemetry.instrumentation.genai.openai_agents import OpenAIAgentsInstrumentor

    # Nothing may reach the SDK's default exporter (api.openai.com): the instrumentation's
    # processor is the only one.
    OpenAIAgentsInstrumentor().instrument(disable_openai_trace_export=True)
    if scenario == "handoff":  # planner => budget => planner, then planner answers
        calls = CallBudget(2)
        planner, _ = agents_handing_off_to_each_other(calls)
        Runner.run_sync(planner, "Plan a trip to Lisbon.")
        return int(calls.made)
    calls = CallBudget(tool_calls(scenario))
    planner = Agent(name="planner", instructions="Plan the trip.")
    budget = Agent(name="budget", instructions="Price the plan.")
    planner.model = LoopModel("planner", "ask_budget", calls)
    budget.model = LoopModel("budget", "ask_planner", calls)
    planner.tools = [budget.as_tool("ask_budget", "Ask the budget agent.")]
    budget.tools = [planner.as_tool("ask_planner", "Ask the planner agent.")]
    Runner.run_sync(planner, "Plan a trip to Lisbon.")
    return int(calls.made)


def run_langgraph(scenario: str) -> int:
    """The agents as LangGraph ``StateGraph``\\ s (the program of the existing corpus)."""
    _only_loops("langgraph_genai", scenario)
    return langgraph_program(scenario, create_agent=False)


def run_langchain_agents(scenario: str) -> int:
    """The agents made by LangChain's ``create_agent`` (a graph the instrumentation knows)."""
    _only_loops("langchain_agent_genai", scenario)
    return langgraph_program(scenario, create_agent=True)


def langgraph_program(scenario: str, create_agent: bool) -> int:
    sys.path.insert(0, str(RUNTIMES / "langgraph"))
    from opentelemetry.instrumentation.genai.langchain import LangChainInstrumentor

    LangChainInstrumentor().instrument()
    from langchain.agents import create_agent as make_agent
    from langchain_core.messages import HumanMessage
    from langgraph_app import Script, agent_graph, delegation_loop

    def build(name: str, model: Any, tools: Any) -> Any:
        return make_agent(model, tools, name=name) if create_agent else agent_graph(name, model, tools)

    script = Script(max_tool_calls=tool_calls(scenario))
    graphs = delegation_loop(
        script, tool_names={"budget": "ask_budget", "planner": "ask_planner"}, build=build
    )
    graphs["planner"].invoke({"messages": [HumanMessage("Plan a three-day trip to Lisbon.")]})
    return script.tool_calls


def run_llama_index(scenario: str) -> int:
    from opentelemetry.instrumentation.genai.llama_index import LlamaIndexInstrumentor

    LlamaIndexInstrumentor().instrument()
    if scenario != "handoff":
        return llama_index_program(scenario)
    sys.path.insert(0, str(RUNTIMES / "llama_index"))
    from llama_index_loop import build_handoffs

    handoffs = build_handoffs(max_tool_calls=2)  # planner => budget => planner, then planner answers

    async def run() -> None:
        await handoffs.workflow.run(user_msg="Plan the team offsite")

    asyncio.run(run())
    return handoffs.calls.made


def run_llama_index_openllmetry(scenario: str) -> int:
    _only_loops("llama_index_openllmetry", scenario)
    os.environ["TRACELOOP_METRICS_ENABLED"] = "false"
    from opentelemetry.instrumentation.llamaindex import LlamaIndexInstrumentor

    LlamaIndexInstrumentor().instrument()
    return llama_index_program(scenario)


def run_agno(scenario: str) -> int:
    _only_loops("agno_genai", scenario)
    from opentelemetry.instrumentation.genai.agno import AgnoInstrumentor

    AgnoInstrumentor().instrument()
    return agno_program(scenario)


def run_smolagents(scenario: str) -> int:
    _only_loops("smolagents_genai", scenario)
    from opentelemetry.instrumentation.genai.smolagents import SmolagentsInstrumentor

    SmolagentsInstrumentor().instrument()
    return smolagents_program(scenario)


def run_dspy(scenario: str) -> int:
    _only_loops("dspy_genai", scenario)
    from opentelemetry.instrumentation.genai.dspy import DSPyInstrumentor

    DSPyInstrumentor().instrument()
    return dspy_program(scenario)


def dspy_program(scenario: str) -> int:
    """planner and budget, two ``dspy.ReAct`` modules, each the other's tool, on ``DummyLM``.

    DummyLM answers in order, and the modules run depth first: each run's first step calls its
    tool until the calls are used up, then each run, innermost first, finishes and extracts."""
    import dspy
    from dspy.utils.dummies import DummyLM

    calls = tool_calls(scenario)
    made = {"calls": 0}

    def step(tool: str) -> dict[str, Any]:
        args = {"question": f"asked by {tool.removeprefix('ask_')}'s caller"} if tool != "finish" else {}
        return {
            "next_thought": "delegate" if tool != "finish" else "done",
            "next_tool_name": tool,
            "next_tool_args": args,
        }

    chain = [step("ask_budget" if at % 2 == 0 else "ask_planner") for at in range(calls)]
    finish = [step("finish"), {"reasoning": "done", "answer": "an answer"}] * (calls + 1)
    dspy.configure(lm=DummyLM([*chain, *finish]))

    def ask_budget(question: str) -> str:
        """Ask the budget agent."""
        made["calls"] += 1
        return str(budget(question=question).answer)

    def ask_planner(question: str) -> str:
        """Ask the planner agent."""
        made["calls"] += 1
        return str(planner(question=question).answer)

    planner = dspy.ReAct("question -> answer", tools=[ask_budget], max_iters=2)
    budget = dspy.ReAct("question -> answer", tools=[ask_planner], max_iters=2)
    planner(question="Plan the team offsite")
    return made["calls"]


RUNNERS: Runners = {
    "openai_agents_genai": (None, run_openai_agents),
    "langgraph_genai": (None, run_langgraph),
    "langchain_agent_genai": (None, run_langchain_agents),
    "llama_index_genai": (None, run_llama_index),
    "llama_index_openllmetry": (None, run_llama_index_openllmetry),
    "agno_genai": (None, run_agno),
    "smolagents_genai": (None, run_smolagents),
    "dspy_genai": (None, run_dspy),
}

if __name__ == "__main__":
    main(sys.argv[1:], RUNNERS, SCENARIOS)
