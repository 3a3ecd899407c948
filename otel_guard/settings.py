"""Every setting once: its name, type, default, environment variable, parser and one line of doc.

:class:`Settings` is the table: each field is declared with :func:`setting`, and everything else
follows from those declarations: :data:`ENV`, reading the environment, :func:`configure`, the check
where the guard starts, and docs/settings.md, which a test holds to the table. A bad value raises
``ValueError`` naming the setting (and, from the environment, its variable).

Per-agent overrides relax or tighten the policy for one agent, e.g. a summarizer that may recurse::

    configure(overrides={"summarizer": {"cycle_rule": "none", "max_name_depth": 12}})
    # or OTEL_GUARD_OVERRIDES='{"summarizer": {"cycle_rule": "none", "max_name_depth": 12}}'
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields, replace
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Final, Literal, cast

from otel_guard._excluded_urls import ExcludedUrls
from otel_guard._jwk import PublicKeys
from otel_guard._prices import Prices, amount, currency, read_prices
from otel_guard._threads import carry_context
from otel_guard.chain import Keyring

Mode = Literal["enforce", "observe", "off"]
OnError = Literal["allow", "refuse"]
CycleRule = Literal["agent_skill", "agent", "none"]

MODES: Final = ("enforce", "observe", "off")
ON_ERROR: Final = ("allow", "refuse")
CYCLE_RULES: Final = ("agent_skill", "agent", "none")
DEFAULT_MAX_HOPS: Final = 1000
"""Hops one delegation tree may make by default: far above any healthy run of the examples (a
handful) and of a planner fanning out to 20 workers that fan out to 20 (420)."""
DEFAULT_OBSERVE_MAX_DEPTH: Final = 32
"""Observe mode's hard stop: a loop it lets through ends at this depth. A 32-hop chain whose agent
names and skills run to 20 characters each signs to 2.3 KB, inside the 4 KB a baggage member may hold."""

PREFIX: Final = "OTEL_GUARD_"
NOT_SETTINGS: Final = ("OTEL_GUARD_PROCESSOR_",)
"""Prefixes of the ``OTEL_GUARD_*`` variables that name no setting and are no mistake: the
collector-side processor's options (``OTEL_GUARD_PROCESSOR_<OPTION>``, ``otel_guard_processor.config``),
which a fleet may set in the same environment as its agents'. The only ones: every other
``OTEL_GUARD_*`` name is a setting's variable (:data:`ENV`) or is warned of at start."""

_log = logging.getLogger("otel_guard")

Parse = Callable[[str, object], Any]
"""A setting's parser: (setting name, value as given or as its variable's text) -> the value, or a
``ValueError`` whose message starts with the name."""


# -- parsers ------------------------------------------------------------------------------------


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


MAX_TTL: Final = 100 * 365.25 * 86400
"""The longest ``ttl``: a chain's ``exp`` must stay before 2^33 (the year 2242), which no guard reads past."""


def _ttl(name: str, value: object) -> float:
    seconds = _seconds(name, value)
    if seconds > MAX_TTL:
        raise ValueError(f"{name}: {value!r} is past the longest ttl, {MAX_TTL:.0f} seconds (100 years)")
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


def choice(*choices: str) -> Parse:
    return lambda name, value: _choice(name, value, choices)


def integer(minimum: int) -> Parse:
    return lambda name, value: _int(name, value, minimum)


SECRET_WORDS: Final = ("pass", "pwd", "secret", "token", "auth", "key", "credential")
"""A URL query parameter whose name holds one of these (percent-decoded, any case) is a secret:
``password`` (what redis-py's ``parse_url`` reads as the password, under any spelling it decodes to,
``?pass%77ord=``), ``ssl_password``, ``token``, ``auth``, ``api_key``..."""


