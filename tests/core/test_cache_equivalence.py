"""The guard's caches change what a hop costs, never what it decides, records or sends.

Random programs of hops (nested ``delegate`` / ``@agentic`` / generator / async / decide-then-open
hops, calls to a server of the same process, chains arriving from another process, refusals of
every kind, observe and off modes, a clock that moves, keys rotated mid-run) run twice: once with
every cache of the guard in place, once with a drawn set of them replaced by their uncached path
(:data:`CACHES`). Both runs must make the same decisions, the same hop spans (attributes, events,
status, parents) and decision counts, and send the same tokens, to the byte where signing is
deterministic (HS256, EdDSA). Where it is not (ES256 signatures; a chain arriving in another
library's spelling, which its children keep by design), the tokens must hold the same claims and
each must verify in the other run.

The clock (``time.time`` as the guard reads it) and the chain ids (``new_root``) are fixed, so the
two runs differ in their caches only.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import importlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jwt
import pytest
from hypothesis import HealthCheck, Phase, event, example, given, settings, target
from hypothesis import strategies as st
from opentelemetry import baggage, context, propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

import otel_guard
import otel_guard._claims_text as claims_text
import otel_guard._context_slots as context_slots
import otel_guard._in_force as in_force
import otel_guard._jwk as jwk
import otel_guard._plans as plans_module
import otel_guard._spending as spending
import otel_guard.budget
import otel_guard.chain as chain_module
import otel_guard.guard as guard
import otel_guard.keys as keys_module
import otel_guard.settings
from otel_guard import telemetry as names
from otel_guard._carriers import attach_caller_context
from otel_guard._plans import FirstHops
from otel_guard._received_hops import ReceivedHops
from otel_guard.budget.meters import _WorkspaceWindows
from otel_guard.chain import (
    Chain,
    ChainToken,
    Hop,
    InvalidToken,
    Keyring,
    NoSigningKey,
    TransferHop,
    VerifiedTokens,
    decode,
    encode,
)
from otel_guard.errors import REASON_CODES, DelegationRefused

CHAIN_KEY = names.CHAIN_BAGGAGE_KEY
PACKAGE = Path(otel_guard.__file__).parent


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


# -- the caches, and each one's uncached path --------------------------------------------------


def _verified_tokens_off(mp: pytest.MonkeyPatch) -> None:
    none_kept = VerifiedTokens(0)  # every token read is verified; nothing signed here is kept
    mp.setattr(chain_module, "verified_tokens", none_kept)
    mp.setattr(in_force, "verified_tokens", none_kept)


class _KeepsNothing(dict[Any, Any]):
    """A memo dict that never holds what it is given: each look-up misses."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


def _hmac_digest(self: Any, message: bytes) -> bytes:
    return hmac.digest(self.secret, message, "sha256")


CACHES: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    # Tokens verified (and signed) here, by text: chain.VerifiedTokens.
    "verified_tokens": _verified_tokens_off,
    # The plan of a hop kept on the token of the chain it came from: ChainToken.children.
    "plans": lambda mp: mp.setattr(ChainToken, "MAX_CHILDREN", 0),
    # Every chain's first hop, and the hops after it down the path, shared: _plans.FirstHops / kin.
    "first_hops": lambda mp: mp.setattr(guard, "first_hops", FirstHops(0)),
    # The plan of a hop a service receives, made again for every chain arriving along a path it was
    # allowed from: _received_hops.ReceivedHops.
    "received_hops": lambda mp: mp.setattr(guard, "received_hops", ReceivedHops(0)),
    # A child token's claims text made from its parent's (or from the sender's, for an arrived
    # token), its agents, skills and size bound from its parent's: ChainToken.extended.
    "claims_reuse": lambda mp: mp.setattr(ChainToken, "extended", ChainToken.extended_afresh),
    # Whether a token fits the baggage, first checked against an upper bound on its length.
    "size_bound": lambda mp: mp.setattr(ChainToken, "fits", lambda self, limit: self.length <= limit),
    # lru_caches of the JSON of a hop and of a string.
    "hop_json": lambda mp: mp.setattr(chain_module, "_hop_json", chain_module._hop_json.__wrapped__),
    "str_json": lambda mp: mp.setattr(chain_module, "_str_json", chain_module._str_json.__wrapped__),
    # HMAC-SHA256's inner and outer hash states, computed once per key (keys._Key): hmac.digest.
    "hmac_states": lambda mp: mp.setattr(keys_module._Key, "sign", _hmac_digest),
    # A token's key found by its header's text, not by reading the header: Keyring.key_for.
    "key_by_header": lambda mp: mp.setattr(Keyring, "key_for", Keyring.key_read),
    # The context's span and baggage slots, found once: the public OpenTelemetry API instead.
    "context_slots": lambda mp: (
        mp.setattr(context_slots, "FAST_CONTEXT", False),
        mp.setattr(guard, "FAST_CONTEXT", False),
    ),
    # The last chain root checked, found by identity: chain.REMEMBER_ROOTS.
    "checked_root": lambda mp: (
        mp.setattr(chain_module, "REMEMBER_ROOTS", False),
        mp.setattr(chain_module, "_checked_root", [None]),
    ),
    # The meter of the workspace's current window, made once a window.
    "workspace_window": lambda mp: mp.setattr(
        spending, "workspace_meter", lambda s, now: _WorkspaceWindows().meter(s, now)
    ),
    # The (agent, skill) pairs check_hop passed, not checked again: chain._CHECKED_HOPS.
    "checked_hops": lambda mp: mp.setattr(chain_module, "_CHECKED_HOPS", _KeepsNothing()),
    # A hop whose take is its tree's hop count alone, taken by the memory store's take_hop.
    "take_alone": lambda mp: mp.setattr(plans_module, "TAKE_ALONE", False),
    # A token's claims read by one regular expression where their text is the guard's own shape
    # (_claims_text.read_claims), not by the JSON decoder and the claims' checks.
    "claims_text": lambda mp: mp.setattr(claims_text, "READ", [False]),
    # The cryptography package's primitives, imported once (_jwk._crypto).
    "crypto_imports": lambda mp: mp.setattr(jwk, "_crypto", jwk._crypto.__wrapped__),
}
MEMOIZED = {"chain._hop_json": "hop_json", "chain._str_json": "str_json", "_jwk._crypto": "crypto_imports"}

