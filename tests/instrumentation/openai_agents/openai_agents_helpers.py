"""What the OpenAI Agents SDK tests share: the SDK's tracing kept offline, span and model readers.

Importing this module turns the SDK's own tracing off for the session: its exporter would try to reach
api.openai.com, and no test turns it back on. The offline models themselves are in
``openai_agents_models.py`` (also used by the programs the subprocess tests run).
"""

from __future__ import annotations

from agents import set_tracing_disabled
from openai_agents_models import LoopModel

set_tracing_disabled(True)

REFUSAL = (
    "Refused by otel-guard (a2a_delegation_cycle, reason: cycle): Delegation cycle: agent planner "
    "is already in chain planner → budget."
)
"""The tool result the model sees when planner -> budget -> planner is refused."""


def attrs(span: object) -> dict[str, object]:
    return dict(span.attributes or {})  # type: ignore[attr-defined]


def last_tool_output(model: LoopModel) -> str:
    """The tool result in the model's last request."""
    item = model.calls[-1].input[-1]
    assert item["type"] == "function_call_output", item
    return str(item["output"])
