"""``excluded_urls`` (``OTEL_GUARD_EXCLUDED_URLS``): regular expressions searched for in a request's
path, as OpenTelemetry's ``OTEL_PYTHON_*_EXCLUDED_URLS`` are (``opentelemetry.util.http``)."""

from __future__ import annotations

import importlib
import re
import time

import pytest

import otel_guard
from otel_guard._excluded_urls import ExcludedUrls
from otel_guard.settings import Settings, current_settings, settings_from_env

PATHS = ["/", "/health", "/v1/healthz", "/metrics", "/metrics/x", "/agents/budget", "/HEALTH"]


def test_none_by_default_and_nothing_excluded() -> None:
    excluded = Settings().excluded_urls
    assert excluded == ExcludedUrls()
    assert not excluded
    assert not any(excluded.excludes(path) for path in PATHS)


@pytest.mark.parametrize(
    "text",
    ["health,^/metrics$", " health , ^/metrics$ ,", "^/agents/", "(?i)health", "/(x)\\1,health", "a{1,2}"],
)
def test_a_path_is_excluded_as_opentelemetry_excludes_a_url(text: str) -> None:
    """A path is excluded when one of the patterns is found in it (``re.search``), and OpenTelemetry's
    own ExcludeList, where installed, gives the same answers for the same variable (without the
    empty items it keeps: see test_an_empty_item_excludes_nothing)."""
    ours = settings_from_env({"OTEL_GUARD_EXCLUDED_URLS": text}).excluded_urls
    items = [item.strip() for item in text.split(",") if item.strip()]
    paths = [*PATHS, "/xx", "/x", "a", "aa"]
    assert [ours.excludes(path) for path in paths] == [
        any(re.search(item, path) for item in items) for path in paths
    ]
    try:
        http = importlib.import_module("opentelemetry.util.http")
    except ImportError:  # installed with the services extra (OpenTelemetry's HTTP instrumentations)
        return
    theirs = http.parse_excluded_urls(",".join(items))
    assert [ours.excludes(path) for path in paths] == [bool(theirs.url_disabled(path)) for path in paths]


def test_patterns_that_change_meaning_in_one_alternation_are_searched_one_by_one() -> None:
    excluded = ExcludedUrls(["^/a$", "(?i)^/HEALTH$", "^/(x)\\1$"])
    assert [excluded.excludes(path) for path in ["/a", "/health", "/xx", "/x", "/ax"]] == [
        True,
        True,
        True,
        False,
        False,
    ]


def test_an_empty_item_excludes_nothing() -> None:
    assert not settings_from_env({"OTEL_GUARD_EXCLUDED_URLS": "health,,"}).excluded_urls.excludes("/budget")
    assert settings_from_env({"OTEL_GUARD_EXCLUDED_URLS": " , "}).excluded_urls == ExcludedUrls()


def test_configure_takes_the_variable_form_a_list_or_the_object() -> None:
    assert otel_guard.configure(excluded_urls="health,^/metrics$").excluded_urls.patterns == (
        "health",
        "^/metrics$",
    )
    assert otel_guard.configure(excluded_urls=["^/ready$"]).excluded_urls == ExcludedUrls(["^/ready$"])
    kept = ExcludedUrls(["x"])
    assert otel_guard.configure(excluded_urls=kept).excluded_urls is kept
    assert current_settings().excluded_urls.excludes("/x")
    assert "excluded_urls=ExcludedUrls(['x'])" in repr(current_settings())
    with pytest.raises(ValueError, match=r"^excluded_urls: 3 is not"):
        otel_guard.configure(excluded_urls=3)
    with pytest.raises(ValueError, match=r"^excluded_urls: "):
        otel_guard.configure(excluded_urls=["ok", 3])


def test_a_bad_expression_is_an_error_naming_the_setting_and_the_pattern() -> None:
    with pytest.raises(ValueError, match="OTEL_GUARD_EXCLUDED_URLS") as raised:
        settings_from_env({"OTEL_GUARD_EXCLUDED_URLS": "health,/agents/(budget"})
    assert str(raised.value).startswith(
        "OTEL_GUARD_EXCLUDED_URLS: excluded_urls: '/agents/(budget' is not a regular expression ("
    )
    with pytest.raises(ValueError, match=r"^excluded_urls: '\[' is not a regular expression"):
        otel_guard.configure(excluded_urls="[")


def test_immutable() -> None:
    excluded = ExcludedUrls(["x"])
    with pytest.raises(AttributeError):
        excluded.patterns = ("y",)  # type: ignore[misc]
    assert hash(excluded) == hash(ExcludedUrls(["x"]))
    assert str(ExcludedUrls(["a", "b"])) == "a,b"


def test_a_path_is_asked_about_in_one_search() -> None:
    """Fast enough for every request: well under a microsecond or two for a few patterns."""
    excluded = ExcludedUrls(["^/health$", "^/ready$", "^/metrics$", "\\.ico$"])
    started = time.perf_counter()
    for _ in range(10_000):
        excluded.excludes("/agents/budget/price")
    assert (time.perf_counter() - started) / 10_000 < 20e-6
