"""A run of the Claude Agent SDK as a hop, and the hooks that make its sub-agents and tools hops.

Every ``query()`` and every ``ClaudeSDKClient`` session makes one ``Query``, the SDK's end of the
CLI's control channel. The guard gives each one a :class:`Run`:

* at ``Query.__init__`` the run's hooks join the app's, after them (``PreToolUse`` and
  ``PostToolUseFailure`` matching the Agent tool and the MCP tools but those of the SDK MCP servers
  the guard wraps, every tool for ``PreToolUse`` while a model budget is on; ``PostToolUse``
  matching the MCP tools whose end the guard does not see itself; ``SubagentStart`` and
  ``SubagentStop`` where the CLI offers the Agent tool; ``UserPromptSubmit`` with guidance on), so
  the CLI asks the guard about every call that can be a hop, the sub-agents' included, but a wrapped
  server's tool calls, which the server decides itself (:mod:`._tools`);
* at ``Query.start``, before the CLI is read, the run's hop is decided: ``invoke_agent {name}``,
  where the name is the CLI's ``--agent`` (``extra_args={"agent": "planner"}``: the session runs as
  that agent); a run inside a hop of its own name (tool ``budget`` running agent ``budget``), or with
  no agent name inside any hop (a tool that asks another agent), is that hop's work, no hop of its
  own; else ``claude``. A refused run raises
  :class:`~otel_guard.DelegationRefused` from the ``query()`` iteration (from ``connect()``) before
  the prompt is sent, and the SDK closes the CLI. Its read loop, and every hook and tool the CLI asks
  for, run in the hop's context, and serve the run (:data:`._scope.SERVING`); the read loop tells the
  run who made each tool call (:mod:`._replies`);
* at ``Query.close``, however the run ends, every hop it opened ends.

Which tool call is a hop: the Agent tool (``Task`` in older CLIs), which starts a sub-agent, is
``invoke_agent {subagent_type}`` (``PreToolUse``), kept open until the sub-agent stops
(``SubagentStop``; the CLI may run it in the background); an MCP tool ``mcp__{server}__{tool}`` is
``execute_tool {tool}``: a wrapped SDK MCP server's call is decided by its server as it is about to
run it (:meth:`Run.open_call`) and ended when the tool returns, another server's is decided in
``PreToolUse`` and ended by ``PostToolUse``; the CLI's built-in tools delegate nothing and are no
hops. A sub-agent's calls are decided in the sub-agent's hop: a hook names its ``agent_id``; for a
server's call, the reply that made it names the Agent call that started its sub-agent (with no
sub-agent started or running, the call is the main thread's, and nothing is waited for). A refused
call in a hook is denied: ``permissionDecision: "deny"`` with the refusal's text as the reason; in
its server, it is the tool's error result with that text, the tool not run. The CLI gives the model
either as the call's error result; the model answers with what it has.

Budgets (:mod:`._usage`): the CLI makes the model requests, out of the guard's reach, so each one is
counted as its reply arrives (the run's read loop sees every assistant message, the sub-agents'
included, and a call waits for its reply). A reply that a spent tree should not have had (in enforce
mode) spends the run: every later tool call of the run is denied with the refusal, with
``continue: false``, which ends the turn: the run ends with a result, however deep the sub-agent
that spent it. So while a model budget is on, ``PreToolUse`` is asked about every call, a wrapped
server's too (its hop then reaches the server open: :data:`._scope.OPEN_CALLS`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable
from typing import Any, Final

import anyio
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from otel_guard.errors import DelegationRefused
from otel_guard.guard import Delegation, current_chain, delegate
from otel_guard.instrumentation._base import refusal_text
from otel_guard.instrumentation.claude_agent_sdk._scope import ENDING_SERVERS, OPEN_CALLS, SERVING, OpenCall
from otel_guard.prompt import guidance_for
from otel_guard.settings import current_settings

RUN_ATTRIBUTE: Final = "_otel_guard_run"
DEFAULT_NAME: Final = "claude"
AGENT_TOOLS: Final = frozenset({"Agent", "Task"})
"""The CLI's tool that starts a sub-agent (``Task`` before Claude Code 2.1)."""
GENERAL_PURPOSE: Final = "general-purpose"
HOP_TOOLS: Final = "mcp__.*|Agent|Task"
"""The hook matcher of the calls that can be hops: MCP tools and the sub-agent tool."""
MCP_TOOLS: Final = "mcp__.*"
"""The ``PostToolUse`` matcher where no tool server ends its calls' hops itself (an Agent call's hop
ends with its sub-agent: ``SubagentStop``)."""
REPLY_WAIT_SECONDS: Final = 1.0
"""How long a tool call waits for the reply that made it to be read (it comes within ms)."""

