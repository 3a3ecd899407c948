//! The reading of spans through the whole built-in table: each dialect's rows, as
//! [`super::call_of`] reads them.
//!
//! What a reader would not guess: these read with no dialects file (`FileRows::default()`); a
//! file's rows are tested beside their code, in `file_rows.rs`.
#![forbid(unsafe_code)]

use super::Key::*;
use super::table::{AGENT, NAME, TL_KIND};
use super::*;
use crate::decode::{Attribute, Value};

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
