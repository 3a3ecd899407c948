//! The attribute keys the engine reads ([`Key`]), in the order of their indices.
//!
//! What a reader would not guess: a `Key`'s discriminant is its index in the decoder's kept keys
//! ([`Key::ALL`], in this order), so a decoded attribute's key index is its `Key` with no lookup;
//! a dialects file's own keys are indexed after these.
#![forbid(unsafe_code)]

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
