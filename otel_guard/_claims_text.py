"""A chain token's claims read straight from their text, when the text has the one shape the guard writes.

Every token a guard signs holds its claims as ``{"v":1,"root":"<32 hex>","ws":"<name>","iat":<time>,
"exp":<time>,"hops":[["<agent>","<skill>"|null(,"transfer")],...]}``, without spaces or escapes.
:func:`read_claims` reads exactly that shape with one regular expression and gives ``None`` for any
other text, which :mod:`otel_guard.chain` then reads with the JSON decoder, as before. What a reader
would not guess: the shape is narrower than what the guard writes, on purpose: a string here is
printable ASCII without ``"`` or ``\\`` (so its JSON text is its value, and a name needs no further
check), a time is digits with a fraction and no exponent (``float`` of it is what JSON gives), and
anything else (an escape, a space, a key twice or in another order, an integer time) goes to the
decoder. Reading the claims this way costs about a third of decoding them and checking the result
(tests/core/test_claims_text.py holds it to ``json.loads``).
"""

from __future__ import annotations

import re
from typing import Final, TypeVar

_TEXT: Final = r"[ !#-\[\]-~]"  # printable ASCII but " and \: a JSON string's text is its value
_TIME: Final = r"(?:0|[1-9][0-9]{0,15}+)\.[0-9]{1,20}+"
_NEXT_HOP: Final = rf',\["{_TEXT}++",(?:"{_TEXT}*+"|null)(?:,"transfer")?\]'
_CLAIMS: Final = re.compile(
    rf'\{{"v":1,"root":"([0-9a-f]{{32}})","ws":"({_TEXT}++)","iat":({_TIME}),"exp":({_TIME}),'
    rf'"hops":\[\["({_TEXT}++)",(?:"({_TEXT}*+)"|null)(,"transfer")?\]((?:{_NEXT_HOP})*+)\]\}}'
)
"""The claims, the first hop's agent, skill (``None``: ``null``) and transfer mark in groups of their
own, and the hops after it in one group (read by :data:`_HOPS`)."""
_HOPS: Final = re.compile(rf',\["({_TEXT}+)",(?:"({_TEXT}*)"|(null))(,"transfer")?\]')

READ: list[bool] = [True]
"""``READ[0]`` False: :func:`read_claims` reads nothing, every token's claims go to the JSON decoder
(the uncached path, tests/core/test_cache_equivalence.py)."""


H = TypeVar("H", bound=tuple[str, "str | None"])


def read_claims(
    text: str, call: type[H], transfer: type[H]
) -> tuple[str, str, float, float, tuple[H, ...]] | None:
    """The root, workspace, issue and expiry times and hops of claims ``text`` in the guard's own
    shape (see the module docs), or ``None`` for any other text (the JSON decoder's to read). A hop
    is made a ``call`` or a ``transfer`` (tuple subclasses: the chain's hop types) from its pair."""
    if not READ[0]:
        return None
    found = _CLAIMS.fullmatch(text)
    if found is None:
        return None
    root, workspace, issued_at, expires_at, agent, skill, handoff, more = found.groups()
    hop = _new(transfer if handoff else call, (agent, skill))
    if more:
        hops = [hop]
        for agent, skill, null, handoff in _HOPS.findall(more):  # a skill that is null reads ""
            hops.append(_new(transfer if handoff else call, (agent, None if null else skill)))
        return root, workspace, float(issued_at), float(expires_at), tuple(hops)
    return root, workspace, float(issued_at), float(expires_at), (hop,)


_new = tuple.__new__