SERVER_SETS: list[tuple[str, ...]] = [(), ("kit",), ("kit", "other"), ("other", "kit"), ("my server", "a.b")]
PURE_MEMOIZED: dict[str, list[tuple[Any, ...]]] = {
    # An adapter's hook matchers: strings made from the run's SDK server names alone (no setting,
    # no clock, no key). No hop program reaches them: each is held to its uncached path directly.
    "instrumentation.claude_agent_sdk._runs._asked_by_the_cli": [(servers,) for servers in SERVER_SETS],
    "instrumentation.claude_agent_sdk._runs._ended_by_the_cli": [(servers,) for servers in SERVER_SETS],
}


def test_every_memoized_function_of_the_guard_has_an_uncached_arm() -> None:
    """A new ``lru_cache`` / ``cache`` in the package must join :data:`CACHES` (and this table)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        for match in re.finditer(
            r"^@(?:functools\.)?(?:lru_cache|cache)\b.*\n(?:@.*\n)*def (\w+)", text, re.M
        ):
            found.add(f"{path.relative_to(PACKAGE).with_suffix('').as_posix().replace('/', '.')}.{match[1]}")
    known = set(MEMOIZED) | set(PURE_MEMOIZED)
    assert found == known, f"memoized functions without an uncached arm: {found - known}"
    assert set(MEMOIZED.values()) <= set(CACHES)


@pytest.mark.parametrize("name", sorted(PURE_MEMOIZED))
def test_a_memoized_function_of_its_arguments_alone_answers_as_its_uncached_path(name: str) -> None:
    module_name, _, function_name = name.rpartition(".")
    memoized = getattr(importlib.import_module(f"otel_guard.{module_name}"), function_name)
    for arguments in PURE_MEMOIZED[name]:
        uncached = memoized.__wrapped__(*arguments)
        assert memoized(*arguments) == uncached, arguments
        assert memoized(*arguments) == uncached, arguments  # the second answer comes from the cache


# -- keys ----------------------------------------------------------------------------------------

HS1, HS2, FOREIGN = bytes(range(32)), bytes(range(32, 64)), bytes([9] * 32)
ED_D, ES_D = bytes([7] * 32), bytes(31) + b"\x05"
K1, K2 = f"k1:{b64(HS1)}", f"k2:{b64(HS2)}"
E1, P1 = f"e1:EdDSA:{b64(ED_D)}", f"p1:ES256:{b64(ES_D)}"
E1_PUBLIC = {"keys": [dict(jwk.private_key("e1", jwk.EDDSA, ED_D).jwk)]}

# Each set-up: its rotation steps (``keys``), and its JWKS. A chain from "another process" is
# signed with the first key of the step in force ("same") or of the last step ("next").
KEY_SETUPS: dict[str, tuple[tuple[str | None, ...], dict[str, Any] | None]] = {
    "none": ((None,), None),
    "hs256": ((K1,), None),
    "rotation": ((K1, f"{K2},{K1}", K2), None),
    "eddsa": ((E1,), None),
    "to_eddsa": ((K1, f"{E1},{K1}", E1), None),
    "es256": ((P1,), None),
    "verify_only": ((None,), E1_PUBLIC),  # public keys only: this process mints nothing
}


def signer(keys: str | None, jwks: dict[str, Any] | None) -> Keyring | None:
    """Another process's keyring for a step: the step's own keys, or the JWKS owner's private key."""
    if keys is None:
        return Keyring.parse(E1) if jwks is not None else None
    return Keyring.parse(keys)


