"""OpenLLMetry's flat OpenAI Agents traces: the tool call that started each agent run, where provable.

OpenLLMetry's OpenAI Agents instrumentation hangs every agent run (``traceloop.span.kind``
``agent``) off the trace's workflow span (``workflow``, naming nothing), none below the tool span
(``tool``) that ran it: the nesting is only in time. A *flat run* -- such a run whose parent is such
a workflow span, present -- is read as the run of the one tool span that provably started it, and
as today (below the workflow span) otherwise.

The tool spans that may have started run R are its *candidates*: the tool spans of the trace, of
the same instrumentation, whose interval holds R's (another interval than R's, and not a tool span
of R's own). Runs are taken in order of start time (then span id), so that a run's callers are
taken before it: a candidate on the proven path above another candidate (its run attributed to a
tool whose run was attributed to ... that candidate) is not R's, and R is attributed when exactly
one candidate is left. So the loop planner → budget → planner, whose every run lies in every tool
span above it, is read back call by call, and two tool spans of one turn that run at once (the SDK
runs a turn's tool calls concurrently), both holding a run, leave it unattributed: no guess, so no
false cycle. What a reader would not guess: the one assumption is that a tool call does not run
two agents at the same time (the SDK's ``Agent.as_tool`` runs one); the workflow span ends last,
so the processor decides once it has arrived (and its count wait ran out); a trace's runs past the
first :data:`MAX_FLAT_RUNS` stay unattributed (each decision scans the trace's tool spans).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from reference.reference import Span, SpanKey

SCOPE: Final = "opentelemetry.instrumentation.openai_agents"
TL_KIND: Final = "traceloop.span.kind"
AGENT: Final = "agent"
TOOL: Final = "tool"
WORKFLOW: Final = "workflow"
MAX_FLAT_RUNS: Final = 256  # a trace's runs past these (in order of start) stay unattributed


def flat_kind(span: Span, named: bool) -> str | None:
    """What a span is to the flat reading: an agent run or a tool call (``named``: read as a call),
    a workflow span (named by nothing), or None (another span, of another instrumentation)."""
    if span.scope != SCOPE:
        return None
    kind = span.text(TL_KIND)
    if kind in (AGENT, TOOL) and named:
        return kind
    if kind == WORKFLOW and not named:
        return WORKFLOW
    return None


@dataclass(frozen=True)
class Timed:
    key: SpanKey
    parent: bytes
    start: int
    end: int


def attribute(runs: list[Timed], tools: list[Timed]) -> dict[SpanKey, SpanKey]:
    """Runs of one trace (any order) -> the tool span each is attributed to (see the docstring)."""
    attributed: dict[SpanKey, SpanKey] = {}
    by_span = {tool.key: tool for tool in tools}
    for run in sorted(runs, key=lambda run: (run.start, run.key[1]))[:MAX_FLAT_RUNS]:
        candidates = [
            tool
            for tool in tools
            if tool.parent != run.key[1]
            and tool.start <= run.start
            and run.end <= tool.end
            and (tool.start, tool.end) != (run.start, run.end)
        ]
        above: set[SpanKey] = set()  # candidates on the proven path above another candidate
        for candidate in candidates:
            at: Timed | None = candidate
            seen: set[SpanKey] = set()
            while at is not None and at.key not in seen:
                seen.add(at.key)
                caller = attributed.get((at.key[0], at.parent))
                at = by_span.get(caller) if caller is not None else None
                if at is not None:
                    above.add(at.key)
        left = [candidate for candidate in candidates if candidate.key not in above]
        if len(left) == 1:
            attributed[run.key] = left[0].key
    return attributed


def attributions(spans: Mapping[SpanKey, Span], named: Iterable[SpanKey]) -> dict[SpanKey, SpanKey]:
    """Each flat run (of ``spans``; ``named``: the spans read as calls) -> the tool span it is the
    run of, where that is provable."""
    calls = set(named)
    kinds = {key: flat_kind(span, key in calls) for key, span in spans.items()}
    runs: dict[bytes, list[Timed]] = defaultdict(list)
    tools: dict[bytes, list[Timed]] = defaultdict(list)
    for key, span in spans.items():
        timed = Timed(key, span.parent_id, span.start, span.end)
        if kinds[key] == TOOL:
            tools[span.trace_id].append(timed)
        elif (
            kinds[key] == AGENT and span.parent_id and kinds.get((span.trace_id, span.parent_id)) == WORKFLOW
        ):
            runs[span.trace_id].append(timed)
    attributed: dict[SpanKey, SpanKey] = {}
    for trace_id, flat in runs.items():
        attributed.update(attribute(flat, tools[trace_id]))
    return attributed
