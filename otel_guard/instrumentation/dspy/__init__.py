"""Guard DSPy: module calls, tool calls and modules used as tools are hops.

Switch it on with ``opentelemetry-instrument`` (extra ``dspy``), or in code:
``DSPyInstrumentor().instrument()``. A module used as another module's tool (``dspy.Tool(module)``,
or a tool that calls one) is one hop into it; a refused call reaches ``dspy.ReAct``'s model as the
tool's error observation, with the refusal's text, and the run goes on. With a model budget on, every
LM request counts against the tree. What is a hop, what the model sees, what is left out:
docs/runtimes/dspy.md.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Final

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, unwrap_all
from otel_guard.instrumentation.dspy.package import _instruments

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    # Every call of every module (dspy.Predict steps only pass through).
    ("dspy.primitives.module", "Module.__call__"),
    ("dspy.primitives.module", "Module.acall"),
    # Every call of a dspy.Tool: ReAct's, and direct calls.
    ("dspy.adapters.types.tool", "Tool.__call__"),
    ("dspy.adapters.types.tool", "Tool.acall"),
    # Every model request, and where DSPy records its usage.
    ("dspy.clients.base_lm", "BaseLM.__call__"),
    ("dspy.clients.base_lm", "BaseLM.acall"),
    ("dspy.clients.execution", "finalize"),
)
"""Every (module, attribute) this instrumentor wraps: DSPy's callbacks cannot refuse a call (an
exception in one is logged and the call goes on), so the calls are wrapped."""


class DSPyInstrumentor(GuardInstrumentor):
    """Makes DSPy module calls, tool calls and modules used as tools guarded hops."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        # Importing the runtime here, not at module level, keeps this module importable without it.
        from wrapt import wrap_function_wrapper

        from otel_guard.instrumentation.dspy import _modules, _tools, _usage

        wrappers = (
            _modules.guard_call,
            _modules.guard_acall,
            _tools.guard_tool_call,
            _tools.guard_tool_acall,
            _usage.count_request,
            _usage.count_arequest,
            _usage.count_tokens,
        )
        for (module, name), wrapper in zip(PATCH_TARGETS, wrappers, strict=True):
            wrap_function_wrapper(module, name, wrapper)

    def _uninstrument(self, **kwargs: Any) -> None:
        unwrap_all(PATCH_TARGETS)
