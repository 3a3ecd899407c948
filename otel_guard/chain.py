"""The delegation chain and the token that carries it between processes.

A :class:`Chain` is the list of hops (agent, skill) that led to the call being executed, plus the
chain's identity (``root``), its workspace and its lifetime. Between processes it travels as a JWS
compact token (RFC 7515), with the key id in the header, so any JWT library verifies it::

    header  {"alg":"HS256","kid":"k1","typ":"JWT"}
    claims  {"v":1,"root":"<32 hex>","ws":"default","iat":1764450000.5,"exp":1764450300.5,
             "hops":[["planner","plan"],["budget",null],["faq",null,"transfer"]]}

A hop is a call (``[agent, skill]``: the caller waits for its answer) or a transfer (``[agent, skill,
"transfer"]``: a handoff, after which the agent handing off waits for nothing); a token written before
transfers existed holds calls only, and reads as it always did.

Without keys the header is ``{"alg":"none"}`` and the signature empty (an unsecured JWS). A shared
secret signs ``HS256``; a service's own key pair ``EdDSA`` (Ed25519) or ``ES256``
(:mod:`otel_guard._jwk`), verified elsewhere with its public key. A process that holds public keys
only verifies every chain and signs none: its hops' chains travel as they arrived
(:attr:`ChainToken.travels`).

This module knows tokens and nothing about OpenTelemetry. Everything that can go wrong while reading a
token raises :class:`InvalidToken`, and nothing else: the guard turns it into a ``bad_signature``
refusal, never into "no chain".
"""

from __future__ import annotations

import json
import random
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from operator import itemgetter
from typing import Any, Final, Literal, NamedTuple

# The token's basics and its keys live below this module; the names other modules take from here
# (in __all__) stay.
from otel_guard._claims_text import read_claims
from otel_guard._jws import (
    _COMPACT,
    MAX_QUOTED,
    InvalidToken,
    _b64decode,
    _b64encode,
    _check_header,
    _json_object,
    _json_text,
    quoted,
)
from otel_guard.keys import Keyring, generate_key, generate_key_pair

__all__ = [
    "MAX_QUOTED",
    "MAX_TIME",
    "MAX_TOKEN_LENGTH",
    "TOKEN_VERSION",
    "Chain",
    "ChainToken",
    "Hop",
    "HopKind",
    "InvalidToken",
    "Keyring",
    "NoSigningKey",
    "TransferHop",
    "VerifiedTokens",
    "check_hop",
    "decode",
    "decode_unsigned",
    "encode",
    "generate_key",
    "generate_key_pair",
    "name_problem",
    "new_root",
    "normal_name",
    "quoted",
    "start_chain",
    "verified_tokens",
]

TOKEN_VERSION: Final = 1
MAX_TOKEN_LENGTH: Final = 4096 - len("otel_guard.chain=")
"""The longest token the W3C baggage propagator carries (it drops members of 4096 bytes or more)."""
# A chain's times (iat, exp) are seconds since 1970 before this bound (2242): anything else is not a
# time any guard wrote, and would overflow the clocks that read it.
MAX_TIME: Final = 2.0**33
# The scripts whose letters look alike: a name may not mix them (see name_problem()).
_LOOK_ALIKE_SCRIPTS: Final = frozenset({"LATIN", "CYRILLIC", "GREEK"})

_ROOT = re.compile(r"[0-9a-f]{32}")
# The last root that passed _ROOT, as the str object it is: a child token's root is its parent's
# object, so signing it checks by identity (a str cannot change), not the regex again (2.9 k
# instructions). REMEMBER_ROOTS False: every root goes through the regex (the uncached path).
REMEMBER_ROOTS = True
_checked_root: list[str | None] = [None]
_UNSIGNED_HEADER: Final = "eyJhbGciOiJub25lIn0"  # base64url of {"alg":"none"}


class NoSigningKey(RuntimeError):
    """A chain started in a process that holds public keys only was to be sent (see
    :attr:`ChainToken.travels`): it has no signature to travel with."""


HopKind = Literal["call", "transfer"]
"""What a hop is: a call (its caller waits for the answer) or a transfer (a handoff: it does not)."""


