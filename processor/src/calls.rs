//! Calls -> hops: one call is one hop, however many spans record it.
//!
//! A named span directly below an entry of the same name on its path is that call again when
//! [`same_call`] says so; a span read as an agent run directly below a tool call is that tool's
//! run (the tool's entry gives way to the agent's); a call only first below a tool (a conditional
//! row) anywhere else is a link. Every other named span is a new call ([`step`]).
//!
//! | above | below | one call, or a new one |
//! |---|---|---|
//! | a caller a remote agent named (`gen_ai.caller.agent.name`) | anything | new |
//! | anything | the guard's tool span, under another instrumentation's tool span | one |
//! | anything | the guard's span | new when its chain holds the name more often than the path above (`otel_guard.name_depth`) |
//! | the guard's span (or its chain) | another instrumentation's span | one |
//! | the client side of a remote call | its server side (either side suffices) | one |
//! | an agent | a tool named after it | new |
//! | one instrumentation | another (scopes differ) | one |
//! | one instrumentation, two rows | a wrapper around its call | one |
//! | one instrumentation, one row (or a wrapper inside the call it wraps) | | new |
//!
//! What a reader would not guess: the rules read only the entry directly above and this span,
//! never the spans beside them; which of two spans of one call came first changes nothing.
#![forbid(unsafe_code)]

use crate::dialects::{Key, Kind, On, RowId, find, same_form_again};

/// What the rules read of a named entry on a path (a span's call, a hop of the guard's chain, or
/// a caller named by its callee).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hop {
    pub kind: Kind,
    /// The row that read the span; None for a chain's hop or a named caller.
    pub row: Option<RowId>,
    /// The instrumentation scope (its name's hash: equal names, equal scopes).
    pub scope: u64,
    /// The client side of a remote call (CLIENT, PRODUCER).
    pub client: bool,
    /// The server side (SERVER, CONSUMER).
    pub server: bool,
    /// The inline guard's span, or a hop of its chain.
    pub guard: bool,
    /// Only the callee's `gen_ai.caller.agent.name` put it here.
    pub caller: bool,
    /// How often the guard's chain holds the name (the guard's spans only; 0 otherwise).
    pub name_depth: u32,
    /// A transfer (a handoff): its spans mark it as one (`otel_guard.hop.kind` `transfer`, or the
    /// conventions' `gen_ai.transfer.mode` `pass_control`). The agent before it on a path handed
    /// off and waits for no answer: a return to that agent is no cycle.
    pub transfer: bool,
}

pub const SPAN_KIND_SERVER: i32 = 2;
pub const SPAN_KIND_CLIENT: i32 = 3;
pub const SPAN_KIND_PRODUCER: i32 = 4;
pub const SPAN_KIND_CONSUMER: i32 = 5;

impl Hop {
    /// A span's call: `kind` its call's kind, `span_kind` its OTLP kind.
    pub fn of_span(
        kind: Kind,
        row: RowId,
        scope: u64,
        span_kind: i32,
        guard: bool,
        name_depth: i64,
        transfer: bool,
    ) -> Hop {
        Hop {
            kind,
            row: Some(row),
            scope,
            client: matches!(span_kind, SPAN_KIND_CLIENT | SPAN_KIND_PRODUCER),
            server: matches!(span_kind, SPAN_KIND_SERVER | SPAN_KIND_CONSUMER),
            guard,
            caller: false,
            name_depth: if guard {
                u32::try_from(name_depth.max(0)).unwrap_or(u32::MAX)
            } else {
                0
            },
            transfer,
        }
    }

    /// An earlier hop of the guard's chain, as a path entry.
    pub const fn chained() -> Hop {
        Hop {
            kind: Kind::Agent,
            row: None,
            scope: 0,
            client: false,
            server: false,
            guard: true,
            caller: false,
            name_depth: 0,
            transfer: false,
        }
    }

