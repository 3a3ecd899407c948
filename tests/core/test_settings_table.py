"""docs/settings.md is held to the settings table (``otel_guard.settings.Settings``): every setting,
in order, with its variable and its default, and nothing the table does not have."""

from __future__ import annotations

import re
from pathlib import Path
from types import MappingProxyType

import pytest

from otel_guard._excluded_urls import ExcludedUrls
from otel_guard.settings import ENV, SETTINGS, Settings, configure, settings_from_env

DOC = (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text(encoding="utf-8")


def documented() -> list[tuple[str, str, str]]:
    """(setting, variable, default as written) of every row of docs/settings.md's setting tables."""
    rows = re.findall(r"^\| `(\w+)` \| `(OTEL_GUARD_\w+)` \| ([^|]+) \|", DOC, re.MULTILINE)
    return [(name, variable, default.strip()) for name, variable, default in rows]


def shown(default: object) -> str:
    """A default as the page writes it: the value in backticks, `none` for no value."""
    if default is None or default == MappingProxyType({}) or default == ExcludedUrls():
        return "none"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, float) and default.is_integer():
        return f"`{int(default)}`"
    return f"`{default}`"


def test_every_setting_is_documented_in_order_with_its_variable_and_default() -> None:
    table = [(f.name, f.metadata["env"], shown(getattr(Settings(), f.name))) for f in SETTINGS]
    rows = [(name, variable, default.split(" (")[0]) for name, variable, default in documented()]
    assert rows == table


def test_every_row_of_the_table_has_a_variable_a_parser_and_a_line_of_doc() -> None:
    variables = [f.metadata["env"] for f in SETTINGS]
    assert len(set(variables)) == len(variables)
    assert len(variables) == len(ENV)
    for f in SETTINGS:
        assert f.metadata["env"] == f"OTEL_GUARD_{f.name.upper()}" or f.metadata["env"].startswith(
            f"OTEL_GUARD_{f.name.upper()}_"
        )
        assert callable(f.metadata["parse"])
        doc = f.metadata["doc"]
        assert 0 < len(doc) <= 100, f.name
        assert "\n" not in doc, f.name


WITH_A_VALUE = [f.name for f in SETTINGS if shown(getattr(Settings(), f.name)) != "none"]


@pytest.mark.parametrize("name", WITH_A_VALUE)
def test_each_setting_takes_its_default_in_the_form_of_its_variable(name: str) -> None:
    """The table's parser reads its own default back, from the environment and from configure()."""
    default = getattr(Settings(), name)
    text = str(default).lower() if isinstance(default, bool) else str(default)
    assert getattr(settings_from_env({ENV[name]: text}), name) == default
    assert getattr(configure(**{name: text}), name) == default
