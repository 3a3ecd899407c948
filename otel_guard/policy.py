"""Settings, and the one pure function that decides a hop.

Settings come from the environment (``OTEL_GUARD_*``) and from :func:`configure`, which changes the
process-wide policy; every value is validated and a bad one raises ``ValueError`` naming the setting.

:func:`decide` is a pure function of (chain on arrival, hop, settings, now): no I/O, no globals.

Per-agent overrides relax or tighten the policy for one agent, e.g. a summarizer that may recurse::

    configure(overrides={"summarizer": {"cycle_rule": "none", "max_name_depth": 12}})
    # or OTEL_GUARD_OVERRIDES='{"summarizer": {"cycle_rule": "none", "max_name_depth": 12}}'

An override applies when the hop being decided is into that agent (or tool).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Final, Literal, cast

from otel_guard._threads import carry_context
from otel_guard.chain import Chain, Hop, Keyring, quoted

Mode = Literal["enforce", "observe", "off"]
OnError = Literal["allow", "refuse"]
CycleRule = Literal["agent_skill", "agent", "none"]
Outcome = Literal["allow", "refuse", "would_refuse"]

MODES: Final = ("enforce", "observe", "off")
ON_ERROR: Final = ("allow", "refuse")
DEFAULT_MAX_HOPS: Final = 1000
"""Hops one delegation tree may make by default: far above any healthy run of the examples (a
handful) and of a planner fanning out to 20 workers that fan out to 20 (420)."""
CYCLE_RULES: Final = ("agent_skill", "agent", "none")

ENV: Final[dict[str, str]] = {
    "mode": "OTEL_GUARD_MODE",
    "cycle_rule": "OTEL_GUARD_CYCLE_RULE",
    "max_depth": "OTEL_GUARD_MAX_DEPTH",
    "max_name_depth": "OTEL_GUARD_MAX_NAME_DEPTH",
    "observe_max_depth": "OTEL_GUARD_OBSERVE_MAX_DEPTH",
    "ttl": "OTEL_GUARD_TTL_SECONDS",
    "keys": "OTEL_GUARD_KEYS",
    "workspace": "OTEL_GUARD_WORKSPACE",
    "overrides": "OTEL_GUARD_OVERRIDES",
    "situational_prompt": "OTEL_GUARD_SITUATIONAL_PROMPT",
    "max_hops": "OTEL_GUARD_MAX_HOPS",
    "max_model_requests": "OTEL_GUARD_MAX_MODEL_REQUESTS",
    "max_tokens": "OTEL_GUARD_MAX_TOKENS",
    "workspace_max_hops": "OTEL_GUARD_WORKSPACE_MAX_HOPS",
    "workspace_window": "OTEL_GUARD_WORKSPACE_WINDOW_SECONDS",
    "budget_store": "OTEL_GUARD_BUDGET_STORE",
    "budget_on_error": "OTEL_GUARD_BUDGET_ON_ERROR",
}
"""Setting name -> environment variable."""

INTEGRITY_REASONS: Final = frozenset({"bad_signature", "expired", "foreign_workspace"})
"""Reasons that mean the chain itself cannot be trusted: refused in observe mode too (fail closed)."""

DEFAULT_OBSERVE_MAX_DEPTH: Final = 32
"""Observe mode's hard stop: a loop it lets through ends at this depth. A 32-hop chain whose agent
names and skills run to 20 characters each signs to 2.3 KB, inside the 4 KB a baggage member may hold."""

CLOCK_SKEW: Final = 30.0
"""Seconds of clock difference between hosts a chain's times may show (see :func:`integrity`)."""


