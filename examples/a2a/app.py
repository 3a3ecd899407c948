"""Planner and budget: two A2A agents that ask each other over HTTP, each with a scripted executor.

The planner asks the budget agent what the offsite costs; the budget agent asks the planner what the
plan is; the planner asks the budget agent again, and so on. With real models behind them, that is
the loop that burns money. Here each agent is an A2A server (uvicorn on 127.0.0.1, started and
stopped by this program) whose executor is scripted: it sends a message to the other agent with the
A2A client (its "tool call"), and answers in text once the reply is back. The scripts stop after
``MAX_TOOL_CALLS`` tool calls, so that the program ends even when nothing stops the loop.

Without the guard (``python examples/a2a/app.py``) the agents bounce until the scripts give up.
Under the guard, with no change to this file::

    pip install '.[a2a]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/a2a/app.py

the budget agent's send back into the planner is refused (the planner, with the same skill, is
already on the chain that came to the budget server in the ``baggage`` header); the budget agent
gets the refusal as the A2A client's error and answers with what it has, and so does the planner.
The spans, the guard's among them, are printed as JSON when the program ends.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import uvicorn
from a2a.client import A2AClientError, create_client
from a2a.helpers import get_stream_response_text, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Role, SendMessageRequest
from starlette.applications import Starlette

MAX_TOOL_CALLS = 6  # in all, both agents: where the scripts give up when nothing else stops them
tool_calls = 0
# One skill per agent: the card's only skill is the skill of every send to it, so the bounce back
# into the planner repeats (planner, plan), which the default cycle rule (agent_skill) refuses.
SKILLS = {"planner": "plan", "budget": "price"}
OTHER = {"planner": "budget", "budget": "planner"}
urls: dict[str, str] = {}  # agent -> where it is served, once it is


async def send(agent: str, text: str) -> str:
    """Send ``text`` to ``agent`` with the A2A client (its card from its URL); return the reply's text."""
    client = await create_client(urls[agent])
    try:
        request = SendMessageRequest(message=new_text_message(text, role=Role.ROLE_USER))
        return "".join([get_stream_response_text(event) async for event in client.send_message(request)])
    finally:
        await client.close()


class Scripted(AgentExecutor):
    """An executor that asks the other agent at the start of each run, then answers with what came back."""

    def __init__(self, agent: str) -> None:
        self.agent, self.other = agent, OTHER[agent]

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        global tool_calls
        if tool_calls < MAX_TOOL_CALLS:
            tool_calls += 1
            print(f"{self.agent} calls {self.other} (tool call {tool_calls})")
            try:
                reply = await send(self.other, f"asked by {self.agent}")
                print(f"  {self.agent} got {self.other}'s reply: {reply[:160]}")
            except A2AClientError as err:  # what A2A raises for an error reply, and for a refused send
                print(f"  {self.agent} got {self.other}'s error: {type(err).__name__}: {str(err)[:160]}")
            answer = f"{self.agent}'s answer, from what {self.other} said"
        else:
            print(f"{self.agent}: the script gives up")
            answer = f"{self.agent} gives up"
        await event_queue.enqueue_event(
            new_text_message(answer, context_id=context.context_id, task_id=context.task_id)
        )

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError("the scripted agents answer at once")


def card(agent: str, url: str) -> AgentCard:
    return AgentCard(
        name=agent,  # the name a hop into this agent has
        description=f"The {agent} agent",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=f"{url}/", protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id=SKILLS[agent], name=SKILLS[agent], description=SKILLS[agent], tags=[agent])],
    )


@asynccontextmanager
async def serving(agent: str) -> AsyncIterator[None]:
    """Serve ``agent`` over A2A JSON-RPC with uvicorn on a free port of 127.0.0.1, until the block ends."""
    sock = socket.create_server(("127.0.0.1", 0))  # bound first: the card must hold the URL
    urls[agent] = f"http://127.0.0.1:{sock.getsockname()[1]}"
    agent_card = card(agent, urls[agent])
    handler = DefaultRequestHandler(Scripted(agent), InMemoryTaskStore(), agent_card)
    app = Starlette(
        routes=[*create_agent_card_routes(agent_card), *create_jsonrpc_routes(handler, rpc_url="/")]
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():  # uvicorn gave up before serving
            raise RuntimeError(f"the {agent} server did not start") from task.exception()
        await asyncio.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        await task


async def main() -> None:
    # An exit stack stops the servers in reverse order, each restoring the signal handlers it replaced.
    async with AsyncExitStack() as stack:
        for agent in SKILLS:
            await stack.enter_async_context(serving(agent))
        answer = await send("planner", "Plan the team offsite")
    print(f"planner's final answer: {answer!r} after {tool_calls} tool calls")


if __name__ == "__main__":
    asyncio.run(main())
