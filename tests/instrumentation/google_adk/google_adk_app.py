"""An ordinary Google ADK program, with no otel-guard code: run it under ``opentelemetry-instrument``.

Planner and budget ask each other, as agents called as tools (``AgentTool``, the default) or by
``transfer_to_agent`` (``--transfer``), driven by the offline ``ScriptedModel`` of
``google_adk_models.py`` (six tool calls in all at most). It prints one line ``RESULT {json}`` of what
happened and what the models saw; the console span exporter prints the spans.
"""

from __future__ import annotations

import argparse
import asyncio
import json

# The script's own folder is on sys.path: the tests' models are importable as they are in the tests.
from google_adk_models import agents_as_tools, final_text, run, transferring_agents


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--transfer", action="store_true", help="transfer_to_agent instead of AgentTool")
    args = parser.parse_args()
    pair = transferring_agents() if args.transfer else agents_as_tools()
    events = await run(pair.planner)
    result = {
        "tool_calls": 6 - pair.tool_calls.left,
        "planner_requests": len(pair.planner_model.requests),
        "budget_errors": pair.budget_model.errors,
        "budget_first_user_text": pair.budget_model.user_texts[0][0]
        if pair.budget_model.user_texts
        else None,
        "answer": final_text(events),
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