# -- programs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HopOp:
    """A hop into ``agent``: ``via`` says how it is made; ``body`` runs inside it."""

    agent: str
    skill: str | None
    kind: str  # agent, tool, transfer
    via: str
    body: tuple[Any, ...]


@dataclass(frozen=True)
class Send:
    """A call out: the chain in force is injected into a carrier (its token recorded)."""


@dataclass(frozen=True)
class Serve:
    """A call to a server of this process: (the caller's hop into ``agent``, then) the carrier, and
    the server's receiving hop in a fresh context."""

    agent: str
    skill: str | None
    client_hop: bool
    body: tuple[Any, ...]


@dataclass(frozen=True)
class Join:
    """A service guarded as ``agent`` (its hop marked joinable), ``body`` inside it."""

    agent: str
    body: tuple[Any, ...]


@dataclass(frozen=True)
class Repeat:
    """``body`` run ``times`` times in a row (what a cache remembers is used again)."""

    times: int
    body: tuple[Any, ...]


@dataclass(frozen=True)
class Member:
    """Another baggage member in force around ``body`` (the hop's baggage is then not the chain alone)."""

    body: tuple[Any, ...]


@dataclass(frozen=True)
class Origin:
    """A chain made by another process: its hops, signer, times, workspace and any tampering."""

    hops: tuple[tuple[str, str | None, bool], ...]
    signer: str  # same, next, foreign, unsigned, pyjwt
    age: float  # seconds before now it was issued (negative: from the future)
    lifetime: float
    foreign_workspace: bool
    tamper: str | None  # claims, signature


@dataclass(frozen=True)
class Arrive:
    """A request arrives with ``origin``'s token; a (receiving) hop into ``agent`` takes it."""

    origin: Origin
    root: int
    agent: str
    skill: str | None
    receiving: bool
    body: tuple[Any, ...]


@dataclass(frozen=True)
class Wait:
    seconds: float


@dataclass(frozen=True)
class Rotate:
    """The next step of the key set-up's rotation."""


@dataclass(frozen=True)
class SetMode:
    mode: str


@dataclass(frozen=True)
class Setup:
    keys: str
    mode: str
    cycle_rule: str
    max_depth: int
    max_name_depth: int
    observe_extra: int
    max_hops: int
    workspace_max_hops: int
    accept_unsigned: bool
    overrides: str


LONG = "L" * 1100  # three of these make a chain too large for baggage
OVERRIDES = {
    "": {},
    "b_recurses": {"b": {"cycle_rule": "none", "max_name_depth": 3}},
    "c_observed": {"c": {"mode": "observe"}},
    "a_off": {"a": {"mode": "off"}},
    "long_recurses": {LONG: {"cycle_rule": "none", "max_name_depth": 5}},
}
agents = st.sampled_from(["a", "b", "c", "a", "b", "c", "é", "ｂ", LONG])
skills = st.sampled_from([None, None, "s", "t"])
leaves = st.one_of(
    st.builds(
        HopOp, agents, skills, st.sampled_from(["agent", "tool", "transfer"]), st.just("with"), st.just(())
    ),
    st.just(Send()),
)


VIAS = ["with", "agentic", "generator", "async", "decide", "decide_bare", "decide_unopened"]
KINDS = ["agent", "agent", "agent", "tool", "transfer"]
heads = st.tuples(
    st.sampled_from(["a", "b", "c", "a", "b", "c", "é", LONG]),
    skills,
    st.sampled_from(KINDS),
    st.sampled_from(VIAS),
)


def _nest(path: list[tuple[str, str | None, str, str]], body: list[Any]) -> HopOp:
    """The hops of ``path``, each inside the one before, ``body`` inside the last."""
    inner = tuple(body)
    for agent, skill, kind, via in reversed(path):
        inner = (HopOp(agent, skill, kind, via, inner),)
    op: HopOp = inner[0]
    return op


def _extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    body = st.lists(inner, max_size=3).map(tuple)
    return st.one_of(
        # A path of hops deep enough for the depth, name-depth, cycle and size rules.
        st.builds(_nest, st.lists(heads, min_size=2, max_size=7), st.lists(inner, max_size=2)),
        st.builds(
            HopOp,
            agents,
            skills,
            st.sampled_from(["agent", "agent", "tool", "transfer"]),
            st.sampled_from(VIAS),
            body,
        ),
        st.builds(Serve, agents, skills, st.booleans(), body),
        st.builds(Join, agents, body),
        st.builds(Member, body),
    )