HookCallback = Callable[[Any, Any, Any], Any]


class Run:
    """One run's hops: its own, its open tool calls and sub-agents; whether it is spent."""

    def __init__(
        self,
        name: str | None,
        tools: Callable[[], dict[str, list[str]]] = dict,
        ending_servers: tuple[str, ...] = (),
        sub_agents: bool = True,
    ) -> None:
        self.name = name
        self._tools = tools  # read for guidance only: agent ("" for the main thread) -> its tools
        self.ending_servers = ending_servers  # the SDK MCP servers that end their calls' hops
        self.sub_agents = sub_agents  # the run may start sub-agents (the CLI offers the Agent tool)
        self.reading = False  # the read loop tells the run who made each tool call (_replies)
        self.hop: Delegation | None = None
        self.context: Context = otel_context.get_current()
        self.calls: dict[str, Delegation] = {}  # tool_use_id -> open MCP tool hop
        self.waiting: dict[str, list[tuple[str, Delegation, Context]]] = {}  # subagent_type -> not started
        self.agents: dict[str, tuple[Delegation, Context]] = {}  # agent_id -> running sub-agent
        self.spawned: dict[str, Context] = {}  # the Agent call's tool_use_id -> its sub-agent's context
        self.spent: str | None = None
        self.counted: set[str] = set()  # ids of the model replies counted
        self.counting = False  # the run's replies are counted (a model budget was on at its start)
        self.asked_about_every_call = False  # PreToolUse matches every tool (a model budget was on)
        self.callers: dict[str, Any] = {}  # tool_use_id read -> its reply's parent_tool_use_id
        self._awaited: dict[str, anyio.Event] = {}
        self.closed = False

    # -- the run's own hop -------------------------------------------------------------------

    async def begin(self) -> None:
        """Decide the run's hop (a refusal raises); its context is the run's from here on."""
        chain = current_chain()
        if chain is not None and (self.name is None or chain.hops[-1].agent == self.name):
            # The work of the hop it runs in: a tool named like the agent it runs is one call.
            self.context = otel_context.get_current()
            return
        self.hop = delegate(self.name or DEFAULT_NAME)
        self.context = await self.hop.astart()

    def end(self) -> None:
        """End every hop the run opened (the run's last)."""
        if self.closed:
            return
        self.closed = True
        for tool_use_id in list(self.calls):
            self.end_call(tool_use_id, None)
        for pending in self.waiting.values():
            for _, hop, _ in pending:
                hop.finish()
        self.waiting.clear()
        for hop, _ in self.agents.values():
            hop.finish()
        self.agents.clear()
        if self.hop is not None:
            self.hop.finish()
        # What an ended run holds it lets go: the SDK leaves the task of an SDK MCP server's session
        # to the garbage collector, and that task's context holds the run it served (SERVING).
        self._tools = dict

    @functools.cached_property
    def tools(self) -> dict[str, list[str]]:
        """Agent name ("" for the main thread) -> the tools it may call (read when guidance is on)."""
        return self._tools()

    def context_of(self, agent_id: Any) -> Context:
        """The context a call of ``agent_id`` (``None``: the main thread) is decided in."""
        found = self.agents.get(agent_id) if isinstance(agent_id, str) else None
        return found[1] if found is not None else self.context

    def context_of_reply(self, parent_tool_use_id: Any) -> Context:
        """The context of a model reply: its sub-agent's (named by the Agent call) or the run's."""
        if isinstance(parent_tool_use_id, str):
            return self.spawned.get(parent_tool_use_id, self.context)
        return self.context

    # -- the hooks -----------------------------------------------------------------------------

    def hooks(self) -> dict[str, tuple[str | None, HookCallback]]:
        """Hook event -> (the tools it matches, ``None``: all; the callback). The CLI asks the
        Python process over its control channel for each: only the calls that can be hops are
        asked about (and every call of a run that may be spent); the user turn only for guidance."""
        settings = current_settings()
        every_call = self.asked_about_every_call = settings.model_budgets_on
        hop_calls = HOP_TOOLS if every_call else _asked_by_the_cli(self.ending_servers)
        hooks: dict[str, tuple[str | None, HookCallback]] = {
            "PreToolUse": (None if every_call else hop_calls, self.pre_tool_use),
            "PostToolUse": (_ended_by_the_cli(self.ending_servers), self.post_tool_use),
            "PostToolUseFailure": (hop_calls, self.post_tool_use_failure),
        }
        if self.sub_agents:
            hooks["SubagentStart"] = (None, self.subagent_start)
            hooks["SubagentStop"] = (None, self.subagent_stop)
        if settings.situational_prompt:
            hooks["UserPromptSubmit"] = (None, self.user_prompt_submit)
        return hooks

    async def user_prompt_submit(self, data: Any, tool_use_id: Any, context: Any) -> dict[str, Any]:
        """The situational guidance, as context of the run's user turn (when it applies)."""
        if self.closed or not current_settings().situational_prompt:
            return {}
        token = otel_context.attach(self.context)
        try:
            prefix = guidance_for(self.name or DEFAULT_NAME, _tool_docs(self.tools.get("", [])))
        finally:
            otel_context.detach(token)
        if prefix is None:
            return {}
        return {"hookSpecificOutput": {"hookEventName": "UserPromptSubmit", "additionalContext": prefix}}

    def reply_read(self, calls: list[str], parent_tool_use_id: Any) -> None:
        """The reply that made these tool calls has been read (and counted, with a budget on); a
        sub-agent's names the Agent call that started it."""
        for call_id in calls:
            self.callers[call_id] = parent_tool_use_id
            event = self._awaited.pop(call_id, None)
            if event is not None:
                event.set()

    async def reply_of(self, call_id: str) -> Any:
        """The ``parent_tool_use_id`` of the reply that made ``call_id`` (``None``: the main
        thread's), once the reply has been read; a moment's wait at most.

        The CLI writes a reply and the requests of its tool calls within milliseconds of each other,
        in either order (measured); the call is decided once the reply is read (and counted, so that
        a reply that spent the tree denies the calls it made)."""
        if call_id not in self.callers:
            event = self._awaited.setdefault(call_id, anyio.Event())
            with anyio.move_on_after(REPLY_WAIT_SECONDS):
                await event.wait()
        return self.callers.get(call_id)

    async def _context_of_call(self, call_id: str) -> Context:
        """The context an SDK MCP call is decided in: that of the agent whose reply made it. With no
        sub-agent started or running, only the main thread makes calls: no reply is waited for."""
        if not self.reading or (not self.agents and not any(self.waiting.values())):
            return self.context
        return self.context_of_reply(await self.reply_of(call_id))

    async def open_call(self, call_id: str, tool: str) -> OpenCall | str | None:
        """An SDK MCP tool call no hook was asked about, as its server is about to run it: its hop,
        decided in the context of the agent that made it (a refusal: its text, the tool not run);
        ``None``: no hop (the run is over, or its calls are decided in ``PreToolUse``)."""
        if self.closed or self.asked_about_every_call:
            return None
        ctx = await self._context_of_call(call_id)
        hop = delegate(tool, kind="tool")
        token = otel_context.attach(ctx)
        try:
            opened = await hop.astart()
        except DelegationRefused as err:
            return refusal_text(err)
        finally:
            otel_context.detach(token)
        self.calls[call_id] = hop
        return OpenCall(opened, functools.partial(self.end_call, call_id))

    async def pre_tool_use(self, data: Any, tool_use_id: Any, context: Any) -> dict[str, Any]:
        if self.closed or not isinstance(data, dict):
            return {}
        tool = data.get("tool_name")
        call_id = data.get("tool_use_id") or tool_use_id
        if self.counting and isinstance(call_id, str):
            await self.reply_of(call_id)
        if self.spent is not None:
            return _denied(self.spent, stop=True)
        target = _hop_of(tool, data.get("tool_input"))
        if target is None or not isinstance(call_id, str):
            return {}
        name, kind = target
        hop = delegate(name, kind=kind)
        token = otel_context.attach(self.context_of(data.get("agent_id")))
        try:
            ctx = await hop.astart()
        except DelegationRefused as err:
            return _denied(refusal_text(err), stop=False)
        finally:
            otel_context.detach(token)
        if kind == "agent":
            self.waiting.setdefault(name, []).append((call_id, hop, ctx))
            self.spawned[call_id] = ctx
            return self._guided(name, data.get("tool_input"), ctx)
        self.calls[call_id] = hop
        OPEN_CALLS[call_id] = OpenCall(ctx, functools.partial(self.end_call, call_id))
        return {}

    def _guided(self, agent: str, tool_input: Any, ctx: Context) -> dict[str, Any]:
        """The Agent call's input with the guidance leading the sub-agent's prompt (its user turn),
        when ``situational_prompt`` is on and the sub-agent's tools include an agent on its path."""
        if not current_settings().situational_prompt or not isinstance(tool_input, dict):
            return {}
        prompt = tool_input.get("prompt")
        if not isinstance(prompt, str):
            return {}
        token = otel_context.attach(ctx)
        try:
            prefix = guidance_for(agent, _tool_docs(self.tools.get(agent, [])))
        finally:
            otel_context.detach(token)
        if prefix is None:
            return {}
        updated = {**tool_input, "prompt": f"{prefix}\n\n{prompt}"}
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "updatedInput": updated}}

    async def post_tool_use(self, data: Any, tool_use_id: Any, context: Any) -> dict[str, Any]:
        self._call_ended(data, tool_use_id, None)
        return {}

    async def post_tool_use_failure(self, data: Any, tool_use_id: Any, context: Any) -> dict[str, Any]:
        error = data.get("error") if isinstance(data, dict) else None
        self._call_ended(data, tool_use_id, RuntimeError(str(error or "tool call failed")))
        return {}

    def end_call(self, call_id: str, exc: BaseException | None) -> bool:
        """End the hop of the MCP tool call ``call_id`` (``exc``: its error); whether it was open."""
        hop = self.calls.pop(call_id, None)
        if hop is None:
            return False
        OPEN_CALLS.pop(call_id, None)
        hop.finish(exc)
        return True

    def _call_ended(self, data: Any, tool_use_id: Any, exc: BaseException | None) -> None:
        call_id = data.get("tool_use_id") if isinstance(data, dict) else None
        call_id = call_id or tool_use_id
        if not isinstance(call_id, str) or self.end_call(call_id, exc):
            return
        if exc is not None:
            # A sub-agent call that failed before its sub-agent started: its hop ends here.
            for pending in self.waiting.values():
                for entry in pending:
                    if entry[0] == call_id:
                        pending.remove(entry)
                        entry[1].finish(exc)
                        return

    async def subagent_start(self, data: Any, tool_use_id: Any, context: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            return {}
        agent_id, agent_type = data.get("agent_id"), data.get("agent_type")
        pending = self.waiting.get(agent_type) if isinstance(agent_type, str) else None
        if pending and isinstance(agent_id, str):
            _, hop, ctx = pending.pop(0)
            self.agents[agent_id] = (hop, ctx)
        return {}

    async def subagent_stop(self, data: Any, tool_use_id: Any, context: Any) -> dict[str, Any]:
        agent_id = data.get("agent_id") if isinstance(data, dict) else None
        found = self.agents.pop(agent_id, None) if isinstance(agent_id, str) else None
        if found is not None:
            found[0].finish()
        return {}


def _hop_of(tool: Any, tool_input: Any) -> tuple[str, Any] | None:
    """(hop name, kind) of a call of ``tool``; ``None``: the call is no hop."""
    if not isinstance(tool, str):
        return None
    if tool in AGENT_TOOLS:
        subagent = tool_input.get("subagent_type") if isinstance(tool_input, dict) else None
        return (subagent if isinstance(subagent, str) and subagent else GENERAL_PURPOSE), "agent"
    if tool.startswith("mcp__"):
        name = tool.split("__", 2)[-1]
        return (name or tool), "tool"
    return None


@functools.lru_cache(maxsize=64)
def _asked_by_the_cli(ending_servers: tuple[str, ...]) -> str:
    """The ``PreToolUse`` matcher (no model budget on): the calls that can be hops but the tools of
    ``ending_servers``, whose calls their server decides (:mod:`._tools`)."""
    if not ending_servers:
        return HOP_TOOLS
    return f"^(?:mcp__(?!(?:{_server_names(ending_servers)})__).*|Agent|Task)$"


@functools.lru_cache(maxsize=64)
def _ended_by_the_cli(ending_servers: tuple[str, ...]) -> str:
    """The ``PostToolUse`` matcher: the MCP tools but those of ``ending_servers``.

    The CLI names a tool ``mcp__{server}__{tool}`` with every character of the server's name but
    ``[a-zA-Z0-9_-]`` made ``_``; it tests a matcher as a JavaScript ``RegExp`` (a lookahead too)."""
    if not ending_servers:
        return MCP_TOOLS
    return f"^mcp__(?!(?:{_server_names(ending_servers)})__)"


def _server_names(servers: tuple[str, ...]) -> str:
    """The alternatives of a matcher for the tools of ``servers``: each name as the CLI writes it in
    ``mcp__{server}__{tool}`` (every character but ``[a-zA-Z0-9_-]`` made ``_``)."""
    return "|".join(sorted({re.sub(r"[^a-zA-Z0-9_-]", "_", name) for name in servers}))


def _tool_docs(tools: list[str]) -> dict[str, str | None]:
    """Hop name -> description (none known) of each tool in ``tools`` that is a hop."""
    docs: dict[str, str | None] = {}
    for name in tools:
        target = _hop_of(name, {}) if name not in AGENT_TOOLS else None
        if target is not None:
            docs[target[0]] = None
    return docs


def _denied(reason: str, *, stop: bool) -> dict[str, Any]:
    """A ``PreToolUse`` answer that denies the call with ``reason`` (and, ``stop``, ends the turn)."""
    output: dict[str, Any] = {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        }
    }
    if stop:
        output["continue_"] = False
        output["stopReason"] = reason
    return output


