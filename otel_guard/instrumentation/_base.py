"""What every otel-guard instrumentor shares: the lazy patching, the suppression check, the hop around a call.

One distribution ships an instrumentor per agent runtime, and a user installs only the runtimes they
use. ``opentelemetry-instrument`` checks the distribution's ``instruments-any`` extra once (at least one
runtime present) and then calls every instrumentor with ``skip_dep_check=True``. So each instrumentor
checks its own runtime again here; one that is not installed (or at an untested version) is skipped
with a debug log instead of failing on import. A runtime that is installed but not imported yet is
patched the moment the app imports it (see :class:`GuardInstrumentor`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import sys
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import wrapt
from opentelemetry.context import Context, attach, detach
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from opentelemetry.instrumentation.utils import is_instrumentation_enabled, unwrap

from otel_guard import telemetry
from otel_guard._start import settings_at_start
from otel_guard.errors import DelegationRefused

if TYPE_CHECKING:
    from otel_guard.guard import Delegation

_log = logging.getLogger("otel_guard.instrumentation")

PatchTarget = tuple[str, str]
"""A patch target: (module path, ``"Class.method"`` or ``"function"``)."""

R = TypeVar("R")
W = TypeVar("W", bound=Callable[..., Any])


class GuardInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Base for the runtime instrumentors: a dependency check that cannot be skipped, and patches
    applied when the runtime is first imported.

    ``opentelemetry-instrument`` instruments before the app imports anything. Importing every runtime
    then would cost an app that uses one of them seconds of start-up (measured: 3.4 s for all five),
    so a runtime that is not imported yet is patched by a post-import hook the moment it is. The
    patches are the same either way: an eager ``_instrument`` imports the runtime first too.
    """

    _pending = False  # instrument() was called; the runtime has not been imported yet

    @property
    def trigger_modules(self) -> tuple[str, ...]:
        """The packages whose first import applies the patches.

        For each module of ``PATCH_TARGETS``, its outermost regular package: ``agents`` for
        ``agents.run``. Hooking the outermost package means the hook runs before the app's import
        goes any deeper, so the patches never meet a half-imported module. A namespace package
        (``langgraph``) runs no code of its own to hook, so the next level down stands in for it.
        """
        targets: tuple[PatchTarget, ...] = sys.modules[type(self).__module__].PATCH_TARGETS
        triggers = set()
        for module, _ in targets:
            parts = module.split(".")
            for depth in range(1, len(parts) + 1):
                name = ".".join(parts[:depth])
                loaded = sys.modules.get(name)
                spec = loaded.__spec__ if loaded is not None else importlib.util.find_spec(name)
                if spec is not None and spec.origin not in (None, "namespace"):
                    triggers.add(name)
                    break
        return tuple(sorted(triggers))

    @property
    def is_instrumented_by_opentelemetry(self) -> bool:
        return bool(self._is_instrumented_by_opentelemetry or self._pending)

    def instrument(self, **kwargs: Any) -> Any:
        # Always check this instrumentor's own runtime (see the module docstring).
        kwargs.pop("skip_dep_check", None)
        kwargs.pop("raise_exception_on_conflict", None)
        conflict = self._check_dependency_conflicts()
        if conflict:
            _log.debug("otel-guard: %s skipped: %s", type(self).__name__, conflict)
            return None
        settings_at_start()  # a bad OTEL_GUARD_* value ends the program now, in one line
        tracer_provider = kwargs.get("tracer_provider")
        meter_provider = kwargs.get("meter_provider")
        if tracer_provider is not None or meter_provider is not None:
            # One telemetry for the whole guard: the hops of every runtime go to these providers.
            telemetry.bind(tracer_provider, meter_provider)
        triggers = self.trigger_modules
        if self._is_instrumented_by_opentelemetry or any(module in sys.modules for module in triggers):
            return super().instrument(skip_dep_check=True, **kwargs)
        if not self._pending:
            self._pending = True
            for module in triggers:
                wrapt.register_post_import_hook(lambda _module: self._instrument_now(kwargs), module)
        return None

    def _instrument_now(self, kwargs: dict[str, Any]) -> None:
        if self._pending:  # not uninstrumented in the meantime
            self._pending = False
            super().instrument(skip_dep_check=True, **kwargs)

    def uninstrument(self, **kwargs: Any) -> Any:
        if self._pending:
            self._pending = False  # the hook stays registered but will do nothing
            return None
        return super().uninstrument(**kwargs)

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