def redacted_url(url: str) -> str:
    """``url`` as logs and errors show it: its password (``user:password@``, or a user part alone) as
    ``***``, and the value of every query parameter whose name is a secret's (:data:`SECRET_WORDS`,
    ``?password=***``, ``?pass%77ord=***``). Everything up to the last ``@`` counts as the user part,
    and a parameter's value runs to the next ``&`` (a ``#`` in it included), so a password that was
    not URL-encoded is hidden too."""
    head, at, tail = url.rpartition("@")
    if at:
        scheme, found, userinfo = head.partition("://")
        user, colon, _ = userinfo.partition(":")
        head = f"{scheme}://{user}:***" if found and colon else f"{scheme}://***" if found else "***"
        url = f"{head}@{tail}"
    base, question, query = url.partition("?")
    if not question:
        return url
    shown = []
    for item in query.split("&"):  # as parse_qs splits it: the first '=' ends the name
        name, equals, _ = item.partition("=")
        shown.append(f"{name}=***" if equals and _secret_name(name) else item)
    return f"{base}?{'&'.join(shown)}"


def _secret_name(name: str) -> bool:
    """Whether a query parameter's ``name`` is a secret's, decoded as parse_qs decodes it (and then
    again, a few times: whatever layer of escapes reads it, it reads as what it is)."""
    from urllib.parse import unquote_plus

    for _ in range(4):
        decoded = unquote_plus(name)
        if decoded == name:
            break
        name = decoded
    name = name.lower()
    return any(word in name for word in SECRET_WORDS)


def _budget_store(name: str, value: object) -> str:
    """``memory``, or a Redis URL (``redis://``, ``rediss://``, ``unix://``; a cluster's
    ``redis+cluster://``, Sentinel's ``redis+sentinel://``: :mod:`otel_guard.budget.redis_urls`) with the
    client installed, and no query option the store does not know.

    An error shows the URL without its password (:func:`redacted_url`)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}: {value!r} is not 'memory' or a Redis URL (redis://host:6379/0)")
    text = value.strip()
    if text.lower() == "memory":
        return "memory"
    from urllib.parse import unquote, urlsplit

    shown = redacted_url(text)
    head, found, _ = text.partition("://")
    fleet = found and head.lower() in ("redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel")
    try:
        parts = urlsplit(text)
        scheme, host = parts.scheme.lower(), parts.hostname
        if not fleet:  # a fleet's URL names several nodes: host:port,host:port
            parts.port  # noqa: B018  # a port that is not a number raises
    except ValueError:
        scheme, host = "", None
    if not fleet and (scheme not in ("redis", "rediss", "unix") or (scheme != "unix" and not host)):
        raise ValueError(
            f"{name}: {shown!r} is not 'memory' or a Redis URL "
            "(redis://host:6379/0, rediss://..., unix:///path)"
        )
    text = scheme + text[len(scheme) :]  # the Redis client reads only a lower-case scheme
    database = unquote(parts.path).replace("/", "")
    if not fleet and scheme != "unix" and database and not database.isdigit():  # the client: 0
        raise ValueError(f"{name}: {shown!r}: the database is not a number (redis://host:6379/0)")
    import importlib.util

    if importlib.util.find_spec("redis") is None:
        raise ValueError(f"{name}: a Redis URL needs the Redis client: pip install 'otel-guard[redis]'")
    from otel_guard.budget.redis_urls import read_store_url

    try:
        read_store_url(text)  # what the store reads: the query too
    except ValueError as exc:  # its message never repeats the URL
        raise ValueError(f"{name}: {shown!r}: {exc}") from None
    return text


def _prices(name: str, value: object) -> Prices | None:
    """A prices file's path (``""``: none), or prices already read (a mapping of model to prices)."""
    if value is None or isinstance(value, Prices):
        return value
    if isinstance(value, str | os.PathLike):
        path = os.fspath(value).strip()
        return read_prices(path) if path else None
    if isinstance(value, Mapping):
        return Prices.of(value, "the prices given")
    raise ValueError(f"{name}: expected the path of a JSON or YAML prices file, not {type(value).__name__}")


def _workspace(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}: {value!r} must be a non-empty string")
    return value.strip()


def _keys(name: str, value: object) -> Keyring | None:
    if value is None or isinstance(value, Keyring):
        return value
    if isinstance(value, str):
        return Keyring.parse(value) if value.strip() else None
    if isinstance(value, Mapping):
        return Keyring(value)
    raise ValueError(
        "keys: expected 'kid:secret,kid:EdDSA:d,...' or a mapping of key id to secret bytes or private key"
    )


