"""Which spans are calls, as data: one row per dialect rule, read in order.

A span is a call when a row matches it: the first of the GenAI span-name rows (in its scope), else
the row of the first dialect kind attribute it carries (OpenInference's or Traceloop's), else the row of its
``gen_ai.operation.name``, else the row of its protocol method (A2A's ``a2a.method.name``, MCP's
``mcp.method.name``: their spans are named by the method, not by a GenAI operation). A kind row
whose ``kind`` is None says "no call by its kind": the span is then read by its operation. A row's
name is the first of its ``names`` the span has (``SUBJECT``: the span name after the operation);
a call with no name is no call (a link like any other span), and a row with no ``names`` names
nothing (an instrumentation that names every agent alike, by its class).

The row that read a span is the call's *form*: two spans of one instrumentation with the same name,
one directly inside the other, are a re-entry when read by the same row (``invoke_agent X`` inside
``invoke_agent X``), and one call when by different rows (a wrapper: ``invoke_workflow X`` around
``invoke_agent X``, Traceloop's ``invoke_agent X`` around ``X.workflow``) -- except a wrapper's row
inside the row of the call it wraps (:data:`WRAPPERS`): the call started a new run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final

AGENT: Final = "agent"
TOOL: Final = "tool"
SUBJECT: Final = "<the span name's subject>"
STEM: Final = "<the span name before its last dot>"  # smolagents' `planner.run`: planner
OPENINFERENCE_LANGCHAIN: Final = "openinference.instrumentation.langchain"
GENAI_DSPY: Final = "opentelemetry.instrumentation.genai.dspy"  # every agent `invoke_agent dspy.ReAct`
TRACELOOP_LLAMAINDEX: Final = "opentelemetry.instrumentation.llamaindex"  # every span a task or workflow
MLFLOW_SCOPE: Final = "mlflow.tracing.provider"  # MLflow Tracing's spans, decorators' and autologs'
LAMINAR_SCOPE: Final = "lmnr.tracer"  # Laminar's spans, decorators' and instrumentors'
GUARD_SCOPE: Final = "otel_guard"  # the inline guard's instrumentation scope


@dataclass(frozen=True)
class Row:
    """One rule: spans whose ``key`` is ``value`` are calls of ``kind``, named by ``names``."""

    dialect: str
    key: str  # an attribute, or SPAN_NAME for the span-name rows
    value: str
    kind: str | None
    names: tuple[str, ...]
    conditional: bool = False  # a call only first below a tool call, or at the top of a path
    scope: str | None = None  # only in this instrumentation scope


SPAN_NAME: Final = "<the span name>"
OPERATION: Final = "gen_ai.operation.name"
OI_KIND: Final = "openinference.span.kind"
TL_KIND: Final = "traceloop.span.kind"
TL_NAME: Final = "traceloop.entity.name"

A2A_METHOD: Final = "a2a.method.name"
MCP_METHOD: Final = "mcp.method.name"

GENAI = "OpenTelemetry GenAI"
OI = "OpenInference"
TL = "OpenLLMetry / Traceloop"

# The span named ``invoke_agent X`` (or bare ``invoke_agent``, named by its attribute), ...
NAME_ROWS: Final = (
    # DSPy's agents are all `invoke_agent dspy.ReAct` (their class): no name, no call.
    Row(GENAI, SPAN_NAME, "invoke_agent", AGENT, (), scope=GENAI_DSPY),
    Row(GENAI, SPAN_NAME, "invoke_agent", AGENT, (SUBJECT, "gen_ai.agent.name")),
    # (A transfer's tool span is `execute_tool {tool} {target}`: its tool is gen_ai.tool.name.)
    Row(GENAI, SPAN_NAME, "execute_tool", TOOL, ("gen_ai.tool.name", SUBJECT)),
    Row(GENAI, SPAN_NAME, "invoke_workflow", AGENT, (SUBJECT, "gen_ai.workflow.name")),
)
# Read by the first of these keys a span carries; the first row that matches its value and scope.
KIND_ROWS: Final = (
    # LangChain's AGENT kind is a guess from the run's name, and its graph run is the agent.
    Row(OI, OI_KIND, "AGENT", None, (), scope=OPENINFERENCE_LANGCHAIN),
    Row(OI, OI_KIND, "CHAIN", AGENT, (SPAN_NAME,), conditional=True, scope=OPENINFERENCE_LANGCHAIN),
    # smolagents' instrumentation names its agents in the span name alone (`planner.run`).
    Row(OI, OI_KIND, "AGENT", AGENT, ("agent.name", "graph.node.id", STEM)),
    Row(OI, OI_KIND, "TOOL", TOOL, ("tool.name", SPAN_NAME)),
    # CrewAI's instrumentation names its agents by gen_ai.agent.name alone.
    Row(TL, TL_KIND, "agent", AGENT, (TL_NAME, "gen_ai.agent.name")),
    Row(TL, TL_KIND, "workflow", AGENT, (TL_NAME, "gen_ai.workflow.name")),
    Row(TL, TL_KIND, "tool", TOOL, (TL_NAME, "gen_ai.tool.name")),
    # LlamaIndex's tool call: the agent's step `task` that holds `tool.name` (no name: no call).
    Row(TL, TL_KIND, "task", TOOL, ("tool.name",), scope=TRACELOOP_LLAMAINDEX),
    Row(TL, TL_KIND, "task", AGENT, (TL_NAME,), conditional=True),  # the run of an agent called as a tool
)
# The observability SDKs' decorators: the span named after the function or the name given. mlflow
# writes its span type as a JSON string, quotes and all; Laminar has no agent type (its agents are
# DEFAULT spans: links). Read as kind rows; they stand last in the engine's table.
LANGFUSE_KIND: Final = "langfuse.observation.type"
MLFLOW_KIND: Final = "mlflow.spanType"
LAMINAR_KIND: Final = "lmnr.span.type"
AGENTOPS_KIND: Final = "agentops.span.kind"
SDK_ROWS: Final = (
    Row("Langfuse", LANGFUSE_KIND, "agent", AGENT, (SPAN_NAME,)),
    Row("Langfuse", LANGFUSE_KIND, "tool", TOOL, (SPAN_NAME,)),
    Row("MLflow Tracing", MLFLOW_KIND, '"AGENT"', AGENT, (SPAN_NAME,)),
    Row("MLflow Tracing", MLFLOW_KIND, '"TOOL"', TOOL, (SPAN_NAME,)),
    Row("Laminar", LAMINAR_KIND, "TOOL", TOOL, (SPAN_NAME,)),
    # AgentOps' decorators' spans are `planner.agent`, `ask_budget.tool`, the name in operation.name;
    # its OpenAI Agents instrumentor's are `planner`, `ask_budget`, the name in agent.name / tool.name.
    Row("AgentOps", AGENTOPS_KIND, "agent", AGENT, ("operation.name", "agent.name", STEM)),
    Row("AgentOps", AGENTOPS_KIND, "tool", TOOL, ("operation.name", "tool.name", STEM)),
    # MLflow's OpenAI Agents integration types its span of each `Runner.run` "AGENT" too, beside the
    # agent's own span: no call (a span-name row with no kind names nothing: no call).
    Row("MLflow Tracing", SPAN_NAME, "AgentRunner.run", None, ()),
    # Its pydantic-ai integration names every agent run after the method (`Agent.run`, ...), typed
    # "AGENT", the agent's name only in a JSON string: no call (else a false `Agent.run>Agent.run`).
    *(
        Row("MLflow Tracing", SPAN_NAME, method, None, (), scope=MLFLOW_SCOPE)
        for method in ("Agent.run", "Agent.run_sync", "Agent.run_stream", "Agent.run_stream_sync")
    ),
    # Langfuse's LangChain CallbackHandler writes a LangGraph graph a `chain` like each of its nodes:
    # the graph run first below a tool (or at the top) is the agent, as OpenInference's.
    Row("Langfuse", LANGFUSE_KIND, "chain", AGENT, (SPAN_NAME,), conditional=True),
    # Laminar's LangGraph instrumentor names only the top graph (`planner.workflow`, invoke_agent); a
    # graph a tool runs is `execute_task budget`, like each node: the one first below a tool is the agent.
    Row("Laminar", SPAN_NAME, "execute_task", AGENT, (SUBJECT,), conditional=True, scope=LAMINAR_SCOPE),
)
KIND_KEYS: Final = (OI_KIND, TL_KIND, LANGFUSE_KIND, MLFLOW_KIND, LAMINAR_KIND, AGENTOPS_KIND)
OPERATION_ROWS: Final = (
    Row(GENAI, OPERATION, "invoke_agent", AGENT, ("gen_ai.agent.name",)),
    Row(GENAI, OPERATION, "execute_tool", TOOL, ("gen_ai.tool.name",)),
    Row(GENAI, OPERATION, "invoke_workflow", AGENT, ("gen_ai.workflow.name",)),
)
# The GenAI conventions' protocol spans, read when a span has no GenAI operation: an A2A message
# to an agent (`SendMessage`, client and server, named by the agent card's gen_ai.agent.name;
# polling a task is no call) and an MCP tool call (`tools/call get-weather`).
PROTOCOL_ROWS: Final = (
    Row(GENAI, A2A_METHOD, "SendMessage", AGENT, ("gen_ai.agent.name",)),
    Row(GENAI, A2A_METHOD, "SendStreamingMessage", AGENT, ("gen_ai.agent.name",)),
    Row(GENAI, MCP_METHOD, "tools/call", TOOL, ("gen_ai.tool.name", SUBJECT)),
)


@dataclass(frozen=True)
class Call:
    """What a span is as a call: the row that read it, and the name it gives (None: no name)."""

    row: Row
    name: str | None

    @property
    def kind(self) -> str:
        assert self.row.kind is not None
        return self.row.kind


def _row(rows: tuple[Row, ...], value: str) -> Row:
    """The row of ``value`` (with a kind, in every scope)."""
    return next(row for row in rows if row.value == value and row.kind is not None and row.scope is None)


# A wrapper span (first) around the call it wraps (second), of the same name and instrumentation.
# Any two rows read one call so, nested either way, except a pair's wrapper row inside its call's:
# that is a new run (``invoke_workflow X`` that ``invoke_agent X`` starts).
WRAPPERS: Final = (
    (_row(NAME_ROWS, "invoke_workflow"), _row(NAME_ROWS, "invoke_agent")),  # Google ADK
    (_row(OPERATION_ROWS, "invoke_workflow"), _row(OPERATION_ROWS, "invoke_agent")),
    (_row(NAME_ROWS, "invoke_agent"), _row(KIND_ROWS, "workflow")),  # Traceloop's LangGraph graph
    (_row(KIND_ROWS, "workflow"), _row(KIND_ROWS, "agent")),
    (_row(KIND_ROWS, "task"), _row(KIND_ROWS, "agent")),
)


@dataclass(frozen=True)
class Table:
    """The rows read in order (see the module docstring), the wrapper pairs, and the groups of rows
    that read one form (none: each row is a form of its own)."""

    name_rows: tuple[Row, ...] = (*NAME_ROWS, *(row for row in SDK_ROWS if row.key == SPAN_NAME))
    kind_rows: tuple[Row, ...] = (*KIND_ROWS, *(row for row in SDK_ROWS if row.key != SPAN_NAME))
    operation_rows: tuple[Row, ...] = OPERATION_ROWS
    protocol_rows: tuple[Row, ...] = PROTOCOL_ROWS
    wrappers: tuple[tuple[Row, Row], ...] = WRAPPERS
    forms: tuple[tuple[Row, ...], ...] = ()
    kind_keys: tuple[str, ...] = KIND_KEYS

    def form(self, row: Row) -> Row:
        """The row that stands for ``row``'s form."""
        return next((group[0] for group in self.forms if row in group), row)

    def call_of(self, span_name: str, scope: str, text: Mapping[str, str | None]) -> Call | None:
        """The call a span records: its name, its scope and its attributes' string values (None
        for a value of another type), or None when it is no call."""
        for row in self.name_rows:
            named = span_name == row.value or span_name.startswith(row.value + " ")
            if named and row.scope in (None, scope):
                return Call(row, _name(row, span_name, text))
        kind_key = next((key for key in text if key in self.kind_keys), None)
        if kind_key is not None:
            for row in self.kind_rows:
                if row.key == kind_key and row.value == text[kind_key] and row.scope in (None, scope):
                    if row.kind is not None:
                        return Call(row, _name(row, span_name, text))
                    break
        for row in (*self.operation_rows, *self.protocol_rows):
            if text.get(row.key) == row.value:
                return Call(row, _name(row, span_name, text))
        return None

    def same_form_again(self, above: Row, below: Row) -> bool:
        """Whether ``below``, directly inside ``above`` (one name, one instrumentation), is a new
        run: the same form again, or a wrapper's row inside the row of the call it wraps."""
        return self.form(above) == self.form(below) or (below, above) in self.wrappers


