//! The built-in dialect table as data: one [`Row`] a rule, read in order, and the wrapper pairs.
//!
//! What a reader would not guess: the rows' order is the rule (span-name rows, kind rows,
//! operation rows, protocol rows), and [`find`] looks a row up at compile time, so a rule or a
//! wrapper pair naming a row the table lacks fails the build, not a test.
#![forbid(unsafe_code)]

use super::Key;

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

pub(super) const AGENT: Option<Kind> = Some(Kind::Agent);
const TOOL: Option<Kind> = Some(Kind::Tool);
pub(super) const NAME: On = On::SpanName;
const OI_KIND: On = On::Attribute(OiKind);
pub(super) const TL_KIND: On = On::Attribute(TlKind);
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

/// The dialect kind keys: [`super::call_of`] reads the one a span carries first.
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