def _jwks(name: str, value: object) -> PublicKeys | None:
    """A JWKS file's path (``""``: none), or a JWKS already read (``{"keys": [...]}``)."""
    if value is None or isinstance(value, PublicKeys):
        return value
    if isinstance(value, str | os.PathLike):
        path = os.fspath(value)
        return PublicKeys.read(path.strip()) if path.strip() else None
    if isinstance(value, Mapping):
        return PublicKeys.of(value)
    raise ValueError(
        f"{name}: expected the path of a JWKS file or a JWKS mapping, not {type(value).__name__}"
    )


def _with_jwks(settings: Settings) -> Settings:
    """``settings`` whose ``keys`` holds the public keys of ``jwks`` too: the one keyring the guard
    signs and verifies with (public keys only, when ``keys`` is not set)."""
    keys, jwks = settings.keys, settings.jwks
    merged = (
        keys.with_public(jwks) if keys is not None else Keyring(public=jwks) if jwks is not None else None
    )
    return settings if merged is keys else replace(settings, keys=merged)


def _excluded_urls(name: str, value: object) -> ExcludedUrls:
    if isinstance(value, ExcludedUrls):
        return value
    if isinstance(value, str):
        return ExcludedUrls.parse(value)
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return ExcludedUrls(value)
    raise ValueError(f"{name}: {value!r} is not comma-separated regular expressions or a list of them")


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


def _overrides(name: str, value: object) -> Mapping[str, AgentOverride]:
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


# -- the table ----------------------------------------------------------------------------------


def setting(default: Any, env: str, parse: Parse, doc: str) -> Any:
    """One row of the table: a field of :class:`Settings` (a mutable default is given as a callable
    that makes it)."""
    metadata = {"env": env, "parse": parse, "doc": doc}
    if callable(default):
        return field(default_factory=default, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, slots=True)
