"""What the A2A client and server patches share: the hop's name and skill, and running a hop.

A2A names the remote agent in its agent card; the skill is the one the request asks for in its
metadata (``{"skill": "price"}`` on the request or on its message), else the card's only skill, else
none. Client and server read the same card and the same request, so the hop the client adds is the
hop the server checks again (and does not add twice).

A hop around a stream attaches its context around each step of the stream only, never across a
``yield`` (:mod:`otel_guard._steps` runs it): between steps the consumer runs in its own context.
Whatever the stream starts during a step (the A2A server starts the agent executor's task there)
copies the hop's context, and with it the chain.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, Callable, Mapping
from typing import Any, TypeVar

from opentelemetry import context as otel_context

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


def start_hop(
    hop: Delegation, refused: Refused, caller: Mapping[str, str] | None = None
) -> otel_context.Context:
    """Decide ``hop`` and start its span; raise ``refused(err)`` instead of a refusal.

    ``caller`` is a carrier (request headers) to continue the caller's context from first, for a
    server that no outer layer has done it for.
    """
    token = attach_caller_context(caller) if caller else None
    try:
        return hop.start()
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
    hop_context = start_hop(hop, refused, caller)
    token = otel_context.attach(hop_context)
    try:
        result = await call()
    except BaseException as exc:
        otel_context.detach(token)
        hop.finish(exc)
        raise
    otel_context.detach(token)
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

    def enter() -> tuple[otel_context.Context, Done]:
        return start_hop(hop, refused, caller), hop.finish

    return async_generator_in_context(enter, open_stream)()