    /// The agent a trace's first span says called it.
    pub const fn named_caller() -> Hop {
        Hop {
            guard: false,
            caller: true,
            ..Hop::chained()
        }
    }
}

/// Whether `below`, named as `above` and directly under it, records the same call. `repeats`:
/// how often the name stands on the path above (for the guard's span).
pub fn same_call(above: &Hop, below: &Hop, repeats: usize) -> bool {
    if above.caller {
        return false; // the caller a remote agent named: another call by definition
    }
    if below.guard {
        if below.kind == Kind::Tool && above.kind == Kind::Tool && !above.guard {
            return true; // the guard's span of a tool call another instrumentation recorded first
        }
        // A new hop when its chain holds the name more often than the path above it.
        return usize::try_from(below.name_depth).unwrap_or(usize::MAX) <= repeats;
    }
    if above.guard {
        return true; // another instrumentation's span of the call the guard's span recorded
    }
    if above.client || below.server {
        return true; // the two sides of a remote call
    }
    if above.kind == Kind::Agent && below.kind == Kind::Tool {
        return false; // an agent that calls a tool named after itself
    }
    if above.scope != below.scope {
        return true; // two instrumentations recording one call
    }
    // One instrumentation: a wrapper read by another row is the call; the same row again (or a
    // wrapper's row inside the call it wraps) a new run.
    match (above.row, below.row) {
        (Some(above), Some(below)) => !same_form_again(above, below),
        _ => true,
    }
}

/// What a call span is on its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// No call here (a call only first below a tool, elsewhere): the span is a link.
    Link,
    /// An agent run directly below a tool call: the tool's run.
    RunOfTool,
    /// The call of the entry directly above, again.
    Again,
    /// A new call.
    New,
}

/// The step of a call span (`below`, read by a `conditional` row or not) whose path so far ends
/// in `last` (None: it starts a path), `same_name` whether `last` bears its name, `repeats` how
/// often its name stands on that path.
pub fn step(
    last: Option<&Hop>,
    same_name: bool,
    below: &Hop,
    conditional: bool,
    repeats: usize,
) -> Step {
    let Some(last) = last else {
        return Step::New;
    };
    if conditional && last.kind != Kind::Tool {
        return Step::Link;
    }
    if last.kind == Kind::Tool && below.kind == Kind::Agent {
        return Step::RunOfTool;
    }
    if same_name && same_call(last, below, repeats) {
        return Step::Again;
    }
    Step::New
}

impl Step {
    /// How docs/processor/dialects.md says it.
    pub fn describe(self) -> &'static str {
        match self {
            Step::Link => "a link (no call)",
            Step::RunOfTool => "the tool's run, in the agent's name",
            Step::Again => "one call",
            Step::New => "a new call",
        }
    }
}

/// One case of the rules, for the docs: a path that ends in `last` (None: nothing named above)
/// and a call span `this`, of the same name or not; `repeats` how often its name stands on the
/// path. [`CASES`] holds one per rule, in the order [`step`] and [`same_call`] read them.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub above: &'static str,
    pub below: &'static str,
    pub last: Option<Hop>,
    pub this: Hop,
    pub same_name: bool,
    pub repeats: usize,
}

impl Case {
    pub fn step(&self) -> Step {
        let conditional = self.this.row.is_some_and(|row| row.row().conditional);
        step(
            self.last.as_ref(),
            self.same_name,
            &self.this,
            conditional,
            self.repeats,
        )
    }
}

const fn hop(kind: Kind, row: RowId, scope: u64) -> Hop {
    Hop {
        kind,
        row: Some(row),
        scope,
        client: false,
        server: false,
        guard: false,
        caller: false,
        name_depth: 0,
        transfer: false,
    }
}

const fn with(mut hop: Hop, client: bool, server: bool, guard: bool, name_depth: u32) -> Hop {
    hop.client = client;
    hop.server = server;
    hop.guard = guard;
    hop.name_depth = name_depth;
    hop
}

