"""What the A2A client and server patches share: the hop's name and skill, and running a hop.

A2A names the remote agent in its agent card; the skill is the one the request asks for in its
metadata (``{"skill": "price"}`` on the request or on its message), else the card's only skill, else
none. Client and server read the same card and the same request, so the hop the client adds is the
hop the server checks again (and does not add twice).

A hop around a stream attaches its context around each step of the stream only, never across a
``yield`` (:mod:`otel_guard._steps` runs it): between steps the consumer runs in its own context.
Whatever the stream starts during a step (the A2A server starts the agent executor's task there)
copies the hop's context, and with it the chain.

The hop's span is the GenAI ``invoke_agent`` span of the call and also carries the A2A conventions'
attributes (docs/spec.md §5): the method, the message, the context (``gen_ai.conversation.id``) and
the task, read from the request and then from the response; the SDK's own spans keep their names.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, Callable, Mapping
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

from a2a.types import (
    Message,
    SendMessageResponse,
    StreamResponse,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatusUpdateEvent,
)
from opentelemetry import context as otel_context
from opentelemetry.util.types import AttributeValue

from otel_guard import telemetry as names
from otel_guard._carriers import attach_caller_context
from otel_guard._steps import Done, async_generator_in_context
from otel_guard.errors import DelegationRefused
from otel_guard.guard import Delegation

T = TypeVar("T")

SKILL_METADATA_KEY = "skill"
"""The metadata key (on the SendMessageRequest or its Message) that names the skill asked for."""

Refused = Callable[[DelegationRefused], BaseException]
"""Turns a refusal into the exception the runtime's callers expect."""


class Switch:
    """Whether the A2A instrumentation is on.

    Patches stay reachable after ``uninstrument()`` where the SDK holds a bound method it took while
    instrumented (a Starlette route keeps ``dispatcher.handle_requests``); they call straight through.
    """

    active = False


switch = Switch()


def _metadata_string(metadata: Any, key: str) -> str | None:
    """A string value of a protobuf ``Struct``, or ``None``."""
    value = metadata.fields.get(key) if metadata is not None else None
    if value is None or value.WhichOneof("kind") != "string_value":
        return None
    text: str = value.string_value
    return text or None


def hop_skill(card: Any, request: Any) -> str | None:
    """The skill a ``SendMessageRequest`` asks of the agent that ``card`` describes, if known."""
    for metadata in (request.metadata, request.message.metadata):
        skill = _metadata_string(metadata, SKILL_METADATA_KEY)
        if skill is not None:
            return skill
    if len(card.skills) == 1:
        only: str = card.skills[0].id
        return only or None
    return None


SEND_MESSAGE: Final = "SendMessage"
SEND_STREAMING_MESSAGE: Final = "SendStreamingMessage"


def hop_attributes(card: Any, request: Any, method: str, url: str | None = None) -> dict[str, AttributeValue]:
    """The A2A attributes of a hop sending ``request`` to the agent ``card`` describes: the agent's
    description and version from its card, the method, what the request's message names, and (on
    the client) the address of the interface ``url`` the call goes to."""
    attributes: dict[str, AttributeValue] = {names.A2A_METHOD_NAME: method}
    if card.description:
        attributes[names.GEN_AI_AGENT_DESCRIPTION] = card.description
    if card.version:
        attributes[names.GEN_AI_AGENT_VERSION] = card.version
    interfaces = card.supported_interfaces
    here = url.rstrip("/") if url else None
    interface = next(
        (i for i in interfaces if i.url.rstrip("/") == here), interfaces[0] if interfaces else None
    )
    if interface is not None and interface.protocol_version:
        attributes[names.A2A_PROTOCOL_VERSION] = interface.protocol_version
    if request.tenant:
        attributes[names.A2A_TENANT] = request.tenant
    message = request.message
    if message.message_id:
        attributes[names.A2A_MESSAGE_ID] = message.message_id
    if message.context_id:
        attributes[names.GEN_AI_CONVERSATION_ID] = message.context_id
    if message.task_id:
        attributes[names.A2A_TASK_ID] = message.task_id
    if message.reference_task_ids:
        attributes[names.A2A_REFERENCE_TASK_IDS] = list(message.reference_task_ids)
    if url:
        where = urlsplit(url)
        if where.hostname:
            attributes[names.SERVER_ADDRESS] = where.hostname
            port = where.port or {"http": 80, "https": 443}.get(where.scheme)
            if port is not None:
                attributes[names.SERVER_PORT] = port
    return attributes