@dataclass(frozen=True, slots=True)
class AgentOverride:
    """Settings that apply to hops into one agent; ``None`` keeps the process-wide value."""

    mode: Mode | None = None
    cycle_rule: CycleRule | None = None
    max_depth: int | None = None
    max_name_depth: int | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """The policy in force. See the README's settings table."""

    mode: Mode = "enforce"
    cycle_rule: CycleRule = "agent_skill"
    max_depth: int = 8
    max_name_depth: int = 5
    observe_max_depth: int = DEFAULT_OBSERVE_MAX_DEPTH
    ttl: float = 300.0
    keys: Keyring | None = None
    workspace: str = "default"
    overrides: Mapping[str, AgentOverride] = field(default_factory=lambda: MappingProxyType({}))
    situational_prompt: bool = False
    max_hops: int = DEFAULT_MAX_HOPS
    max_model_requests: int = 0
    max_tokens: int = 0
    workspace_max_hops: int = 0
    workspace_window: float = 3600.0
    budget_store: str = "memory"
    budget_on_error: OnError = "allow"

    def __repr__(self) -> str:
        # Written here, so the dataclass keeps it: every field as the dataclass would show it, but the
        # store URL without its password, and the keys by their ids: no secret in a log or an error.
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "budget_store":
                value = redacted_url(value)
            if isinstance(value, Keyring):
                shown.append(f"{f.name}=<Keyring {', '.join(value.kids)}>")
            else:
                shown.append(f"{f.name}={value!r}")
        return f"Settings({', '.join(shown)})"

    @property
    def model_budgets_on(self) -> bool:
        """Whether model requests are checked and counted (``max_model_requests`` or ``max_tokens``)."""
        return bool(self.max_model_requests or self.max_tokens)

    @property
    def budgets_on(self) -> bool:
        """Whether a hop has anything to count or check (a tree or workspace budget is on)."""
        return bool(self.max_hops or self.workspace_max_hops or self.max_model_requests or self.max_tokens)

    def for_agent(self, agent: str) -> Settings:
        """These settings with the override for ``agent`` applied."""
        override = self.overrides.get(agent)
        if override is None:
            return self
        changes = {f.name: getattr(override, f.name) for f in fields(AgentOverride)}
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :func:`decide` says about one hop."""

    outcome: Outcome
    reason: str | None = None
    message: str = ""


ALLOW: Final = Verdict("allow")


# -- validation ---------------------------------------------------------------------------------


def _choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    text = value.strip().lower() if isinstance(value, str) else value
    if not isinstance(text, str) or text not in choices:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(choices)}")
    return text


def _int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name}: {value!r} is not an integer")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ValueError(f"{name}: {value!r} is not an integer") from None
    if not isinstance(value, int):
        raise ValueError(f"{name}: {value!r} is not an integer")
    if value < minimum:
        raise ValueError(f"{name}: {value} is less than {minimum}")
    return value


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{name}: {value!r} is not a number of seconds")
    try:
        seconds = float(value.strip() if isinstance(value, str) else cast(float, value))
    except (TypeError, ValueError):
        raise ValueError(f"{name}: {value!r} is not a number of seconds") from None
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{name}: {value!r} must be a positive, finite number of seconds")
    return seconds


def _bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise ValueError(f"{name}: {value!r} is not true or false")


_QUERY_PASSWORD: Final = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def redacted_url(url: str) -> str:
    """``url`` as logs and errors show it: its password (``user:password@``, or a user part alone, or
    ``?password=``) as ``***``. Everything up to the last ``@`` counts as the user part, so a password
    that was not URL-encoded is hidden too."""
    head, at, tail = url.rpartition("@")
    if at:
        scheme, found, userinfo = head.partition("://")
        user, colon, _ = userinfo.partition(":")
        head = f"{scheme}://{user}:***" if found and colon else f"{scheme}://***" if found else "***"
        url = f"{head}@{tail}"
    return _QUERY_PASSWORD.sub(r"\1***", url)


def _budget_store(value: object) -> str:
    """``memory``, or a Redis URL (``redis://``, ``rediss://``, ``unix://``) with the client installed.

    An error shows the URL without its password (:func:`redacted_url`)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"budget_store: {value!r} is not 'memory' or a Redis URL (redis://host:6379/0)")
    text = value.strip()
    if text.lower() == "memory":
        return "memory"
    from urllib.parse import unquote, urlsplit

    shown = redacted_url(text)
    try:
        parts = urlsplit(text)
        scheme, host, _ = parts.scheme.lower(), parts.hostname, parts.port
    except ValueError:
        scheme, host = "", None
    if scheme not in ("redis", "rediss", "unix") or (scheme != "unix" and not host):
        raise ValueError(
            f"budget_store: {shown!r} is not 'memory' or a Redis URL "
            "(redis://host:6379/0, rediss://..., unix:///path)"
        )
    text = scheme + text[len(scheme) :]  # the Redis client reads only a lower-case scheme
    database = unquote(parts.path).replace("/", "")
    if scheme != "unix" and database and not database.isdigit():  # the client would take it for 0
        raise ValueError(f"budget_store: {shown!r}: the database is not a number (redis://host:6379/0)")
    import importlib.util

    if importlib.util.find_spec("redis") is None:
        raise ValueError("budget_store: a Redis URL needs the Redis client: pip install 'otel-guard[redis]'")
    from redis.connection import parse_url

    try:
        parse_url(text)  # type: ignore[no-untyped-call]  # what the store reads: the query too
    except ValueError as exc:  # its message never repeats the URL
        raise ValueError(f"budget_store: {shown!r}: {exc}") from None
    return text


