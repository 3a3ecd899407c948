"""The policy (docs/spec.md §2, §3): decide() as a pure function, and settings from env and configure()."""

from __future__ import annotations

import base64
import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import otel_guard
from otel_guard import delegate
from otel_guard.chain import Chain, Hop, Keyring
from otel_guard.policy import CLOCK_SKEW, decide
from otel_guard.settings import (
    CYCLE_RULES,
    ENV,
    AgentOverride,
    CycleRule,
    Settings,
    current_settings,
    reset_settings,
    settings_from_env,
)

ROOT = "0123456789abcdef0123456789abcdef"
NOW = 1_000_000.0
SECRET = b"s" * 32


def chain(*hops: Hop | str, workspace: str = "default", issued: float = NOW - 10, ttl: float = 300) -> Chain:
    made = tuple(h if isinstance(h, Hop) else Hop(h) for h in hops)
    return Chain(made, ROOT, workspace, issued, issued + ttl)


def verdict(arrival: Chain | None, hop: Hop, **settings: Any) -> tuple[str, str | None]:
    result = decide(arrival, hop, Settings(**settings), NOW)
    return result.outcome, result.reason


PLANNER_PLAN = Hop("planner", "plan")
BUDGET_PRICE = Hop("budget", "price")
PLANNER_ITINERARY = Hop("planner", "itinerary")


# -- decide: the rules ------------------------------------------------------------------------------


def test_a_first_hop_is_always_allowed() -> None:
    for mode in ("enforce", "observe", "off"):
        for rule in ("agent_skill", "agent", "none"):
            assert decide(None, PLANNER_PLAN, Settings(mode=mode, cycle_rule=rule), NOW).outcome == "allow"


def test_seed_table_default_rule_same_agent_and_skill() -> None:
    assert verdict(chain(PLANNER_PLAN), BUDGET_PRICE) == ("allow", None)
    assert verdict(chain(PLANNER_PLAN, BUDGET_PRICE), PLANNER_ITINERARY) == ("allow", None)
    assert verdict(chain(PLANNER_PLAN, BUDGET_PRICE, PLANNER_ITINERARY), BUDGET_PRICE) == ("refuse", "cycle")


def test_seed_table_strict_rule_same_agent() -> None:
    assert verdict(chain(PLANNER_PLAN), BUDGET_PRICE, cycle_rule="agent") == ("allow", None)
    refused = decide(chain(PLANNER_PLAN, BUDGET_PRICE), PLANNER_ITINERARY, Settings(cycle_rule="agent"), NOW)
    assert (refused.outcome, refused.reason) == ("refuse", "cycle")
    assert refused.message == "Delegation cycle: agent planner is already in chain planner → budget"


def test_default_rule_treats_no_skill_as_a_skill_of_its_own() -> None:
    assert verdict(chain("a"), Hop("a")) == ("refuse", "cycle")
    assert verdict(chain("a"), Hop("a", "x")) == ("allow", None)
    assert verdict(chain(Hop("a", "x")), Hop("a")) == ("allow", None)


def test_cycle_anywhere_in_the_chain_not_only_the_caller() -> None:
    long = chain("planner", "budget", "fx", "tax")
    assert verdict(long, Hop("planner"), cycle_rule="agent") == ("refuse", "cycle")
    assert verdict(long, Hop("planner")) == ("refuse", "cycle")
    assert verdict(long, Hop("weather"), cycle_rule="agent") == ("allow", None)


def test_cycle_rule_none_leaves_only_the_depth_limits() -> None:
    assert verdict(chain("a", "b", "a"), Hop("b"), cycle_rule="none") == ("allow", None)
    assert verdict(chain(*["a"] * 4), Hop("a"), cycle_rule="none") == ("allow", None)
    assert verdict(chain(*["a"] * 5), Hop("a"), cycle_rule="none") == ("refuse", "name_depth")