class AgentOverride:
    """Settings that apply to hops into one agent; ``None`` keeps the process-wide value."""

    mode: Mode | None = None
    cycle_rule: CycleRule | None = None
    max_depth: int | None = None
    max_name_depth: int | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """The policy in force: one field a setting (docs/settings.md says each in full)."""

    mode: Mode = setting(
        "enforce",
        "OTEL_GUARD_MODE",
        choice(*MODES),
        "enforce refuses; observe records a would-refuse and lets the call through; off checks nothing",
    )
    cycle_rule: CycleRule = setting(
        "agent_skill",
        "OTEL_GUARD_CYCLE_RULE",
        choice(*CYCLE_RULES),
        "what a repeat is: the same agent and skill, the same agent, or none (depth limits only)",
    )
    max_depth: int = setting(8, "OTEL_GUARD_MAX_DEPTH", integer(1), "the most hops one chain may hold")
    max_name_depth: int = setting(
        5, "OTEL_GUARD_MAX_NAME_DEPTH", integer(1), "the most times one name may stand in a chain"
    )
    observe_max_depth: int = setting(
        DEFAULT_OBSERVE_MAX_DEPTH,
        "OTEL_GUARD_OBSERVE_MAX_DEPTH",
        integer(1),
        "observe mode's hard stop: a deeper chain is refused in observe mode too",
    )
    ttl: float = setting(300.0, "OTEL_GUARD_TTL_SECONDS", _ttl, "a chain's lifetime from its first hop")
    keys: Keyring | None = setting(
        None, "OTEL_GUARD_KEYS", _keys, "kid:secret pairs; the first signs, every one verifies"
    )
    jwks: PublicKeys | None = setting(
        None, "OTEL_GUARD_JWKS", _jwks, "a JWKS file: public keys that verify chains and sign none"
    )
    accept_unsigned: bool = setting(
        False,
        "OTEL_GUARD_ACCEPT_UNSIGNED",
        _bool,
        "with keys, take an unsigned chain as it arrived, as a would-refuse (a key rollout)",
    )
    workspace: str = setting("default", "OTEL_GUARD_WORKSPACE", _workspace, "a chain from another is refused")
    overrides: Mapping[str, AgentOverride] = setting(
        lambda: MappingProxyType({}), "OTEL_GUARD_OVERRIDES", _overrides, "per-agent settings, JSON"
    )
    situational_prompt: bool = setting(
        False,
        "OTEL_GUARD_SITUATIONAL_PROMPT",
        _bool,
        "tell an agent that can see its call path where it runs",
    )
    excluded_urls: ExcludedUrls = setting(
        ExcludedUrls(),
        "OTEL_GUARD_EXCLUDED_URLS",
        _excluded_urls,
        "regular expressions: a request whose path has one is no hop (ASGI middleware)",
    )
    max_hops: int = setting(
        DEFAULT_MAX_HOPS, "OTEL_GUARD_MAX_HOPS", integer(0), "the most hops one tree may make (0: off)"
    )
    max_model_requests: int = setting(
        0, "OTEL_GUARD_MAX_MODEL_REQUESTS", integer(0), "the most model requests one tree may make (0: off)"
    )
    max_tokens: int = setting(
        0, "OTEL_GUARD_MAX_TOKENS", integer(0), "the most model tokens one tree may spend (0: off)"
    )
    max_cost: Decimal = setting(
        Decimal(0),
        "OTEL_GUARD_MAX_COST",
        amount,
        "the most one tree may spend on model requests, in cost_currency (0: off)",
    )
    cost_currency: str = setting(
        "USD", "OTEL_GUARD_COST_CURRENCY", currency, "the ISO 4217 code of max_cost and of the prices"
    )
    prices: Prices | None = setting(
        None,
        "OTEL_GUARD_PRICES",
        _prices,
        "a JSON or YAML file: model (or glob) -> prices per million tokens",
    )
    budget_unpriced: OnError = setting(
        "allow",
        "OTEL_GUARD_BUDGET_UNPRICED",
        choice(*ON_ERROR),
        "a response no price covers: allow (counted as unpriced) or refuse the tree's next request",
    )
    workspace_max_hops: int = setting(
        0,
        "OTEL_GUARD_WORKSPACE_MAX_HOPS",
        integer(0),
        "the most hops the workspace may make a window (0: off)",
    )
    workspace_window: float = setting(
        3600.0, "OTEL_GUARD_WORKSPACE_WINDOW_SECONDS", _seconds, "the window of workspace_max_hops"
    )
    budget_store: str = setting(
        "memory", "OTEL_GUARD_BUDGET_STORE", _budget_store, "memory, or a Redis URL shared by a fleet"
    )
    budget_on_error: OnError = setting(
        "allow",
        "OTEL_GUARD_BUDGET_ON_ERROR",
        choice(*ON_ERROR),
        "what a hop gets when the store cannot answer",
    )

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
        """Whether model requests are checked and counted (``max_model_requests``, ``max_tokens`` or
        ``max_cost``)."""
        return bool(self.max_model_requests or self.max_tokens or self.max_cost)

    @property
    def budgets_on(self) -> bool:
        """Whether a hop has anything to count or check (a tree or workspace budget is on)."""
        return bool(self.max_hops or self.workspace_max_hops or self.model_budgets_on)

    def for_agent(self, agent: str) -> Settings:
        """These settings with the override for ``agent`` applied."""
        override = self.overrides.get(agent)
        if override is None:
            return self
        changes = {f.name: getattr(override, f.name) for f in fields(AgentOverride)}
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


SETTINGS: Final[tuple[Field[Any], ...]] = fields(Settings)
"""The table's rows, in order."""
ENV: Final[dict[str, str]] = {f.name: f.metadata["env"] for f in SETTINGS}
"""Setting name -> environment variable."""
_PARSE: Final[dict[str, Parse]] = {f.name: f.metadata["parse"] for f in SETTINGS}


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