class PatchWhenImported:
    """Patches applied when their module is imported: now, if the app has imported it already.

    For an optional part of a runtime that the app may never import (``strands.multiagent``,
    ``langchain.agents``): an app that never uses it never pays for importing it. ``module`` is the
    one whose import applies the patches; each target's module is it or one it imports. A
    post-import hook cannot be taken back, so a removed patch leaves a hook that does nothing.
    """

    def __init__(self, module: str, *patches: tuple[PatchTarget, Callable[..., Any]]) -> None:
        self._module = module
        self._patches = patches
        self.wanted = False  # instrumented, not uninstrumented since
        self._applied = False
        self._hooked = False

    def apply(self) -> None:
        self.wanted = True
        if self._module in sys.modules:
            self._patch()
        elif not self._hooked:
            self._hooked = True
            wrapt.register_post_import_hook(lambda _module: self._patch(), self._module)

    def remove(self) -> None:
        self.wanted = False
        if self._applied:
            self._applied = False
            unwrap_all(target for target, _ in self._patches)

    def _patch(self) -> None:
        if self.wanted and not self._applied:
            self._applied = True
            for (module, name), wrapper in self._patches:
                wrapt.wrap_function_wrapper(module, name, wrapper)


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


def refusal_behind(error: object) -> DelegationRefused | None:
    """The :class:`DelegationRefused` that ``error`` is, or was raised from.

    Runtimes wrap a tool's exception in their own (once per nested call); the refusal's text must
    reach the model all the same. Follows ``__cause__`` and stops at a loop in the chain.
    """
    seen: set[int] = set()
    while isinstance(error, BaseException) and id(error) not in seen:
        if isinstance(error, DelegationRefused):
            return error
        seen.add(id(error))
        error = error.__cause__
    return None


# -- what every wrapper does ----------------------------------------------------------------------


def unless_suppressed(wrapper: W) -> W:
    """A ``wrapt`` wrapper that steps aside while instrumentation is suppressed: the patched function
    is then the runtime's own call, unchanged.

    Sync and async wrappers alike: an async wrapper's coroutine (or, suppressed, the wrapped
    function's) is returned to be awaited, so the check is made when the call is made.
    """

    @functools.wraps(wrapper)
    def checked(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if not is_instrumentation_enabled():
            return wrapped(*args, **kwargs)
        return wrapper(wrapped, instance, args, kwargs)

    return cast(W, checked)


def call_in_hop(
    hop: Delegation,
    call: Callable[[], R],
    *,
    enter: Callable[[], Context] | None = None,
    refused: Callable[[DelegationRefused], R] | None = None,
) -> R:
    """``call()`` inside ``hop``: started (``enter``, default ``hop.start``), its context attached
    around the call, then detached and the hop finished with the call's outcome, as ``with hop:``.

    ``refused(err)`` answers for a hop refused on entry (``call`` never runs); without it the
    refusal is raised. A refusal raised by ``call`` itself passes through as any error does.
    """
    try:
        ctx = hop.start() if enter is None else enter()
    except DelegationRefused as err:
        if refused is None:
            raise
        return refused(err)
    return call_in_context(ctx, hop, call)


async def acall_in_hop(
    hop: Delegation,
    call: Callable[[], Awaitable[R]],
    *,
    enter: Callable[[], Context] | None = None,
    refused: Callable[[DelegationRefused], R] | None = None,
) -> R:
    """:func:`call_in_hop` for a coroutine: ``await call()`` inside ``hop``, started with
    ``hop.astart`` unless ``enter`` is given, as ``async with hop:``."""
    try:
        ctx = await hop.astart() if enter is None else enter()
    except DelegationRefused as err:
        if refused is None:
            raise
        return refused(err)
    return await acall_in_context(ctx, hop, call)


def call_in_context(ctx: Context, hop: Delegation | None, call: Callable[[], R]) -> R:
    """``call()`` with ``ctx`` attached, then detached, and ``hop`` (started already; ``None`` where
    the call is the work of the hop it runs in) finished with the call's outcome."""
    token = attach(ctx)
    try:
        result = call()
    except BaseException as exc:
        detach(token)
        if hop is not None:
            hop.finish(exc)
        raise
    detach(token)
    if hop is not None:
        hop.finish()
    return result


async def acall_in_context(ctx: Context, hop: Delegation | None, call: Callable[[], Awaitable[R]]) -> R:
    """:func:`call_in_context` for a coroutine: ``await call()``."""
    token = attach(ctx)
    try:
        result = await call()
    except BaseException as exc:
        detach(token)
        if hop is not None:
            hop.finish(exc)
        raise
    detach(token)
    if hop is not None:
        hop.finish()
    return result