def note_response(hop: Delegation, item: Any) -> None:
    """Put what an A2A response (a ``Task``, a ``Message``, a ``StreamResponse`` or one of its
    events) says of the task and the context on the hop's span: ``a2a.task.id``, ``a2a.task.state``
    and ``gen_ai.conversation.id``. Anything else is left alone."""
    span = hop.span
    if not span.is_recording():
        return
    if isinstance(item, StreamResponse | SendMessageResponse):
        which = item.WhichOneof("payload")
        if which is None:
            return
        item = getattr(item, which)
    if isinstance(item, Task):
        task_id, state = item.id, item.status.state
    elif isinstance(item, TaskStatusUpdateEvent):
        task_id, state = item.task_id, item.status.state
    elif isinstance(item, Message | TaskArtifactUpdateEvent):
        task_id, state = item.task_id, None
    else:
        return
    if task_id:
        span.set_attribute(names.A2A_TASK_ID, task_id)
    if state is not None:
        span.set_attribute(names.A2A_TASK_STATE, TaskState.Name(state))
    if item.context_id:
        span.set_attribute(names.GEN_AI_CONVERSATION_ID, item.context_id)


async def astart_hop(
    hop: Delegation, refused: Refused, caller: Mapping[str, str] | None = None
) -> otel_context.Context:
    """Decide ``hop`` and start its span; raise ``refused(err)`` instead of a refusal.

    ``caller`` is a carrier (request headers) to continue the caller's context from first, for a
    server that no outer layer has done it for. A budget store with an asyncio API (Redis) is
    awaited, so the loop serves other calls meanwhile.
    """
    token = attach_caller_context(caller) if caller else None
    try:
        return await hop.astart()
    except DelegationRefused as err:
        raise refused(err) from err
    finally:
        if token is not None:
            otel_context.detach(token)


async def hop_call(
    hop: Delegation,
    refused: Refused,
    call: Callable[[], Any],
    caller: Mapping[str, str] | None = None,
) -> Any:
    """Run ``await call()`` as ``hop``: decided first, inside its context, span ended after."""
    hop_context = await astart_hop(hop, refused, caller)
    token = otel_context.attach(hop_context)
    try:
        result = await call()
    except BaseException as exc:
        otel_context.detach(token)
        hop.finish(exc)
        raise
    otel_context.detach(token)
    note_response(hop, result)
    hop.finish()
    return result


def hop_stream(
    hop: Delegation,
    refused: Refused,
    open_stream: Callable[[], AsyncIterable[T]],
    caller: Mapping[str, str] | None = None,
) -> AsyncGenerator[T, Any]:
    """Iterate ``open_stream()`` as ``hop``: decided at the first step, span ended with the stream.

    ``open_stream`` is called inside the hop's context, so what it builds (headers to inject) sees
    the new chain. A consumer that stops early (break, aclose, cancellation) closes the inner stream
    in the hop's context and ends the span as a success: the hop itself did not fail.
    """

    async def enter() -> tuple[otel_context.Context, Done]:
        return await astart_hop(hop, refused, caller), hop.finish

    return async_generator_in_context(enter, lambda: _noting(hop, open_stream()))()


async def _noting(hop: Delegation, stream: AsyncIterable[T]) -> AsyncGenerator[T, Any]:
    """``stream``'s items, each noted on the hop's span first (:func:`note_response`); closing this
    closes ``stream``."""
    inner = aiter(stream)
    try:
        async for item in inner:
            note_response(hop, item)
            yield item
    finally:
        aclose = getattr(inner, "aclose", None)
        if aclose is not None:
            await aclose()
