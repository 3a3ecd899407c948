"""A service's hop shared by the chains that arrive along one path (otel_guard._received_hops).

Once a hop into a service was allowed from a path, the next chain along that path makes its plan
from the shared one instead of being decided. Nothing it would refuse gets through: a chain along
the same path that has expired, was issued in the future, claims a lifetime past ``ttl``, belongs to
another workspace, or is forged, altered or signed with a foreign key is refused as before, and a
change of settings decides afresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest

import otel_guard
import otel_guard.guard as guard
from otel_guard import DelegationRefused, delegate
from otel_guard._received_hops import ReceivedHops
from otel_guard.chain import Chain, ChainToken, Hop, Keyring, TransferHop, new_root
from otel_guard.policy import decide_for_agent

SECRET = bytes(range(32))
FOREIGN = bytes([9] * 32)
InBaggage = Callable[[object], AbstractContextManager[None]]


@pytest.fixture(autouse=True)
def _fresh_received_hops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard, "received_hops", ReceivedHops())
    otel_guard.configure(mode="enforce", keys={"k1": SECRET}, ttl=300)


def arriving(
    hops: tuple[Hop, ...] = (Hop("planner", "plan"),),
    *,
    secret: bytes = SECRET,
    workspace: str = "default",
    issued_at: float | None = None,
    lifetime: float = 300,
) -> str:
    """A token another process signed for a chain of ``hops`` (a fresh root each)."""
    now = time.time() if issued_at is None else issued_at
    chain = Chain(hops, new_root(), workspace, now, now + lifetime)
    return str(ChainToken(chain, Keyring({"k1": secret})))


def receive(chain_in_baggage: InBaggage, token: str) -> tuple[str | None, str | None]:
    """The service ``concierge``'s hop on ``token``: its decision and the chain it sends on (or the
    refusal's reason and ``None``)."""
    with chain_in_baggage(token):
        hop = delegate("concierge", "quote", receiving=True)
        try:
            with hop:
                sent = otel_guard.current_chain()
                return hop.decision, None if sent is None else sent.path()
        except DelegationRefused as refused:
            return refused.reason, None


def decided(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The chains the policy decides from, from now on."""
    calls: list[Any] = []

    def counting(arrival: Any, *rest: Any) -> Any:
        calls.append(arrival)
        return decide_for_agent(arrival, *rest)

    monkeypatch.setattr(guard, "decide_for_agent", counting)
    return calls


def test_the_next_chain_along_a_path_is_not_decided_again(
    chain_in_baggage: InBaggage, monkeypatch: pytest.MonkeyPatch, spans: Any
) -> None:
    calls = decided(monkeypatch)
    first = receive(chain_in_baggage, arriving())
    second = receive(chain_in_baggage, arriving())
    assert first == second == ("allow", "planner → concierge")
    assert len(calls) == 1  # the second made from the first's plan
    made = spans.named("invoke_agent concierge")
    assert len(made) == 2
    roots = [span.attributes["otel_guard.chain.root"] for span in made]
    assert roots[0] != roots[1]  # each its own chain's root, the rest the same
    assert {key: value for key, value in made[0].attributes.items() if key != "otel_guard.chain.root"} == {
        key: value for key, value in made[1].attributes.items() if key != "otel_guard.chain.root"
    }


def test_another_path_or_kind_of_hop_is_decided(
    chain_in_baggage: InBaggage, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = decided(monkeypatch)
    assert receive(chain_in_baggage, arriving())[0] == "allow"
    assert receive(
        chain_in_baggage, arriving((Hop("planner", "plan"), Hop("concierge", "quote"), Hop("fx")))
    )[0] == ("cycle")
    assert receive(chain_in_baggage, arriving((TransferHop("planner", "plan"),)))[0] == "allow"
    assert len(calls) == 3


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (lambda: arriving(issued_at=time.time() - 400), "expired"),
        (lambda: arriving(issued_at=time.time() + 3600), "expired"),
        (lambda: arriving(lifetime=3600), "expired"),
        (lambda: arriving(workspace="other"), "foreign_workspace"),
        (lambda: arriving(secret=FOREIGN), "bad_signature"),
        (lambda: arriving()[:-2] + "AA", "bad_signature"),
        (lambda: arriving().replace(".", ".e", 1), "bad_signature"),
    ],
)
def test_a_chain_along_an_allowed_path_is_still_refused_for_what_it_is(
    chain_in_baggage: InBaggage, token: Callable[[], str], reason: str
) -> None:
    assert receive(chain_in_baggage, arriving())[0] == "allow"
    assert receive(chain_in_baggage, token()) == (reason, None)
    assert receive(chain_in_baggage, arriving())[0] == "allow"


def test_observe_mode_and_new_settings_decide_afresh(
    chain_in_baggage: InBaggage, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert receive(chain_in_baggage, arriving())[0] == "allow"
    otel_guard.configure(mode="observe", keys={"k1": SECRET}, ttl=300, max_depth=1)
    calls = decided(monkeypatch)
    assert receive(chain_in_baggage, arriving())[0] == "would_refuse"
    assert receive(chain_in_baggage, arriving())[0] == "would_refuse"  # never shared: not allowed
    assert len(calls) == 2
