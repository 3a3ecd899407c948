"""Planner and budget: two Claude Agent SDK agents that ask each other, on a scripted model.

The planner asks the budget agent what the offsite costs; the budget agent asks the planner what the
plan is; the planner asks the budget agent again, and so on. With a real model, that is the loop
that burns money, and the SDK's own limit (``max_turns``, per run) never meets it: every bounce is a
fresh run. Each agent is a ``query()`` run as that agent (the CLI's ``--agent``), with an in-process
SDK MCP tool named after the other agent whose handler runs the other agent's ``query()``.

The SDK runs the Claude Code CLI its wheel bundles. Here the CLI talks to a scripted model: a small
Messages API server on 127.0.0.1, started by this program (``ANTHROPIC_BASE_URL`` points at it; no
account, no key, nothing leaves the machine). It answers each agent's first request with a call of
its tool, and a tool result with a text answer; the scripts stop after ``MAX_TOOL_CALLS`` calls, so
that the program ends even when nothing stops the loop.

Without the guard (``python examples/claude_agent_sdk/app.py``) the agents bounce until the scripts
give up. Under the guard, with no change to this file::

    pip install '.[claude-agent-sdk]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/claude_agent_sdk/app.py

the budget agent's call back into the planner is denied (the planner is already on the path); the
budget agent reads the denial as its tool's error and answers with what it has, and so does the
planner. The spans are printed as JSON when the program ends.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from claude_agent_sdk import (
    AgentDefinition,
    ClaudeAgentOptions,
    ResultMessage,
    create_sdk_mcp_server,
    query,
    tool,
)

MAX_TOOL_CALLS = 6  # in all, both agents: where the scripts give up when nothing else stops them
tool_calls = 0


def scripted_reply(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The model: call the other agent at the start of a run, answer once a tool result is back."""
    global tool_calls
    tools = [t["name"] for t in request.get("tools") or ()]
    if not tools:
        return [{"type": "text", "text": "ok"}]  # one of the CLI's own requests (a title, say)
    me = "planner" if "mcp__team__budget" in tools else "budget"
    other = "budget" if me == "planner" else "planner"
    turn = request["messages"][-1]["content"]
    recent = [m["content"] for m in request["messages"][-2:] if isinstance(m["content"], list)]
    results = [block for content in recent for block in content if block.get("type") == "tool_result"]
    if results:
        said = results[-1]["content"]
        said = said if isinstance(said, str) else "".join(part.get("text", "") for part in said)
        print(f"  {me} got: {said[:160]!r}")
        return [{"type": "text", "text": f"{me}'s answer, from what {other} said"}]
    if tool_calls < MAX_TOOL_CALLS and turn:
        tool_calls += 1
        print(f"{me} calls {other} (tool call {tool_calls})")
        call = {"type": "tool_use", "id": f"toolu_{tool_calls}", "name": f"mcp__team__{other}"}
        return [{**call, "input": {"question": f"asked by {me}"}}]
    print(f"{me}: the script gives up")
    return [{"type": "text", "text": f"{me} gives up"}]


class MessagesAPI(BaseHTTPRequestHandler):
    """``POST /v1/messages``, streamed as the Messages API streams it (server-sent events)."""

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        blocks = scripted_reply(request)
        stop = "tool_use" if blocks[-1]["type"] == "tool_use" else "end_turn"
        usage = {"input_tokens": 10, "output_tokens": 5}
        message = {"id": f"msg_{id(request)}", "type": "message", "role": "assistant", "content": []}
        events = [("message_start", {"message": {**message, "model": request["model"], "usage": usage}})]
        for index, block in enumerate(blocks):
            if block["type"] == "tool_use":
                empty = {**block, "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            else:
                empty = {"type": "text", "text": ""}
                delta = {"type": "text_delta", "text": block["text"]}
            events.append(("content_block_start", {"index": index, "content_block": empty}))
            events.append(("content_block_delta", {"index": index, "delta": delta}))
            events.append(("content_block_stop", {"index": index}))
        events.append(("message_delta", {"delta": {"stop_reason": stop}, "usage": {"output_tokens": 5}}))
        events.append(("message_stop", {}))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for name, data in events:
            self.wfile.write(f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode())
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


def options(me: str, api: str, config: str) -> ClaudeAgentOptions:
    """``me``'s run: the CLI's ``--agent me``, with a tool that asks the other agent."""
    other = "budget" if me == "planner" else "planner"

    @tool(other, f"Ask the {other} agent.", {"question": str})
    async def ask(arguments: dict[str, Any]) -> dict[str, Any]:
        answer = await run(other, arguments["question"], api, config)
        return {"content": [{"type": "text", "text": answer}]}

    return ClaudeAgentOptions(
        model="claude-scripted",
        env={
            "ANTHROPIC_BASE_URL": api,  # the scripted model
            "ANTHROPIC_API_KEY": "sk-ant-scripted",
            "CLAUDE_CONFIG_DIR": config,  # the CLI's settings and transcripts: this run's folder
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
        cwd=config,
        setting_sources=[],
        tools=[],
        mcp_servers={"team": create_sdk_mcp_server("team", tools=[ask])},
        allowed_tools=[f"mcp__team__{other}"],
        agents={me: AgentDefinition(description=f"The {me} agent.", prompt=f"You are the {me} agent.")},
        extra_args={"agent": me},
    )


async def run(me: str, prompt: str, api: str, config: str) -> str:
    answer = ""
    async for message in query(prompt=prompt, options=options(me, api, config)):
        if isinstance(message, ResultMessage):
            answer = message.result or ""
    return answer


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), MessagesAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with tempfile.TemporaryDirectory() as config:
            answer = asyncio.run(run("planner", "Plan the team offsite", api, config))
    finally:
        server.shutdown()
        server.server_close()
    print(f"planner's final answer: {answer!r} after {tool_calls} tool calls")


if __name__ == "__main__":
    main()