nested = st.recursive(leaves, _extend, max_leaves=8)
origins = st.builds(
    Origin,
    st.lists(st.tuples(agents, skills, st.booleans()), min_size=1, max_size=4).map(tuple),
    st.sampled_from(["same", "same", "same", "next", "foreign", "unsigned", "pyjwt"]),
    st.sampled_from([0.0, 10.0, 250.0, 400.0, -100.0]),
    st.sampled_from([300.0, 300.0, 60.0, 1000.0]),
    st.sampled_from([False, False, False, True]),
    st.sampled_from([None, None, None, "claims", "signature"]),
)
top = st.one_of(
    nested,
    st.builds(
        Arrive,
        origins,
        st.integers(0, 3),
        agents,
        skills,
        st.booleans(),
        st.lists(nested, max_size=3).map(tuple),
    ),
    st.builds(Repeat, st.integers(2, 3), st.lists(nested, min_size=1, max_size=2).map(tuple)),
    st.builds(Wait, st.sampled_from([1.0, 31.0, 301.0])),
    st.just(Rotate()),
    st.builds(SetMode, st.sampled_from(["enforce", "observe", "off"])),
)
programs = st.lists(top, min_size=1, max_size=6).map(tuple)
setups = st.builds(
    Setup,
    st.sampled_from(sorted(KEY_SETUPS)),
    st.sampled_from(["enforce", "enforce", "observe", "off"]),
    st.sampled_from(["agent_skill", "agent", "none"]),
    st.integers(2, 5),
    st.integers(1, 3),
    st.integers(0, 2),
    st.sampled_from([0, 0, 2, 3, 6]),
    st.sampled_from([0, 0, 4, 7]),
    st.booleans(),
    st.sampled_from(sorted(OVERRIDES)),
)


# -- running a program -------------------------------------------------------------------------

START = 1_764_450_000.25


