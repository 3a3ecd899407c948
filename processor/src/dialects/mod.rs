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

mod attributes;
mod file_rows;
mod keys;
mod read;
mod table;
#[cfg(test)]
mod tests;

pub use attributes::Attributes;
pub use file_rows::{
    FileRow, FileRows, MAX_FILE_ROWS, Match, Named, RowSpec, SPAN_NAME, STEM, SUBJECT,
};
pub use keys::{KEY_COUNT, Key};
pub use read::{Call, call_of};
pub(crate) use table::find;
pub use table::{
    AGENTOPS, GENAI, GENAI_DSPY, GUARD_SCOPE, KIND_KEYS, Kind, LAMINAR, LAMINAR_SCOPE, LANGFUSE,
    MLFLOW, MLFLOW_SCOPE, OI, OPENAI_AGENTS, OPENINFERENCE_LANGCHAIN, On, ROWS, Row, RowId, Source,
    TL, TRACELOOP_LLAMAINDEX, WRAPPERS, same_form_again,
};
