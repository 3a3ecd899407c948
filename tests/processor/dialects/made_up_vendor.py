"""A made-up vendor's spans ("Acme Trace"), which no built-in dialect row reads, and the file teaching them.

Its agent spans are named ``run`` and carry ``acme.span.type`` ``"AGENT"`` -- a JSON string, quotes
and all, as mlflow writes its span type -- with the agent in ``acme.entity``; its tool spans are
``call ask_X`` (``"TOOL"``), named by the span name's subject. The loop and the healthy run are the
corpus's (``corpus/README.md``): planner -> budget -> planner ... (5 tool calls), and planner asks
budget once.
"""

from __future__ import annotations

import itertools
from typing import Any

SCOPE = "acme.trace"
DIALECTS_FILE = """\
rows:
  - dialect: Acme Trace
    key: acme.span.type
    value: '"AGENT"'
    kind: agent
    named_by: [acme.entity]
  - dialect: Acme Trace
    key: acme.span.type
    value: '"TOOL"'
    kind: tool
    named_by: [the span name's subject]
"""


def spans(tool_calls: int, trace: int = 1) -> list[dict[str, Any]]:
    """planner and budget asking each other ``tool_calls`` times in all, as corpus records."""
    ids = itertools.count(1)
    trace_id = f"{trace:032x}"
    records: list[dict[str, Any]] = []

    def span(name: str, parent: str | None, attributes: dict[str, str]) -> str:
        span_id = f"{next(ids):016x}"
        records.append(
            {
                "name": name,
                "kind": "INTERNAL",
                "scope": SCOPE,
                "scope_version": "1.0",
                "trace_id": trace_id,
                "span_id": span_id,
                "parent_id": parent,
                "links": 0,
                "start": 1_700_000_000_000_000_000 + len(records) * 1_000_000,
                "attributes": {"acme.session": "s-1", **attributes},
            }
        )
        return span_id

    agents = itertools.cycle(["planner", "budget"])
    agent = next(agents)
    parent = span("run", None, {"acme.span.type": '"AGENT"', "acme.entity": agent})
    for _ in range(tool_calls):
        callee = next(agents)
        tool = span(f"call ask_{callee}", parent, {"acme.span.type": '"TOOL"'})
        parent = span("run", tool, {"acme.span.type": '"AGENT"', "acme.entity": callee})
    return records
