//! Spans -> calls: the dialect table, as data (one row per rule), and the keys the engine reads.
//!
//! A span is a call when a row matches it: the first of the GenAI span-name rows (in its scope),
//! else the row of the first dialect kind attribute it carries (OpenInference's, Traceloop's, an
//! observability SDK's), else the row of its `gen_ai.operation.name`, else the row of its protocol
//! method (`a2a.method.name`, `mcp.method.name`). A kind row with no kind says "no call by its kind":
//! the span is then read by its operation. A row's name is the first of its sources the span has
//! (the span name's subject, the span name, or an attribute); a call with no name is no call, and a
//! row with no sources names nothing (an instrumentation that names every agent alike).
//!
//! | dialect | key | value | kind | named by |
//! |---|---|---|---|---|
//! | GenAI (DSPy's scope) | span name | `invoke_agent` | agent | nothing (`dspy.ReAct` for all) |
//! | GenAI | span name | `invoke_agent` | agent | subject, `gen_ai.agent.name` |
//! | GenAI | span name | `execute_tool` | tool | `gen_ai.tool.name`, subject |
//! | GenAI | span name | `invoke_workflow` | agent | subject, `gen_ai.workflow.name` |
//! | OpenInference (LangChain scope) | `openinference.span.kind` | `AGENT` | none | |
//! | OpenInference (LangChain scope) | `openinference.span.kind` | `CHAIN` | agent, first below a tool | span name |
//! | OpenInference | `openinference.span.kind` | `AGENT` | agent | `agent.name`, `graph.node.id`, span name before its last dot |
//! | OpenInference | `openinference.span.kind` | `TOOL` | tool | `tool.name`, span name |
//! | Traceloop | `traceloop.span.kind` | `agent` | agent | `traceloop.entity.name`, `gen_ai.agent.name` |
//! | Traceloop | `traceloop.span.kind` | `workflow` | agent | `traceloop.entity.name`, `gen_ai.workflow.name` |
//! | Traceloop | `traceloop.span.kind` | `tool` | tool | `traceloop.entity.name`, `gen_ai.tool.name` |
//! | Traceloop (LlamaIndex scope) | `traceloop.span.kind` | `task` | tool | `tool.name` |
//! | Traceloop | `traceloop.span.kind` | `task` | agent, first below a tool | `traceloop.entity.name` |
//! | GenAI | `gen_ai.operation.name` | `invoke_agent` | agent | `gen_ai.agent.name` |
//! | GenAI | `gen_ai.operation.name` | `execute_tool` | tool | `gen_ai.tool.name` |
//! | GenAI | `gen_ai.operation.name` | `invoke_workflow` | agent | `gen_ai.workflow.name` |
//! | GenAI (A2A) | `a2a.method.name` | `SendMessage` | agent | `gen_ai.agent.name` |
//! | GenAI (A2A) | `a2a.method.name` | `SendStreamingMessage` | agent | `gen_ai.agent.name` |
//! | GenAI (MCP) | `mcp.method.name` | `tools/call` | tool | `gen_ai.tool.name`, subject |
//! | Langfuse | `langfuse.observation.type` | `agent` / `tool` | agent / tool | span name |
//! | MLflow Tracing | `mlflow.spanType` | `"AGENT"` / `"TOOL"` (quotes and all) | agent / tool | span name |
//! | Laminar | `lmnr.span.type` | `TOOL` | tool | span name |
//! | AgentOps | `agentops.span.kind` | `agent` / `tool` | agent / tool | `operation.name`, `agent.name` / `tool.name`, span name before its last dot |
//! | MLflow Tracing | span name | `AgentRunner.run` | none (no call) | |
//! | MLflow Tracing (its scope) | span name | `Agent.run`, `Agent.run_sync`, `Agent.run_stream`, `Agent.run_stream_sync` | none (no call) | |
//! | Langfuse | `langfuse.observation.type` | `chain` | agent, first below a tool | span name |
//! | Laminar (its scope) | span name | `execute_task` | agent, first below a tool | subject |
//!
//! What a reader would not guess: the row that read a span is part of what the call *is* (its
//! form). Two spans of one instrumentation with one name, one directly inside the other, are a
//! re-entry when one row read both, and one call when two rows did (a wrapper: ADK's
//! `invoke_workflow X` around `invoke_agent X`) -- except a wrapper's row inside the row of the
//! call it wraps ([`WRAPPERS`]): that call started a new run. The table mirrors
//! `tests/processor/reference/dialects.py` row for row; a test through the binding keeps them equal.
#![forbid(unsafe_code)]

use crate::decode::{Attribute, Request, Span, Value};

/// What a call is: an agent run or a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Agent,
    Tool,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Agent => "agent",
            Kind::Tool => "tool",
        }
    }
}

/// Every attribute the engine reads: the table's, then the hop's. The walker keeps these alone
/// (a [`crate::decode::Keys`] of [`Key::ALL`], in this order, so a decoded attribute's key index
/// is its `Key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Key {
    Operation,
    AgentName,
    ToolName,
    WorkflowName,
    OiKind,
    OiAgentName,
    GraphNodeId,
    OiToolName,
    TlKind,
    TlName,
    A2aMethod,
    McpMethod,
    /// A call span that starts a trace and names the agent that called it (agent-to-agent
    /// servers; the first of these two keys with a value) continues that caller's path.
    Caller,
    /// The conventions' proposed caller of an `invoke_agent` CLIENT span.
    CallerName,
    /// The inline guard's attributes on its hop spans.
    Decision,
    Reason,
    /// How often the guard's chain holds the hop's name.
    NameDepth,
    ChainAgents,
    ChainDepth,
    ChainRoot,
    /// The hops the chain root's tree has used.
    TreeHops,
    /// A hop's kind, `call` or `transfer` (the guard's spans).
    HopKind,
    /// The conventions' transfer mode: `pass_control` (a handoff) or `return_to_caller`.
    TransferMode,
    /// The observability SDKs' own span kinds: Langfuse's, mlflow's (a JSON string), Laminar's,
    /// AgentOps' (and the name AgentOps gives a call).
    LangfuseKind,
    MlflowKind,
    LaminarKind,
    AgentopsKind,
    AgentopsName,
}

pub const KEY_COUNT: usize = 28;