def _workspace(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"workspace: {value!r} must be a non-empty string")
    return value.strip()


def _keys(value: object) -> Keyring | None:
    if value is None or isinstance(value, Keyring):
        return value
    if isinstance(value, str):
        return Keyring.parse(value) if value.strip() else None
    if isinstance(value, Mapping):
        return Keyring(value)
    raise ValueError("keys: expected 'kid:secret,...' or a mapping of key id to secret bytes")


def _override(agent: str, value: object) -> AgentOverride:
    if isinstance(value, AgentOverride):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"overrides: the override of {agent!r} must be a mapping of settings")
    known = {f.name for f in fields(AgentOverride)}
    unknown = set(value) - known
    if unknown:
        raise ValueError(
            f"overrides: {agent!r} sets {', '.join(sorted(map(str, unknown)))}; "
            f"an override may set {', '.join(sorted(known))}"
        )
    where = f"overrides[{agent!r}]"
    return AgentOverride(
        mode=cast(Mode, _choice(f"{where}.mode", value["mode"], MODES)) if "mode" in value else None,
        cycle_rule=cast(CycleRule, _choice(f"{where}.cycle_rule", value["cycle_rule"], CYCLE_RULES))
        if "cycle_rule" in value
        else None,
        max_depth=_int(f"{where}.max_depth", value["max_depth"], 1) if "max_depth" in value else None,
        max_name_depth=_int(f"{where}.max_name_depth", value["max_name_depth"], 1)
        if "max_name_depth" in value
        else None,
    )


def _overrides(value: object) -> Mapping[str, AgentOverride]:
    if isinstance(value, str):
        if not value.strip():
            return MappingProxyType({})
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"overrides: not JSON ({exc})") from None
    if not isinstance(value, Mapping):
        raise ValueError("overrides: expected a mapping of agent name to settings")
    return MappingProxyType({str(agent): _override(str(agent), v) for agent, v in value.items()})


_VALIDATORS: Final[dict[str, Any]] = {
    "mode": lambda v: _choice("mode", v, MODES),
    "cycle_rule": lambda v: _choice("cycle_rule", v, CYCLE_RULES),
    "max_depth": lambda v: _int("max_depth", v, 1),
    "max_name_depth": lambda v: _int("max_name_depth", v, 1),
    "observe_max_depth": lambda v: _int("observe_max_depth", v, 1),
    "ttl": lambda v: _seconds("ttl", v),
    "keys": _keys,
    "workspace": _workspace,
    "overrides": _overrides,
    "situational_prompt": lambda v: _bool("situational_prompt", v),
    "max_hops": lambda v: _int("max_hops", v, 0),
    "max_model_requests": lambda v: _int("max_model_requests", v, 0),
    "max_tokens": lambda v: _int("max_tokens", v, 0),
    "workspace_max_hops": lambda v: _int("workspace_max_hops", v, 0),
    "workspace_window": lambda v: _seconds("workspace_window", v),
    "budget_store": _budget_store,
    "budget_on_error": lambda v: _choice("budget_on_error", v, ON_ERROR),
}


