"""The work tests/core/test_pools.py hands to pools: module-level, so that a process pool can pickle it
and a spawned worker can import it (tests/core is on the path the worker is given).

Each function reports what it saw in the worker as plain data the pool sends back.
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry import trace

from otel_guard import DelegationRefused, agentic, current_chain, delegate

initialized_in: dict[str, Any] = {}


def seen(tag: object = None) -> dict[str, Any]:
    """The chain in force when the work starts (its root, or ``None``), the trace it is in, and the
    hop ``worker`` made there: the chain it made (agents, root) and its decision, or the refusal."""
    before = current_chain()
    span = trace.get_current_span().get_span_context()
    report: dict[str, Any] = {
        "tag": tag,
        "pid": os.getpid(),
        "before": before.root if before is not None else None,
        "trace_id": span.trace_id if span.is_valid else None,
        "agents": None,
        "root": None,
        "decision": None,
        "refused": None,
    }
    try:
        with delegate("worker", "task") as hop:
            chain = hop.chain
            assert chain is not None
            report.update(agents=list(chain.agents), root=chain.root, decision=hop.decision)
    except DelegationRefused as refused:
        report["refused"] = refused.reason
    return report


def initialize() -> None:
    """A pool's ``initializer``: notes the chain its worker started in."""
    chain = current_chain()
    initialized_in["root"] = chain.root if chain is not None else None


def initialized(tag: object = None) -> dict[str, Any]:
    """What :func:`initialize` noted in this worker."""
    return dict(initialized_in)


@agentic
def planner(task: str) -> str:
    """The planner a budget in the worker calls back: refused there, at the loop's first bounce."""
    return f"planned {task}"


@agentic
def budget(task: str) -> str:
    return planner(task)