def test_max_depth_allows_exactly_max_depth_hops() -> None:
    names = [f"agent{i}" for i in range(8)]
    assert verdict(chain(*names[:7]), Hop("last")) == ("allow", None)  # makes 8
    refused = decide(chain(*names), Hop("last"), Settings(), NOW)
    assert (refused.outcome, refused.reason) == ("refuse", "depth")
    assert "last" in refused.message
    assert "8" in refused.message
    assert " → ".join(names) in refused.message
    assert verdict(chain("a", "b"), Hop("c"), max_depth=2) == ("refuse", "depth")
    assert verdict(chain("a"), Hop("c"), max_depth=2) == ("allow", None)


def test_max_name_depth_counts_one_name_across_skills() -> None:
    # The default rule allows planner again for a new job each time; the name-depth backstop does not.
    skills = [Hop("planner", f"job{i}") for i in range(5)]
    assert verdict(chain(*skills[:4]), Hop("planner", "job9")) == ("allow", None)
    refused = decide(chain(*skills), Hop("planner", "job9"), Settings(), NOW)
    assert (refused.outcome, refused.reason) == ("refuse", "name_depth")
    assert "planner" in refused.message
    assert "5" in refused.message
    assert verdict(chain(*skills[:2]), Hop("planner", "job9"), max_name_depth=2) == ("refuse", "name_depth")


def test_max_name_depth_of_one_is_the_strict_rule() -> None:
    assert verdict(chain("a", "b"), Hop("a", "new"), max_name_depth=1) == ("refuse", "name_depth")


def test_ttl_counts_from_the_first_hop() -> None:
    fresh = chain("a", issued=NOW - 299.9, ttl=300)
    stale = chain("a", issued=NOW - 300, ttl=300)
    assert verdict(fresh, Hop("b")) == ("allow", None)
    refused = decide(stale, Hop("b"), Settings(), NOW)
    assert (refused.outcome, refused.reason) == ("refuse", "expired")
    assert "b" in refused.message
    # A chain may not claim a longer lifetime than the ttl of the process deciding, beyond the
    # clock skew allowed (every process of a workspace has the same ttl).
    assert verdict(fresh, Hop("b"), ttl=300 - CLOCK_SKEW) == ("allow", None)
    refused = decide(fresh, Hop("b"), Settings(ttl=300 - CLOCK_SKEW - 1), NOW)
    assert (refused.outcome, refused.reason) == ("refuse", "expired")
    assert "lifetime of 300 s, longer than the ttl here (269 s)" in refused.message


def test_a_chain_issued_in_the_future_beyond_the_skew_is_refused_in_every_mode() -> None:
    assert verdict(chain("a", issued=NOW + CLOCK_SKEW), Hop("b")) == ("allow", None)
    ahead = chain("a", issued=NOW + CLOCK_SKEW + 5)
    for mode in ("enforce", "observe"):
        refused = decide(ahead, Hop("b"), Settings(mode=mode), NOW)
        assert (refused.outcome, refused.reason) == ("refuse", "expired")
        assert "35 s in the future" in refused.message


def test_foreign_workspace_is_refused() -> None:
    refused = decide(chain("a", workspace="travel"), Hop("b"), Settings(workspace="finance"), NOW)
    assert (refused.outcome, refused.reason) == ("refuse", "foreign_workspace")
    assert "travel" in refused.message
    assert "finance" in refused.message
    assert verdict(chain("a", workspace="finance"), Hop("b"), workspace="finance") == ("allow", None)


def test_integrity_is_checked_before_the_rules() -> None:
    # An expired or foreign chain that is also a cycle is refused for its integrity: in observe mode
    # that difference decides whether the call goes through.
    expired_cycle = chain("a", issued=NOW - 1000)
    assert verdict(expired_cycle, Hop("a")) == ("refuse", "expired")
    foreign_cycle = chain("a", workspace="other")
    assert verdict(foreign_cycle, Hop("a"), mode="observe") == ("refuse", "foreign_workspace")


def test_cycle_is_reported_before_depth() -> None:
    assert verdict(chain("a", "b"), Hop("a"), max_depth=2) == ("refuse", "cycle")