def _consistent(settings: Settings) -> Settings:
    """``settings``, if observe mode's ceiling stands at or above every depth limit it backs."""
    ceiling = settings.observe_max_depth
    deepest = max(
        [settings.max_depth] + [o.max_depth for o in settings.overrides.values() if o.max_depth is not None]
    )
    if deepest > ceiling:
        raise ValueError(
            f"observe_max_depth: {ceiling} is less than max_depth {deepest}; observe mode's ceiling "
            f"must be at least every max_depth (set observe_max_depth to {deepest} or more)"
        )
    return settings


def settings_from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings the environment asks for; a bad value raises ``ValueError`` naming its variable."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name, variable in ENV.items():
        raw = environ.get(variable)
        if raw is None:
            continue
        try:
            values[name] = _VALIDATORS[name](raw)
        except ValueError as exc:
            raise ValueError(f"{variable}: {exc}") from None
    try:
        return _consistent(Settings(**values))
    except ValueError as exc:
        raise ValueError(f"{ENV['observe_max_depth']}: {exc}") from None


_lock = threading.Lock()
_current: Settings | None = None


def current_settings() -> Settings:
    """The settings in force (read from the environment the first time)."""
    settings = _current
    return settings if settings is not None else reset_settings()


def settings_at_start() -> Settings:
    """The settings in force, checked where the guard starts (an instrumentor, the ASGI middleware,
    the CLI): a bad ``OTEL_GUARD_*`` value ends the program there, with one line on stderr naming the
    variable and what it accepts and exit status 2 -- never a traceback, and never a server that
    starts and then refuses every request. A budget store that cannot be reached is one warning there.
    """
    try:
        settings = current_settings()
    except ValueError as exc:
        sys.stderr.write(f"otel-guard: {exc}\n")
        sys.stderr.flush()
        if _in_sitecustomize():
            # opentelemetry-instrument loads instrumentors from sitecustomize, where SystemExit is a
            # fatal error with a traceback: end the process as SystemExit would have.
            os._exit(2)
        raise SystemExit(2) from None
    from otel_guard.budget import probe_store

    probe_store(settings)
    return settings


def _in_sitecustomize() -> bool:
    """Whether ``sitecustomize`` is being imported now (Python's start-up is still under way)."""
    module = sys.modules.get("sitecustomize")
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def reset_settings() -> Settings:
    """Forget every :func:`configure` and read the environment again."""
    global _current
    with _lock:
        settings = settings_from_env()
        # The guard starts (a first hop reads its settings): the context, and the chain in it, goes
        # into the threads a hop starts from now on; done before any hop can read these settings.
        carry_context()
        _current = settings
        return settings


def configure(**settings: Any) -> Settings:
    """Change the process-wide policy; see the settings table in the README.

    Each keyword takes the string form of its environment variable or a Python value; a keyword left
    out keeps its current value. Returns the settings now in force.
    """
    global _current
    unknown = set(settings) - set(_VALIDATORS)
    if unknown:
        raise ValueError(f"unknown setting {', '.join(sorted(unknown))}; settings are {', '.join(ENV)}")
    validated = {name: _VALIDATORS[name](value) for name, value in settings.items()}
    with _lock:
        if _current is not None:
            base = _current
        elif len(validated) == len(_VALIDATORS):
            base = Settings()  # every setting given: the environment has nothing left to say
        else:
            base = settings_from_env()
        in_force = _consistent(replace(base, **validated))
        carry_context()  # as in reset_settings
        _current = in_force
        return in_force


# -- the decision -------------------------------------------------------------------------------