impl Key {
    pub const ALL: [Key; KEY_COUNT] = [
        Key::Operation,
        Key::AgentName,
        Key::ToolName,
        Key::WorkflowName,
        Key::OiKind,
        Key::OiAgentName,
        Key::GraphNodeId,
        Key::OiToolName,
        Key::TlKind,
        Key::TlName,
        Key::A2aMethod,
        Key::McpMethod,
        Key::Caller,
        Key::CallerName,
        Key::Decision,
        Key::Reason,
        Key::NameDepth,
        Key::ChainAgents,
        Key::ChainDepth,
        Key::ChainRoot,
        Key::TreeHops,
        Key::HopKind,
        Key::TransferMode,
        Key::LangfuseKind,
        Key::MlflowKind,
        Key::LaminarKind,
        Key::AgentopsKind,
        Key::AgentopsName,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Key::Operation => "gen_ai.operation.name",
            Key::AgentName => "gen_ai.agent.name",
            Key::ToolName => "gen_ai.tool.name",
            Key::WorkflowName => "gen_ai.workflow.name",
            Key::OiKind => "openinference.span.kind",
            Key::OiAgentName => "agent.name",
            Key::GraphNodeId => "graph.node.id",
            Key::OiToolName => "tool.name",
            Key::TlKind => "traceloop.span.kind",
            Key::TlName => "traceloop.entity.name",
            Key::A2aMethod => "a2a.method.name",
            Key::McpMethod => "mcp.method.name",
            Key::Caller => "gen_ai.caller.agent.name",
            Key::CallerName => "gen_ai.caller.name",
            Key::Decision => "otel_guard.decision",
            Key::Reason => "otel_guard.reason",
            Key::NameDepth => "otel_guard.name_depth",
            Key::ChainAgents => "otel_guard.chain.agents",
            Key::ChainDepth => "otel_guard.chain.depth",
            Key::ChainRoot => "otel_guard.chain.root",
            Key::TreeHops => "otel_guard.budget.hops",
            Key::HopKind => "otel_guard.hop.kind",
            Key::TransferMode => "gen_ai.transfer.mode",
            Key::LangfuseKind => "langfuse.observation.type",
            Key::MlflowKind => "mlflow.spanType",
            Key::LaminarKind => "lmnr.span.type",
            Key::AgentopsKind => "agentops.span.kind",
            Key::AgentopsName => "operation.name",
        }
    }
}

/// The instrumentation scope of the inline guard's spans.
pub const GUARD_SCOPE: &str = "otel_guard";
pub const OPENINFERENCE_LANGCHAIN: &str = "openinference.instrumentation.langchain";
/// The official DSPy instrumentation: every agent `invoke_agent dspy.ReAct`, named by its class.
pub const GENAI_DSPY: &str = "opentelemetry.instrumentation.genai.dspy";
/// MLflow Tracing's spans (its decorators' and its autologs' alike).
pub const MLFLOW_SCOPE: &str = "mlflow.tracing.provider";
/// Laminar's spans (its decorators' and its instrumentors' alike).
pub const LAMINAR_SCOPE: &str = "lmnr.tracer";
/// OpenLLMetry's LlamaIndex instrumentation: every span a `task` (or the top `workflow`), each
/// named by a class and method; a tool call is the step's `task` holding `tool.name`.
pub const TRACELOOP_LLAMAINDEX: &str = "opentelemetry.instrumentation.llamaindex";
/// The OpenAI Agents SDK's instrumentations by OpenLLMetry and opentelemetry-python-contrib (v2):
/// OpenLLMetry's spans (those with `traceloop.span.kind`) hang every agent run off the workflow
/// span, none below the tool span that ran it (read back where provable: `graph/flat.rs`).
pub const OPENAI_AGENTS: &str = "opentelemetry.instrumentation.openai_agents";

pub const GENAI: &str = "OpenTelemetry GenAI";
pub const OI: &str = "OpenInference";
pub const TL: &str = "OpenLLMetry / Traceloop";
pub const LANGFUSE: &str = "Langfuse";
pub const MLFLOW: &str = "MLflow Tracing";
pub const LAMINAR: &str = "Laminar";
pub const AGENTOPS: &str = "AgentOps";

/// What a row matches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    /// The span name is the value, or starts with the value and a space.
    SpanName,
    Attribute(Key),
}

/// Where a call's name comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The span name after its first space (`invoke_agent X` -> `X`).
    Subject,
    SpanName,
    /// The span name before its last dot (smolagents' `planner.run` -> `planner`); no dot, no name.
    Stem,
    Attribute(Key),
}

/// One rule: spans whose `on` is `value` are calls of `kind`, named by the first of `names`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub dialect: &'static str,
    pub on: On,
    pub value: &'static str,
    /// None: no call by this kind (the span is read by its operation).
    pub kind: Option<Kind>,
    pub names: &'static [Source],
    /// A call only first below a tool call, or at the top of a path.
    pub conditional: bool,
    /// Only in this instrumentation scope.
    pub scope: Option<&'static str>,
}

/// A row of [`ROWS`], by its index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RowId(pub u8);

impl RowId {
    pub fn row(self) -> &'static Row {
        &ROWS[usize::from(self.0)]
    }
}

const fn row(
    dialect: &'static str,
    on: On,
    value: &'static str,
    kind: Option<Kind>,
    names: &'static [Source],
) -> Row {
    Row {
        dialect,
        on,
        value,
        kind,
        names,
        conditional: false,
        scope: None,
    }
}

const fn conditional(mut row: Row) -> Row {
    row.conditional = true;
    row
}

const fn scoped(mut row: Row, scope: &'static str) -> Row {
    row.scope = Some(scope);
    row
}

use Key::*;
use Source::{SpanName, Stem, Subject};

const AGENT: Option<Kind> = Some(Kind::Agent);
const TOOL: Option<Kind> = Some(Kind::Tool);
const NAME: On = On::SpanName;
const OI_KIND: On = On::Attribute(OiKind);
const TL_KIND: On = On::Attribute(TlKind);
const OPERATION: On = On::Attribute(Operation);
const LF_KIND: On = On::Attribute(LangfuseKind);
const ML_KIND: On = On::Attribute(MlflowKind);
const LMNR_KIND: On = On::Attribute(LaminarKind);
const AO_KIND: On = On::Attribute(AgentopsKind);
const A2A: On = On::Attribute(A2aMethod);
const MCP: On = On::Attribute(McpMethod);
const fn attr(key: Key) -> Source {
    Source::Attribute(key)
}