class Run:
    """One run of a program: what it decided and sent, in order."""

    def __init__(self, setup: Setup, tracer: trace.Tracer) -> None:
        self.setup = setup
        self.tracer = tracer
        self.now = START
        self.step = 0
        self.log: list[Any] = []
        self.sent: list[tuple[str, Keyring | None]] = []
        self.in_loop = False

    def clock(self) -> float:
        return self.now

    def configure_step(self) -> None:
        steps, jwks = KEY_SETUPS[self.setup.keys]
        otel_guard.configure(keys=steps[self.step] or "", jwks=jwks)

    def run(self, ops: tuple[Any, ...]) -> None:
        for op in ops:
            self.op(op)

    def op(self, op: Any) -> None:
        try:
            if isinstance(op, HopOp):
                self.hop(op)
            elif isinstance(op, Send):
                self.send()
            elif isinstance(op, Serve):
                self.serve(op)
            elif isinstance(op, Join):
                self.join(op)
            elif isinstance(op, Repeat):
                for _ in range(op.times):
                    self.run(op.body)
            elif isinstance(op, Member):
                with self.attached(baggage.set_baggage("tenant", "t1")):
                    self.run(op.body)
            elif isinstance(op, Arrive):
                self.arrive(op)
            elif isinstance(op, Wait):
                self.now += op.seconds
            elif isinstance(op, Rotate):
                self.step = min(self.step + 1, len(KEY_SETUPS[self.setup.keys][0]) - 1)
                self.configure_step()
            elif isinstance(op, SetMode):
                otel_guard.configure(mode=op.mode)
        except DelegationRefused as err:
            self.log.append(("refused", err.reason, err.code, str(err), tuple(err.hop), _chain(err.chain)))
        except ValueError as err:
            self.log.append(("bad input", str(err)))

    @contextmanager
    def attached(self, ctx: Context) -> Iterator[None]:
        token = context.attach(ctx)
        try:
            yield
        finally:
            context.detach(token)

    def inside(self, decision: str | None, agent: str, body: tuple[Any, ...]) -> None:
        """A hop's body: what it sees of the chain, then its own ops."""
        members = sorted(k for k in baggage.get_all() if k != CHAIN_KEY)
        self.log.append(
            ("in", decision, _chain(otel_guard.current_chain()), otel_guard.name_depth(agent), members)
        )
        self.run(body)

    def hop(self, op: HopOp) -> None:
        kind = "tool" if op.kind == "tool" else "agent"
        transfer = op.kind == "transfer"
        via = op.via if kind == "agent" and not transfer else op.via.replace("agentic", "with")
        if via in ("agentic", "generator"):
            run = self

            if via == "agentic":

                @otel_guard.agentic(name=op.agent, skill=op.skill)
                def function() -> None:
                    run.inside(None, op.agent, op.body)

                function()
            else:

                @otel_guard.agentic(name=op.agent, skill=op.skill)
                def steps() -> Iterator[int]:
                    run.inside(None, op.agent, op.body)
                    yield 1
                    run.log.append(("step", _chain(otel_guard.current_chain())))

                list(steps())
            return
        delegation = otel_guard.delegate(op.agent, op.skill, kind=kind, transfer=transfer)  # type: ignore[arg-type]
        if via == "async" and not self.in_loop:  # an async hop inside one: as a with block

            async def hop() -> None:
                async with delegation as d:
                    self.inside(d.decision, op.agent, op.body)

            self.in_loop = True
            try:
                asyncio.run(hop())
            finally:
                self.in_loop = False
        elif via in ("with", "async"):
            with delegation as d:
                self.inside(d.decision, op.agent, op.body)
        else:
            decided = delegation.decide()
            try:
                with self.attached(decided):
                    if via == "decide_unopened":  # the call never began: finish() opens the span
                        self.log.append(("decided", delegation.decision, _chain(otel_guard.current_chain())))
                        return
                    runtime = self.tracer.start_span("runtime call")
                    base = decided if via == "decide" else Context()  # a runtime's own context
                    with self.attached(delegation.open(trace.set_span_in_context(runtime, base))):
                        self.inside(delegation.decision, op.agent, op.body)
                    runtime.end()
            finally:
                delegation.finish()

    def send(self) -> None:
        carrier: dict[str, str] = {}
        try:
            propagate.inject(carrier)
        except NoSigningKey:
            self.log.append(("sent", "NoSigningKey"))
            return
        token = _token_of(carrier)
        self.log.append(("sent", None if token is None else len(self.sent)))
        if token is not None:
            self.sent.append((token, otel_guard.settings.current_settings().keys))

    def serve(self, op: Serve) -> None:
        if op.client_hop:  # the client's instrumentation makes the hop, then calls
            with otel_guard.delegate(op.agent, op.skill, span_kind=SpanKind.CLIENT) as d:
                self.log.append(("client", d.decision))
                self._serve(op)
        else:
            self._serve(op)

    def _serve(self, op: Serve) -> None:
        carrier: dict[str, str] = {}
        try:
            propagate.inject(carrier)
        except NoSigningKey:
            self.log.append(("call", "NoSigningKey"))
            return
        with self.attached(Context()):
            caller = attach_caller_context(carrier)
            try:
                self.receive(op.agent, op.skill, True, op.body)
            finally:
                if caller is not None:
                    context.detach(caller)

    def receive(self, agent: str, skill: str | None, receiving: bool, body: tuple[Any, ...]) -> None:
        self.log.append(("arrived", _chain(otel_guard.current_chain())))
        with otel_guard.delegate(agent, skill, receiving=receiving, span_kind=SpanKind.SERVER) as d:
            self.inside(d.decision, agent, body)

    def join(self, op: Join) -> None:
        service = otel_guard.delegate(op.agent, span_kind=SpanKind.SERVER)
        ctx = service.start()
        try:
            with self.attached(guard.joinable(service, ctx)):
                self.inside(service.decision, op.agent, op.body)
        finally:
            service.finish()

    def arrive(self, op: Arrive) -> None:
        token = self.mint(op.origin, f"{op.root + 1:032x}")
        with self.attached(baggage.set_baggage(CHAIN_KEY, token, Context())):
            self.receive(op.agent, op.skill, op.receiving, op.body)

    def mint(self, origin: Origin, root: str) -> str:
        """The token another process sent."""
        steps, jwks = KEY_SETUPS[self.setup.keys]
        hops = tuple((TransferHop if transfer else Hop)(a, s) for a, s, transfer in origin.hops)
        issued = self.now - origin.age
        workspace = "elsewhere" if origin.foreign_workspace else "default"
        made = Chain(hops, root, workspace, issued, issued + origin.lifetime)
        if origin.signer == "pyjwt":  # another library's spelling: whole-second times, other header
            claims = {
                "v": 1,
                "root": root,
                "ws": workspace,
                "iat": int(issued),
                "exp": int(issued + origin.lifetime),
                "hops": [
                    [h.agent, h.skill, "transfer"] if type(h) is TransferHop else [h.agent, h.skill]
                    for h in hops
                ],
            }
            token = jwt.encode(claims, HS1, "HS256", headers={"kid": "k1"})
        else:
            keyring = {
                "same": lambda: signer(steps[self.step], jwks),
                "next": lambda: signer(steps[-1], jwks),
                "foreign": lambda: Keyring({"k1": FOREIGN}),
                "unsigned": lambda: None,
            }[origin.signer]()
            token = encode(made, keyring)
        if origin.tamper == "claims":
            header, _, signature = token.split(".")
            other = encode(Chain((*hops, Hop("x")), root, workspace, issued, issued + origin.lifetime), None)
            token = f"{header}.{other.split('.')[1]}.{signature}"
        elif origin.tamper == "signature":
            header, claims_part, signature = token.split(".")
            token = f"{header}.{claims_part}.{'B' if signature[:1] == 'A' else 'A'}{signature[1:]}"
        return token


def _token_of(carrier: dict[str, str]) -> str | None:
    for member in carrier.get("baggage", "").split(","):
        name, _, value = member.partition("=")
        if name.strip() == CHAIN_KEY:
            return value.strip()
    return None


def _chain(chain: Chain | None) -> Any:
    if chain is None:
        return None
    return (
        tuple((*hop, hop.kind) for hop in chain.hops),
        chain.root,
        chain.workspace,
        chain.issued_at,
        chain.expires_at,
    )