# The other keys the detection reads. A call span that starts a trace and names the agent that
# called it (the first of these keys with a value) continues that caller's path: an
# agent-to-agent server's caller, in the trace before (gen_ai.caller.agent.name), or the caller of
# an invoke_agent CLIENT span in this trace (gen_ai.caller.name, the conventions' caller-aware
# refinement, with gen_ai.caller.type agent or workflow).
CALLER: Final = "gen_ai.caller.agent.name"
CALLER_NAME: Final = "gen_ai.caller.name"
CALLERS: Final = (CALLER, CALLER_NAME)
# The inline guard's attributes on its hop spans.
DECISION: Final = "otel_guard.decision"
REASON: Final = "otel_guard.reason"
NAME_DEPTH: Final = "otel_guard.name_depth"  # how often the chain holds the hop's name
CHAIN_AGENTS: Final = "otel_guard.chain.agents"
CHAIN_DEPTH: Final = "otel_guard.chain.depth"
CHAIN_ROOT: Final = "otel_guard.chain.root"
TREE_HOPS: Final = "otel_guard.budget.hops"  # the hops the chain root's tree has used
# A transfer (a handoff), as its spans mark one: the guard's hop kind, or the conventions' transfer
# mode (`gen_ai.transfer.mode` `pass_control`; `return_to_caller` is a call).
HOP_KIND: Final = "otel_guard.hop.kind"
TRANSFER_MODE: Final = "gen_ai.transfer.mode"


