"""One process injects the chain into a carrier, another extracts it and continues (docs/spec.md §4).

The other processes are fresh interpreters (``programs/continue_chain.py``) configured only by
``OTEL_GUARD_*`` environment variables, as deployed agents are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import propagate

import otel_guard
from otel_guard import delegate

pytestmark = pytest.mark.integration

Run = Callable[..., Any]


def send(*hops: tuple[str, str | None]) -> tuple[dict[str, str], Any]:
    """Enter ``hops`` in this process and inject what the last one carries; returns (carrier, chain)."""
    carrier: dict[str, str] = {}

    def enter(rest: tuple[tuple[str, str | None], ...]) -> Any:
        if not rest:
            propagate.inject(carrier)
            return otel_guard.current_chain()
        with delegate(*rest[0]):
            return enter(rest[1:])

    return carrier, enter(hops)


def hop(agent: str, skill: str | None = None, receiving: bool = False) -> dict[str, Any]:
    return {"agent": agent, "skill": skill, "receiving": receiving}


def test_a_chain_continues_across_processes(run_program: Run, key: Any, spans: Any) -> None:
    otel_guard.configure(workspace="travel")
    carrier, sent = send(("planner", "plan"), ("budget", "price"))
    assert "traceparent" in carrier
    budget_process = run_program(
        "continue_chain.py",
        {"carrier": carrier, "hops": [hop("budget", "price", receiving=True), hop("fx", "convert")]},
        OTEL_GUARD_KEYS=key.env,
        OTEL_GUARD_WORKSPACE="travel",
    )
    assert budget_process["outcome"] == "ok"
    chain = budget_process["chain"]
    assert chain["hops"] == [["planner", "plan"], ["budget", "price"], ["fx", "convert"]]
    assert chain["root"] == sent.root  # one delegation tree across processes
    assert chain["workspace"] == "travel"
    assert chain["expires_at"] == sent.expires_at  # the lifetime counts from the first hop
    # The trace continues too, and the receiving hop is a server span.
    trace_id = f"{spans.one('invoke_agent budget').context.trace_id:032x}"
    assert {s["trace_id"] for s in budget_process["spans"]} == {trace_id}
    assert [(s["name"], s["kind"], s["decision"]) for s in budget_process["spans"]] == [
        ("invoke_agent fx", "INTERNAL", "allow"),
        ("invoke_agent budget", "SERVER", "allow"),
    ]

    # A third process continues from the second.
    fx_process = run_program(
        "continue_chain.py",
        {"carrier": budget_process["carrier"], "hops": [hop("fx", receiving=True), hop("tax")]},
        OTEL_GUARD_KEYS=key.env,
        OTEL_GUARD_WORKSPACE="travel",
    )
    assert fx_process["outcome"] == "ok"
    assert [h[0] for h in fx_process["chain"]["hops"]] == ["planner", "budget", "fx", "tax"]
    assert fx_process["chain"]["root"] == sent.root


def test_a_cycle_across_the_process_boundary_is_refused_there(run_program: Run, key: Any) -> None:
    carrier, _ = send(("planner", None), ("budget", None))
    result = run_program(
        "continue_chain.py",
        {"carrier": carrier, "hops": [hop("planner", receiving=True)]},
        OTEL_GUARD_KEYS=key.env,
    )
    assert result["outcome"] == "refused"
    assert result["refusal"] == {
        "reason": "cycle",
        "code": "a2a_delegation_cycle",
        "status": 409,
        "message": "Delegation cycle: agent planner is already in chain planner → budget",
    }
    assert [(s["name"], s["decision"], s["reason"]) for s in result["spans"]] == [
        ("invoke_agent planner", "refuse", "cycle")
    ]


def test_a_hop_an_observing_client_let_through_is_refused_by_an_enforcing_server(
    run_program: Run, key: Any
) -> None:
    otel_guard.configure(mode="observe", cycle_rule="agent")
    carrier, sent = send(("planner", None), ("budget", None), ("planner", None))
    assert sent.agents == ("planner", "budget", "planner")
    result = run_program(
        "continue_chain.py",
        {"carrier": carrier, "hops": [hop("planner", receiving=True)]},
        OTEL_GUARD_KEYS=key.env,
        OTEL_GUARD_CYCLE_RULE="agent",
    )
    assert result["outcome"] == "refused"
    assert result["refusal"]["reason"] == "cycle"


def test_the_rules_of_the_receiving_process_apply_there(run_program: Run, key: Any) -> None:
    carrier, _ = send(("planner", "plan"), ("budget", "price"))
    request = {
        "carrier": carrier,
        "hops": [hop("budget", "price", receiving=True), hop("planner", "itinerary")],
    }
    default = run_program("continue_chain.py", request, OTEL_GUARD_KEYS=key.env)
    strict = run_program("continue_chain.py", request, OTEL_GUARD_KEYS=key.env, OTEL_GUARD_CYCLE_RULE="agent")
    shallow = run_program("continue_chain.py", request, OTEL_GUARD_KEYS=key.env, OTEL_GUARD_MAX_DEPTH="2")
    assert default["outcome"] == "ok"
    assert (strict["outcome"], strict["refusal"]["reason"]) == ("refused", "cycle")
    assert (shallow["outcome"], shallow["refusal"]["reason"]) == ("refused", "depth")


@pytest.mark.parametrize("mode", ["enforce", "observe"])
def test_a_process_with_another_key_refuses(
    run_program: Run, key: Any, make_key: Callable[[str], Any], mode: str
) -> None:
    carrier, _ = send(("planner", None), ("budget", None))
    stranger = make_key("k1")  # same key id, another secret
    result = run_program(
        "continue_chain.py",
        {"carrier": carrier, "hops": [hop("budget", receiving=True)]},
        OTEL_GUARD_KEYS=stranger.env,
        OTEL_GUARD_MODE=mode,
    )
    assert result["outcome"] == "refused"
    assert result["refusal"]["reason"] == "bad_signature"
    assert result["refusal"]["code"] == "a2a_delegation_invalid"


def test_a_process_with_keys_refuses_an_unsigned_chain(
    run_program: Run, make_key: Callable[[str], Any]
) -> None:
    carrier, _ = send(("planner", None))  # this process has no keys
    result = run_program(
        "continue_chain.py",
        {"carrier": carrier, "hops": [hop("budget")]},
        OTEL_GUARD_KEYS=make_key("k1").env,
        OTEL_GUARD_MODE="observe",
    )
    assert result["outcome"] == "refused"
    assert result["refusal"]["reason"] == "bad_signature"


def test_processes_without_keys_accept_unsigned_chains(run_program: Run) -> None:
    carrier, sent = send(("planner", None))
    result = run_program("continue_chain.py", {"carrier": carrier, "hops": [hop("budget")]})
    assert result["outcome"] == "ok"
    assert result["chain"]["hops"] == [["planner", None], ["budget", None]]
    assert result["chain"]["root"] == sent.root


def test_a_foreign_workspace_is_refused_across_processes(run_program: Run, key: Any) -> None:
    otel_guard.configure(workspace="travel")
    carrier, _ = send(("planner", None))
    result = run_program(
        "continue_chain.py",
        {"carrier": carrier, "hops": [hop("budget")]},
        OTEL_GUARD_KEYS=key.env,
        OTEL_GUARD_WORKSPACE="finance",
    )
    assert result["outcome"] == "refused"
    assert result["refusal"]["reason"] == "foreign_workspace"


def test_key_rotation_across_processes(run_program: Run, make_key: Callable[[str], Any]) -> None:
    old, new = make_key("old"), make_key("new")
    otel_guard.configure(keys={"old": old.secret})
    carrier, _ = send(("planner", None))

    def forward(carrier: dict[str, str], keys: str, agent: str = "budget") -> Any:
        return run_program(
            "continue_chain.py", {"carrier": carrier, "hops": [hop(agent)]}, OTEL_GUARD_KEYS=keys
        )

    # A process already signing with the new key still verifies the old one it lists second...
    rotated = forward(carrier, f"{new.env},{old.env}")
    assert rotated["outcome"] == "ok"
    # ...and what it sends, signed with the new key, is verified by a process that lists it second,
    during = forward(rotated["carrier"], f"{old.env},{new.env}", "fx")
    assert during["outcome"] == "ok"
    # but refused by a process that never learned it.
    stale = forward(rotated["carrier"], old.env, "fx")
    assert (stale["outcome"], stale["refusal"]["reason"]) == ("refused", "bad_signature")
    # Once the old key is dropped everywhere, its tokens are refused.
    dropped = forward(carrier, new.env)
    assert (dropped["outcome"], dropped["refusal"]["reason"]) == ("refused", "bad_signature")


def test_an_expired_chain_is_refused_across_processes(run_program: Run, key: Any) -> None:
    otel_guard.configure(ttl="0.001")
    carrier, _ = send(("planner", None))  # expired by the time the other process starts
    result = run_program(
        "continue_chain.py", {"carrier": carrier, "hops": [hop("budget")]}, OTEL_GUARD_KEYS=key.env
    )
    assert result["outcome"] == "refused"
    assert result["refusal"]["reason"] == "expired"