def _spans(finished: list[Any]) -> list[Any]:
    index = {span.context.span_id: n for n, span in enumerate(finished)}
    shown = []
    for span in finished:
        parent = span.parent
        events = [
            (event.name, {k: v for k, v in event.attributes.items() if k != "exception.stacktrace"})
            for event in span.events
        ]
        shown.append(
            (
                span.name,
                span.kind,
                dict(span.attributes),
                events,
                span.status.status_code,
                span.status.description,
                None if parent is None else index.get(parent.span_id, "outside"),
            )
        )
    return shown


@dataclass
class Observed:
    log: list[Any]
    spans: list[Any]
    decisions: Counter[Any]
    sent: list[tuple[str, Keyring | None]]


def run_program(setup: Setup, program: tuple[Any, ...], off: frozenset[str], recorder: Any) -> Observed:
    """Run ``program`` from a fresh process state, with the caches ``off`` replaced by their uncached path."""
    tracer = trace.get_tracer("cache-equivalence")
    with pytest.MonkeyPatch.context() as mp:
        # Fresh caches for both runs, then the uncached paths of those turned off.
        fresh = VerifiedTokens()
        mp.setattr(chain_module, "verified_tokens", fresh)
        mp.setattr(in_force, "verified_tokens", fresh)
        mp.setattr(guard, "first_hops", FirstHops())
        chain_module._hop_json.cache_clear()
        for name in sorted(off):
            CACHES[name](mp)
        run = Run(setup, tracer)
        roots = iter(range(10_000, 100_000))
        mp.setattr(chain_module, "new_root", lambda: f"{next(roots):032x}")
        clock = SimpleNamespace(time=run.clock)
        mp.setattr(guard, "time", clock)
        mp.setattr(spending, "time", clock)
        otel_guard.settings.reset_settings()
        otel_guard.budget.reset_stores()
        otel_guard.configure(
            mode=setup.mode,
            cycle_rule=setup.cycle_rule,
            max_depth=setup.max_depth,
            max_name_depth=setup.max_name_depth,
            observe_max_depth=setup.max_depth + setup.observe_extra,
            ttl=300,
            workspace="default",
            max_hops=setup.max_hops,
            workspace_max_hops=setup.workspace_max_hops,
            accept_unsigned=setup.accept_unsigned,
            overrides=OVERRIDES[setup.overrides],
        )
        run.configure_step()
        recorder.clear()
        before = Counter(dict(names.current().hops.decisions()))
        with run.attached(Context()):
            run.run(program)
        decisions = Counter(dict(names.current().hops.decisions()))
        decisions.subtract(before)
        spans = _spans(recorder.all())
    return Observed(run.log, spans, +decisions, run.sent)


def _same_token(
    cached: tuple[str, Keyring | None], uncached: tuple[str, Keyring | None], exact: bool
) -> None:
    (text_a, keys_a), (text_b, keys_b) = cached, uncached
    if exact or text_a == text_b:
        assert text_a == text_b
        return
    # ES256 signs with a random nonce; a chain that arrived in another library's spelling keeps it
    # in its children's claims, where the uncached path writes this module's: the same claims.
    header_a, claims_a, _ = text_a.split(".")
    header_b, claims_b, _ = text_b.split(".")
    assert json.loads(chain_module._b64decode(header_a)) == json.loads(chain_module._b64decode(header_b))
    assert json.loads(chain_module._b64decode(claims_a)) == json.loads(chain_module._b64decode(claims_b))
    assert decode(text_a, keys_b) == decode(text_b, keys_a)


everything = frozenset(CACHES)


def _path(*names: str, body: tuple[Any, ...] = (), via: str = "with") -> HopOp:
    """Hops into ``names`` (``agent/skill``), each inside the one before."""
    heads = [(*name.split("/"), None)[:2] for name in names]
    return _nest([(agent, skill, "agent", via) for agent, skill in heads], list(body))


def _origin(signer: str = "same", age: float = 10.0, lifetime: float = 300.0, **changes: Any) -> Origin:
    fields = {"foreign_workspace": False, "tamper": None, **changes}
    return Origin((("a", None, False), ("b", "s", False)), signer, age, lifetime, **fields)


