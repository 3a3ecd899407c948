"""Strands swarm handoffs under otel-guard: a handoff is a transfer into the node it hands off to.

A swarm node's ``handoff_to_agent`` passes control: the node's run ends and the swarm runs the target
next, the node handing off waits for nothing. So a hand-back (triage → faq → triage, the
customer-service shape) runs to its answer, while a ping-pong of handoffs (planner and budget, whose
scripted models hand off to each other on every fresh turn) stops at ``max_depth`` /
``max_name_depth``, or at the swarm's own ``max_handoffs`` when that comes first; the refusal is the
handoff call's error result, which the node's model reads and answers. A return that is no handoff
(an agent offered as a tool calling back the agent that called it) is still a cycle.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from strands import Agent, tool
from strands.multiagent import Status, Swarm
from strands_loop import CallBudget, ScriptedModel, tool_results_of
from strands_support import decisions, guard_spans, instrumented_fixture, parent_of

import otel_guard
from otel_guard.instrumentation.strands import StrandsInstrumentor
from tests.hop_spans import assert_observe_mode_recorded_the_ping_pong

instrumented = instrumented_fixture()

HANDOFF = "handoff_to_agent"


def ping_pong(
    handoffs: int = 6, *, max_handoffs: int = 20
) -> tuple[Swarm, ScriptedModel, ScriptedModel, CallBudget]:
    calls = CallBudget(handoffs)

    def node(me: str, other: str) -> tuple[Agent, ScriptedModel]:
        handoff = {"agent_name": other, "message": f"{me} needs {other}"}
        model = ScriptedModel(me, HANDOFF, calls, tool_input=handoff)
        return Agent(name=me, model=model, callback_handler=None), model

    planner, planner_model = node("planner", "budget")
    budget, budget_model = node("budget", "planner")
    swarm = Swarm([planner, budget], max_handoffs=max_handoffs, max_iterations=max_handoffs)
    return swarm, planner_model, budget_model, calls


class Steps(ScriptedModel):
    """A node's model that, on each fresh turn, makes the next call of its script (tool name and
    input), and answers in text once the script is done; from a tool result it answers as
    :class:`ScriptedModel` does."""

    def __init__(self, me: str, *steps: tuple[str, dict[str, Any]]) -> None:
        super().__init__(me, None, CallBudget(len(steps)))
        self.steps: Iterator[tuple[str, dict[str, Any]]] = iter(steps)

    def _respond(self, messages: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        if not tool_results_of(messages[-1]):
            self.tool, self.tool_input = next(self.steps, (None, None))
        return super()._respond(messages)


def hand_off(to: str, message: str) -> tuple[str, dict[str, Any]]:
    return HANDOFF, {"agent_name": to, "message": message}


def customer_service() -> tuple[Swarm, Steps, Steps, Steps]:
    """The OpenAI Agents SDK's customer-service example as a Strands swarm: triage hands off to faq,
    which answers the question and hands the customer back to triage, which hands off to seat
    booking, which books the seat and answers."""

    @tool
    def update_seat(confirmation_number: str, new_seat: str) -> str:
        """Update the seat for a given confirmation number."""
        chain = otel_guard.current_chain()
        assert chain is not None
        return f"Seat {new_seat} booked along {chain.path()}"

    triage_model = Steps(
        "triage", hand_off("faq", "How many bags?"), hand_off("seat_booking", "Seat 12A on LX42")
    )
    faq_model = Steps("faq", hand_off("triage", "One bag is allowed; the customer wants a seat"))
    seat_model = Steps("seat_booking", ("update_seat", {"confirmation_number": "LX42", "new_seat": "12A"}))
    triage = Agent(name="triage", model=triage_model, callback_handler=None)
    faq = Agent(name="faq", model=faq_model, callback_handler=None)
    seat_booking = Agent(name="seat_booking", model=seat_model, tools=[update_seat], callback_handler=None)
    return Swarm([triage, faq, seat_booking]), triage_model, faq_model, seat_model


def attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


# -- a hand-back is no cycle --------------------------------------------------------------------


async def test_the_customer_service_shape_hands_back_to_triage_and_runs_to_its_answer(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    swarm, triage_model, faq_model, seat_model = customer_service()

    result = await swarm.invoke_async("How many bags may I bring, and can I have seat 12A?")

    assert result.status == Status.COMPLETED
    assert [node.node_id for node in result.node_history] == ["triage", "faq", "triage", "seat_booking"]
    models = (triage_model, faq_model, seat_model)
    assert [len(m.tool_results) for m in models] == [2, 1, 1]  # every handoff taken, the seat booked
    assert all(r["status"] == "success" for m in models for r in m.tool_results)
    assert str(result.results["seat_booking"].result).strip() == (
        "seat_booking answers after success: "
        "Seat 12A booked along triage ⇒ faq ⇒ triage ⇒ seat_booking → update_seat"
    )
    assert decisions(spans) == [
        ("invoke_agent triage", "allow", ("triage",)),
        ("invoke_agent faq", "allow", ("triage", "faq")),
        ("invoke_agent triage", "allow", ("triage", "faq", "triage")),
        ("invoke_agent seat_booking", "allow", ("triage", "faq", "triage", "seat_booking")),
        ("execute_tool update_seat", "allow", ("triage", "faq", "triage", "seat_booking", "update_seat")),
    ]
    hops = guard_spans(spans)
    assert attrs(hops[0])["otel_guard.hop.kind"] == "call"  # the entry node's run
    assert "gen_ai.transfer.mode" not in attrs(hops[0])
    for handoff in hops[1:4]:
        assert attrs(handoff)["otel_guard.hop.kind"] == "transfer"
        assert attrs(handoff)["gen_ai.transfer.mode"] == "pass_control"
        # Decided in the handing-off node's call of handoff_to_agent, under Strands' span of it.
        assert parent_of(handoff, spans).name == f"execute_tool {HANDOFF}"  # type: ignore[union-attr]
    assert attrs(hops[4])["otel_guard.hop.kind"] == "call"


async def test_unguarded_the_swarm_ping_pongs_until_the_scripts_give_up(spans: Any) -> None:
    swarm, _planner_model, _budget_model, calls = ping_pong()

    result = await swarm.invoke_async("Plan the team offsite")

    assert result.status == Status.COMPLETED
    assert calls.made == 6
    assert len(result.node_history) == 7
    assert guard_spans(spans) == []


# -- a ping-pong of handoffs stops at a limit ---------------------------------------------------


async def test_with_the_default_limits_a_ping_pong_of_handoffs_stops_at_max_depth(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    swarm, _planner_model, budget_model, calls = ping_pong(handoffs=20)

    result = await swarm.invoke_async("Plan the team offsite")

    # The entry node's run and 7 handoffs fill the 8 places of max_depth: the eighth handoff is
    # refused, long before the swarm's own max_handoffs (20). The node that tried it answers.
    assert calls.made == 8
    assert result.status == Status.COMPLETED
    assert [node.node_id for node in result.node_history] == ["planner", "budget"] * 4
    refusal = budget_model.tool_results[-1]
    assert refusal["status"] == "error"
    text = refusal["content"][0]["text"]
    assert text.startswith("Refused by otel-guard (a2a_delegation_depth, reason: depth)")
    assert "the limit (max_depth) is 8" in text
    assert str(result.results["budget"].result).strip() == f"budget answers after error: {text}"
    refused = [s for s in guard_spans(spans) if attrs(s)["otel_guard.decision"] == "refuse"]
    assert [(s.name, attrs(s)["otel_guard.hop.kind"]) for s in refused] == [
        ("invoke_agent planner", "transfer")
    ]


async def test_a_ping_pong_of_handoffs_stops_at_max_name_depth(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_name_depth=3)
    swarm, planner_model, budget_model, calls = ping_pong(handoffs=20)

    result = await swarm.invoke_async("Plan the team offsite")

    # planner stands at places 1, 3, 5 and budget at 2, 4, 6: the sixth handoff would make planner
    # stand a fourth time.
    assert calls.made == 6
    assert result.status == Status.COMPLETED
    assert len(result.node_history) == 6
    assert all(r["status"] == "success" for r in planner_model.tool_results)
    refusal = budget_model.tool_results[-1]
    assert refusal["status"] == "error"
    assert refusal["content"][0]["text"].startswith(
        "Refused by otel-guard (a2a_delegation_depth, reason: name_depth): Delegation name depth: agent "
        "planner already stands 3 times in chain planner ⇒ budget ⇒ planner ⇒ budget ⇒ planner ⇒ budget; "
        "the limit (max_name_depth) is 3"
    )
    assert [d[:2] for d in decisions(spans)] == [
        *[("invoke_agent planner", "allow"), ("invoke_agent budget", "allow")] * 3,
        ("invoke_agent planner", "refuse"),
    ]
    # Each handoff's hop lasts until the node it handed off to has run: the refused one is decided
    # inside the handoff that made budget's last run.
    hops = guard_spans(spans)
    assert hops[5].start_time < hops[6].start_time < hops[6].end_time < hops[5].end_time  # type: ignore[operator]


async def test_a_swarm_whose_max_handoffs_comes_first_stops_there_with_nothing_refused(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    swarm, _planner_model, budget_model, calls = ping_pong(handoffs=20, max_handoffs=4)

    result = await swarm.invoke_async("Plan the team offsite")

    # Strands' own limit: after four node runs the swarm fails, its fourth handoff never taken.
    assert result.status == Status.FAILED
    assert len(result.node_history) == 4
    assert calls.made == 4
    assert all(r["status"] == "success" for r in budget_model.tool_results)
    assert {d[1] for d in decisions(spans)} == {"allow"}
    # The handoff the swarm did not take is still recorded, ended with the swarm.
    assert decisions(spans)[-1] == ("invoke_agent planner", "allow", ("planner", "budget") * 2 + ("planner",))


async def test_observe_mode_lets_the_handoffs_through_and_records_would_refuse(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(mode="observe", max_name_depth=2)
    swarm, _planner_model, _budget_model, calls = ping_pong()

    result = await swarm.invoke_async("Plan the team offsite")

    assert result.status == Status.COMPLETED
    assert calls.made == 6  # only the scripts ended the loop
    # Each handoff hop is the target's run: no node's run adds a hop of its own after a handoff.
    assert len(guard_spans(spans)) == 7  # the entry node's run and six handoffs
    assert_observe_mode_recorded_the_ping_pong(spans)


# -- a return that is no handoff is still a cycle -----------------------------------------------


async def test_an_agent_offered_as_a_tool_calling_back_its_caller_is_a_cycle(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    # triage hands off to faq; faq asks lookup (an agent offered as a tool), which asks faq back
    # (another instance, offered as lookup's tool): faq waits for lookup's answer, so that is a cycle.
    faq_again = Agent(
        name="faq", model=ScriptedModel("faq again", None, CallBudget(0)), callback_handler=None
    )
    lookup_model = ScriptedModel("lookup", "faq", CallBudget(1), tool_input={"input": "what is the rule?"})
    lookup = Agent(name="lookup", model=lookup_model, tools=[faq_again], callback_handler=None)
    faq_model = ScriptedModel("faq", "lookup", CallBudget(1), tool_input={"input": "how many bags?"})
    faq = Agent(name="faq", model=faq_model, tools=[lookup], callback_handler=None)
    triage_model = Steps("triage", hand_off("faq", "How many bags?"))
    triage = Agent(name="triage", model=triage_model, callback_handler=None)

    result = await Swarm([triage, faq]).invoke_async("How many bags may I bring?")

    assert result.status == Status.COMPLETED
    assert [node.node_id for node in result.node_history] == ["triage", "faq"]
    assert decisions(spans) == [
        ("invoke_agent triage", "allow", ("triage",)),
        ("invoke_agent faq", "allow", ("triage", "faq")),
        ("invoke_agent lookup", "allow", ("triage", "faq", "lookup")),
        ("invoke_agent faq", "refuse", ("triage", "faq", "lookup", "faq")),
    ]
    (refusal,) = lookup_model.tool_results
    assert refusal["status"] == "error"
    assert (
        "Delegation cycle: agent faq is already in chain triage ⇒ faq → lookup"
        in refusal["content"][0]["text"]
    )
    assert faq_again.messages == []  # the refused agent never ran
    assert str(result.results["faq"].result).strip().startswith("faq answers after success: lookup answers")


async def test_a_handoff_to_an_agent_that_waits_for_its_tool_is_a_cycle(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    # planner asks a swarm, through a tool, to price the plan; in it, budget hands off to a node
    # named planner. The planner that called the tool still waits for its answer: a cycle.
    budget_model = Steps("budget", hand_off("planner", "planner should decide"))
    inner_planner = Agent(
        name="planner", model=ScriptedModel("inner", None, CallBudget(0)), callback_handler=None
    )
    pricing = Swarm([Agent(name="budget", model=budget_model, callback_handler=None), inner_planner])

    @tool
    async def price(question: str) -> str:
        """Ask the pricing swarm."""
        result = await pricing.invoke_async(question)
        return str(result.results["budget"].result).strip()

    planner = Agent(
        name="planner",
        model=ScriptedModel("planner", "price", CallBudget(1)),
        tools=[price],
        callback_handler=None,
    )

    result = await planner.invoke_async("Plan the team offsite")

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool price", "allow", ("planner", "price")),
        ("invoke_agent budget", "allow", ("planner", "price", "budget")),
        ("invoke_agent planner", "refuse", ("planner", "price", "budget", "planner")),
    ]
    (refusal,) = budget_model.tool_results
    assert refusal["status"] == "error"
    assert (
        "Delegation cycle: agent planner is already in chain planner → price → budget"
        in (refusal["content"][0]["text"])
    )
    assert attrs(guard_spans(spans)[-1])["otel_guard.hop.kind"] == "transfer"
    assert inner_planner.messages == []  # the handoff was not taken
    assert str(result).strip().startswith("planner answers after success: budget answers after error")
