"""A user's OpenAI Agents SDK program, with no otel-guard code: planner and budget call each other.

Run it the way a user would, under ``opentelemetry-instrument`` with settings from the environment
(``OPENAI_AGENTS_DISABLE_TRACING=1`` keeps the SDK's own tracing offline). It prints one JSON line to
stderr: the final output and how many tool calls the models made.

    python openai_agents_app.py [tools|handoffs]
"""

from __future__ import annotations

import json
import sys

from agents import Runner
from openai_agents_models import (
    CallBudget,
    agents_as_tools_of_each_other,
    agents_handing_off_to_each_other,
)

CALL_BUDGET = 6


def main() -> None:
    shape = sys.argv[1] if len(sys.argv) > 1 else "tools"
    budget = CallBudget(CALL_BUDGET)
    build = agents_handing_off_to_each_other if shape == "handoffs" else agents_as_tools_of_each_other
    planner, _ = build(budget)
    result = Runner.run_sync(planner, "Plan a trip to Lisbon.")
    print(json.dumps({"final_output": result.final_output, "calls": budget.made}), file=sys.stderr)


if __name__ == "__main__":
    main()