def test_observe_would_refuse_policy_reasons_but_refuses_integrity_reasons() -> None:
    assert verdict(chain(PLANNER_PLAN, BUDGET_PRICE, PLANNER_ITINERARY), BUDGET_PRICE, mode="observe") == (
        "would_refuse",
        "cycle",
    )
    assert verdict(chain("a", "b"), Hop("c"), mode="observe", max_depth=2) == ("would_refuse", "depth")
    assert verdict(chain(*["a"] * 5), Hop("a"), mode="observe", cycle_rule="none") == (
        "would_refuse",
        "name_depth",
    )
    assert verdict(chain("a", issued=NOW - 1000), Hop("b"), mode="observe") == ("refuse", "expired")
    assert verdict(chain("a", workspace="x"), Hop("b"), mode="observe") == ("refuse", "foreign_workspace")


def test_off_mode_allows_everything() -> None:
    for arrival, hop in [
        (chain("a"), Hop("a")),
        (chain(*[f"n{i}" for i in range(20)]), Hop("z")),
        (chain("a", issued=NOW - 1000), Hop("b")),
        (chain("a", workspace="x"), Hop("b")),
    ]:
        assert verdict(arrival, hop, mode="off") == ("allow", None)


def test_decide_is_pure() -> None:
    # It reads neither the process-wide settings nor the clock.
    otel_guard.configure(mode="off", cycle_rule="none")
    arrival = chain("a", issued=NOW - 10, ttl=20)
    assert verdict(arrival, Hop("a")) == ("refuse", "cycle")
    assert decide(arrival, Hop("b"), Settings(), NOW + 100).reason == "expired"
    assert decide(arrival, Hop("b"), Settings(), NOW).outcome == "allow"
    first = decide(arrival, Hop("a"), Settings(), NOW)
    assert decide(arrival, Hop("a"), Settings(), NOW) == first


def test_per_agent_override_relaxes_one_agent() -> None:
    relaxed = Settings(overrides={"summarizer": AgentOverride(cycle_rule="none", max_name_depth=12)})
    recursing = chain(*["summarizer"] * 7)
    assert decide(recursing, Hop("summarizer"), relaxed, NOW).outcome == "allow"
    assert decide(chain(*["summarizer"] * 12), Hop("summarizer"), relaxed, NOW).reason == "name_depth"
    # Other agents keep the process-wide rule, even inside the summarizer's chain.
    assert decide(chain("writer", "summarizer"), Hop("writer"), relaxed, NOW).reason == "cycle"


def test_per_agent_override_of_mode_and_depth() -> None:
    settings = Settings(
        overrides={"legacy": AgentOverride(mode="observe"), "shallow": AgentOverride(max_depth=2)}
    )
    assert decide(chain("legacy"), Hop("legacy"), settings, NOW).outcome == "would_refuse"
    assert decide(chain("a", "b"), Hop("shallow"), settings, NOW).reason == "depth"
    assert decide(chain("a", "b"), Hop("other"), settings, NOW).outcome == "allow"
    assert settings.for_agent("legacy").mode == "observe"
    assert settings.for_agent("other") is settings


# -- settings: defaults, environment, configure() ---------------------------------------------------


def test_defaults_are_the_contract_defaults() -> None:
    defaults = settings_from_env({})
    assert defaults.mode == "enforce"
    assert defaults.cycle_rule == "agent_skill"
    assert defaults.max_depth == 8
    assert defaults.max_name_depth == 5
    assert defaults.ttl == 300
    assert defaults.keys is None
    assert defaults.workspace == "default"
    assert defaults.situational_prompt is False
    assert dict(defaults.overrides) == {}


def test_environment_variable_names_are_the_contract_names() -> None:
    assert {
        "mode": "OTEL_GUARD_MODE",
        "cycle_rule": "OTEL_GUARD_CYCLE_RULE",
        "max_depth": "OTEL_GUARD_MAX_DEPTH",
        "max_name_depth": "OTEL_GUARD_MAX_NAME_DEPTH",
        "ttl": "OTEL_GUARD_TTL_SECONDS",
        "keys": "OTEL_GUARD_KEYS",
        "workspace": "OTEL_GUARD_WORKSPACE",
        "situational_prompt": "OTEL_GUARD_SITUATIONAL_PROMPT",
    }.items() <= ENV.items()