# -- the wrappers ------------------------------------------------------------------------------


def _may_start_sub_agents(options: Any) -> bool:
    """Whether the run's CLI offers the Agent tool: not when the run's ``tools`` (the CLI's
    ``--tools``) are a list without it, which disables it "in subagents as well as here"."""
    tools = getattr(options, "tools", None)
    return not isinstance(tools, list) or any(tool in AGENT_TOOLS for tool in tools)


def _agent_name(options: Any) -> str | None:
    """The CLI's ``--agent`` of the run (``extra_args={"agent": ...}``), if it has one."""
    extra = getattr(options, "extra_args", None)
    name = extra.get("agent") if isinstance(extra, dict) else None
    return name if isinstance(name, str) and name else None


def _tools_of(options: Any, agents: Any) -> dict[str, list[str]]:
    """Agent name ("" for the main thread) -> the tools it may call: the run's allowed tools, and
    each sub-agent's own (its ``AgentDefinition``'s ``tools``, else the run's), sub-agents by name."""
    allowed = [name for name in getattr(options, "allowed_tools", None) or () if isinstance(name, str)]
    agents = agents or {}
    tools = {"": allowed + [str(name) for name in agents]}
    for name, definition in agents.items():
        own = definition.get("tools") if isinstance(definition, dict) else None
        tools[str(name)] = [str(t) for t in own] if isinstance(own, list) else allowed
    return tools