/// The rows, read in order: the span-name rows, the kind rows, the operation rows, the protocol
/// rows (the observability SDKs' kind rows stand last, read as kind rows).
#[rustfmt::skip]
pub const ROWS: [Row; 33] = [
    // DSPy's agents are all `invoke_agent dspy.ReAct` (their class): no name, no call.
    scoped(row(GENAI, NAME, "invoke_agent", AGENT, &[]), GENAI_DSPY),
    // The span named `invoke_agent X` (or bare `invoke_agent`, named by its attribute), ...
    row(GENAI, NAME, "invoke_agent", AGENT, &[Subject, attr(AgentName)]),
    // (A transfer's tool span is `execute_tool {tool} {target}`: its tool is gen_ai.tool.name.)
    row(GENAI, NAME, "execute_tool", TOOL, &[attr(ToolName), Subject]),
    row(GENAI, NAME, "invoke_workflow", AGENT, &[Subject, attr(WorkflowName)]),
    // Read by the first of the kind keys a span carries; the first row that matches its value and
    // scope. LangChain's AGENT kind is a guess from the run's name, and its graph run is the agent.
    scoped(row(OI, OI_KIND, "AGENT", None, &[]), OPENINFERENCE_LANGCHAIN),
    scoped(conditional(row(OI, OI_KIND, "CHAIN", AGENT, &[SpanName])), OPENINFERENCE_LANGCHAIN),
    // smolagents' instrumentation names its agents in the span name alone (`planner.run`).
    row(OI, OI_KIND, "AGENT", AGENT, &[attr(OiAgentName), attr(GraphNodeId), Stem]),
    row(OI, OI_KIND, "TOOL", TOOL, &[attr(OiToolName), SpanName]),
    // CrewAI's instrumentation names its agents by gen_ai.agent.name alone.
    row(TL, TL_KIND, "agent", AGENT, &[attr(TlName), attr(AgentName)]),
    row(TL, TL_KIND, "workflow", AGENT, &[attr(TlName), attr(WorkflowName)]),
    row(TL, TL_KIND, "tool", TOOL, &[attr(TlName), attr(ToolName)]),
    // LlamaIndex's tool call: the agent's step `task` that holds `tool.name` (no name: no call).
    scoped(row(TL, TL_KIND, "task", TOOL, &[attr(OiToolName)]), TRACELOOP_LLAMAINDEX),
    // The run of an agent called as a tool.
    conditional(row(TL, TL_KIND, "task", AGENT, &[attr(TlName)])),
    row(GENAI, OPERATION, "invoke_agent", AGENT, &[attr(AgentName)]),
    row(GENAI, OPERATION, "execute_tool", TOOL, &[attr(ToolName)]),
    row(GENAI, OPERATION, "invoke_workflow", AGENT, &[attr(WorkflowName)]),
    // The conventions' protocol spans, read when a span has no GenAI operation: an A2A message to
    // an agent (client and server, named by the agent card's name; polling a task is no call)
    // and an MCP tool call (`tools/call get-weather`).
    row(GENAI, A2A, "SendMessage", AGENT, &[attr(AgentName)]),
    row(GENAI, A2A, "SendStreamingMessage", AGENT, &[attr(AgentName)]),
    row(GENAI, MCP, "tools/call", TOOL, &[attr(ToolName), Subject]),
    // The observability SDKs' decorators: the span named after the function or the name given.
    // mlflow writes its span type as a JSON string, quotes and all; Laminar has no agent type (its
    // agents are DEFAULT spans: links).
    row(LANGFUSE, LF_KIND, "agent", AGENT, &[SpanName]),
    row(LANGFUSE, LF_KIND, "tool", TOOL, &[SpanName]),
    row(MLFLOW, ML_KIND, "\"AGENT\"", AGENT, &[SpanName]),
    row(MLFLOW, ML_KIND, "\"TOOL\"", TOOL, &[SpanName]),
    row(LAMINAR, LMNR_KIND, "TOOL", TOOL, &[SpanName]),
    // AgentOps' decorators' spans are `planner.agent`, `ask_budget.tool`, the name in
    // operation.name; its OpenAI Agents instrumentor's are `planner`, `ask_budget`, the name in
    // agent.name / tool.name.
    row(AGENTOPS, AO_KIND, "agent", AGENT, &[attr(AgentopsName), attr(OiAgentName), Stem]),
    row(AGENTOPS, AO_KIND, "tool", TOOL, &[attr(AgentopsName), attr(OiToolName), Stem]),
    // MLflow's OpenAI Agents integration types its span of each `Runner.run` `"AGENT"` too, beside
    // the agent's own span: no call (a span-name row with no kind is no call).
    row(MLFLOW, NAME, "AgentRunner.run", None, &[]),
    // Its pydantic-ai integration names every agent run after the method (`Agent.run`, ...),
    // typed "AGENT", the agent's name only in a JSON string: no call (else every run of one agent
    // inside another's tool is a false `Agent.run>Agent.run` cycle).
    scoped(row(MLFLOW, NAME, "Agent.run", None, &[]), MLFLOW_SCOPE),
    scoped(row(MLFLOW, NAME, "Agent.run_sync", None, &[]), MLFLOW_SCOPE),
    scoped(row(MLFLOW, NAME, "Agent.run_stream", None, &[]), MLFLOW_SCOPE),
    scoped(row(MLFLOW, NAME, "Agent.run_stream_sync", None, &[]), MLFLOW_SCOPE),
    // Langfuse's LangChain CallbackHandler writes a LangGraph graph a `chain` like each of its
    // nodes: the graph run first below a tool (or at the top) is the agent, as OpenInference's.
    conditional(row(LANGFUSE, LF_KIND, "chain", AGENT, &[SpanName])),
    // Laminar's LangGraph instrumentor names only the top graph (`planner.workflow`, invoke_agent);
    // a graph a tool runs is `execute_task budget`, like each node: the one first below a tool (or
    // at the top) is the agent.
    scoped(conditional(row(LAMINAR, NAME, "execute_task", AGENT, &[Subject])), LAMINAR_SCOPE),
];

