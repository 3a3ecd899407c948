"""Patched functions as plain functions in their owners' slots, and putting the originals back.

Where a runtime looks a patched function up on every call (MCP's ``call_tool`` and request handlers,
LangChain's callback methods at every run's start, LlamaIndex's workflow steps about 20 times a hop),
a ``wrapt`` wrapper costs at each lookup: it makes a bound proxy and calls the wrapper through it
(an async method so wrapped: 6.7 k instructions a call more than the bare method; a bound
LlamaIndex step read: about 22 k). A plain function in the class's slot is bound by CPython in C, as
the method it replaces was. Each replacement keeps the replaced function's name, docstring and
signature (``__wrapped__``, and any attribute a runtime reads off it, such as LlamaIndex's
``_step_config``) and remembers what it replaced, which :func:`restore` puts back.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any, Final, NamedTuple, TypeVar

from otel_guard.instrumentation._base import PatchTarget, resolve

F = TypeVar("F", bound=Callable[..., Any])

Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]
"""A ``wrapt``-style wrapper: ``(wrapped, instance, args, kwargs)``."""

_REPLACED: Final = "_otel_guard_replaced"
"""The attribute of a replacement that says what it replaced (a :class:`_Replaced`)."""


class _Replaced(NamedTuple):
    original: Any  # as its owner held it (inspect.getattr_static)
    own: bool  # whether the owner itself held it, or inherited it


def _owner_and_name(target: PatchTarget) -> tuple[Any, str]:
    """The class (or module) that holds ``target``'s function, and the function's name there."""
    module, path = target
    owner_path, _, name = path.rpartition(".")
    owner = resolve((module, owner_path)) if owner_path else importlib.import_module(module)
    return owner, name


def replace(target: PatchTarget, make: Callable[[F], F]) -> None:
    """Put ``make(original)`` in the place of the function ``target`` names (``(module,
    "Class.method")`` or ``(module, "function")``); a target replaced already is left as it is."""
    owner, name = _owner_and_name(target)
    original = inspect.getattr_static(owner, name)
    if isinstance(getattr(original, _REPLACED, None), _Replaced):
        return
    replacement = functools.wraps(original)(make(original))
    setattr(replacement, _REPLACED, _Replaced(original, name in vars(owner)))
    setattr(owner, name, replacement)


def restore(target: PatchTarget) -> None:
    """Put back the function :func:`replace` replaced (nothing when ``target`` is not replaced)."""
    owner, name = _owner_and_name(target)
    replaced = getattr(vars(owner).get(name), _REPLACED, None)
    if not isinstance(replaced, _Replaced):
        return
    if replaced.own:
        setattr(owner, name, replaced.original)
    else:
        delattr(owner, name)


def replaced(target: PatchTarget) -> bool:
    """Whether ``target`` is a replacement made by :func:`replace`."""
    owner, name = _owner_and_name(target)
    return isinstance(getattr(vars(owner).get(name), _REPLACED, None), _Replaced)


def guard_method(target: PatchTarget, wrapper: Wrapper) -> None:
    """Replace the method ``target`` names with a function that runs it through ``wrapper`` (called
    as ``wrapt`` calls one: the method bound to the instance, the instance, the arguments)."""
    replace(target, lambda method: _calling(method, wrapper))


def _calling(method: Any, wrapper: Wrapper) -> Any:
    bind = method.__get__

    def call(instance: Any, /, *args: Any, **kwargs: Any) -> Any:
        return wrapper(bind(instance, type(instance)), instance, args, kwargs)

    return call
