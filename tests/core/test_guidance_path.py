"""The call path in the situational guidance: an agent is told how it got where it is."""

from __future__ import annotations

import otel_guard
from otel_guard import delegate, situational_prefix
from otel_guard.prompt import current_path, guidance_for


def test_a_path_names_every_agent_on_it_and_warns_off_each() -> None:
    text = situational_prefix("budget", "Price a plan.", path=["planner", "budget"])
    assert "INSIDE the agentic function `budget`" in text
    assert "do NOT call it" in text  # the contract's warning about the function itself stays
    assert "path planner → budget" in text
    assert "do NOT call `planner` either" in text
    assert text.endswith("This function's job: Price a plan.")  # the job line still comes last


def test_a_path_may_leave_the_function_out_and_repeats_count_once() -> None:
    with_it = situational_prefix("c", path=["a", "b", "c"])
    assert situational_prefix("c", path=["a", "b"]) == with_it
    assert "a → b → c" in with_it
    assert "`a`, `b` either" in with_it
    looped = situational_prefix("c", path=["a", "b", "a"])
    assert "a → b → a → c" in looped
    assert "`a`, `b` either" in looped


def test_a_path_of_the_function_alone_is_the_plain_prefix() -> None:
    assert situational_prefix("planner", "x", path=["planner"]) == situational_prefix("planner", "x")
    assert "either" not in situational_prefix("planner", "x")


def test_current_path_reads_the_chain_in_force() -> None:
    assert current_path("planner") == ["planner"]
    with delegate("planner"):
        assert current_path("planner") == ["planner"]  # inside its own hop
        assert current_path("budget") == ["planner", "budget"]  # about to be called
        with delegate("budget"):
            assert current_path("budget") == ["planner", "budget"]


def test_guidance_only_when_a_tool_is_an_agent_on_the_path() -> None:
    assert guidance_for("budget", {"search": "Search the web."}) is None
    # Outside any hop: only a tool named after the agent itself.
    assert guidance_for("budget", {"budget": "Prices."}) == situational_prefix("budget", "Prices.")
    with delegate("planner"):
        assert guidance_for("budget", {"search": ""}) is None
        text = guidance_for("budget", {"planner": "Plans.", "search": ""})
        assert text == situational_prefix("budget", "", path=["planner", "budget"])
        # The job line is the agent's own tool's description, never its caller's.
        assert text is not None
        assert "Plans." not in text


def test_guidance_follows_the_chain_across_threads_of_the_same_context() -> None:
    import contextvars
    import threading

    seen: list[str | None] = []
    with delegate("planner"):
        context = contextvars.copy_context()
    thread = threading.Thread(
        target=lambda: seen.append(context.run(guidance_for, "budget", {"planner": ""}))
    )
    thread.start()
    thread.join(5)
    assert seen == [situational_prefix("budget", path=["planner", "budget"])]
    assert otel_guard.current_chain() is None


def test_an_agent_that_handed_off_is_not_warned_off() -> None:
    """triage handed off to faq (a transfer): triage waits for nothing, so faq calling it is no
    re-entry (the guard allows it) and the guidance does not forbid it; a caller still waiting is."""
    with delegate("triage"), delegate("faq", transfer=True):
        assert guidance_for("faq", {"triage": "Routes questions."}) is None
        text = guidance_for("faq", {"triage": "", "faq": "Answers questions."})
        assert text is not None
        assert "do NOT call `triage`" not in text
        assert "`faq` itself — do NOT call it" in text
    with delegate("triage"), delegate("faq"):
        text = guidance_for("faq", {"triage": ""})
        assert text is not None
        assert "do NOT call `triage` either" in text