/// The dialect kind keys: [`call_of`] reads the one a span carries first.
pub const KIND_KEYS: [Key; 6] = [
    OiKind,
    TlKind,
    LangfuseKind,
    MlflowKind,
    LaminarKind,
    AgentopsKind,
];

const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut at = 0;
    while at < a.len() {
        if a[at] != b[at] {
            return false;
        }
        at += 1;
    }
    true
}

const fn same_on(a: On, b: On) -> bool {
    match (a, b) {
        (On::SpanName, On::SpanName) => true,
        (On::Attribute(x), On::Attribute(y)) => x as u16 == y as u16,
        _ => false,
    }
}

/// The row (with a kind, in every scope) that matches `on` = `value`; a missing one fails the
/// build.
pub(crate) const fn find(on: On, value: &str) -> RowId {
    let mut at = 0;
    while at < ROWS.len() {
        let row = &ROWS[at];
        if same_on(row.on, on)
            && same(row.value, value)
            && row.kind.is_some()
            && row.scope.is_none()
        {
            return RowId(at as u8);
        }
        at += 1;
    }
    panic!("no such row")
}

/// A wrapper span's row (first) around the row of the call it wraps (second), of the same name
/// and instrumentation. Any two rows read one call so, nested either way, except a pair's wrapper
/// row inside its call's row: a new run (`invoke_workflow X` that `invoke_agent X` starts).
#[rustfmt::skip]
pub const WRAPPERS: [(RowId, RowId); 5] = [
    // Google ADK
    (find(NAME, "invoke_workflow"), find(NAME, "invoke_agent")),
    (find(OPERATION, "invoke_workflow"), find(OPERATION, "invoke_agent")),
    // Traceloop's LangGraph graph
    (find(NAME, "invoke_agent"), find(TL_KIND, "workflow")),
    (find(TL_KIND, "workflow"), find(TL_KIND, "agent")),
    (find(TL_KIND, "task"), find(TL_KIND, "agent")),
];

/// Whether `below`, directly inside `above` (one name, one instrumentation), is a new run: the
/// same row again, or a wrapper's row inside the row of the call it wraps.
pub fn same_form_again(above: RowId, below: RowId) -> bool {
    above == below || WRAPPERS.contains(&(below, above))
}

/// A span's attributes as the rules read them: the first value of each key, and where it stood.
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'l, 'a> {
    list: &'l [Attribute<'a>],
    /// Key -> where its first value stands in `list` (ABSENT: nowhere).
    first: [u16; KEY_COUNT],
}

const ABSENT: u16 = u16::MAX;

impl<'l, 'a> Attributes<'l, 'a> {
    /// The attributes of one decoded span (the request decoded with the keys of [`Key::ALL`]).
    pub fn of(request: &'l Request<'a>, span: &Span<'a>) -> Attributes<'l, 'a> {
        Attributes::from_list(request.attributes_of(span))
    }

    pub fn from_list(list: &'l [Attribute<'a>]) -> Attributes<'l, 'a> {
        let mut first = [ABSENT; KEY_COUNT];
        // (A span with more than 65,534 of the keys asked for reads the first of them.)
        for (at, attribute) in list.iter().enumerate().take(usize::from(ABSENT)) {
            if let Some(slot) = first.get_mut(usize::from(attribute.key))
                && *slot == ABSENT
            {
                *slot = at as u16;
            }
        }
        Attributes { list, first }
    }

    pub fn value(&self, key: Key) -> Option<Value<'a>> {
        let at = self.first[key as usize];
        (at != ABSENT).then(|| self.list[usize::from(at)].value)
    }

    /// The key's string value; None when it is missing or of another type.
    pub fn text(&self, key: Key) -> Option<&'a str> {
        match self.value(key) {
            Some(Value::Str(text)) => Some(text),
            _ => None,
        }
    }

    pub fn integer(&self, key: Key) -> Option<i64> {
        match self.value(key) {
            Some(Value::Int(number)) => Some(number),
            _ => None,
        }
    }

    /// The string value of the key of index `key` (a file's own key past [`KEY_COUNT`]: the first
    /// of its values, found by a scan of the span's kept attributes).
    pub fn text_at(&self, key: u16) -> Option<&'a str> {
        let value = match key_at(key) {
            Some(key) => self.value(key),
            None => self
                .list
                .iter()
                .find(|attribute| attribute.key == key)
                .map(|attribute| attribute.value),
        };
        match value {
            Some(Value::Str(text)) => Some(text),
            _ => None,
        }
    }

    /// Of the keys of `keys` (indices), the one that stands first among the span's attributes.
    fn first_index_of(&self, keys: impl Iterator<Item = u16>) -> Option<u16> {
        keys.filter_map(|key| {
            let at = match key_at(key) {
                Some(known) => self.first[known as usize],
                None => self
                    .list
                    .iter()
                    .position(|attribute| attribute.key == key)
                    .map_or(ABSENT, |at| at as u16),
            };
            (at != ABSENT).then_some((at, key))
        })
        .min_by_key(|&(at, _)| at)
        .map(|(_, key)| key)
    }

    /// Of `keys`, the one that stands first among the span's attributes.
    fn first_of(&self, keys: &[Key]) -> Option<Key> {
        keys.iter()
            .map(|&key| (self.first[key as usize], key))
            .filter(|&(at, _)| at != ABSENT)
            .min_by_key(|&(at, _)| at)
            .map(|(_, key)| key)
    }
}

/// What a span is as a call: the row that read it (a built-in row's index, then a file's rows),
/// what that row makes of it, and the name it gives (None: no name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call<'a> {
    pub row: RowId,
    kind: Kind,
    /// Read by a row that makes a call only first below a tool call.
    pub conditional: bool,
    pub name: Option<&'a str>,
}

impl Call<'_> {
    pub fn kind(&self) -> Kind {
        self.kind
    }
}

