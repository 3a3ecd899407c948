"""The chain in force in a context: where the context keeps it, and reading it (verified) from there.

The chain lives in the OpenTelemetry context, as the W3C baggage member ``otel_guard.chain``: a
:class:`~otel_guard.chain.ChainToken` when a hop of this process put it there (verified already),
a string when it came from a carrier (verified when read). What a reader would not guess: the
baggage is read straight from the context's own slot, found once through the public API (a test
holds it to that API), because every hop reads it.
"""

from __future__ import annotations

from opentelemetry import context
from opentelemetry.context import Context

from otel_guard import telemetry as names
from otel_guard._context_slots import baggage_of
from otel_guard.chain import Chain, ChainToken, InvalidToken, Keyring, decode_unsigned, verified_tokens
from otel_guard.settings import Settings, current_settings

_BAGGAGE_KEY = names.CHAIN_BAGGAGE_KEY


def verified_token(value: object, keyring: Keyring | None) -> ChainToken | None:
    """The chain a baggage value carries; raises :class:`InvalidToken` for one that fails verification."""
    if value is None or type(value) is ChainToken:
        return value
    if not isinstance(value, str):
        raise InvalidToken("baggage member otel_guard.chain is not a token")
    return verified_tokens.verify(value, keyring)


def unsigned_token(value: object, settings: Settings) -> ChainToken | None:
    """With keys and ``accept_unsigned`` (a key rollout), the unsigned chain a baggage value carries,
    taken as it arrived; ``None`` for any other value (a signed, altered or unreadable token among
    them), and without keys or ``accept_unsigned``. Its hops then decide it as any chain's."""
    if not settings.accept_unsigned or settings.keys is None or not isinstance(value, str):
        return None
    try:
        return ChainToken(decode_unsigned(value), None, value)
    except InvalidToken:
        return None


def current_chain() -> Chain | None:
    """The verified chain in force in the current context, or ``None`` outside any hop."""
    return chain_in(context.get_current())


def chain_in(ctx: Context) -> Chain | None:
    """The verified chain in force in ``ctx``, or ``None`` (:func:`current_chain` of a context)."""
    members = baggage_of(ctx)
    value = members.get(_BAGGAGE_KEY) if members else None
    if value is None or type(value) is ChainToken:  # the usual cases: no settings to read
        return value.chain if value is not None else None
    settings = current_settings()
    try:
        token = verified_token(value, settings.keys)
    except InvalidToken:
        token = unsigned_token(value, settings)
    return token.chain if token is not None else None


def name_depth(name: str) -> int:
    """How many times ``name`` stands in the current chain (0 outside any hop)."""
    chain = current_chain()
    return chain.name_depth(name) if chain is not None else 0