const AGENT_ROW: RowId = find(On::SpanName, "invoke_agent");
const TOOL_ROW: RowId = find(On::SpanName, "execute_tool");
const WORKFLOW_ROW: RowId = find(On::SpanName, "invoke_workflow");
const TASK_ROW: RowId = find(On::Attribute(Key::TlKind), "task");
const AGENT: Hop = hop(Kind::Agent, AGENT_ROW, 1);
const TOOL: Hop = hop(Kind::Tool, TOOL_ROW, 1);
const GUARD: u64 = 7;

const fn case(
    above: &'static str,
    below: &'static str,
    last: Option<Hop>,
    this: Hop,
    same_name: bool,
    repeats: usize,
) -> Case {
    Case {
        above,
        below,
        last,
        this,
        same_name,
        repeats,
    }
}

#[rustfmt::skip]
pub const CASES: [Case; 16] = [
    case("nothing named", "any call", None, AGENT, false, 0),
    case("an agent run, or no tool call", "a call of a row read only first below a tool (Traceloop's `task`, LangChain's graph run)",
        Some(AGENT), hop(Kind::Agent, TASK_ROW, 1), false, 0),
    case("a tool call", "an agent run directly below it, whatever its name", Some(TOOL), AGENT, false, 0),
    case("a tool call", "a call of a row read only first below a tool", Some(TOOL), hop(Kind::Agent, TASK_ROW, 1), false, 0),
    case("another name", "a call", Some(AGENT), hop(Kind::Tool, TOOL_ROW, 2), false, 0),
    case("a caller a trace's first span names (`gen_ai.caller.agent.name`, `gen_ai.caller.name`)", "a call of that name",
        Some(Hop::named_caller()), AGENT, true, 1),
    case("another instrumentation's tool call", "the guard's span of a tool of that name",
        Some(TOOL), with(hop(Kind::Tool, TOOL_ROW, GUARD), false, false, true, 9), true, 1),
    case("a call of the name", "the guard's span, its chain holding the name more often than the path above (`otel_guard.name_depth`)",
        Some(AGENT), with(hop(Kind::Agent, AGENT_ROW, GUARD), false, false, true, 2), true, 1),
    case("a call of the name", "the guard's span, its chain holding the name no more often than the path above",
        Some(AGENT), with(hop(Kind::Agent, AGENT_ROW, GUARD), false, false, true, 1), true, 1),
    case("the guard's span, or a hop of its chain", "another instrumentation's span of the name",
        Some(with(hop(Kind::Agent, AGENT_ROW, GUARD), false, false, true, 1)), AGENT, true, 1),
    case("the client side of a remote call (CLIENT, PRODUCER)", "a span of the name",
        Some(with(AGENT, true, false, false, 0)), AGENT, true, 1),
    case("a span of the name", "the server side of a remote call (SERVER, CONSUMER)",
        Some(AGENT), with(AGENT, false, true, false, 0), true, 1),
    case("an agent run", "a tool named after it", Some(AGENT), TOOL, true, 1),
    case("one instrumentation's span", "another instrumentation's span of the name (scopes differ)",
        Some(AGENT), hop(Kind::Agent, AGENT_ROW, 2), true, 1),
    case("a wrapper: `invoke_workflow X`", "the call it wraps, one instrumentation: `invoke_agent X`",
        Some(hop(Kind::Agent, WORKFLOW_ROW, 1)), AGENT, true, 1),
    case("`invoke_agent X`", "the same row again, one instrumentation: `invoke_agent X` (or its wrapper's, `invoke_workflow X`)",
        Some(AGENT), AGENT, true, 1),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialects::ROWS;

    fn row(value: &str, on_name: bool) -> RowId {
        let at = ROWS
            .iter()
            .position(|row| {
                row.value == value
                    && (row.on == crate::dialects::On::SpanName) == on_name
                    && row.kind.is_some()
                    && row.scope.is_none()
            })
            .expect("a row");
        RowId(u8::try_from(at).expect("few rows"))
    }

    fn span(kind: Kind, value: &str, scope: u64) -> Hop {
        Hop::of_span(kind, row(value, true), scope, 1, false, 0, false)
    }

    #[test]
    fn one_instrumentation_one_row_is_a_new_run_and_a_wrapper_one_call() {
        let agent = span(Kind::Agent, "invoke_agent", 1);
        let workflow = span(Kind::Agent, "invoke_workflow", 1);
        assert!(!same_call(&agent, &agent, 1));
        assert!(same_call(&workflow, &agent, 1)); // ADK: invoke_workflow X around invoke_agent X
        assert!(!same_call(&agent, &workflow, 1)); // the run of X starts a workflow of X: new
        let other = span(Kind::Agent, "invoke_agent", 2);
        assert!(same_call(&agent, &other, 1)); // two instrumentations, one call
    }

    #[test]
    fn remote_sides_guard_spans_and_named_callers() {
        let mut client = span(Kind::Agent, "invoke_agent", 1);
        client.client = true;
        let agent = span(Kind::Agent, "invoke_agent", 1);
        assert!(same_call(&client, &agent, 1));
        let mut server = agent;
        server.server = true;
        assert!(same_call(&agent, &server, 1));
        assert!(!same_call(&Hop::named_caller(), &server, 1));
        let guard = Hop::of_span(Kind::Agent, row("invoke_agent", true), 7, 1, true, 2, false);
        assert!(!same_call(&agent, &guard, 1)); // its chain holds the name twice: a new hop
        assert!(same_call(&agent, &guard, 2));
        assert!(same_call(&guard, &agent, 1)); // the runtime's span of the guard's call
        assert!(same_call(&Hop::chained(), &agent, 1));
        let tool = span(Kind::Tool, "execute_tool", 1);
        let guard_tool = Hop::of_span(Kind::Tool, row("execute_tool", true), 7, 1, true, 5, false);
        assert!(same_call(&tool, &guard_tool, 0));
        assert!(!same_call(&agent, &tool, 1)); // an agent calling a tool named after itself
        assert_eq!(
            Hop::of_span(
                Kind::Agent,
                row("invoke_agent", true),
                1,
                1,
                false,
                9,
                false
            )
            .name_depth,
            0
        );
        assert_eq!(
            Hop::of_span(
                Kind::Agent,
                row("invoke_agent", true),
                1,
                1,
                true,
                -3,
                false
            )
            .name_depth,
            0
        );
    }

    #[test]
    fn each_case_is_the_step_the_docs_say() {
        let steps: Vec<_> = CASES.iter().map(|case| case.step()).collect();
        use Step::*;
        assert_eq!(
            steps,
            [
                New, Link, RunOfTool, RunOfTool, New, New, Again, New, Again, Again, Again, Again,
                New, Again, Again, New
            ]
        );
        let workflow = hop(Kind::Agent, WORKFLOW_ROW, 1);
        assert!(!same_call(&AGENT, &workflow, 1)); // the run of X starts a workflow of X: new
    }

    #[test]
    fn the_steps() {
        let agent = span(Kind::Agent, "invoke_agent", 1);
        let tool = span(Kind::Tool, "execute_tool", 1);
        assert_eq!(step(None, false, &agent, true, 0), Step::New);
        assert_eq!(step(Some(&agent), false, &agent, true, 0), Step::Link);
        assert_eq!(step(Some(&tool), false, &agent, true, 0), Step::RunOfTool);
        assert_eq!(step(Some(&tool), true, &agent, false, 1), Step::RunOfTool);
        assert_eq!(step(Some(&agent), true, &agent, false, 1), Step::New);
        assert_eq!(step(Some(&agent), false, &tool, false, 0), Step::New);
        let other = span(Kind::Agent, "invoke_agent", 2);
        assert_eq!(step(Some(&agent), true, &other, false, 1), Step::Again);
        assert_eq!(step(Some(&agent), false, &other, false, 0), Step::New);
    }
}