/// The call a span records, by its name, its instrumentation scope and its attributes, read by the
/// built-in table and then by `more` (a dialects file's rows); None when it is none.
pub fn call_of<'a>(
    span_name: &'a str,
    scope: &str,
    attributes: &Attributes<'_, 'a>,
    more: &FileRows,
) -> Option<Call<'a>> {
    let rows = ROWS.iter().enumerate();
    for (at, row) in rows.clone().filter(|(_, row)| row.on == On::SpanName) {
        // (The scope first: of another length than a scoped row's, it differs at no cost.)
        if row.scope.is_none_or(|only| only == scope) && names(span_name, row.value) {
            return Some(call(at, row, span_name, attributes));
        }
    }
    if !more.name_rows.is_empty()
        && let Some(at) = more.name_rows.iter().copied().find(|&at| {
            let row = &more.rows[usize::from(at)];
            row.scope.as_deref().is_none_or(|only| only == scope) && names(span_name, &row.value)
        })
    {
        return Some(more.call(at, span_name, attributes));
    }
    let kind_key = if more.kind_keys.is_empty() {
        attributes.first_of(&KIND_KEYS).map(|key| key as u16)
    } else {
        attributes.first_index_of(
            KIND_KEYS
                .iter()
                .map(|&key| key as u16)
                .chain(more.kind_keys.iter().copied()),
        )
    };
    if let Some(kind_key) = kind_key {
        let value = attributes.text_at(kind_key);
        let on = key_at(kind_key).map(On::Attribute);
        for (at, row) in rows.clone() {
            if Some(row.on) == on
                && Some(row.value) == value
                && row.scope.is_none_or(|only| only == scope)
            {
                if row.kind.is_some() {
                    return Some(call(at, row, span_name, attributes));
                }
                return more.after_operation(span_name, attributes);
            }
        }
        for &at in &more.kind_rows {
            let row = &more.rows[usize::from(at)];
            if row.on == Match::Attribute(kind_key)
                && value == Some(row.value.as_str())
                && row.scope.as_deref().is_none_or(|only| only == scope)
            {
                if row.kind.is_some() {
                    return Some(more.call(at, span_name, attributes));
                }
                break;
            }
        }
    }
    more.after_operation(span_name, attributes)
}

/// Whether the span name is `value`, or `value`, a space and more.
fn names(span_name: &str, value: &str) -> bool {
    span_name
        .strip_prefix(value)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
}

/// The built-in key of a key index below [`KEY_COUNT`] (None for a file's own key).
fn key_at(index: u16) -> Option<Key> {
    Key::ALL.get(usize::from(index)).copied()
}

/// The operation rows, then the protocol rows (each the built-in ones, then the file's): the first
/// whose key has its value.
fn by_operation<'a>(
    span_name: &'a str,
    attributes: &Attributes<'_, 'a>,
    more: &FileRows,
) -> Option<Call<'a>> {
    let rows = ROWS.iter().enumerate();
    if more.operation_rows.is_empty() && more.protocol_rows.is_empty() {
        // The built-in rows alone: one pass, the operation rows standing before the protocol rows.
        return rows
            .filter(|(_, row)| matches!(row.on, On::Attribute(Operation | A2aMethod | McpMethod)))
            .find(|(_, row)| match row.on {
                On::Attribute(key) => attributes.text(key) == Some(row.value),
                On::SpanName => false,
            })
            .map(|(at, row)| call(at, row, span_name, attributes));
    }
    let operation = |keys: &[Key]| {
        rows.clone()
            .filter(|(_, row)| matches!(row.on, On::Attribute(key) if keys.contains(&key)))
            .find(|(_, row)| match row.on {
                On::Attribute(key) => attributes.text(key) == Some(row.value),
                On::SpanName => false,
            })
            .map(|(at, row)| call(at, row, span_name, attributes))
    };
    let file = |group: &[u8]| {
        group.iter().copied().find_map(|at| {
            let row = &more.rows[usize::from(at)];
            match row.on {
                Match::Attribute(key) if attributes.text_at(key) == Some(row.value.as_str()) => {
                    Some(more.call(at, span_name, attributes))
                }
                _ => None,
            }
        })
    };
    operation(&[Operation])
        .or_else(|| file(&more.operation_rows))
        .or_else(|| operation(&[A2aMethod, McpMethod]))
        .or_else(|| file(&more.protocol_rows))
}

fn call<'a>(at: usize, row: &Row, span_name: &'a str, attributes: &Attributes<'_, 'a>) -> Call<'a> {
    let name = row.names.iter().find_map(|source| {
        let name = match *source {
            Subject => subject(span_name),
            SpanName => span_name,
            Stem => stem(span_name),
            Source::Attribute(key) => attributes.text(key)?,
        };
        (!name.is_empty()).then_some(name)
    });
    Call {
        row: RowId(u8::try_from(at).unwrap_or(u8::MAX)),
        kind: row.kind.unwrap_or(Kind::Agent),
        conditional: row.conditional,
        name,
    }
}

fn subject(span_name: &str) -> &str {
    span_name.split_once(' ').map_or("", |(_, subject)| subject)
}

fn stem(span_name: &str) -> &str {
    span_name.rsplit_once('.').map_or("", |(stem, _)| stem)
}

mod file_rows;

