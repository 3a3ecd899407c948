"""Guard the calls an agent makes to other services over HTTP: httpx, requests and aiohttp.

Switch it on with ``opentelemetry-instrument`` (it is registered as ``otel_guard_http`` and needs no
extra), or in code: ``HTTPClientsInstrumentor().instrument()``. For every request of an
``httpx.Client`` / ``httpx.AsyncClient``, a ``requests`` session (``requests.get`` included) and an
``aiohttp.ClientSession``:

- the chain in force leaves with it, as the ``otel_guard.chain`` member of its ``baggage`` header,
  whether or not OpenTelemetry's own client instrumentation is installed (it carries the trace; the
  ``services`` extra installs it for all three), so a loop through another service is refused there;
- a guard's refusal answered by the service called (``409`` with the JSON body of
  :func:`otel_guard.asgi.refusal_body`) raises :class:`~otel_guard.DelegationRefused` from the call,
  with the same ``reason``, ``code`` and message and ``remote`` true, whether the caller would have
  called ``raise_for_status()`` or not. A tool that makes the call hands it to its model as its
  runtime's tool error, as it does for a refusal made in this process.

A library is patched when the app first imports it. One at a version whose call the guard cannot
find is left alone, and the guard says so once, at that import.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable, Collection
from typing import Any, Final

import wrapt
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from otel_guard import telemetry
from otel_guard._start import settings_at_start
from otel_guard.instrumentation._base import PatchTarget, resolve, unwrap_all

_log = logging.getLogger("otel_guard")

_instruments: Final = ("httpx >= 0.27", "requests >= 2.28", "aiohttp >= 3.9")
"""The clients guarded, each optional: the instrumentor patches whichever the app imports."""

CLIENTS: Final[dict[str, tuple[tuple[PatchTarget, str], ...]]] = {
    "httpx": ((("httpx", "Client.send"), "guard_send"), (("httpx", "AsyncClient.send"), "aguard_send")),
    "requests": ((("requests.sessions", "Session.send"), "guard_send"),),
    "aiohttp": ((("aiohttp.client", "ClientSession._request"), "guard_request"),),
}
"""Library -> its patch targets, each with the wrapper (in ``._<library>``) that guards it."""

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = tuple(
    target for patches in CLIENTS.values() for target, _ in patches
)


class HTTPClientsInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Carries the chain on httpx, requests and aiohttp calls and raises a remote refusal there."""

    # BaseInstrumentor is a singleton whose __init__ runs at every HTTPClientsInstrumentor(): the
    # state is set where it changes, never in __init__.
    _wanted = False
    _patched: frozenset[str] = frozenset()
    _hooked: frozenset[str] = frozenset()

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def instrument(self, **kwargs: Any) -> Any:
        # Any one of the three is enough, and none need be installed yet: never the all-of check.
        kwargs["skip_dep_check"] = True
        return super().instrument(**kwargs)

    def _instrument(self, **kwargs: Any) -> None:
        settings_at_start()
        tracer_provider = kwargs.get("tracer_provider")
        meter_provider = kwargs.get("meter_provider")
        if tracer_provider is not None or meter_provider is not None:
            # As every otel-guard instrumentor: one telemetry for the whole guard, these providers'.
            telemetry.bind(tracer_provider, meter_provider)
        self._wanted = True
        for library in CLIENTS:
            if library in sys.modules:
                self._patch(library)
            elif library not in self._hooked:
                self._hooked |= {library}
                wrapt.register_post_import_hook(self._patcher(library), library)

    def _uninstrument(self, **kwargs: Any) -> None:
        self._wanted = False  # a hook registered for a library not imported yet will do nothing
        for library in list(self._patched):
            unwrap_all(target for target, _ in CLIENTS[library])
            self._patched -= {library}

    def _patcher(self, library: str) -> Callable[[object], None]:
        return lambda _module: self._patch(library)

    def _patch(self, library: str) -> None:
        if not self._wanted or library in self._patched:
            return
        try:
            wrappers = importlib.import_module(f"{__name__}._{library}")
            found: list[tuple[PatchTarget, Callable[..., Any]]] = []
            for target, wrapper_name in CLIENTS[library]:
                resolve(target)
                found.append((target, getattr(wrappers, wrapper_name)))
        except (LookupError, ImportError) as exc:
            _log.warning(
                "otel-guard: calls through %s are not guarded (%s): they carry no delegation chain, "
                "and another service's refusal reaches the caller as an HTTP 409",
                library,
                exc,
            )
            return
        for (module, name), wrapper in found:
            wrapt.wrap_function_wrapper(module, name, wrapper)
        self._patched |= {library}