def _b64(secret: bytes) -> str:
    return base64.urlsafe_b64encode(secret).rstrip(b"=").decode()


def _key_text() -> tuple[str, Keyring]:
    new, old = os.urandom(32), os.urandom(48)
    return f"new:{_b64(new)}, old:{_b64(old)}", Keyring({"new": new, "old": old})


def test_every_setting_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    text, keyring = _key_text()
    environ = {
        "OTEL_GUARD_MODE": "observe",
        "OTEL_GUARD_CYCLE_RULE": "agent",
        "OTEL_GUARD_MAX_DEPTH": "3",
        "OTEL_GUARD_MAX_NAME_DEPTH": "2",
        "OTEL_GUARD_TTL_SECONDS": "12.5",
        "OTEL_GUARD_KEYS": text,
        "OTEL_GUARD_WORKSPACE": "travel",
        "OTEL_GUARD_OVERRIDES": '{"summarizer": {"cycle_rule": "none", "max_name_depth": 12}}',
        "OTEL_GUARD_SITUATIONAL_PROMPT": "true",
    }
    for variable, value in environ.items():
        monkeypatch.setenv(variable, value)
    settings = reset_settings()
    assert settings == current_settings()
    assert settings.mode == "observe"
    assert settings.cycle_rule == "agent"
    assert settings.max_depth == 3
    assert settings.max_name_depth == 2
    assert settings.ttl == 12.5
    assert settings.keys == keyring
    assert settings.keys is not None
    assert settings.keys.kids == ("new", "old")
    assert settings.workspace == "travel"
    assert settings.overrides["summarizer"] == AgentOverride(cycle_rule="none", max_name_depth=12)
    assert settings.situational_prompt is True


def test_environment_values_are_read_leniently_where_unambiguous() -> None:
    settings = settings_from_env(
        {
            "OTEL_GUARD_MODE": " Enforce ",
            "OTEL_GUARD_CYCLE_RULE": "AGENT_SKILL",
            "OTEL_GUARD_MAX_DEPTH": " 8 ",
            "OTEL_GUARD_TTL_SECONDS": "300",
            "OTEL_GUARD_KEYS": "",
            "OTEL_GUARD_OVERRIDES": "",
            "OTEL_GUARD_SITUATIONAL_PROMPT": "0",
        }
    )
    assert settings == Settings()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_GUARD_MODE", "loud"),
        ("OTEL_GUARD_CYCLE_RULE", "skill"),
        ("OTEL_GUARD_MAX_DEPTH", "0"),
        ("OTEL_GUARD_MAX_DEPTH", "eight"),
        ("OTEL_GUARD_MAX_DEPTH", "2.5"),
        ("OTEL_GUARD_MAX_NAME_DEPTH", "-1"),
        ("OTEL_GUARD_TTL_SECONDS", "0"),
        ("OTEL_GUARD_TTL_SECONDS", "-5"),
        ("OTEL_GUARD_TTL_SECONDS", "soon"),
        ("OTEL_GUARD_TTL_SECONDS", "inf"),
        ("OTEL_GUARD_TTL_SECONDS", "nan"),
        ("OTEL_GUARD_TTL_SECONDS", "1e10"),  # exp past 2242: every guard would refuse its chains
        ("OTEL_GUARD_KEYS", "k1"),
        ("OTEL_GUARD_KEYS", "k1:c2hvcnQ"),
        ("OTEL_GUARD_KEYS", "k1:***"),
        ("OTEL_GUARD_WORKSPACE", "  "),
        ("OTEL_GUARD_OVERRIDES", "{not json"),
        ("OTEL_GUARD_OVERRIDES", '{"a": {"colour": "red"}}'),
        ("OTEL_GUARD_OVERRIDES", '{"a": {"max_depth": 0}}'),
        ("OTEL_GUARD_OVERRIDES", "[1, 2]"),
        ("OTEL_GUARD_SITUATIONAL_PROMPT", "maybe"),
    ],
)
def test_bad_environment_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    with pytest.raises(ValueError, match=variable):
        settings_from_env({variable: value})
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable):
        reset_settings()