pub use file_rows::{
    FileRow, FileRows, MAX_FILE_ROWS, Match, Named, RowSpec, SPAN_NAME, STEM, SUBJECT,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::Attribute;

    fn list<'a>(pairs: &[(Key, Value<'a>)]) -> Vec<Attribute<'a>> {
        pairs
            .iter()
            .map(|&(key, value)| Attribute {
                key: key as u16,
                value,
            })
            .collect()
    }

    fn read<'a>(
        name: &'a str,
        scope: &str,
        pairs: &[(Key, &'a str)],
    ) -> Option<(Kind, Option<&'a str>, bool)> {
        let pairs: Vec<_> = pairs
            .iter()
            .map(|&(key, text)| (key, Value::Str(text)))
            .collect();
        let list = list(&pairs);
        let attributes = Attributes::from_list(&list);
        call_of(name, scope, &attributes, &FileRows::default())
            .map(|call| (call.kind(), call.name, call.conditional))
    }

    #[test]
    fn the_keys_are_in_the_order_of_their_indices() {
        for (at, key) in Key::ALL.iter().enumerate() {
            assert_eq!(*key as usize, at);
        }
        let mut names: Vec<_> = Key::ALL.iter().map(|key| key.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KEY_COUNT);
    }

    #[test]
    fn every_key_a_row_reads_is_a_key_the_walker_keeps() {
        for row in &ROWS {
            if let On::Attribute(key) = row.on {
                assert!(Key::ALL.contains(&key));
            }
            // A row with no kind names nothing; one with no sources is scoped (names nothing there).
            assert!(row.kind.is_some() || row.names.is_empty(), "{row:?}");
            assert!(
                !row.names.is_empty() || row.kind.is_none() || row.scope.is_some(),
                "{row:?}"
            );
        }
    }

    #[test]
    fn genai_span_names_are_read_by_their_subject_then_their_attribute() {
        assert_eq!(
            read("invoke_agent planner", "s", &[]),
            Some((Kind::Agent, Some("planner"), false))
        );
        assert_eq!(
            read("execute_tool search", "s", &[]),
            Some((Kind::Tool, Some("search"), false))
        );
        assert_eq!(
            read("invoke_workflow crew", "s", &[]),
            Some((Kind::Agent, Some("crew"), false))
        );
        assert_eq!(
            read("invoke_agent", "s", &[(AgentName, "budget")]),
            Some((Kind::Agent, Some("budget"), false))
        );
        assert_eq!(
            read("invoke_agent ", "s", &[]),
            Some((Kind::Agent, None, false))
        );
        // Not the prefix and a space: no name row.
        assert_eq!(read("invoke_agentx", "s", &[]), None);
        assert_eq!(
            read("invoke_agent a b", "s", &[]),
            Some((Kind::Agent, Some("a b"), false))
        );
    }

    #[test]
    fn a_dialect_kind_comes_before_the_operation_and_the_first_kind_key_wins() {
        let workflow = [
            (TlKind, "workflow"),
            (TlName, "graph"),
            (Operation, "invoke_agent"),
            (AgentName, "x"),
        ];
        assert_eq!(
            read("graph.workflow", "s", &workflow),
            Some((Kind::Agent, Some("graph"), false))
        );
        let both = [(OiKind, "TOOL"), (TlKind, "agent"), (OiToolName, "search")];
        assert_eq!(
            read("s", "s", &both),
            Some((Kind::Tool, Some("search"), false))
        );
        let both = [(TlKind, "agent"), (OiKind, "TOOL"), (TlName, "planner")];
        assert_eq!(
            read("s", "s", &both),
            Some((Kind::Agent, Some("planner"), false))
        );
        // An unknown kind value falls through to the operation.
        let unknown = [
            (OiKind, "LLM"),
            (Operation, "execute_tool"),
            (ToolName, "t"),
        ];
        assert_eq!(
            read("chat", "s", &unknown),
            Some((Kind::Tool, Some("t"), false))
        );
    }

    #[test]
    fn langchains_agent_guess_is_no_call_and_its_chain_is_a_conditional_agent() {
        let guess = [
            (OiKind, "AGENT"),
            (Operation, "invoke_agent"),
            (AgentName, "a"),
        ];
        assert_eq!(
            read("agent", OPENINFERENCE_LANGCHAIN, &guess),
            Some((Kind::Agent, Some("a"), false))
        );
        assert_eq!(read("agent", OPENINFERENCE_LANGCHAIN, &guess[..1]), None);
        assert_eq!(
            read("planner", OPENINFERENCE_LANGCHAIN, &[(OiKind, "CHAIN")]),
            Some((Kind::Agent, Some("planner"), true))
        );
        assert_eq!(read("planner", "other", &[(OiKind, "CHAIN")]), None);
        assert_eq!(
            read("x", "other", &[(OiKind, "AGENT"), (GraphNodeId, "node")]),
            Some((Kind::Agent, Some("node"), false))
        );
        assert_eq!(
            read("lookup", "s", &[(OiKind, "TOOL")]),
            Some((Kind::Tool, Some("lookup"), false))
        );
    }

    #[test]
    fn an_openinference_agent_with_no_name_attribute_is_named_by_its_span_names_stem() {
        // smolagents: `f"{agent.name}.run"`, no agent.name attribute.
        assert_eq!(
            read("planner.run", "s", &[(OiKind, "AGENT")]),
            Some((Kind::Agent, Some("planner"), false))
        );
        assert_eq!(
            read("team.planner.run", "s", &[(OiKind, "AGENT")]),
            Some((Kind::Agent, Some("team.planner"), false))
        );
        assert_eq!(
            read("planner.run", "s", &[(OiKind, "AGENT"), (OiAgentName, "a")]),
            Some((Kind::Agent, Some("a"), false))
        );
        // No dot, no name: Phoenix's `@tracer.agent` span `planner` is as unnamed as the OpenAI
        // Agents SDK's `Agent workflow` root, which is no agent.
        assert_eq!(
            read("planner", "s", &[(OiKind, "AGENT")]),
            Some((Kind::Agent, None, false))
        );
    }

    #[test]
    fn the_observability_sdks_kinds_name_their_calls_by_the_span_name() {
        let langfuse = [(LangfuseKind, "agent")];
        assert_eq!(
            read("planner", "langfuse-sdk", &langfuse),
            Some((Kind::Agent, Some("planner"), false))
        );
        assert_eq!(
            read("ask_budget", "s", &[(LangfuseKind, "tool")]),
            Some((Kind::Tool, Some("ask_budget"), false))
        );
        assert_eq!(read("model", "s", &[(LangfuseKind, "generation")]), None);
        // mlflow's type is a JSON string: the quotes are part of the value.
        assert_eq!(
            read("budget", "s", &[(MlflowKind, "\"AGENT\"")]),
            Some((Kind::Agent, Some("budget"), false))
        );
        assert_eq!(read("budget", "s", &[(MlflowKind, "AGENT")]), None);
        assert_eq!(
            read("ask_planner", "s", &[(MlflowKind, "\"TOOL\"")]),
            Some((Kind::Tool, Some("ask_planner"), false))
        );
        // Laminar names no agent.
        assert_eq!(read("planner", "s", &[(LaminarKind, "DEFAULT")]), None);
        assert_eq!(
            read("ask_budget", "s", &[(LaminarKind, "TOOL")]),
            Some((Kind::Tool, Some("ask_budget"), false))
        );
        let agentops = [(AgentopsKind, "agent"), (AgentopsName, "planner")];
        assert_eq!(
            read("x.agent", "agentops", &agentops),
            Some((Kind::Agent, Some("planner"), false))
        );
        assert_eq!(
            read("ask_budget.tool", "agentops", &[(AgentopsKind, "tool")]),
            Some((Kind::Tool, Some("ask_budget"), false))
        );
        assert_eq!(
            read("model.task", "agentops", &[(AgentopsKind, "task")]),
            None
        );
        // MLflow's pydantic-ai integration names every agent run after the method: no name, in
        // MLflow's scope alone (elsewhere its "AGENT" type reads it by the span name).
        let typed = [(MlflowKind, "\"AGENT\"")];
        for method in [
            "Agent.run",
            "Agent.run_sync",
            "Agent.run_stream",
            "Agent.run_stream_sync",
        ] {
            assert_eq!(
                read(method, MLFLOW_SCOPE, &typed).and_then(|(_, name, _)| name),
                None
            );
            assert_eq!(
                read(method, "other", &typed),
                Some((Kind::Agent, Some(method), false))
            );
        }
        // Laminar's LangGraph instrumentor: `execute_task X`, an agent only first below a tool, in
        // Laminar's scope alone.
        assert_eq!(
            read(
                "execute_task budget",
                LAMINAR_SCOPE,
                &[(Operation, "execute_task")]
            ),
            Some((Kind::Agent, Some("budget"), true))
        );
        assert_eq!(
            read(
                "execute_task budget",
                "other",
                &[(Operation, "execute_task")]
            ),
            None
        );
        // Langfuse's LangChain CallbackHandler: a graph's `chain`, an agent only first below a tool.
        assert_eq!(
            read("budget", "langfuse-sdk", &[(LangfuseKind, "chain")]),
            Some((Kind::Agent, Some("budget"), true))
        );
        // AgentOps' OpenAI Agents instrumentor: the span named after the agent or tool, no dot,
        // the name in agent.name / tool.name.
        let agent = [(AgentopsKind, "agent"), (OiAgentName, "planner")];
        assert_eq!(
            read("planner", "openai-agents", &agent),
            Some((Kind::Agent, Some("planner"), false))
        );
        let tool = [(AgentopsKind, "tool"), (OiToolName, "ask_budget")];
        assert_eq!(
            read("ask_budget", "openai-agents", &tool),
            Some((Kind::Tool, Some("ask_budget"), false))
        );
    }

    #[test]
    fn a_transfers_tool_span_is_named_by_its_tool_not_its_target() {
        let transfer = [(ToolName, "transfer_to_budget")];
        assert_eq!(
            read("execute_tool transfer_to_budget budget", "s", &transfer),
            Some((Kind::Tool, Some("transfer_to_budget"), false))
        );
    }

    #[test]
    fn a2a_messages_and_mcp_tool_calls_are_read_by_their_method_after_the_operation() {
        let send = [(A2aMethod, "SendMessage"), (AgentName, "budget")];
        assert_eq!(
            read("SendMessage", "a2a", &send),
            Some((Kind::Agent, Some("budget"), false))
        );
        let stream = [(A2aMethod, "SendStreamingMessage"), (AgentName, "b")];
        assert_eq!(
            read("SendStreamingMessage", "a2a", &stream),
            Some((Kind::Agent, Some("b"), false))
        );
        // Polling a task is no call, and a message with no agent card name is unnamed.
        let poll = [(A2aMethod, "GetTask"), (AgentName, "budget")];
        assert_eq!(read("GetTask", "a2a", &poll), None);
        assert_eq!(
            read("SendMessage", "a2a", &[(A2aMethod, "SendMessage")]),
            Some((Kind::Agent, None, false))
        );
        assert_eq!(
            read("tools/call search", "mcp", &[(McpMethod, "tools/call")]),
            Some((Kind::Tool, Some("search"), false))
        );
        let named = [(McpMethod, "tools/call"), (ToolName, "fetch")];
        assert_eq!(
            read("tools/call x", "mcp", &named),
            Some((Kind::Tool, Some("fetch"), false))
        );
        assert_eq!(
            read("initialize", "mcp", &[(McpMethod, "initialize")]),
            None
        );
        // The GenAI operation comes first.
        let both = [
            (McpMethod, "tools/call"),
            (Operation, "invoke_agent"),
            (AgentName, "a"),
        ];
        assert_eq!(
            read("tools/call x", "mcp", &both),
            Some((Kind::Agent, Some("a"), false))
        );
    }

    #[test]
    fn traceloop_agents_fall_back_to_the_genai_name_and_a_task_is_conditional() {
        let crewai = [
            (TlKind, "agent"),
            (Operation, "invoke_agent"),
            (AgentName, "planner"),
        ];
        assert_eq!(
            read("planner.agent", "s", &crewai),
            Some((Kind::Agent, Some("planner"), false))
        );
        assert_eq!(
            read("x.task", "s", &[(TlKind, "task"), (TlName, "x")]),
            Some((Kind::Agent, Some("x"), true))
        );
        // A task with no entity name: a call with no name.
        let unnamed = [(TlKind, "task"), (Operation, "invoke_agent")];
        assert_eq!(
            read("y.task", "s", &unnamed),
            Some((Kind::Agent, None, true))
        );
    }

    #[test]
    fn dspys_agents_name_nothing_and_openllmetrys_llamaindex_tools_are_their_steps_tool_name() {
        let dspy = [(Operation, "invoke_agent"), (AgentName, "dspy.ReAct")];
        assert_eq!(
            read("invoke_agent dspy.ReAct", GENAI_DSPY, &dspy),
            Some((Kind::Agent, None, false))
        );
        assert_eq!(
            read("invoke_agent dspy.ReAct", "other", &dspy),
            Some((Kind::Agent, Some("dspy.ReAct"), false))
        );
        let tool = [
            (TlKind, "task"),
            (TlName, "BaseWorkflowAgent.task"),
            (OiToolName, "ask_budget"),
        ];
        assert_eq!(
            read("BaseWorkflowAgent.task", TRACELOOP_LLAMAINDEX, &tool),
            Some((Kind::Tool, Some("ask_budget"), false))
        );
        assert_eq!(
            read("run.task", TRACELOOP_LLAMAINDEX, &tool[..2]),
            Some((Kind::Tool, None, false))
        );
        // Elsewhere a task is the conditional agent it was.
        assert_eq!(
            read("x.task", "other", &tool),
            Some((Kind::Agent, Some("BaseWorkflowAgent.task"), true))
        );
        // The rows the rules name are the unscoped ones.
        assert_eq!(find(NAME, "invoke_agent").row().scope, None);
        assert_eq!(find(TL_KIND, "task").row().kind, AGENT);
    }

    #[test]
    fn a_value_of_another_type_is_no_text() {
        let other = list(&[
            (OiKind, Value::Int(3)),
            (Operation, Value::Str("invoke_agent")),
        ]);
        let call = call_of(
            "x",
            "s",
            &Attributes::from_list(&other),
            &FileRows::default(),
        )
        .map(|call| (call.kind(), call.name));
        assert_eq!(call, Some((Kind::Agent, None)));
        let repeated = list(&[
            (AgentName, Value::Str("first")),
            (AgentName, Value::Str("second")),
        ]);
        assert_eq!(
            Attributes::from_list(&repeated).text(AgentName),
            Some("first")
        );
    }

    #[test]
    fn the_wrapper_pairs_name_the_rows_they_say() {
        let pairs: Vec<_> = WRAPPERS
            .iter()
            .map(|(wrapper, wrapped)| (wrapper.row().value, wrapped.row().value))
            .collect();
        assert_eq!(
            pairs,
            [
                ("invoke_workflow", "invoke_agent"),
                ("invoke_workflow", "invoke_agent"),
                ("invoke_agent", "workflow"),
                ("workflow", "agent"),
                ("task", "agent"),
            ]
        );
        let (workflow, agent) = WRAPPERS[0];
        assert!(!same_form_again(workflow, agent)); // the wrapper around its call: one call
        assert!(same_form_again(agent, workflow)); // the wrapper inside its call: a new run
        assert!(same_form_again(agent, agent));
        assert!(!same_form_again(find(NAME, "execute_tool"), agent));
    }

    fn spec(key: &str, value: &str, kind: Option<&str>, names: &[&str]) -> RowSpec {
        (
            "Acme".to_owned(),
            key.to_owned(),
            value.to_owned(),
            kind.map(str::to_owned),
            names.iter().map(|name| (*name).to_owned()).collect(),
            false,
            None,
        )
    }

    #[test]
    fn a_files_rows_read_after_the_built_in_rows_of_their_group() {
        let more = FileRows::new(vec![
            spec(
                "acme.type",
                "\"AGENT\"",
                Some("agent"),
                &["acme.entity", STEM],
            ),
            spec("acme.type", "\"LLM\"", None, &[]),
            spec(SPAN_NAME, "Running", Some("tool"), &[SUBJECT]),
            spec(
                "gen_ai.operation.name",
                "invoke_team",
                Some("agent"),
                &["acme.entity"],
            ),
        ])
        .expect("rows");
        assert_eq!(more.keys(), ["acme.type", "acme.entity"]);
        let (type_key, entity) = (KEY_COUNT as u16, KEY_COUNT as u16 + 1);
        let read = |name: &'static str, pairs: &[(u16, &'static str)]| {
            let list: Vec<_> = pairs
                .iter()
                .map(|&(key, text)| Attribute {
                    key,
                    value: Value::Str(text),
                })
                .collect();
            let attributes = Attributes::from_list(&list);
            call_of(name, "s", &attributes, &more).map(|call| (call.kind(), call.name, call.row.0))
        };
        let rows = ROWS.len() as u8;
        assert_eq!(
            read("run", &[(type_key, "\"AGENT\""), (entity, "planner")]),
            Some((Kind::Agent, Some("planner"), rows))
        );
        assert_eq!(
            read("planner.run", &[(type_key, "\"AGENT\"")]),
            Some((Kind::Agent, Some("planner"), rows))
        );
        // Without its quotes the value is another.
        assert_eq!(
            read("run", &[(type_key, "AGENT"), (entity, "planner")]),
            None
        );
        // A kind of no call falls through to the operation, the file's operation rows included.
        let team = [
            (type_key, "\"LLM\""),
            (Operation as u16, "invoke_team"),
            (entity, "crew"),
        ];
        assert_eq!(
            read("x", &team),
            Some((Kind::Agent, Some("crew"), rows + 3))
        );
        assert_eq!(
            read("Running search", &[]),
            Some((Kind::Tool, Some("search"), rows + 2))
        );
        // The built-in rows come first: a span name of theirs, an OpenInference kind.
        assert_eq!(
            read("invoke_agent a", &[(type_key, "\"AGENT\""), (entity, "b")]),
            Some((Kind::Agent, Some("a"), 1)) // row 0 is DSPy's scope's
        );
        let both = [
            (OiKind as u16, "TOOL"),
            (type_key, "\"AGENT\""),
            (OiToolName as u16, "t"),
        ];
        assert_eq!(read("x", &both).map(|call| call.1), Some(Some("t")));
        // The first kind key a span carries wins, a file's as a built-in one.
        let first = [
            (type_key, "\"AGENT\""),
            (entity, "p"),
            (OiKind as u16, "TOOL"),
        ];
        assert_eq!(read("x", &first).map(|call| call.1), Some(Some("p")));
    }

    #[test]
    fn a_malformed_row_is_an_error_naming_it() {
        let error = |specs: Vec<RowSpec>| FileRows::new(specs).expect_err("refused");
        assert_eq!(
            error(vec![
                spec("k", "v", Some("agent"), &["n"]),
                spec("k", "v", Some("robot"), &["n"])
            ]),
            "row 2: kind \"robot\": agent, tool or None"
        );
        assert!(error(vec![spec("k", "", Some("agent"), &["n"])]).starts_with("row 1: an empty"));
        assert!(
            error(vec![spec("k", "v", Some("agent"), &[])]).starts_with("row 1: a row with a kind")
        );
        assert!(
            error(vec![spec(SUBJECT, "v", Some("agent"), &["n"])])
                .starts_with("row 1: a row matches")
        );
        assert!(
            error(vec![spec("k", "v", Some("tool"), &[""])]).starts_with("row 1: an empty name")
        );
        let many = vec![spec("k", "v", None, &[]); MAX_FILE_ROWS + 1];
        assert!(error(many).contains("rows; at most"));
        assert!(FileRows::new(vec![spec("k", "v", None, &[]); MAX_FILE_ROWS]).is_ok());
    }
}
