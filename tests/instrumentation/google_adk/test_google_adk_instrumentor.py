"""The Google ADK instrumentor itself: its patch targets exist in the installed ADK, it patches ADK when
the app first imports it, it sends hops to the providers it is given, and ``uninstrument()`` restores
everything (the plugins left on existing runners make no more hops)."""

from __future__ import annotations

from importlib.metadata import distribution, entry_points
from typing import Any

import pytest
import wrapt
from google.adk.agents import LlmAgent
from google.adk.agents.callback_context import CallbackContext
from google.adk.agents.invocation_context import InvocationContext
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import InMemoryRunner, Runner
from google.adk.sessions.in_memory_session_service import InMemorySessionService
from google.adk.tools.transfer_to_agent_tool import TransferToAgentTool
from google.genai import types
from google_adk_models import ScriptedModel, ToolCalls, agents_as_tools
from packaging.requirements import Requirement

from otel_guard import telemetry
from otel_guard.instrumentation._base import resolve
from otel_guard.instrumentation.google_adk import PATCH_TARGETS, GoogleADKInstrumentor
from otel_guard.instrumentation.google_adk import _tools as adk_tools
from otel_guard.instrumentation.google_adk._contexts import actions_of, calling_agent
from otel_guard.instrumentation.google_adk._plugin import GuardPlugin
from otel_guard.instrumentation.google_adk.package import _instruments
from tests.instrumentation.instrumentors import given_providers, patched_on_import

PROXY = getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)


def patched() -> list[bool]:
    return [isinstance(resolve(target), PROXY) for target in PATCH_TARGETS]


def guard_span_names(exporter_spans: Any) -> list[str]:
    return [s.name for s in exporter_spans if s.attributes and "otel_guard.decision" in s.attributes]


# -- the installed ADK --------------------------------------------------------------------------


def test_every_patch_target_and_internal_name_exists_in_the_installed_adk() -> None:
    missing = []
    for target in (*PATCH_TARGETS, *adk_tools.INTERNAL_NAMES):
        try:
            resolve(target)
        except LookupError as exc:
            missing.append(str(exc))
    assert not missing, "\n".join(missing)
    # An instance attribute, read for guidance: the agents transfer_to_agent offers.
    assert adk_tools.transfer_targets(TransferToAgentTool(agent_names=["budget", "fx"])) == (
        "budget",
        "fx",
    )


def test_the_declared_versions_are_the_ones_installed_and_the_entry_point_is_registered() -> None:
    assert GoogleADKInstrumentor().instrumentation_dependencies() == _instruments
    assert Requirement(_instruments[0]).specifier.contains(distribution("google-adk").version)
    (entry_point,) = [
        ep for ep in entry_points(group="opentelemetry_instrumentor") if ep.name == "otel_guard_google_adk"
    ]
    assert entry_point.load() is GoogleADKInstrumentor


async def test_the_plugin_reads_the_agent_and_the_actions_the_public_accessors_give() -> None:
    # The plugin asks a callback or tool context for its agent on every model response that calls
    # a function, and for a tool call's actions after every call: from the context's own attributes,
    # not through get_invocation_context() (a copy) or the actions property (a state comparison).
    service = InMemorySessionService()
    session = await service.create_session(app_name="app", user_id="user")
    agent = LlmAgent(name="planner")
    invocation = InvocationContext(session_service=service, invocation_id="inv", agent=agent, session=session)
    context = CallbackContext(invocation)
    assert context._invocation_context is invocation  # the instance attribute read
    assert calling_agent(context) is agent
    assert context.get_invocation_context().agent is agent
    # The same for a tool call's actions: the object the public property returns.
    assert actions_of(context) is context.actions


# -- lazy patching ------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("uninstrument_first", [False, True], ids=["instrumented", "uninstrumented-first"])
def test_adk_is_patched_when_the_app_first_imports_it(uninstrument_first: bool) -> None:
    report = patched_on_import(
        GoogleADKInstrumentor,
        "from google.adk.agents import LlmAgent",
        ["google.adk"],
        uninstrument_first=uninstrument_first,
    )
    assert report["loaded_before"] == [], "instrument() imported ADK before the app did"
    assert report["pending"] is True
    assert report["patched"] == [not uninstrument_first] * len(PATCH_TARGETS)


# -- providers, uninstrument --------------------------------------------------------------------


def planner_with_lookup() -> LlmAgent:
    def lookup(city: str) -> str:
        """Look up the weather of a city."""
        return f"{city}: sunny"

    model = ScriptedModel(
        agent="planner", tool="lookup", tool_args={"city": "Lisbon"}, tool_calls=ToolCalls(1)
    )
    return LlmAgent(name="planner", model=model, tools=[lookup])


async def run_in(runner: Runner) -> None:
    session = await runner.session_service.create_session(app_name=runner.app_name, user_id="user")
    message = types.Content(role="user", parts=[types.Part.from_text(text="Plan the team offsite")])
    async for _ in runner.run_async(user_id="user", session_id=session.id, new_message=message):
        pass


async def test_hops_go_to_the_providers_given_to_instrument(spans: Any) -> None:
    with given_providers(GoogleADKInstrumentor) as given:
        await run_in(InMemoryRunner(agent=planner_with_lookup(), app_name="offsite"))

    assert given.hop_names() == ["execute_tool lookup", "invoke_agent planner"]
    assert telemetry.METRIC_DECISIONS in given.metric_names()
    assert guard_span_names(spans.all()) == []  # ADK's own spans went to the global provider, ours did not


async def test_the_guard_plugin_goes_first_on_every_runner_once(spans: Any) -> None:
    class Another(BasePlugin):
        pass

    instrumentor = GoogleADKInstrumentor()
    instrumentor.instrument()
    try:
        planner = planner_with_lookup()
        runner = Runner(
            app_name="offsite",
            agent=planner,
            session_service=InMemorySessionService(),
            plugins=[Another("another")],
        )
        # A runner made with another runner's plugins (an AgentTool's) gets no second one.
        shared = Runner(
            app_name="offsite",
            agent=planner,
            session_service=InMemorySessionService(),
            plugins=runner.plugin_manager.plugins,
        )
    finally:
        instrumentor.uninstrument()

    assert [type(p).__name__ for p in runner.plugin_manager.plugins] == ["GuardPlugin", "Another"]
    assert [type(p).__name__ for p in shared.plugin_manager.plugins] == ["GuardPlugin", "Another"]


async def test_uninstrument_restores_adk_and_leaves_existing_runners_unguarded(spans: Any) -> None:
    instrumentor = GoogleADKInstrumentor()
    instrumentor.instrument()
    assert all(patched())
    pair = agents_as_tools(max_tool_calls=4)
    made_while_instrumented = InMemoryRunner(agent=pair.planner, app_name="offsite")
    instrumentor.uninstrument()

    assert not any(patched())
    made_after = InMemoryRunner(agent=planner_with_lookup(), app_name="offsite")
    assert not any(isinstance(p, GuardPlugin) for p in made_after.plugin_manager.plugins)
    # The plugin stays on the runner made before, and makes no hops: the loop runs its course.
    assert isinstance(made_while_instrumented.plugin_manager.plugins[0], GuardPlugin)
    await run_in(made_while_instrumented)
    assert pair.tool_calls.left == 0
    assert guard_span_names(spans.all()) == []
