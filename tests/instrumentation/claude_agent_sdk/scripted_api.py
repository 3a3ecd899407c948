"""A scripted Anthropic Messages API on 127.0.0.1: the model the Claude Code CLI talks to in the tests.

The Claude Agent SDK runs the Claude Code CLI its wheel bundles; the CLI sends every model request to
``ANTHROPIC_BASE_URL`` + ``/v1/messages``. :class:`ScriptedAPI` is a real HTTP server there (a
``ThreadingHTTPServer`` on a free port of 127.0.0.1, started and stopped by its user) that answers
as the real API does: ``stream: true`` requests with server-sent events (``message_start``,
``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta`` with the stop reason and usage,
``message_stop``), others with one JSON message; ``/v1/messages/count_tokens`` with a count.

What it answers is the script's: a function from the request's JSON body to the content blocks of
the reply (``{"type": "text", ...}``, ``{"type": "tool_use", "name": ..., "input": ...}``), as a
model reacts to what it receives. Every request is recorded. The CLI's own side requests (a title,
a quota check: requests that offer no tools) get a short text answer from :func:`side_request`.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Script = Callable[[dict[str, Any]], list[dict[str, Any]]]

_ids = itertools.count(1)
USAGE = {"input_tokens": 10, "output_tokens": 5}
"""What every scripted reply reports using."""


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{next(_ids):06d}", "name": name, "input": arguments}


def last_user_blocks(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The content blocks of the request's turn: every message after the model's last reply (the
    user's prompt or tool results, and the CLI's own notes, which it sends in messages of their own)."""
    blocks: list[dict[str, Any]] = []
    for message in reversed(request["messages"]):
        if message.get("role") == "assistant":
            break
        content = message["content"]
        blocks[:0] = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    return blocks


def tool_results(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [block for block in last_user_blocks(request) if block.get("type") == "tool_result"]


def result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or () if isinstance(part, dict))


def prompt_text(request: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in last_user_blocks(request) if b.get("type") == "text")


def system_text(request: dict[str, Any]) -> str:
    system = request.get("system")
    if isinstance(system, str):
        return system
    return "".join(part.get("text", "") for part in system or () if isinstance(part, dict))


def tool_names(request: dict[str, Any]) -> list[str]:
    return [tool.get("name", "") for tool in request.get("tools") or ()]


def side_request(request: dict[str, Any]) -> bool:
    """A request of the CLI's own (no tools offered): not one of an agent's turns."""
    return not request.get("tools")


class ScriptedAPI:
    """The Messages API on 127.0.0.1, answering with ``script``; a context manager."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                path = self.path.split("?")[0]
                if path.endswith("/count_tokens"):
                    self._json({"input_tokens": 10})
                elif path.endswith("/v1/messages"):
                    api._answer(self, body)
                else:
                    self._json({"type": "error", "error": {"type": "not_found_error", "message": path}}, 404)

            def do_GET(self) -> None:
                self._json({"type": "error", "error": {"type": "not_found_error", "message": self.path}}, 404)

            def do_HEAD(self) -> None:
                self._json({}, 404)

            def _json(self, payload: Any, status: int = 200) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def agent_requests(self) -> list[dict[str, Any]]:
        """The requests that were an agent's turn (tools offered), in the order they came."""
        with self._lock:
            return [request for request in self.requests if not side_request(request)]

    def __enter__(self) -> ScriptedAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _answer(self, handler: BaseHTTPRequestHandler, request: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(request)
        blocks = [text("ok")] if side_request(request) else self.script(request)
        stop_reason = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
        message_id = f"msg_{next(_ids):06d}"
        model = request.get("model", "claude-scripted")
        if not request.get("stream"):
            payload = {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": blocks,
                "stop_reason": stop_reason,
                "stop_sequence": None,
                "usage": USAGE,
            }
            handler._json(payload)  # type: ignore[attr-defined]
            return
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("cache-control", "no-cache")
        handler.send_header("connection", "close")
        handler.end_headers()
        for event, data in _events(message_id, model, blocks, stop_reason):
            handler.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
        handler.wfile.flush()
        handler.close_connection = True


def _events(
    message_id: str, model: str, blocks: list[dict[str, Any]], stop_reason: str
) -> list[tuple[str, dict[str, Any]]]:
    """The server-sent events of one streamed reply, as the Messages API sends them."""
    start = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": USAGE["input_tokens"], "output_tokens": 1},
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            opened = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            opened = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": index, "content_block": opened})
        )
        events.append(
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": USAGE["output_tokens"]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events