TABLE: Final = Table()


def with_rows(specs: Iterable[tuple[str, str, str, str | None, tuple[str, ...], bool, str | None]]) -> Table:
    """The table with a dialects file's rows (in ``dialect_table()``'s form) after the built-in rows
    of their group: span-name rows, ``gen_ai.operation.name`` rows, protocol rows; every other key a
    kind key after OpenInference's and Traceloop's."""
    rows = [Row(*spec) for spec in specs]
    kind_keys = list(KIND_KEYS)
    for row in rows:
        if row.key not in (SPAN_NAME, OPERATION, A2A_METHOD, MCP_METHOD) and row.key not in kind_keys:
            kind_keys.append(row.key)
    return replace(
        TABLE,
        name_rows=(*TABLE.name_rows, *(row for row in rows if row.key == SPAN_NAME)),
        kind_rows=(*TABLE.kind_rows, *(row for row in rows if row.key in kind_keys)),
        operation_rows=(*OPERATION_ROWS, *(row for row in rows if row.key == OPERATION)),
        protocol_rows=(*PROTOCOL_ROWS, *(row for row in rows if row.key in (A2A_METHOD, MCP_METHOD))),
        kind_keys=tuple(kind_keys),
    )


def call_of(span_name: str, scope: str, text: Mapping[str, str | None]) -> Call | None:
    """:meth:`Table.call_of` of the table."""
    return TABLE.call_of(span_name, scope, text)


def _name(row: Row, span_name: str, text: Mapping[str, str | None]) -> str | None:
    for source in row.names:
        if source == SUBJECT:
            name: str | None = span_name.partition(" ")[2]
        elif source == SPAN_NAME:
            name = span_name
        elif source == STEM:
            name = span_name.rpartition(".")[0]
        else:
            name = text.get(source)
        if name:
            return name
    return None