def _priced_in_currency(settings: Settings) -> Settings:
    """``settings``, if every entry of ``prices`` that names its currency names ``cost_currency``."""
    prices = settings.prices
    if prices is None:
        return settings
    for model, named in prices.currencies():
        if named != settings.cost_currency:
            raise ValueError(
                f"prices: {prices.source}: {model!r} is priced in {named}, but cost_currency is "
                f"{settings.cost_currency} (a budget adds amounts of one currency only)"
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
            values[name] = _PARSE[name](name, raw)
        except ValueError as exc:
            raise ValueError(f"{variable}: {exc}") from None
    try:
        settings = _with_jwks(Settings(**values))
    except ValueError as exc:
        raise ValueError(f"{ENV['jwks']}: {exc}") from None
    try:
        _priced_in_currency(settings)
    except ValueError as exc:
        raise ValueError(f"{ENV['prices']}: {exc}") from None
    try:
        return _consistent(settings)
    except ValueError as exc:
        raise ValueError(f"{ENV['observe_max_depth']}: {exc}") from None


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """Each ``OTEL_GUARD_*`` variable of ``environ`` that names no setting (nor :data:`NOT_SETTINGS`),
    sorted, with the variable of the setting closest to it (or ``None`` when none is close).

    A name is compared with each setting's variable and with its setting's name (the setting ``ttl``
    for ``OTEL_GUARD_TTL_SECONDS``), without the common prefix, which would make every name look
    close to every other.
    """
    environ = os.environ if environ is None else environ
    known = set(ENV.values())
    candidates: dict[str, str] = {}
    for name, variable in ENV.items():
        candidates[variable[len(PREFIX) :]] = variable
        candidates.setdefault(name.upper(), variable)
    unknown = []
    for variable in sorted(environ):
        upper = variable.upper()
        if variable in known or not upper.startswith(PREFIX) or upper.startswith(NOT_SETTINGS):
            continue
        close = difflib.get_close_matches(upper[len(PREFIX) :], list(candidates), n=1)
        unknown.append((variable, candidates[close[0]] if close else None))
    return unknown


_lock = threading.Lock()
_current: Settings | None = None
_unknown_reported = False


def report_unknown_variables() -> None:
    """Warn, once in the process, of each ``OTEL_GUARD_*`` variable that names no setting: where the
    guard starts (:func:`otel_guard._start.settings_at_start`, the first :func:`configure` that reads
    the environment, the first :func:`current_settings`). Not :func:`reset_settings` itself: the demo
    and the tests reset to the environment without starting anything."""
    global _unknown_reported
    with _lock:
        if _unknown_reported:
            return
        _unknown_reported = True
    for variable, closest in unknown_variables():
        hint = f"did you mean {closest}?" if closest else "no setting's variable is close to it"
        # On the otel_guard logger: with no logging configured, Python's last-resort handler writes
        # it to stderr (as the guard's other one-time warnings).
        _log.warning("otel-guard: %s names no setting and is ignored; %s", variable, hint)


def current_settings() -> Settings:
    """The settings in force (read from the environment the first time)."""
    settings = _current
    if settings is not None:
        return settings
    report_unknown_variables()  # the first read: the guard starts (a first hop, the CLI)
    return reset_settings()


def checked_settings() -> Settings:
    """The settings in force, where the guard starts: a bad ``OTEL_GUARD_*`` value ends the program
    with one line on stderr naming the variable and what it accepts, and exit status 2 -- never a
    traceback, and never a server that starts and then refuses every request.
    """
    try:
        return current_settings()
    except ValueError as exc:
        sys.stderr.write(f"otel-guard: {exc}\n")
        sys.stderr.flush()
        if _in_sitecustomize():
            # opentelemetry-instrument loads instrumentors from sitecustomize, where SystemExit is a
            # fatal error with a traceback: end the process as SystemExit would have.
            os._exit(2)
        raise SystemExit(2) from None


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
    """Change the process-wide policy (the settings of :class:`Settings`).

    Each keyword takes the string form of its environment variable or a Python value; a keyword left
    out keeps its current value. Returns the settings now in force.
    """
    global _current
    unknown = set(settings) - set(_PARSE)
    if unknown:
        raise ValueError(f"unknown setting {', '.join(sorted(unknown))}; settings are {', '.join(ENV)}")
    validated = {name: _PARSE[name](name, value) for name, value in settings.items()}
    if _current is None and len(validated) < len(_PARSE):  # the environment is read: the guard starts
        report_unknown_variables()
    with _lock:
        if _current is not None:
            base = _current
        elif len(validated) == len(_PARSE):
            base = Settings()  # every setting given: the environment has nothing left to say
        else:
            base = settings_from_env()
        in_force = _consistent(_priced_in_currency(_with_jwks(replace(base, **validated))))
        carry_context()  # as in reset_settings
        _current = in_force
        return in_force