class Hop(NamedTuple):
    """One call in a delegation chain: the agent (or tool) called, and the job it was asked for.

    An immutable pair, as on the wire (``[agent, skill]``); a tuple so that comparing and hashing
    hops, which every decision does, runs at C speed. A transfer is a :class:`TransferHop`: the
    same pair, so two hops into the same (agent, skill) are equal whatever their kind (what the
    cycle rule compares); :attr:`kind` tells them apart.
    """

    agent: str
    skill: str | None = None

    @property
    def kind(self) -> HopKind:
        """``"call"``: the agent before this hop waits for its answer."""
        return "call"


class TransferHop(Hop):
    """A hop of kind transfer: control passed to ``agent`` and the agent handing off no longer
    waits for an answer (an OpenAI Agents handoff, ADK's ``transfer_to_agent``, a LangGraph
    ``Command(goto=...)`` handoff tool). On the wire ``[agent, skill, "transfer"]``."""

    __slots__ = ()

    @property
    def kind(self) -> HopKind:
        return "transfer"


_AGENT: Final = itemgetter(0)
_SKILL: Final = itemgetter(1)


@dataclass(frozen=True, slots=True)
class Chain:
    """The hops that led to the call being executed, oldest first; the last hop is the current one."""

    hops: tuple[Hop, ...]
    root: str
    workspace: str
    issued_at: float
    expires_at: float

    @property
    def depth(self) -> int:
        return len(self.hops)

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(map(_AGENT, self.hops))  # no comprehension's frame: every token reads it

    @property
    def skills(self) -> tuple[str, ...]:
        """The hops' skills, ``""`` for none (the span attribute ``otel_guard.chain.skills``)."""
        skills = tuple(map(_SKILL, self.hops))
        return tuple([skill or "" for skill in skills]) if None in skills else skills

    def name_depth(self, name: str) -> int:
        """How many times ``name`` stands in the chain."""
        return self.agents.count(name)

    def extended(self, hop: Hop) -> Chain:
        """This chain with ``hop`` appended (same root, workspace and lifetime)."""
        return Chain((*self.hops, hop), self.root, self.workspace, self.issued_at, self.expires_at)

    def path(self) -> str:
        """The agents joined by arrows, for messages: ``planner → budget``; a transfer's arrow is
        ``⇒`` (``triage ⇒ faq``: triage handed off to faq)."""
        hops = self.hops
        if all(type(hop) is Hop for hop in hops):
            return " → ".join([hop.agent for hop in hops])
        parts = [hops[0].agent]
        for hop in hops[1:]:
            parts.append(f"{' ⇒ ' if type(hop) is TransferHop else ' → '}{hop.agent}")
        return "".join(parts)


def new_root() -> str:
    """A fresh chain id: 32 lowercase hex characters.

    The root identifies a delegation tree; it is not a secret (the signature protects the chain), so
    it comes from the same fast generator the SDK uses for trace ids.
    """
    return f"{random.getrandbits(128):032x}"


def start_chain(hop: Hop, workspace: str, now: float, ttl: float) -> Chain:
    """A new chain whose first hop is ``hop``."""
    return Chain((hop,), new_root(), workspace, now, now + ttl)


# -- encoding -----------------------------------------------------------------------------------


@lru_cache(maxsize=4096, typed=True)  # typed: a call and a transfer into one name are equal tuples
def _hop_json(hop: Hop) -> tuple[str, int]:
    """A hop as JSON, and its length in UTF-8 bytes."""
    fields = [hop.agent, hop.skill] if type(hop) is Hop else [hop.agent, hop.skill, hop.kind]
    text = json.dumps(fields, separators=_COMPACT, ensure_ascii=False)
    return text, len(text.encode())


