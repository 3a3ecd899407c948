"""LlamaIndex's multi-agent research report (its ``AgentWorkflow`` docs' example), offline.

Three ``FunctionAgent`` s as the docs build them: ResearchAgent (``search_web``, ``record_notes``; may
hand off to WriteAgent), WriteAgent (``write_report``; to ReviewAgent or ResearchAgent) and ReviewAgent
(``review_report``; to WriteAgent), their tools keeping the notes, the report and the review in the
workflow's state. Each model is a :class:`~llama_index_loop.StepsModel` playing the run the docs
describe: ResearchAgent searches, records its notes and hands off to WriteAgent, which writes the
report and hands off to ReviewAgent, which asks for changes and hands back to WriteAgent, which writes
the report again and answers with it. ``write_report`` also says which chain it ran in.

What a reader would not guess: this module has no ``from __future__ import annotations``. LlamaIndex
finds a tool's ``Context`` parameter by its annotation object (``inspect.signature``, not evaluated),
so with string annotations the tools would ask the model for a ``ctx``.
"""

from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent
from llama_index.core.workflow import Context
from llama_index_loop import StepsModel, call

import otel_guard

REVIEW = "Add a section on offline mode."


async def search_web(query: str) -> str:
    """Useful for using the web to answer questions."""
    return f"Search results for {query}: voice input, large buttons, offline packs."


async def record_notes(ctx: Context, notes: str, notes_title: str) -> str:
    """Useful for recording notes on a given topic."""
    async with ctx.store.edit_state() as ctx_state:
        ctx_state["state"].setdefault("research_notes", {})[notes_title] = notes
    return "Notes recorded."


async def write_report(ctx: Context, report_content: str) -> str:
    """Useful for writing a report on a given topic. The report must be in markdown format."""
    async with ctx.store.edit_state() as ctx_state:
        ctx_state["state"]["report_content"] = report_content
    chain = otel_guard.current_chain()
    return f"Report written along {chain.path() if chain is not None else 'no chain'}."


async def review_report(ctx: Context, review: str) -> str:
    """Useful for reviewing a report and providing feedback."""
    async with ctx.store.edit_state() as ctx_state:
        ctx_state["state"]["review"] = review
    return "Report reviewed."


def research_team() -> tuple[AgentWorkflow, dict[str, StepsModel]]:
    """The docs' three agents in one ``AgentWorkflow`` rooted at ResearchAgent, and their models."""
    models = {
        "ResearchAgent": StepsModel(
            "ResearchAgent",
            [
                call("search_web", query="translation app interfaces"),
                call("record_notes", notes="voice input, offline packs", notes_title="interfaces"),
                call("handoff", to_agent="WriteAgent", reason="The notes are ready."),
            ],
        ),
        "WriteAgent": StepsModel(
            "WriteAgent",
            [
                call("write_report", report_content="# Translation app\n\nVoice input."),
                call("handoff", to_agent="ReviewAgent", reason="The report is written."),
                call("write_report", report_content="# Translation app\n\nVoice input. Offline mode."),
                "{result}",
            ],
        ),
        "ReviewAgent": StepsModel(
            "ReviewAgent",
            [
                call("review_report", review=REVIEW),
                call("handoff", to_agent="WriteAgent", reason=REVIEW),
            ],
        ),
    }
    research = FunctionAgent(
        name="ResearchAgent",
        description="Useful for searching the web for information on a given topic and recording notes.",
        system_prompt="You are the ResearchAgent. Once notes are recorded, hand off to the WriteAgent.",
        llm=models["ResearchAgent"].llm(),
        tools=[search_web, record_notes],
        can_handoff_to=["WriteAgent"],
    )
    write = FunctionAgent(
        name="WriteAgent",
        description="Useful for writing a report on a given topic.",
        system_prompt="You are the WriteAgent. Once the report is written, ask the ReviewAgent for feedback.",
        llm=models["WriteAgent"].llm(),
        tools=[write_report],
        can_handoff_to=["ReviewAgent", "ResearchAgent"],
    )
    review = FunctionAgent(
        name="ReviewAgent",
        description="Useful for reviewing a report and providing feedback.",
        system_prompt="You are the ReviewAgent. Approve the report or request changes from the WriteAgent.",
        llm=models["ReviewAgent"].llm(),
        tools=[review_report],
        can_handoff_to=["WriteAgent"],
    )
    workflow = AgentWorkflow(
        agents=[research, write, review],
        root_agent=research.name,
        initial_state={
            "research_notes": {},
            "report_content": "Not written yet.",
            "review": "Review required.",
        },
    )
    return workflow, models
