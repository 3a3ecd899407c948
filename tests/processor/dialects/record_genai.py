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

RUNTIME (its environment NAME): ``openai_agents_genai`` (openai-agents), ``langgraph_genai`` and
``langchain_agent_genai`` (langchain), ``llama_index_genai`` and ``llama_index_openllmetry``
(llama-index), ``agno_genai`` (agno), ``smolagents_genai`` (smolagents), ``dspy_genai`` (dspy),
``qwen_agent_genai`` (qwen-agent). SCENARIO ``loop`` or ``control`` as in
``record_runtime_telemetry.py``; ``handoff`` (OpenAI Agents and LlamaIndex's official
instrumentation): planner hands off to budget and budget hands back, by the runtime's own handoffs
(the SDK's ``handoffs``, an ``AgentWorkflow``), once each. It prints one line ``RESULT {json}``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, ClassVar

from record_runtime_telemetry import (
    RUNTIMES,
    CallBudget,
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


def run_qwen_agent(scenario: str) -> int:
    _only_loops("qwen_agent_genai", scenario)
    from opentelemetry.instrumentation.genai.qwen_agent import QwenAgentInstrumentor

    QwenAgentInstrumentor().instrument()
    return qwen_agent_program(scenario)


def qwen_agent_program(scenario: str) -> int:
    """planner and budget, two Qwen-Agent ``Assistant``\\ s, each with a tool that runs the other, on
    a scripted model: a fresh question calls the tool while the calls last, anything else is
    answered."""
    import json

    from qwen_agent.agents import Assistant
    from qwen_agent.llm.base import BaseChatModel
    from qwen_agent.llm.schema import ASSISTANT, USER, FunctionCall, Message
    from qwen_agent.tools.base import BaseTool

    calls = CallBudget(tool_calls(scenario))

    class Scripted(BaseChatModel):
        def __init__(self, tool: str) -> None:
            super().__init__({"model": "scripted"})
            self.tool = tool

        def chat(self, messages: Any, functions: Any = None, stream: bool = True, **kwargs: Any) -> Any:
            last = messages[-1]
            role = last.role if isinstance(last, Message) else last["role"]
            if role == USER and calls.take():
                arguments = json.dumps({"question": "a question"})
                call = FunctionCall(self.tool, arguments)
                reply = Message(role=ASSISTANT, content="", function_call=call, extra={"function_id": "1"})
            else:
                reply = Message(role=ASSISTANT, content="an answer")
            return iter([[reply]]) if stream else [reply]

        def _chat_with_functions(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        def _chat_stream(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        def _chat_no_stream(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    agents: dict[str, Any] = {}

    class Ask(BaseTool):
        description = "Ask another agent."
        parameters: ClassVar[dict[str, Any]] = {
            "type": "object",
            "properties": {"question": {"type": "string"}},
            "required": ["question"],
        }

        def __init__(self, name: str, agent: str) -> None:
            self.name, self.agent = name, agent
            super().__init__()

        def call(self, params: Any, **kwargs: Any) -> str:
            question = json.loads(params)["question"] if isinstance(params, str) else params["question"]
            *_, last = agents[self.agent].run([Message(role=USER, content=question)])
            return str(last[-1].content)

    for name, other in (("planner", "budget"), ("budget", "planner")):
        tool = Ask(f"ask_{other}", other)
        agents[name] = Assistant(llm=Scripted(tool.name), function_list=[tool], name=name)
    for _ in agents["planner"].run([Message(role=USER, content="Plan the team offsite")]):
        pass
    return calls.made


RUNNERS: Runners = {
    "openai_agents_genai": (None, run_openai_agents),
    "langgraph_genai": (None, run_langgraph),
    "langchain_agent_genai": (None, run_langchain_agents),
    "llama_index_genai": (None, run_llama_index),
    "llama_index_openllmetry": (None, run_llama_index_openllmetry),
    "agno_genai": (None, run_agno),
    "smolagents_genai": (None, run_smolagents),
    "dspy_genai": (None, run_dspy),
    "qwen_agent_genai": (None, run_qwen_agent),
}

if __name__ == "__main__":
    main(sys.argv[1:], RUNNERS, SCENARIOS)