def decide(arrival: Chain | None, hop: Hop, settings: Settings, now: float) -> Verdict:
    """Decide whether ``hop`` may run, given the chain it arrives with.

    Checks, in order: the chain's workspace and lifetime (integrity: refused in observe mode too),
    then the cycle rule, the per-name depth and the chain depth. Observe mode lets those last three
    through, up to ``observe_max_depth`` hops. In ``off`` mode everything is allowed.
    """
    settings = settings.for_agent(hop.agent)
    if settings.mode == "off":
        return ALLOW
    verdict = _check(arrival, hop, settings, now)
    if verdict is None:
        return ALLOW
    reason, message = verdict
    if settings.mode != "observe" or reason in INTEGRITY_REASONS:
        return Verdict("refuse", reason, message)
    if arrival is not None and len(arrival.hops) >= settings.observe_max_depth:
        return Verdict(
            "refuse",
            "observe_ceiling",
            f"Delegation observe ceiling: calling agent {hop.agent} would make chain {arrival.path()} "
            f"{len(arrival.hops) + 1} hops long; observe mode refuses past observe_max_depth "
            f"{settings.observe_max_depth} (enforce mode would have refused it for {reason})",
        )
    return Verdict("would_refuse", reason, message)


def integrity(
    chain: Chain, settings: Settings, now: float, agent: str | None = None
) -> tuple[str, str] | None:
    """Why an arriving chain cannot be trusted here, as (reason, message), or None.

    Its workspace must be this one; it must not have expired, nor claim a lifetime longer than this
    guard's ``ttl``, nor have been issued in the future, each beyond ``CLOCK_SKEW`` seconds of clock
    difference between hosts (every process of a workspace needs the same ``ttl``, as it needs the
    same keys). The guard refuses such a chain in every mode; ``otel-guard inspect`` reports it.
    """
    lifetime = chain.expires_at - chain.issued_at
    if chain.workspace != settings.workspace:
        reason = "foreign_workspace"
        message = (
            f"Delegation chain belongs to workspace {quoted(chain.workspace)}, not {settings.workspace!r}"
        )
    elif now >= chain.expires_at:
        reason = "expired"
        message = (
            f"Delegation chain expired {now - chain.expires_at:.0f} s ago "
            f"(lifetime {lifetime:.0f} s from its first hop)"
        )
    elif lifetime > settings.ttl + CLOCK_SKEW:
        reason = "expired"
        message = (
            f"Delegation chain claims a lifetime of {lifetime:.0f} s, longer than the ttl here "
            f"({settings.ttl:.0f} s)"
        )
    elif chain.issued_at > now + CLOCK_SKEW:
        reason = "expired"
        message = (
            f"Delegation chain was issued {chain.issued_at - now:.0f} s in the future "
            f"(more than the {CLOCK_SKEW:.0f} s of clock skew allowed)"
        )
    else:
        return None  # the common case: no message is built
    if agent is not None:
        message += f"; agent {agent} refused in chain {chain.path() or '(empty)'}"
    return reason, message


def _check(arrival: Chain | None, hop: Hop, settings: Settings, now: float) -> tuple[str, str] | None:
    if arrival is None:
        return None  # a first hop: nothing to repeat, depth 1
    problem = integrity(arrival, settings, now, hop.agent)
    if problem is not None:
        return problem
    hops = arrival.hops
    standing = [h[0] for h in hops].count(hop.agent)
    if settings.cycle_rule == "agent" and standing:
        return "cycle", f"Delegation cycle: agent {hop.agent} is already in chain {arrival.path()}"
    if settings.cycle_rule == "agent_skill" and standing and hop in hops:
        skill = f" with skill {hop.skill}" if hop.skill is not None else ""
        return "cycle", f"Delegation cycle: agent {hop.agent}{skill} is already in chain {arrival.path()}"
    if standing >= settings.max_name_depth:
        return (
            "name_depth",
            f"Delegation name depth: agent {hop.agent} already stands {standing} times in chain "
            f"{arrival.path()}; the limit (max_name_depth) is {settings.max_name_depth} "
            "- possible runaway recursion",
        )
    if len(hops) >= settings.max_depth:
        return (
            "depth",
            f"Delegation depth: calling agent {hop.agent} would make chain {arrival.path()} "
            f"{len(hops) + 1} hops long; the limit (max_depth) is {settings.max_depth}",
        )
    return None