@lru_cache(maxsize=256)
def _str_json(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _claims_prefix(chain: Chain) -> tuple[str, int]:
    """The claims before the hops (the same for every hop of a chain), and its length in bytes."""
    text = (
        f'{{"v":{TOKEN_VERSION},"root":"{chain.root}","ws":{_str_json(chain.workspace)},'
        f'"iat":{chain.issued_at!r},"exp":{chain.expires_at!r},"hops":['
    )
    return text, len(text.encode())


_CHECKED_HOPS: dict[tuple[str, str | None], None] = {}
"""The (agent, skill) pairs :func:`check_hop` passed (bounded: emptied at 1024): a service's ingress
plans a hop of the same names for every fresh chain, and checking them again cost 4 k instructions."""


def check_hop(hop: Hop) -> None:
    """Raise ``ValueError`` for a hop whose names cannot travel in a token (:func:`name_problem`);
    a skill is text or ``None``. Called once per planned hop, not per call."""
    agent, skill = hop
    if type(agent) is str and (skill is None or type(skill) is str):
        if (agent, skill) in _CHECKED_HOPS:
            return
        _check_names(hop)
        if len(_CHECKED_HOPS) >= 1024:
            _CHECKED_HOPS.clear()
        _CHECKED_HOPS[agent, skill] = None
        return
    _check_names(hop)


def _check_names(hop: Hop) -> None:
    if hop.skill is not None and not isinstance(hop.skill, str):
        raise ValueError(f"delegate: skill must be a string or None, not {hop.skill!r}")
    for what, name in (("agent", hop.agent), ("skill", hop.skill)):
        problem = name_problem(name) if name is not None else None
        if problem is not None:
            raise ValueError(f"delegate: {what} name {quoted(name)} {problem}")


# Upper bounds on the claims' size in bytes, cheap enough for every hop: in the JSON this module
# writes, one character of a string takes at most 6 bytes (a \u00XX escape; UTF-8 needs at most 4),
# and a float's repr at most 24 characters.
_PREFIX_BOUND: Final = len('{"v":1,"root":"","ws":"","iat":,"exp":,"hops":[') + 32 + 2 * 24
_CLAIMS_END: Final = len("]}")


_TRANSFER_MARK: Final = len(',"transfer"')


def _hop_bound(hop: Hop) -> int:
    bound = 6 * (len(hop[0]) + len(hop[1] or "")) + len('["",null]')
    return bound if type(hop) is Hop else bound + _TRANSFER_MARK


def _claims_bound(chain: Chain) -> int:
    bound = _PREFIX_BOUND + 6 * len(chain.workspace) + _CLAIMS_END + len(chain.hops) - 1
    for hop in chain.hops:
        bound += _hop_bound(hop)
    return bound


def _token_length(claims_bytes: int, keyring: Keyring | None) -> int:
    # Base64url without padding is 4 characters per 3 bytes, rounded up; an HS256 signature is 43,
    # an EdDSA or ES256 one 86. A keyring with no signing key makes no token (ChainToken.travels).
    if keyring is None:
        return len(_UNSIGNED_HEADER) + 1 + (4 * claims_bytes + 2) // 3 + 1
    signing = keyring.signing
    if signing is None:
        return 0
    return len(signing.header) + 1 + (4 * claims_bytes + 2) // 3 + 1 + signing.signature_length


class ChainToken:
    """A verified chain ready to travel: encoded and signed only when a propagator needs its text.

    The guard puts this object itself into the context's baggage. Inside the process it *is* the
    verified chain, so nested hops never re-verify; the W3C baggage propagator calls ``str()`` on
    it when a carrier is injected, and only then is it encoded and signed (and the result kept).

    A child token (:meth:`extended`) costs a few tuples: its :class:`Chain`, its claims and its exact
    length are all made on first use, from its parent's. Whether it fits the baggage limit is first
    checked against an upper bound on its length, so a hop that does not call out never encodes.
    A child keeps its parent's chain and claims, never the parent token itself: the guard keeps
    children in their parent's :attr:`children`, and a reference back would make a cycle that only
    the garbage collector could free (a token arriving with every request would make one each).
    """

    __slots__ = (
        "_base",
        "_base_claims",
        "_bound",
        "_chain",
        "_claims",
        "_hop",
        "_keyring",
        "_length",
        "_relay",
        "_text",
        "agents",
        "children",
        "kin",
        "root",
        "skills",
    )

    MAX_CHILDREN = 32

    def __init__(self, chain: Chain, keyring: Keyring | None, text: str | None = None) -> None:
        self._chain: Chain | None = chain
        self._base: Chain | None = None  # a child's: its parent's chain, and its parent's claims
        self._base_claims: tuple[str, int, str, int] | None = None
        self._hop: Hop | None = None
        self._keyring = keyring
        self._text = text
        # The token this chain arrived in, which a process with no signing key sends on instead.
        self._relay: str | None = None
        self._claims: tuple[str, int, str, int] | None = None  # prefix, its bytes, hops, their bytes
        self._length = len(text) if text is not None else -1  # -1: not computed yet
        self._bound = -1  # see _claims_size_bound(); -1: not computed yet
        self.root = chain.root
        # The span attributes otel_guard.chain.agents / .skills, built once per chain.
        self.agents = chain.agents
        self.skills = chain.skills
        self.children: dict[Any, Any] = {}  # the guard's memo of hops made from this chain
        # What the hops from every chain with this one's path share, when the guard made this token
        # from such a shared hop (otel_guard._plans.SharedHop); None for any other token.
        self.kin: dict[Any, Any] | None = None

    def sibling(self, chain: Chain) -> ChainToken:
        """The token of ``chain``, a chain with this one's hops and workspace (another root, other
        times): what depends on those alone (the agents, the skills, the size bound) is this one's."""
        twin = ChainToken.__new__(ChainToken)
        twin._chain = chain
        twin._base = None
        twin._base_claims = None
        twin._hop = None
        twin._keyring = self._keyring
        twin._text = None
        twin._relay = None  # another root: nothing that arrived is this chain's
        twin._claims = None
        twin._length = -1
        twin._bound = self._claims_size_bound()  # the root's length and the times' bound are fixed
        twin.root = chain.root
        twin.agents = self.agents
        twin.skills = self.skills
        twin.children = {}
        twin.kin = None
        return twin

    @property
    def chain(self) -> Chain:
        chain = self._chain
        if chain is None:
            assert self._base is not None
            assert self._hop is not None
            chain = self._chain = self._base.extended(self._hop)
        return chain

    def extended(self, hop: Hop, keyring: Keyring | None) -> ChainToken:
        """The token of this chain with ``hop`` appended; nothing is encoded until it is needed."""
        child = ChainToken.__new__(ChainToken)
        child._chain = None
        child._base = self.chain
        child._base_claims = self._claims
        child._hop = hop
        child._keyring = keyring
        child._text = None
        child._relay = self._text if self._relay is None else self._relay
        child._claims = None
        child._length = -1
        child._bound = self._claims_size_bound() + 1 + _hop_bound(hop)
        child.root = self.root
        child.agents = (*self.agents, hop[0])
        child.skills = (*self.skills, hop[1] or "")
        child.children = {}
        child.kin = None
        return child

    def extended_afresh(self, hop: Hop, keyring: Keyring | None) -> ChainToken:
        """The token :meth:`extended` makes, built from the chain alone: none of this token's claims
        text (its own, or the sender's it arrived with), size bound, agents or skills is reused;
        only the arrived token that a process with no signing key sends on (:attr:`travels`). The
        guard calls :meth:`extended`; this is the uncached path that it must agree with, to the
        byte (tests/core/test_cache_equivalence.py)."""
        child = ChainToken(self.chain.extended(hop), keyring)
        child._relay = self._text if self._relay is None else self._relay
        return child

    def fits(self, limit: int) -> bool:
        """Whether the token's text is at most ``limit`` characters, encoding it only if it may not be."""
        if self._length < 0 and _token_length(self._claims_size_bound(), self._keyring) <= limit:
            return True
        return self.length <= limit

    def _claims_size_bound(self) -> int:
        """An upper bound on the size in bytes of this chain's claims as this module encodes them."""
        if self._bound < 0:
            self._bound = _claims_bound(self.chain)
        return self._bound

    @property
    def length(self) -> int:
        """The exact length of the token's text, known without signing it."""
        if self._length < 0:
            keyring = self._keyring
            if keyring is not None and keyring.signing is None:
                self._length = len(self._relay) if self._relay is not None else 0
            else:
                _, prefix_bytes, _, hops_bytes = self._encoded_claims()
                self._length = _token_length(prefix_bytes + hops_bytes + _CLAIMS_END, keyring)
        return self._length

    @property
    def travels(self) -> bool:
        """Whether this chain can leave the process in a token that a process with keys takes.

        False only where the keyring has public keys and no signing key (``jwks`` without ``keys``)
        and the chain is not one that arrived signed: a chain started here. Such a process mints
        nothing. The token of a hop it extends an arrived chain with is the arrived token itself,
        sent on unchanged (as a process without the guard passes baggage on): the next process
        verifies the chain as it entered this one, the hops made here are not in it. Never an
        unsigned token, never one signed with a key this process does not hold.
        """
        keyring = self._keyring
        return (
            keyring is None
            or keyring.signing is not None
            or self._text is not None
            or self._relay is not None
        )

    def _encoded_claims(self) -> tuple[str, int, str, int]:
        claims = self._claims
        if claims is None:
            base, hop = self._base_claims, self._hop
            if base is not None and hop is not None:
                # A child of an encoded parent: only the new hop is encoded.
                prefix, prefix_bytes, hops, hops_bytes = base
                hop_json, hop_bytes = _hop_json(hop)
                claims = (prefix, prefix_bytes, f"{hops},{hop_json}", hops_bytes + 1 + hop_bytes)
            else:
                chain = self.chain
                pieces = [_hop_json(hop) for hop in chain.hops]
                claims = (
                    *_claims_prefix(chain),
                    ",".join([piece for piece, _ in pieces]),
                    len(pieces) - 1 + sum([size for _, size in pieces]),
                )
            self._claims = claims
        return claims

    def arrived_claims(self, text: str, size: int) -> None:
        """Take ``text`` (``size`` bytes), the claims this token arrived with, as its encoded claims,
        so a child's are that text with one more hop instead of the whole chain encoded again (its
        times' ``repr`` alone cost 13 k instructions). Only for the claims of :func:`_decode` that
        extend so; its text may be spelled otherwise than this module writes (spaces, escapes), so
        its exact size also replaces the upper bound that :meth:`fits` checks first."""
        # The claims as prefix and hops: the prefix is all but the closing "]}", the hops empty;
        # a child appends ",<hop>" to them, which is what follows a last hop.
        self._claims = (text[:-2], size - 2, "", 0)
        self._bound = size

    def remember(self, key: Any, value: Any) -> None:
        """Keep ``value`` for ``key`` in :attr:`children`, up to :attr:`MAX_CHILDREN` entries."""
        if len(self.children) < self.MAX_CHILDREN:
            self.children[key] = value

    def __str__(self) -> str:
        text = self._text
        if text is None:
            keyring = self._keyring
            signing = keyring.signing if keyring is not None else None
            if keyring is not None and signing is None:
                return self._relayed()
            prefix, _, hops, _ = self._encoded_claims()
            claims = _b64encode(f"{prefix}{hops}]}}".encode())
            if signing is None:
                text = f"{_UNSIGNED_HEADER}.{claims}."
            else:
                signing_input = f"{signing.header}.{claims}"
                text = f"{signing_input}.{_b64encode(signing.sign(signing_input.encode('ascii')))}"
            self._text = text
            # What a server in this process would verify it against (an MCP or A2A call to itself).
            verified_tokens.signed(text, keyring, self)
        return text

    def _relayed(self) -> str:
        """The text of a token made where no key signs: the arrived token it extends (:attr:`travels`)."""
        if self._relay is None:
            raise NoSigningKey(
                "otel-guard: this process holds public keys only (jwks, no key of its own in keys): "
                "a chain it starts cannot be signed, so it cannot be sent; give the service a key "
                "of its own (otel-guard keygen --alg ed25519) to send chains it starts"
            )
        return self._relay

    def __repr__(self) -> str:  # never shows the token
        return f"ChainToken(root={self.root!r}, depth={len(self.agents)})"


class VerifiedTokens:
    """Tokens this process has verified, or signed itself, by token text.

    A server reads the same incoming token more than once (``current_chain()``, then the hop): the
    second read is a dict lookup. A token this process signed (a call to a server in this same
    process, over a transport) is what verifying its text with the same keyring would give, so it
    is kept too: the check is the keyring's identity, as for a verified one. Bounded (emptied when
    full; ``VerifiedTokens(0)`` keeps nothing); only successful verifications are kept. Small on
    purpose: the reads of one request come close together, and a token used once (as most are)
    should die young, before the garbage collector's older generations see it and its plan (at 256
    entries the ingress hop cost 4 % more instructions, most of it in collections). Plain dict
    operations are atomic under the GIL, so no lock is needed.
    """

    def __init__(self, size: int = 16) -> None:
        self._size = size
        # text -> (keyring, token, signed here): a token signed here is kept as the token that
        # signed it, and a token of its own is made only if a server here reads it.
        self._items: dict[str, tuple[Keyring | None, ChainToken, bool]] = {}

    def verify(self, text: str, keyring: Keyring | None) -> ChainToken:
        """The token of ``text`` verified with ``keyring``; raises :class:`InvalidToken`."""
        item = self._items.get(text)
        if item is not None and item[0] is keyring:
            if not item[2]:
                return item[1]
            token = ChainToken(item[1].chain, keyring, text)  # signed here: read for the first time
        else:
            chain, claims, size = _decoded(text, keyring)
            token = ChainToken(chain, keyring, text)
            if claims is not None:
                token.arrived_claims(claims, size)
        self._keep(text, keyring, token, False)
        return token

    def signed(self, text: str, keyring: Keyring | None, token: ChainToken) -> None:
        """Keep ``token``, which this process just encoded as ``text`` (signed with ``keyring``).

        Kept as it is: most signed tokens go to another process and are never read here, and
        making a token object for the cache costs a signing a sixth more (measured: 15 k
        instructions), building its chain (a child's is made on first use) 5 k more."""
        # What decode would refuse, this refuses too: a token too long, a chain with no root (the
        # stand-in of a refused hop's span, never sent), times past MAX_TIME (a clock that far on).
        # The names of a chain the guard made were checked when its hops were planned; encode()
        # forgets the chains it is given, which nothing here has checked. A child's times are its
        # parent chain's: read there, so that its own chain is not made for this.
        times = token._chain if token._chain is not None else token._base
        if (
            len(text) <= MAX_TOKEN_LENGTH
            and (token.root is _checked_root[0] or _root_checked(token.root))
            and times is not None
            and 0.0 <= times.issued_at <= times.expires_at <= MAX_TIME
        ):
            self._keep(text, keyring, token, True)

    def forget(self, text: str) -> None:
        """Keep nothing for ``text``: a token made here from a chain the guard has not checked."""
        self._items.pop(text, None)

    def _keep(self, text: str, keyring: Keyring | None, token: ChainToken, signed: bool) -> None:
        if len(self._items) >= self._size:
            self._items.clear()
            if not self._size:  # VerifiedTokens(0) keeps nothing: every read verifies (the uncached path)
                return
        self._items[text] = (keyring, token, signed)


verified_tokens = VerifiedTokens()


def encode(chain: Chain, keyring: Keyring | None) -> str:
    """The compact token for ``chain``, signed with the keyring's first key (unsigned without one).

    ``chain`` is taken as given (a name or a time :func:`decode` refuses included): this process
    verifies the token when it reads it, as any other does."""
    text = str(ChainToken(chain, keyring))
    verified_tokens.forget(text)
    return text


# -- decoding -----------------------------------------------------------------------------------


def _number(value: object, name: str) -> float:
    number = None
    if type(value) is float:
        number = value
    elif type(value) is int and -MAX_TIME <= value <= MAX_TIME:
        number = float(value)
    if number is None or not 0 <= number <= MAX_TIME:  # NaN fails this too
        raise InvalidToken(f"token claim {name!r} must be a time in seconds from 1970 to 2242")
    return number


_CLAIMS_READ: Final = len(("v", "root", "ws", "iat", "exp", "hops"))
_new_hop = tuple.__new__  # builds a Hop straight from a checked [agent, skill] pair
_HOP_SHAPE: Final = 'token hop must be [non-empty string, string or null] or [..., ..., "transfer"]'


def _root_checked(root: str) -> bool:
    """Whether ``root`` is 32 lowercase hex characters; one that is is remembered (REMEMBER_ROOTS)."""
    if _ROOT.fullmatch(root) is None:
        return False
    if REMEMBER_ROOTS:
        _checked_root[0] = root
    return True


def _claims_to_chain(claims: Mapping[str, Any]) -> Chain:
    version = claims.get("v")
    if version != TOKEN_VERSION or type(version) is bool:
        raise InvalidToken(f"token format version {quoted(version)} is not {TOKEN_VERSION}")
    root = claims.get("root")
    if type(root) is not str or not _root_checked(root):
        raise InvalidToken("token claim 'root' must be 32 lowercase hex characters")
    workspace = claims.get("ws")
    if type(workspace) is not str or not workspace:
        raise InvalidToken("token claim 'ws' must be a non-empty string")
    raw_hops = claims.get("hops")
    if type(raw_hops) is not list or not raw_hops:
        raise InvalidToken("token claim 'hops' must be a non-empty list")
    hops = []
    for raw in raw_hops:
        kind: type[Hop] = Hop
        item = raw
        if type(item) is not list or len(item) != 2:
            # A transfer is [agent, skill, "transfer"]; no other third element is known (fail closed).
            if type(raw) is not list or len(raw) != 3 or raw[2] != "transfer":
                raise InvalidToken(_HOP_SHAPE)
            kind = TransferHop
            item = raw[:2]
        agent, skill = item
        if type(agent) is not str or not agent or not (skill is None or type(skill) is str):
            raise InvalidToken(_HOP_SHAPE)
        # JSON escapes can spell anything, a lone surrogate included. Printable ASCII (nearly every
        # name) is the test inline; anything else gets name_problem's full check.
        if not (agent.isascii() and agent.isprintable()):
            _check_name(agent)
        if skill is not None and not (skill.isascii() and skill.isprintable()):
            _check_name(skill)
        hops.append(_new_hop(kind, item))
    # A float in range (what this module writes) inline; anything else is _number's to read.
    issued_at = claims.get("iat")
    if type(issued_at) is not float or not 0 <= issued_at <= MAX_TIME:
        issued_at = _number(issued_at, "iat")
    expires_at = claims.get("exp")
    if type(expires_at) is not float or not 0 <= expires_at <= MAX_TIME:
        expires_at = _number(expires_at, "exp")
    if expires_at < issued_at:
        raise InvalidToken("token claim 'exp' is before its 'iat'")
    return Chain(tuple(hops), root, workspace, issued_at, expires_at)


def _check_name(name: str) -> None:
    problem = name_problem(name)
    if problem is not None:
        raise InvalidToken(f"token hop name {quoted(name)} {problem}")


def name_problem(name: str) -> str | None:
    """What is wrong with an agent or skill name, or None.

    A name is printable text (no control characters, no invisible format characters such as a
    zero-width joiner, no lone surrogate, which no carrier, span or log can encode), in NFKC form
    (fullwidth and other compatibility forms are the same name as their plain one:
    :func:`normal_name`), and its letters are not of more than one of the Latin, Cyrillic and Greek
    scripts (``plаnner`` with a Cyrillic ``а`` is refused, not taken for another agent than
    ``planner``: UTS #39's mixed-script rule, for the scripts whose letters look alike). Its length
    is bounded by the baggage member the chain travels in: a hop whose chain would not fit is
    refused with reason ``chain_size``.
    """
    if not name.isprintable():
        return "is not printable text (control, format or unpaired surrogate characters)"
    if name.isascii():
        return None
    if not unicodedata.is_normalized("NFKC", name):
        return "is not in Unicode NFKC form"
    scripts = {_script(character) for character in name if character.isalpha()} & _LOOK_ALIKE_SCRIPTS
    if len(scripts) > 1:
        mixed = " and ".join(sorted(script.title() for script in scripts))
        return f"mixes the letters of {mixed}, which look alike"
    return None


def normal_name(name: str) -> str:
    """``name`` in NFKC form: how the guard takes a name it is given (``delegate``, the runtimes)."""
    return name if name.isascii() else unicodedata.normalize("NFKC", name)


def _script(character: str) -> str:
    # The first word of a letter's Unicode name is its script for these three (LATIN SMALL LETTER
    # E WITH ACUTE, CYRILLIC SMALL LETTER A, GREEK SMALL LETTER ALPHA).
    return "LATIN" if character.isascii() else unicodedata.name(character, "").partition(" ")[0]


def decode(token: object, keyring: Keyring | None) -> Chain:
    """Verify ``token`` and return its chain; raise :class:`InvalidToken` for anything else.

    With a keyring, only tokens signed by one of its keys pass, each with the algorithm its key is
    for (an HMAC is compared in constant time). Without one, signatures cannot be checked: unsigned
    and signed tokens are read as they are, which is what "no keys" means.
    """
    return _decoded(token, keyring)[0]


def _decoded(token: object, keyring: Keyring | None) -> tuple[Chain, str | None, int]:
    """:func:`decode`, with the claims' JSON text and its size in bytes where a child's claims can
    be that text with one more hop (see :func:`_decode`); ``None`` and 0 elsewhere."""
    try:
        return _decode(token, keyring)
    except InvalidToken:
        raise
    except Exception as exc:  # a decoder must never fail in another way: fail closed
        raise InvalidToken(f"token could not be read ({type(exc).__name__})") from None


def decode_unsigned(token: object) -> Chain:
    """The chain of an unsigned token (header ``alg`` ``none``, empty signature: what a process without
    keys sends), read as such a process reads it; raises :class:`InvalidToken` for any other token, a
    signed one (however badly) included. For ``accept_unsigned``: the caller has keys, and decides
    what an unsigned chain gets."""
    if type(token) is not str or token.count(".") != 2:
        raise InvalidToken("token is not a JWS compact serialization (header.claims.signature)")
    header, _, signature = token.split(".")
    if signature or (
        header != _UNSIGNED_HEADER and _json_object(_b64decode(header), "header").get("alg") != "none"
    ):
        raise InvalidToken("token is not an unsigned token")
    return decode(token, None)


def _decode(token: object, keyring: Keyring | None) -> tuple[Chain, str | None, int]:
    if type(token) is not str:
        raise InvalidToken("token is not a string")
    if len(token) > MAX_TOKEN_LENGTH:
        raise InvalidToken(f"token is longer than {MAX_TOKEN_LENGTH} characters")
    if not token.isascii():
        raise InvalidToken("token has characters outside ASCII")
    parts = token.split(".")
    if len(parts) != 3:
        raise InvalidToken("token is not a JWS compact serialization (header.claims.signature)")
    header, payload, signature = parts
    if keyring is None:
        if header != _UNSIGNED_HEADER:
            _check_header(_json_object(_b64decode(header), "header"))
    else:
        if header == _UNSIGNED_HEADER or not signature:
            raise InvalidToken("token is unsigned but keys are configured")
        key = keyring.key_for(header)
        if not key.verify(token[: len(header) + 1 + len(payload)].encode("ascii"), signature):
            raise InvalidToken("token signature does not match")
    raw = _b64decode(payload)
    if raw.isascii():
        # The claims in the shape this module writes, read without the JSON decoder (a third of
        # its cost and the checks'); any other text is decoded and checked below.
        text = raw.decode("ascii")
        read = read_claims(text, Hop, TransferHop)
        if read is not None:
            root, workspace, issued_at, expires_at, hops = read
            if 0.0 <= issued_at <= expires_at <= MAX_TIME:
                if REMEMBER_ROOTS:
                    _checked_root[0] = root
                return Chain(hops, root, workspace, issued_at, expires_at), text, len(raw)
    text, claims = _json_text(raw, "claims")
    chain = _claims_to_chain(claims)
    # The text extends by one hop when it is the chain's claims and nothing else, its hops last:
    # the object has exactly the six claims read (a duplicate key is the last one's, as any JSON
    # reader takes it) and its text ends "]}", so its last member is an array: the hops. Inserting
    # ",<hop>" before that end then reads back as this chain with the hop appended.
    if len(claims) == _CLAIMS_READ and text.endswith("]}"):
        return chain, text, len(raw)
    return chain, None, 0