# Programs every run checks, whatever the search draws: between them they reach every refusal
# reason of docs/spec.md §3, a process that cannot mint, arrived chains extended and sent on, a key
# rotation, joins, and the public API's context path (see the test after the property).
EXAMPLES: list[tuple[Setup, tuple[Any, ...]]] = [
    (
        Setup("hs256", "enforce", "agent_skill", 5, 2, 0, 6, 0, False, "long_recurses"),
        (
            _path("a", "b", "a"),  # cycle
            _path("a", "b", "c", "d", "e", "f"),  # depth
            _path("a/s", "b", "a/t", "c", "a"),  # name_depth
            _path(LONG, f"{LONG}/s", f"{LONG}/t", body=(Send(),)),  # chain_size
            HopOp("r", None, "agent", "with", tuple(HopOp("x", None, "tool", "with", ()) for _ in range(6))),
            Repeat(2, (_path("a", "b", body=(Send(),)), _path("a", "b", via="decide_bare"))),
        ),
    ),
    (
        Setup("rotation", "enforce", "agent_skill", 5, 2, 0, 0, 0, False, ""),
        (
            Arrive(_origin(), 0, "c", None, True, (_path("d", body=(Send(),)), Send())),
            Arrive(_origin(), 0, "c", None, True, (_path("d", body=(Send(),)),)),  # the same token again
            Arrive(_origin(), 1, "b", "s", True, (Send(),)),  # the caller made the hop already
            Arrive(_origin(age=400.0), 2, "c", None, True, ()),  # expired
            Arrive(_origin(age=-100.0), 2, "c", None, False, ()),  # from the future
            Arrive(_origin(lifetime=1000.0), 2, "c", None, True, ()),  # a lifetime beyond the ttl
            Arrive(_origin(foreign_workspace=True), 2, "c", None, True, ()),
            Arrive(_origin(tamper="claims"), 2, "c", None, True, ()),  # bad_signature
            Arrive(_origin("next"), 3, "c", None, True, ()),  # a key not yet rolled out
            Rotate(),
            Arrive(_origin("next"), 3, "c", None, True, (Send(),)),
            Arrive(_origin("pyjwt"), 3, "c", None, True, (_path("d", body=(Send(),)),)),
            Rotate(),
            Arrive(_origin("pyjwt"), 3, "c", None, True, ()),  # its key dropped
            Wait(301.0),
            Arrive(_origin(), 0, "c", None, True, ()),
        ),
    ),
    (
        Setup("eddsa", "observe", "agent_skill", 2, 1, 0, 0, 4, False, "c_observed"),
        (
            _path("a", "b", "a", "c", body=(Send(),)),  # would_refuse, then observe_ceiling
            Join("svc", (HopOp("svc", None, "agent", "agentic", (Send(),)), _path("svc"))),
            Member((_path("a", "b", via="decide_bare", body=(Send(),)),)),
            Repeat(3, (Serve("b", None, True, (Send(),)), Serve("c", "s", False, ()))),
        ),
    ),
    (
        Setup("verify_only", "enforce", "agent_skill", 5, 2, 0, 0, 0, True, ""),
        (
            Arrive(_origin(), 0, "c", None, True, (_path("d", body=(Send(),)), Send())),
            Arrive(_origin("unsigned"), 1, "c", None, True, (Send(),)),  # accept_unsigned
            _path("a", body=(Send(),)),  # a chain started here cannot be sent
            Serve("b", None, True, ()),
        ),
    ),
    (
        Setup("es256", "enforce", "agent", 4, 2, 0, 0, 0, False, ""),
        (
            Arrive(_origin("pyjwt"), 0, "c", None, True, ()),
            _path("a", "b/s", body=(Send(), Serve("c", None, True, (Send(),)))),
            Repeat(2, (_path("a", "b/s", "a/t"),)),
        ),
    ),
]


def _examples(test: Callable[..., None]) -> Callable[..., None]:
    for setup, program in EXAMPLES:
        test = example(setup=setup, program=program, off=everything)(test)
    return test


offs = st.one_of(st.just(everything), st.frozensets(st.sampled_from(sorted(CACHES)), min_size=1))


