"""The LlamaIndex instrumentor itself: its patch targets exist in the installed LlamaIndex, its
metadata is in step with the distribution's, it patches LlamaIndex only when the app imports it, and
the providers given to ``instrument()`` get the hops of a real run."""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core.tools import FunctionTool
from llama_index_loop import CallBudget, ScriptedModel, agent

from otel_guard import telemetry
from otel_guard.instrumentation.llama_index import PATCH_TARGETS, LlamaIndexInstrumentor
from otel_guard.instrumentation.llama_index.package import _instruments
from tests.hop_spans import guard_spans
from tests.instrumentation.instrumentors import (
    assert_registered,
    given_providers,
    patched_on_import,
    unresolved,
)


def test_every_patch_target_exists_in_the_installed_llama_index() -> None:
    missing = unresolved(PATCH_TARGETS)
    assert not missing, "\n".join(missing)


def test_the_entry_point_and_the_dependency_range_match_the_installed_llama_index() -> None:
    assert_registered(LlamaIndexInstrumentor, "otel_guard_llama_index", _instruments)


# -- lazy patching ------------------------------------------------------------------------------

SPAN_HANDLERS = """
from llama_index.core.instrumentation import get_dispatcher
from otel_guard.instrumentation.llama_index._runs import run_dispatcher
report = {name: [type(handler).__name__ for handler in dispatcher.span_handlers]
          for name, dispatcher in (("root", get_dispatcher()), ("runs", run_dispatcher()))}
"""


@pytest.mark.integration
def test_llama_index_is_patched_when_the_app_imports_it() -> None:
    report = patched_on_import(
        LlamaIndexInstrumentor,
        "import llama_index.core",
        ["llama_index", "workflows"],
        uninstrument_first=False,
        after=SPAN_HANDLERS,
    )
    # Finding llama_index.core imports the namespace package llama_index, which runs no code.
    assert report["loaded_before"] == ["llama_index"], "instrument() imported LlamaIndex before the app did"
    # The guard's span handler where the runs' spans open, not on the root (which sees every span).
    assert report["after"] == {"root": ["NullSpanHandler"], "runs": ["RunEnds"]}
    assert report["pending"] is True
    assert report["patched"] == [True] * len(PATCH_TARGETS)


@pytest.mark.integration
def test_uninstrument_before_the_import_leaves_llama_index_unpatched() -> None:
    report = patched_on_import(
        LlamaIndexInstrumentor,
        "import llama_index.core",
        ["llama_index", "workflows"],
        uninstrument_first=True,
        after=SPAN_HANDLERS,
    )
    assert report["patched"] == [False] * len(PATCH_TARGETS)
    assert report["after"] == {"root": ["NullSpanHandler"], "runs": []}


# -- providers ----------------------------------------------------------------------------------


async def test_hops_go_to_the_providers_given_to_instrument(spans: Any) -> None:
    with given_providers(LlamaIndexInstrumentor) as given:

        def lookup(question: str) -> str:
            """Look something up."""
            return question

        model = ScriptedModel("searcher", "lookup", CallBudget(1))
        await agent("searcher", model, [FunctionTool.from_defaults(fn=lookup)]).run(user_msg="find")

    assert given.hop_names() == ["execute_tool lookup", "invoke_agent searcher"]
    assert telemetry.METRIC_DECISIONS in given.metric_names()
    assert guard_spans(spans) == []  # nothing of the guard's went to the global provider