def initializing(init: Callable[..., None]) -> Callable[..., None]:
    """``Query.__init__``, after which the run gets its :class:`Run` and the guard's hooks (unless
    instrumentation is suppressed)."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if is_instrumentation_enabled():
            _join(self, kwargs.get("transport", args[0] if args else None))

    return __init__


def _join(query: Any, transport: Any) -> None:
    """The run of ``query`` (a new ``Query``) made, and its hooks joined to the app's."""
    servers = getattr(query, "sdk_mcp_servers", None)
    ending = tuple(str(name) for name, server in (servers or {}).items() if server in ENDING_SERVERS)
    options = getattr(transport, "_options", None)
    # The options and agents, not the Query: the Query holds the run (its hooks), and a run holding
    # the Query would make the two a cycle, left with all they hold to the garbage collector.
    tools = functools.partial(_tools_of, options, getattr(query, "_agents", None))
    run = Run(_agent_name(options), tools, ending, _may_start_sub_agents(options))
    hooks = query.hooks
    for event, (matcher, callback) in run.hooks().items():
        hooks.setdefault(event, []).append({"matcher": matcher, "hooks": [callback]})
    setattr(query, RUN_ATTRIBUTE, run)


def starting(start: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``Query.start``: the run's hop decided, then the CLI read inside it."""

    async def start_(self: Any, *args: Any, **kwargs: Any) -> Any:
        run = getattr(self, RUN_ATTRIBUTE, None)
        if not isinstance(run, Run) or run.hop is not None:
            serving = SERVING.set(None)  # its SDK MCP servers serve no run of the guard's
            try:
                return await start(self, *args, **kwargs)
            finally:
                SERVING.reset(serving)
        await run.begin()  # a refusal raises here: the SDK closes the query
        run.counting = current_settings().model_budgets_on
        # Who made an SDK MCP call matters only where a sub-agent may make one.
        run.reading = run.counting or bool(run.ending_servers and run.sub_agents)
        if run.reading:
            from otel_guard.instrumentation.claude_agent_sdk._replies import ReadingTransport

            self.transport = ReadingTransport(self.transport, run)
        token = otel_context.attach(run.context)
        serving = SERVING.set(run)  # the read loop's tasks (its SDK MCP servers') serve this run
        try:
            return await start(self, *args, **kwargs)
        finally:
            SERVING.reset(serving)
            otel_context.detach(token)

    return start_


def closing(close: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``Query.close``: the run's hops end with it (the SDK closes a run's Query several times)."""

    async def close_(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await close(self, *args, **kwargs)
        finally:
            run = getattr(self, RUN_ATTRIBUTE, None)
            if isinstance(run, Run):
                run.end()

    return close_