def test_configure_takes_string_and_python_forms() -> None:
    secret = os.urandom(32)
    python = otel_guard.configure(
        mode="observe",
        cycle_rule="agent",
        max_depth=4,
        max_name_depth=3,
        ttl=2.5,
        keys={"k1": secret},
        workspace="travel",
        overrides={"summarizer": {"cycle_rule": "none"}},
        situational_prompt=True,
    )
    reset_settings()
    strings = otel_guard.configure(
        mode="observe",
        cycle_rule="agent",
        max_depth="4",
        max_name_depth="3",
        ttl="2.5",
        keys="k1:" + _b64(secret),
        workspace="travel",
        overrides='{"summarizer": {"cycle_rule": "none"}}',
        situational_prompt="true",
    )
    assert python == strings
    assert python.max_depth == 4
    assert python.ttl == 2.5
    assert python.overrides["summarizer"].cycle_rule == "none"
    assert otel_guard.configure(ttl=7).ttl == 7.0
    assert isinstance(otel_guard.configure(ttl=7).ttl, float)


def test_configure_accepts_a_keyring_and_clears_keys() -> None:
    keyring = Keyring({"k1": SECRET})
    assert otel_guard.configure(keys=keyring).keys is keyring
    assert otel_guard.configure(keys=None).keys is None
    otel_guard.configure(keys=keyring)
    assert otel_guard.configure(keys="").keys is None


def test_configure_returns_the_settings_in_force_and_keeps_what_it_is_not_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_GUARD_MAX_DEPTH", "4")
    reset_settings()
    first = otel_guard.configure(mode="observe")
    assert first is current_settings()
    assert (first.mode, first.max_depth) == ("observe", 4)  # max_depth still from the environment
    second = otel_guard.configure(cycle_rule="none")
    assert (second.mode, second.cycle_rule, second.max_depth) == ("observe", "none", 4)
    assert reset_settings().mode == "enforce"


BAD_CONFIGURE: list[tuple[str, object]] = [
    ("mode", "loud"),
    ("mode", 1),
    ("mode", None),
    ("cycle_rule", "skill"),
    ("max_depth", 0),
    ("max_depth", -3),
    ("max_depth", 2.5),
    ("max_depth", True),
    ("max_depth", "x"),
    ("max_depth", None),
    ("max_name_depth", 0),
    ("ttl", 0),
    ("ttl", -1.0),
    ("ttl", float("inf")),
    ("ttl", float("nan")),
    ("ttl", True),
    ("ttl", "later"),
    ("ttl", None),
    ("keys", "k1"),
    ("keys", {"k1": b"short"}),
    ("keys", {"bad kid": SECRET}),
    ("keys", {"k1": "not bytes but long enough to be thirty-two"}),
    ("keys", 42),
    ("max_name_depth", "two"),
    ("overrides", {"a": {"colour": "red"}}),
    ("overrides", {"a": {"mode": "loud"}}),
    ("overrides", {"a": {"max_name_depth": 0}}),
    ("overrides", {"a": 5}),
    ("overrides", [("a", {})]),
    ("overrides", "{"),
    ("situational_prompt", "maybe"),
    ("situational_prompt", 2),
]


@pytest.mark.parametrize(("name", "value"), BAD_CONFIGURE, ids=[f"{n}={v!r}" for n, v in BAD_CONFIGURE])
def test_bad_configure_value_names_the_setting_and_changes_nothing(name: str, value: object) -> None:
    before = otel_guard.configure(workspace="before")
    with pytest.raises(ValueError, match=name):
        otel_guard.configure(**{"workspace": "after", name: value})
    assert current_settings() == before  # the good value given alongside was not applied either


