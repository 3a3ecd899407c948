"""The public face (docs/spec.md §1): ``otel_guard.__all__``, the refusal's fields, immutable values."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import types

import pytest

import otel_guard
from otel_guard import Chain, DelegationRefused, Hop

SPEC_NAMES = {
    "configure",
    "agentic",
    "delegate",
    "current_chain",
    "name_depth",
    "Chain",
    "Hop",
    "DelegationRefused",
    "situational_prefix",
}


def test_all_is_complete_and_sorted() -> None:
    exported = otel_guard.__all__
    assert exported == sorted(exported)
    assert len(set(exported)) == len(exported)
    public = {
        name
        for name, value in vars(otel_guard).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(exported)
    assert set(exported) >= SPEC_NAMES
    for name in exported:
        assert getattr(otel_guard, name) is not None


def test_the_contract_signatures() -> None:
    delegate = inspect.signature(otel_guard.delegate)
    assert list(delegate.parameters)[:2] == ["agent", "skill"]
    assert delegate.parameters["skill"].default is None
    prefix = inspect.signature(otel_guard.situational_prefix)
    positional = [p.name for p in prefix.parameters.values() if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert positional == ["fn_name", "fn_doc"]
    assert prefix.parameters["fn_doc"].default == ""
    # The call path came later, as a keyword: calls written to the contract's two parameters still work.
    assert prefix.parameters["path"].kind is inspect.Parameter.KEYWORD_ONLY
    assert prefix.parameters["path"].default == ()
    assert list(inspect.signature(otel_guard.name_depth).parameters) == ["name"]
    assert list(inspect.signature(otel_guard.current_chain).parameters) == []
    configure = inspect.signature(otel_guard.configure)
    assert [p.kind for p in configure.parameters.values()] == [inspect.Parameter.VAR_KEYWORD]


def test_configure_returns_settings() -> None:
    assert isinstance(otel_guard.configure(), otel_guard.Settings)


def test_delegation_refused_fields() -> None:
    chain = Chain((Hop("planner"), Hop("budget")), "0" * 32, "default", 1.0, 301.0)
    refused = DelegationRefused("cycle", "Delegation cycle: agent planner is ...", Hop("planner"), chain)
    assert isinstance(refused, RecursionError)
    assert (refused.reason, refused.hop, refused.chain) == ("cycle", Hop("planner"), chain)
    assert refused.status == 409
    assert refused.retryable is False
    assert refused.code == "a2a_delegation_cycle"
    assert str(refused) == "Delegation cycle: agent planner is ..."
    codes = {
        reason: DelegationRefused(reason, "m", Hop("a"), None).code
        for reason in ("cycle", "depth", "name_depth", "expired", "bad_signature", "foreign_workspace")
    }
    assert codes == {
        "cycle": "a2a_delegation_cycle",
        "depth": "a2a_delegation_depth",
        "name_depth": "a2a_delegation_depth",
        "expired": "a2a_delegation_invalid",
        "bad_signature": "a2a_delegation_invalid",
        "foreign_workspace": "a2a_delegation_invalid",
    }


def test_delegation_refused_survives_pickling_with_its_fields() -> None:
    # Refusals cross process pools and task queues.
    chain = Chain((Hop("planner", "plan"),), "a" * 32, "default", 1.0, 2.0)
    refused = DelegationRefused("cycle", "Delegation cycle: ...", Hop("planner", "plan"), chain)
    copy = pickle.loads(pickle.dumps(refused))
    assert (copy.reason, copy.hop, copy.chain, str(copy), copy.code) == (
        "cycle",
        Hop("planner", "plan"),
        chain,
        "Delegation cycle: ...",
        "a2a_delegation_cycle",
    )


def test_hop_and_chain_are_immutable_values() -> None:
    hop = Hop("planner", "plan")
    chain = Chain((hop,), "0" * 32, "default", 1.0, 301.0)
    with pytest.raises(AttributeError):
        hop.agent = "budget"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        chain.hops = ()  # type: ignore[misc]
    with pytest.raises((AttributeError, TypeError)):
        chain.depth = 3  # type: ignore[misc]
    assert isinstance(chain.hops, tuple)
    assert hop == Hop("planner", "plan")
    assert hash(hop) == hash(Hop("planner", "plan"))
    assert Hop("planner") == Hop("planner", None)
    assert chain == Chain((Hop("planner", "plan"),), "0" * 32, "default", 1.0, 301.0)
    assert {chain: 1}[Chain((hop,), "0" * 32, "default", 1.0, 301.0)] == 1


def test_chain_fields_of_the_contract() -> None:
    chain = Chain((Hop("planner", "plan"), Hop("budget")), "0" * 32, "ws", 10.0, 310.0)
    assert chain.depth == len(chain.hops) == 2
    assert chain.root == "0" * 32
    assert chain.workspace == "ws"
    assert (chain.issued_at, chain.expires_at) == (10.0, 310.0)
    assert chain.hops[-1] == Hop("budget")
    assert chain.hops[-1].skill is None


def test_current_chain_outside_any_hop_is_none() -> None:
    assert otel_guard.current_chain() is None
    assert otel_guard.name_depth("anything") == 0


def test_the_package_is_typed() -> None:
    from pathlib import Path

    assert (Path(otel_guard.__file__).parent / "py.typed").is_file()
