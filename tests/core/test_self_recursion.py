"""The self-recursion contract of ``seeds/self-recursion-guard.md`` §5, translated to otel-guard.

The seed's per-name depth counter is the chain's name depth here: ``name_depth(name)`` is how often
``name`` stands in the chain, and ``max_name_depth`` (5) is its ceiling. The seed has no cycle rule,
so these tests run with ``cycle_rule="none"`` where the default rule would stop a re-entry sooner.
"""

from __future__ import annotations

import asyncio

import pytest

import otel_guard
from otel_guard import DelegationRefused, agentic, name_depth, situational_prefix


@pytest.fixture(autouse=True)
def _seed_rules() -> None:
    otel_guard.configure(cycle_rule="none")


# 1, 2: the situational prompt ----------------------------------------------------------------------


def test_1_situational_prefix_warns_against_self_call_and_demotes_the_docstring() -> None:
    doc = "Maintain a wiki vault — route to ingest, search or answer."
    text = situational_prefix("wiki_agent", doc)
    assert "wiki_agent" in text
    assert "do NOT call it" in text
    assert "recursion" in text
    assert "re-enters" in text
    assert text.index("recursion") < text.index(doc)
    assert text.index("do NOT call it") < text.index(doc)
    assert text.endswith(doc)
    assert f"This function's job: {doc}" in text


@pytest.mark.parametrize("doc", ["", "   \n\t", None])
def test_2_situational_prefix_handles_an_empty_docstring(doc: str | None) -> None:
    text = situational_prefix("wiki_agent", doc)
    assert "This function's job" not in text
    assert "wiki_agent" in text
    assert "do NOT call it" in text
    assert situational_prefix("wiki_agent") == text


def test_situational_prefix_strips_the_docstring_and_is_per_function() -> None:
    text = situational_prefix("research_agent", "\n    Research a topic.\n    ")
    assert text.endswith("This function's job: Research a topic.")
    assert "wiki_agent" not in text
    assert situational_prefix("a", "x") != situational_prefix("b", "x")


# 3: the function is not hidden from itself ---------------------------------------------------------


def test_3_the_function_is_not_denied_to_itself_a_re_entry_runs() -> None:
    # Guidance, not a deny list: entering the function again from inside it is not refused up front.
    depths: list[int] = []

    @agentic
    def wiki_agent(again: bool) -> None:
        depths.append(name_depth("wiki_agent"))
        if again:
            wiki_agent(False)

    wiki_agent(True)
    assert depths == [1, 2]


# 4: depth during a call -----------------------------------------------------------------------------


def test_4_depth_is_one_during_a_normal_call() -> None:
    seen: list[int] = []

    @agentic
    def wiki_agent() -> None:
        seen.append(name_depth("wiki_agent"))

    assert name_depth("wiki_agent") == 0
    wiki_agent()
    assert seen == [1]


# 5: the backstop -------------------------------------------------------------------------------------


def test_5_runaway_self_call_runs_its_body_exactly_five_times() -> None:
    entered = 0

    @agentic
    def wiki_agent(task: str) -> str:
        nonlocal entered
        entered += 1
        return wiki_agent(task)

    with pytest.raises(RecursionError) as raised:
        wiki_agent("summarise the vault")
    err = raised.value
    assert isinstance(err, DelegationRefused)
    assert entered == 5
    assert err.reason == "name_depth"
    assert "wiki_agent" in str(err)
    assert "5" in str(err)
    assert "runaway recursion" in str(err)
    assert name_depth("wiki_agent") == 0


async def test_5_runaway_async_self_call_runs_its_body_exactly_five_times() -> None:
    entered = 0

    @agentic
    async def research_agent() -> None:
        nonlocal entered
        entered += 1
        await asyncio.sleep(0)
        await research_agent()

    with pytest.raises(DelegationRefused, match="research_agent") as raised:
        await research_agent()
    assert entered == 5
    assert raised.value.reason == "name_depth"


def test_5_the_limit_follows_max_name_depth() -> None:
    otel_guard.configure(max_name_depth=3)
    entered = 0

    @agentic
    def wiki_agent() -> None:
        nonlocal entered
        entered += 1
        wiki_agent()

    with pytest.raises(DelegationRefused, match="is 3"):
        wiki_agent()
    assert entered == 3


def test_5_with_the_default_rule_the_cycle_stops_it_sooner() -> None:
    otel_guard.configure(cycle_rule="agent_skill")
    entered = 0

    @agentic
    def wiki_agent() -> None:
        nonlocal entered
        entered += 1
        wiki_agent()

    with pytest.raises(DelegationRefused) as raised:
        wiki_agent()
    assert entered == 1
    assert raised.value.reason == "cycle"


# 6: names count independently -------------------------------------------------------------------------


def test_6_distinct_names_do_not_count_against_each_other() -> None:
    otel_guard.configure(max_depth=12)
    trace: list[tuple[str, int, int]] = []

    @agentic
    def a(levels_of_b: int, then_a: bool) -> None:
        trace.append(("a", name_depth("a"), name_depth("b")))
        if levels_of_b:
            b(levels_of_b, then_a)

    @agentic
    def b(remaining: int, then_a: bool) -> None:
        trace.append(("b", name_depth("a"), name_depth("b")))
        if remaining > 1:
            b(remaining - 1, then_a)
        elif then_a:
            a(0, False)

    # B nests to its limit under A; A can still be entered: B's depth is not A's.
    a(5, True)
    assert trace == [
        ("a", 1, 0),
        ("b", 1, 1),
        ("b", 1, 2),
        ("b", 1, 3),
        ("b", 1, 4),
        ("b", 1, 5),
        ("a", 2, 5),
    ]
    # And B at its limit is refused one level deeper, whatever A's count.
    with pytest.raises(DelegationRefused, match="agent b "):
        a(6, False)


# 7, 8: restored after return and after an exception ---------------------------------------------


def test_7_depth_restored_after_return() -> None:
    after_inner: list[int] = []

    @agentic
    def wiki_agent(nested: bool) -> None:
        if nested:
            wiki_agent(False)
            after_inner.append(name_depth("wiki_agent"))

    wiki_agent(True)
    assert after_inner == [1]
    assert name_depth("wiki_agent") == 0


def test_8_depth_restored_after_exception() -> None:
    after_inner: list[int] = []

    @agentic
    def wiki_agent(nested: bool) -> None:
        if not nested:
            raise RuntimeError("inner failed")
        try:
            wiki_agent(False)
        except RuntimeError:
            after_inner.append(name_depth("wiki_agent"))
        raise ValueError("outer failed")

    with pytest.raises(ValueError, match="outer failed"):
        wiki_agent(True)
    assert after_inner == [1]
    assert name_depth("wiki_agent") == 0


def test_8_depth_restored_after_a_refusal() -> None:
    @agentic
    def wiki_agent() -> None:
        wiki_agent()

    with pytest.raises(DelegationRefused):
        wiki_agent()
    assert name_depth("wiki_agent") == 0
    assert otel_guard.current_chain() is None
