"""The Redis URLs a budget store may be given, read once: one Redis, a Redis Cluster, or Sentinel.

``redis://`` / ``rediss://`` / ``unix://`` name one Redis, as redis-py reads them.
``redis+cluster://[user:password@]host:port[,host:port...][/0][?option=...]`` (``rediss+cluster://`` for
TLS) names a Redis Cluster (or Valkey cluster) by one or more of its nodes: the client learns the rest.
``redis+sentinel://[user:password@]host[:port][,host[:port]...]/service[/db][?option=...]``
(``rediss+sentinel://``) names the sentinels (port 26379 unless given) and the master's service name,
the form of the ``Redis-Sentinel-Url`` package, Prefect's and RedisVL's; the user and password are the
data nodes', ``sentinel_username`` and ``sentinel_password`` the sentinels'.

What a reader would not guess: redis-py takes any query option and hands it to the connection as a
string, so an option it does not know (``?cluster=true``) fails every take with a ``TypeError``. Here
an option is known only if it is one of :data:`OPTIONS` that the scheme's connection takes (``ssl_*``
only with TLS), and anything else is a :class:`ValueError` where the settings are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal
from urllib.parse import parse_qs, unquote

STRING_OPTIONS: Final = frozenset(
    {
        "username",
        "password",
        "client_name",
        "lib_name",
        "lib_version",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_ca_data",
        "ssl_password",
        "ssl_ciphers",
    }
)
"""Options redis-py reads as strings (the rest of :data:`OPTIONS` it converts: numbers, booleans)."""

SENTINEL_OPTIONS: Final = frozenset({"sentinel_username", "sentinel_password"})
"""The options of a ``redis+sentinel://`` URL for the sentinels themselves."""

SCHEMES: Final = (
    "redis",
    "rediss",
    "unix",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
)

SENTINEL_PORT: Final = 26379
REDIS_PORT: Final = 6379

Kind = Literal["single", "cluster", "sentinel"]


def options_known() -> frozenset[str]:
    """Every query option a store URL may set: redis-py's typed URL options and :data:`STRING_OPTIONS`."""
    from redis.connection import URL_QUERY_ARGUMENT_PARSERS

    return frozenset(URL_QUERY_ARGUMENT_PARSERS) | STRING_OPTIONS


@dataclass(frozen=True)
class StoreUrl:
    """A store URL, read: what kind of Redis, where, and the options of its connections."""

    kind: Kind
    tls: bool
    nodes: tuple[tuple[str, int], ...] = ()
    """A cluster's nodes to start from, or the sentinels (empty for one Redis: see ``single``)."""
    service: str = ""
    """Sentinel: the master's service name."""
    options: dict[str, Any] = field(default_factory=dict)
    """The data nodes' connection options, as redis-py's ``parse_url`` gives them (``db``,
    ``password``, ``socket_timeout``...); for one Redis, its host and port too."""
    sentinel_options: dict[str, Any] = field(default_factory=dict)
    """Sentinel: ``username``/``password`` of the sentinels."""


def read_store_url(text: str) -> StoreUrl:
    """``text`` read as a store URL (scheme in lower case already). Raises :class:`ValueError` with a
    message that never repeats the URL (it may hold a password)."""
    from redis.connection import parse_url

    scheme, _, rest = text.partition("://")
    if scheme not in SCHEMES:
        raise ValueError(f"the scheme is not one of {', '.join(s + '://' for s in SCHEMES)}")
    base, _, query = rest.partition("?")
    raw = parse_qs(query, keep_blank_values=True)
    sentinel_options = {
        name.removeprefix("sentinel_"): values[-1] for name, values in raw.items() if name in SENTINEL_OPTIONS
    }
    if sentinel_options and not scheme.endswith("+sentinel"):
        raise ValueError(f"{', '.join(sorted(raw.keys() & SENTINEL_OPTIONS))} is only for redis+sentinel://")
    _check_options(set(raw) - SENTINEL_OPTIONS, tls=scheme.startswith("rediss"))
    if "+" not in scheme:
        return StoreUrl("single", scheme == "rediss", options=parse_url(text))  # type: ignore[no-untyped-call]
    tls = scheme.startswith("rediss")
    userinfo, at, hostpart = base.rpartition("@")
    hosts, _, path = hostpart.partition("/")
    kind: Kind = "cluster" if scheme.endswith("+cluster") else "sentinel"
    nodes = tuple(
        _node(item, REDIS_PORT if kind == "cluster" else SENTINEL_PORT) for item in hosts.split(",")
    )
    parts = [unquote(part) for part in path.split("/") if part]
    service, database = "", ""
    if kind == "cluster":
        if len(parts) > 1 or (parts and parts[0] != "0"):
            raise ValueError("a cluster has one database, 0 (redis+cluster://host:port/0)")
    else:
        if not parts or len(parts) > 2:
            raise ValueError("no service name (redis+sentinel://host:26379/service[/db])")
        service = parts[0]
        database = parts[1] if len(parts) == 2 else ""
        if database and not database.isdigit():
            raise ValueError("the database is not a number (redis+sentinel://host:26379/service/0)")
    # The data nodes' options as redis-py reads them, from an equivalent URL of one Redis.
    equivalent = f"{'rediss' if tls else 'redis'}://{userinfo}{at}{nodes[0][0]}:{nodes[0][1]}/{database}"
    kept = "&".join(item for item in query.split("&") if item and _name(item) not in SENTINEL_OPTIONS)
    options = parse_url(f"{equivalent}?{kept}" if kept else equivalent)  # type: ignore[no-untyped-call]
    for name in ("host", "port", "connection_class"):
        options.pop(name, None)
    if kind == "cluster" and options.get("db", 0) != 0:
        raise ValueError("a cluster has one database, 0 (redis+cluster://host:port/0)")
    return StoreUrl(kind, tls, nodes, service, options, sentinel_options)


def _name(item: str) -> str:
    return next(iter(parse_qs(item, keep_blank_values=True)), "")


def _check_options(names: set[str], *, tls: bool) -> None:
    known = options_known()
    unknown = sorted(name for name in names if name not in known or (name.startswith("ssl_") and not tls))
    if unknown:
        said = ", ".join(f"'{name}'" for name in unknown)
        raise ValueError(
            f"the option {said} is not one the budget store knows"
            + (
                " (ssl_* options need rediss://)"
                if any(n.startswith("ssl_") for n in unknown) and not tls
                else ""
            )
            + f"; it knows {', '.join(sorted(known))}"
        )


def _node(item: str, default_port: int) -> tuple[str, int]:
    host, colon, port = item.strip().rpartition(":") if ":" in item else (item.strip(), "", "")
    host = host.strip("[]")
    if not host:
        raise ValueError("a node has no host (host:port,host:port)")
    if colon and not port.isdigit():
        raise ValueError("a node's port is not a number (host:port,host:port)")
    return unquote(host), int(port) if colon else default_port