@settings(
    max_examples=100,
    deadline=None,  # the whole test is bounded by its examples (about 10 s)
    # No explain phase: tracing every line of two runs of a failing program takes minutes.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(setup=setups, program=programs, off=offs)
@_examples
def test_caches_on_and_off_decide_record_and_send_the_same(
    setup: Setup, program: tuple[Any, ...], off: frozenset[str], spans: Any
) -> None:
    cached = run_program(setup, program, frozenset(), spans)
    uncached = run_program(setup, program, off, spans)
    # What the examples reached (pytest --hypothesis-show-statistics); more kinds of refusal and
    # more tokens sent are what the search aims at.
    reasons = {entry[1] for entry in cached.log if entry[0] == "refused"}
    reasons |= {
        event_attributes[names.REASON]
        for span in cached.spans
        for _, event_attributes in span[3]
        if names.REASON in event_attributes
    }
    for reason in sorted(reasons):
        event(f"refused or would refuse: {reason}")
    target(float(len(reasons)), label="kinds of refusal")
    target(float(len(cached.sent)), label="tokens sent")
    assert uncached.log == cached.log
    assert uncached.spans == cached.spans
    assert uncached.decisions == cached.decisions
    assert len(uncached.sent) == len(cached.sent)
    exact = setup.keys != "es256" and not _mentions_pyjwt(program)
    for a, b in zip(cached.sent, uncached.sent, strict=True):
        _same_token(a, b, exact)


def _mentions_pyjwt(ops: tuple[Any, ...]) -> bool:
    """Whether a chain arrives in PyJWT's spelling somewhere in ``ops``."""
    for op in ops:
        if isinstance(op, Arrive) and op.origin.signer == "pyjwt":
            return True
        if _mentions_pyjwt(getattr(op, "body", ())):
            return True
    return False


def test_the_examples_reach_every_refusal_and_a_process_that_cannot_mint(spans: Any) -> None:
    """The property is not vacuous: its fixed examples are refused for every reason of §3, send
    tokens (arrived ones extended among them), and meet a process that holds public keys only."""
    reasons: set[str] = set()
    log: list[Any] = []
    sent = 0
    for setup, program in EXAMPLES:
        observed = run_program(setup, program, frozenset(), spans)
        log += observed.log
        sent += len(observed.sent)
        reasons |= {entry[1] for entry in observed.log if entry[0] == "refused"}
        reasons |= {e[names.REASON] for span in observed.spans for _, e in span[3] if names.REASON in e}
    assert reasons == set(REASON_CODES)
    assert ("sent", "NoSigningKey") in log
    assert sent >= 15
    assert any(entry[0] == "in" and entry[1] == "would_refuse" for entry in log)


@pytest.mark.parametrize("fast_context", [True, False])
def test_a_hop_opened_under_another_context_keeps_the_baggage_it_was_decided_in(
    fast_context: bool, monkeypatch: pytest.MonkeyPatch, spans: Any
) -> None:
    """``open(span_parent)`` takes the parent span from ``span_parent`` and nothing else: the body's
    baggage is the hop's (the decided context's members and the chain), on the public API's path too
    (found by the property above: that path took ``span_parent``'s baggage and lost the others)."""
    monkeypatch.setattr(context_slots, "FAST_CONTEXT", fast_context)
    monkeypatch.setattr(guard, "FAST_CONTEXT", fast_context)
    tracer = trace.get_tracer("cache-equivalence")
    outer = context.attach(baggage.set_baggage("tenant", "t1", Context()))
    try:
        hop = otel_guard.delegate("a")
        decided = hop.decide()
        runtime = tracer.start_span("runtime call", context=decided)
        # The runtime's span lives in a context of its own, with none of the hop's baggage.
        body = hop.open(trace.set_span_in_context(runtime, Context()))
        runtime.end()
        hop.finish()
    finally:
        context.detach(outer)
    assert dict(baggage.get_all(body)) == {"tenant": "t1", CHAIN_KEY: baggage.get_baggage(CHAIN_KEY, decided)}
    assert trace.get_current_span(body) is hop.span
    assert spans.one("invoke_agent a").parent.span_id == runtime.get_span_context().span_id


def test_a_chain_encoded_by_hand_is_verified_when_this_process_reads_it(spans: Any) -> None:
    """``encode()`` of a chain the guard never checked (here a name not in NFKC form, which no
    guard writes and every guard refuses) leaves nothing in the verified tokens: this process reads
    it as any other does (found by the property: the cache took it as verified)."""
    otel_guard.configure(keys="")
    made = Chain((Hop("ｂ"),), f"{1:032x}", "default", START, START + 300)
    token = encode(made, None)
    with pytest.raises(InvalidToken, match="NFKC"):
        decode(token, None)
    with _in(token):
        assert otel_guard.current_chain() is None
        with pytest.raises(DelegationRefused) as refused, otel_guard.delegate("a", receiving=True):
            pass
    assert refused.value.reason == "bad_signature"


def test_a_chain_that_ends_past_2242_gives_tokens_refused_here_as_everywhere(
    carrier_token: Callable[[dict[str, str]], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chain whose ``exp`` no token may hold (past the year 2242: a clock that far on, as ``ttl``
    is bounded) is refused by every other process; a server in this process refuses it too, cache
    or no cache (found by the property's reasoning: the cache kept every token signed here,
    whatever its times)."""
    otel_guard.configure(keys=K1)
    late = 2.0**33 - 100  # the chain's exp, 300 s on, is past 2^33
    monkeypatch.setattr(guard, "time", SimpleNamespace(time=lambda: late))
    monkeypatch.setattr(spending, "time", SimpleNamespace(time=lambda: late))
    carrier: dict[str, str] = {}
    with otel_guard.delegate("a"):
        propagate.inject(carrier)
    token = carrier_token(carrier)
    with pytest.raises(InvalidToken, match="exp"):
        decode(token, Keyring.parse(K1))
    with _in(token), pytest.raises(DelegationRefused) as refused, otel_guard.delegate("b", receiving=True):
        pass
    assert refused.value.reason == "bad_signature"


@contextmanager
def _in(token: str) -> Iterator[None]:
    """A request's context: ``token`` as its chain, nothing else."""
    attached = context.attach(baggage.set_baggage(CHAIN_KEY, token, Context()))
    try:
        yield
    finally:
        context.detach(attached)
