"""The patched methods of LlamaIndex's agents: plain functions on the class, read as cheaply as the methods.

LlamaIndex's workflows look their steps up again and again during a run (``Workflow._get_steps``:
``inspect.getmembers`` of the workflow, then ``hasattr(method, "_step_config")`` on each method; a
one-tool ``FunctionAgent`` run does it 12 times), so every patched method is read off the agent
about 20 times a hop. A ``wrapt`` wrapper is expensive to read (a bound wrapper made at each read,
about 22 k instructions); a Python ``__get__`` that returns a plain method still runs a frame at each
read (about 6 k instructions a hop in all); a function is bound by CPython in C, as the method it
replaces was. So each patched method is a function that
calls the wrapper as ``wrapt`` would (the method bound to the agent, the agent, the arguments), with
the method's name, signature (``__wrapped__``) and step configuration; :func:`unguard_method` puts
the method back.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from otel_guard.instrumentation._base import PatchTarget, resolve

Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]
"""A ``wrapt``-style wrapper: ``(wrapped, instance, args, kwargs)``."""

_REPLACED: Final = "_otel_guard_replaced"
"""The attribute of a guarding function that says what it replaced (a :class:`_Replaced`)."""


class _Replaced(NamedTuple):
    method: Any  # as the class held it (inspect.getattr_static)
    own: bool  # whether the class itself held it, or inherited it


def _owner_and_name(target: PatchTarget) -> tuple[type, str]:
    module, path = target
    owner_path, _, name = path.rpartition(".")
    owner: type = resolve((module, owner_path))
    return owner, name


def guard_method(target: PatchTarget, wrapper: Wrapper) -> None:
    """Replace the method ``target`` names (``(module, "Class.method")``) with a function that runs
    it through ``wrapper``; a method guarded already is left as it is."""
    owner, name = _owner_and_name(target)
    method = inspect.getattr_static(owner, name)
    if isinstance(getattr(method, _REPLACED, None), _Replaced):
        return
    guarded = _calling(method, wrapper)
    setattr(guarded, _REPLACED, _Replaced(method, name in owner.__dict__))
    setattr(owner, name, guarded)


def unguard_method(target: PatchTarget) -> None:
    """Put back the method :func:`guard_method` replaced (nothing when it is not guarded)."""
    owner, name = _owner_and_name(target)
    replaced = getattr(owner.__dict__.get(name), _REPLACED, None)
    if not isinstance(replaced, _Replaced):
        return
    if replaced.own:
        setattr(owner, name, replaced.method)
    else:
        delattr(owner, name)


def _calling(method: Any, wrapper: Wrapper) -> Callable[..., Any]:
    """The function that stands for ``method``: ``wrapper`` with ``method`` bound to the instance."""
    bind = method.__get__

    @functools.wraps(method)
    def call(instance: Any, /, *args: Any, **kwargs: Any) -> Any:
        return wrapper(bind(instance, type(instance)), instance, args, kwargs)

    return call