@pytest.mark.parametrize("value", ["", "   ", 5, None])
def test_bad_workspace_names_the_setting_and_changes_nothing(value: object) -> None:
    before = otel_guard.configure(workspace="before", max_depth=6)
    with pytest.raises(ValueError, match="workspace"):
        otel_guard.configure(max_depth=3, workspace=value)
    assert current_settings() == before


def test_configure_rejects_an_unknown_setting_by_name() -> None:
    with pytest.raises(ValueError, match="max_tree_width"):
        otel_guard.configure(max_tree_width=3)


def test_settings_are_frozen() -> None:
    settings = current_settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.mode = "off"  # type: ignore[misc]
    overrides = otel_guard.configure(overrides={"a": {"max_depth": 2}}).overrides
    assert isinstance(overrides, Mapping)
    with pytest.raises(TypeError):
        overrides["b"] = AgentOverride()  # type: ignore[index]


# -- properties of the rules ------------------------------------------------------------------------

NAMES = st.sampled_from(["planner", "budget", "fx", "tax", "weather"])
SKILLS = st.none() | st.sampled_from(["plan", "price", "itinerary"])
HOPS = st.builds(Hop, NAMES, SKILLS)
ARRIVALS = st.lists(HOPS, min_size=1, max_size=10).map(lambda hops: chain(*hops))
PROPERTIES = settings(max_examples=300, deadline=None, database=None)


@PROPERTIES
@given(arrival=ARRIVALS, hop=HOPS, depth=st.integers(1, 12), name_depth_limit=st.integers(1, 6))
def test_stricter_rules_refuse_at_least_what_laxer_rules_refuse(
    arrival: Chain, hop: Hop, depth: int, name_depth_limit: int
) -> None:
    limits = {"max_depth": depth, "max_name_depth": name_depth_limit}
    allowed = {rule: verdict(arrival, hop, cycle_rule=rule, **limits)[0] == "allow" for rule in CYCLE_RULES}
    assert allowed["agent"] <= allowed["agent_skill"] <= allowed["none"]
    # A larger limit never refuses what a smaller one allowed.
    if allowed["agent_skill"]:
        assert verdict(arrival, hop, max_depth=depth + 1, max_name_depth=name_depth_limit)[0] == "allow"
        assert verdict(arrival, hop, max_depth=depth, max_name_depth=name_depth_limit + 1)[0] == "allow"


@PROPERTIES
@given(arrival=ARRIVALS, hop=HOPS, rule=st.sampled_from(CYCLE_RULES), depth=st.integers(1, 12))
def test_observe_flags_exactly_what_enforce_refuses(
    arrival: Chain, hop: Hop, rule: CycleRule, depth: int
) -> None:
    enforce = decide(arrival, hop, Settings(cycle_rule=rule, max_depth=depth), NOW)
    observe = decide(arrival, hop, Settings(mode="observe", cycle_rule=rule, max_depth=depth), NOW)
    assert observe.reason == enforce.reason
    assert (enforce.outcome, observe.outcome) in {("allow", "allow"), ("refuse", "would_refuse")}
    assert (
        decide(arrival, hop, Settings(mode="off", cycle_rule=rule, max_depth=depth), NOW).outcome == "allow"
    )


@PROPERTIES
@given(arrival=ARRIVALS, hop=HOPS)
def test_an_allowed_hop_keeps_the_chain_within_the_limits(arrival: Chain, hop: Hop) -> None:
    settings_ = Settings(cycle_rule="none")
    if decide(arrival, hop, settings_, NOW).outcome == "allow":
        longer = arrival.extended(hop)
        assert longer.depth <= settings_.max_depth
        assert longer.name_depth(hop.agent) <= settings_.max_name_depth


def test_a_ttl_past_a_hundred_years_is_a_settings_error_and_a_hundred_years_is_not() -> None:
    with pytest.raises(ValueError, match=r"past the longest ttl, 3155760000 seconds \(100 years\)"):
        otel_guard.configure(ttl=3155760001)
    otel_guard.configure(ttl=3155760000)
    with delegate("planner") as planner:
        assert planner.chain is not None
        assert planner.chain.expires_at < 2**33
