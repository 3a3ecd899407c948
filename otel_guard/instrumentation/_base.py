"""What every otel-guard instrumentor shares.

One distribution ships an instrumentor per agent runtime, and a user installs only the runtimes they
use. ``opentelemetry-instrument`` checks the distribution's ``instruments-any`` extra once (at least one
runtime present) and then calls every instrumentor with ``skip_dep_check=True``. So each instrumentor
checks its own runtime again here; one that is not installed (or at an untested version) is skipped
with a debug log instead of failing on import.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Collection, Iterable
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from opentelemetry.instrumentation.utils import unwrap

from otel_guard.errors import DelegationRefused

_log = logging.getLogger("otel_guard.instrumentation")

PatchTarget = tuple[str, str]
"""A patch target: (module path, ``"Class.method"`` or ``"function"``)."""


class GuardInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Base for the runtime instrumentors: a dependency check that cannot be skipped."""

    def instrument(self, **kwargs: Any) -> Any:
        # Always check this instrumentor's own runtime (see the module docstring).
        kwargs["skip_dep_check"] = False
        kwargs.pop("raise_exception_on_conflict", None)
        conflict = self._check_dependency_conflicts()
        if conflict:
            _log.debug("otel-guard: %s skipped: %s", type(self).__name__, conflict)
            return None
        return super().instrument(**kwargs)

    def instrumentation_dependencies(self) -> Collection[str]:  # pragma: no cover - abstract
        raise NotImplementedError


def resolve(target: PatchTarget) -> Any:
    """Return the object a patch target names, or raise ``LookupError`` naming the target."""
    module_name, attr_path = target
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise LookupError(f"patch target module {module_name!r} cannot be imported: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise LookupError(
                f"patch target {module_name}.{attr_path} does not exist in the installed version "
                f"(no attribute {part!r})"
            ) from None
    return obj


def unwrap_all(targets: Iterable[PatchTarget]) -> None:
    """Undo ``wrapt`` patches on every target (a target that is not patched is left alone)."""
    for module_name, attr_path in targets:
        owner_path, _, attr = attr_path.rpartition(".")
        owner = resolve((module_name, owner_path)) if owner_path else importlib.import_module(module_name)
        unwrap(owner, attr)


def refusal_text(err: DelegationRefused) -> str:
    """The text a model sees when its tool or agent call was refused.

    It says what was refused and why, the path that led here, and that retrying will not help, so
    the model answers with what it already has instead of calling again.
    """
    return (
        f"Refused by otel-guard ({err.code}, reason: {err.reason}): {err}. "
        "This call will be refused again if retried; do not call it again. "
        "Continue with the information you already have and answer."
    )
