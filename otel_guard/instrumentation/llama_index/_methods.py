"""The patched methods of LlamaIndex's agents: a ``wrapt`` wrapper on the class, a plain method on an agent.

LlamaIndex's workflows look their steps up again and again during a run (``Workflow._get_steps``:
``inspect.getmembers`` of the workflow, then ``hasattr(method, "_step_config")`` on each method; a
one-tool ``FunctionAgent`` run does it 12 times). There every patched method is read off the agent,
and a ``wrapt`` bound wrapper is expensive to read and to miss an attribute on (it is made for each
read, and a miss is looked up again through the method it wraps): about 22 k instructions each time,
against about 1 k for a method. So :class:`GuardedMethod` is the ``wrapt`` ``FunctionWrapper`` that
``uninstrument()`` and any tool looking at the class find, but read off an agent it gives a plain
bound method of a function that calls the wrapper as ``wrapt`` would (the method bound to the agent,
the agent, the arguments). Its ``__wrapped__`` is the method it replaces, as for ``inspect.signature``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import MethodType
from typing import Any

import wrapt

from otel_guard.instrumentation._base import PatchTarget, resolve

Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]
"""A ``wrapt`` wrapper: ``(wrapped, instance, args, kwargs)``."""


class GuardedMethod(wrapt.FunctionWrapper):  # type: ignore[type-arg]
    """A ``wrapt`` method wrapper whose reads off an instance give a plain bound method."""

    def __init__(self, wrapped: Any, wrapper: Wrapper) -> None:
        super().__init__(wrapped, wrapper)
        self._self_call = _calling(wrapped, wrapper)  # ``_self_``: kept on the proxy, not the method

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:  # read off the class: wrapt's own binding
            return super().__get__(instance, owner)
        return MethodType(self._self_call, instance)


def _calling(wrapped: Any, wrapper: Wrapper) -> Callable[..., Any]:
    """The function an instance's method calls: ``wrapper`` with the method ``wrapped`` bound to it."""
    bind = wrapped.__get__

    @functools.wraps(wrapped)
    def call(instance: Any, /, *args: Any, **kwargs: Any) -> Any:
        return wrapper(bind(instance, type(instance)), instance, args, kwargs)

    return call


def guard_method(target: PatchTarget, wrapper: Wrapper) -> None:
    """Replace the method ``target`` names (``(module, "Class.method")``) with a :class:`GuardedMethod`."""
    module, path = target
    owner_path, _, name = path.rpartition(".")
    owner = resolve((module, owner_path))
    setattr(owner, name, GuardedMethod(inspect.getattr_static(owner, name), wrapper))
