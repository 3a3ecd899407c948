"""docs/spec.md says what the code does: its tables are read and compared with the code's own names."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from otel_guard import telemetry
from otel_guard.errors import REASON_CODES
from otel_guard.policy import INTEGRITY_REASONS
from otel_guard.settings import ENV

ROOT = Path(__file__).resolve().parents[1]
SPEC = (ROOT / "docs" / "spec.md").read_text(encoding="utf-8")


def section(number: int) -> str:
    return SPEC.split(f"\n## {number}. ", 1)[1].split("\n## ", 1)[0]


def table(text: str, first_header: str) -> list[list[str]]:
    """The rows of the Markdown table whose first header cell is ``first_header``, cells stripped."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_every_setting_and_its_variable() -> None:
    rows = table(section(2), "setting")
    assert {names(r[0])[0]: names(r[1])[0] for r in rows} == ENV


def test_every_reason_its_code_and_what_observe_mode_does() -> None:
    rows = table(section(3), "reason")
    assert {names(r[0])[0]: names(r[2])[0] for r in rows} == REASON_CODES
    let_through = {names(r[0])[0] for r in rows if r[3] == "would-refuse"}
    assert let_through == {"cycle", "depth", "name_depth", "budget"}
    assert set(REASON_CODES) - let_through > INTEGRITY_REASONS


def test_every_span_attribute_event_and_metric() -> None:
    text = section(5)
    spelled = {name for row in table(text, "attribute") for name in names(row[0])}
    assert spelled == {
        telemetry.GEN_AI_OPERATION_NAME,
        telemetry.GEN_AI_AGENT_NAME,
        telemetry.GEN_AI_TOOL_NAME,
        telemetry.SKILL,
        telemetry.CHAIN_AGENTS,
        telemetry.CHAIN_SKILLS,
        telemetry.CHAIN_ROOT,
        telemetry.CHAIN_DEPTH,
        telemetry.NAME_DEPTH,
        telemetry.DECISION,
        telemetry.REASON,
        telemetry.MODE,
        telemetry.BUDGET_HOPS,
        telemetry.BUDGET_EXHAUSTED,
        telemetry.HOP_KIND,
        telemetry.GEN_AI_TRANSFER_MODE,
    }
    for event in (telemetry.EVENT_REFUSED, telemetry.EVENT_WOULD_REFUSE, telemetry.EVENT_MESSAGE):
        assert f"`{event}`" in text
    metrics = {names(row[0])[0] for row in table(text, "metric (Prometheus name)")}
    assert metrics == {
        telemetry.METRIC_DECISIONS,
        telemetry.METRIC_CHAIN_DEPTH,
        telemetry.METRIC_STORE_ERRORS,
        telemetry.METRIC_STORE_EVICTIONS,
        telemetry.METRIC_UNPRICED,
        telemetry.METRIC_SPEND,
    }


def test_every_conventions_attribute_a_hop_carries() -> None:
    from tests.conventions import model

    rows = table(section(5), "conventions' attribute")
    spelled = {name for row in rows for name in names(row[0])}
    assert spelled == {
        telemetry.GEN_AI_CONVERSATION_ID,
        telemetry.GEN_AI_AGENT_DESCRIPTION,
        telemetry.GEN_AI_AGENT_VERSION,
        telemetry.GEN_AI_TOOL_CALL_ID,
        telemetry.A2A_METHOD_NAME,
        telemetry.A2A_PROTOCOL_VERSION,
        telemetry.A2A_TENANT,
        telemetry.A2A_MESSAGE_ID,
        telemetry.A2A_REFERENCE_TASK_IDS,
        telemetry.A2A_TASK_ID,
        telemetry.A2A_TASK_STATE,
        telemetry.SERVER_ADDRESS,
        telemetry.SERVER_PORT,
        telemetry.MCP_METHOD_NAME,
        telemetry.MCP_PROTOCOL_VERSION,
        telemetry.JSONRPC_REQUEST_ID,
    }
    assert spelled <= set(model().types)  # each is the conventions' own


def test_the_baggage_key_and_the_size_limit() -> None:
    from otel_guard.chain import MAX_TOKEN_LENGTH

    text = section(4)
    assert f"key `{telemetry.CHAIN_BAGGAGE_KEY}`" in text
    assert MAX_TOKEN_LENGTH == 4096 - len(f"{telemetry.CHAIN_BAGGAGE_KEY}=") == 4096 - 17
    assert "4,096 − 17 characters" in text


def test_every_instrumentor_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    registered = set(project["entry-points"]["opentelemetry_instrumentor"])
    extras = names(section(8).split("extra of the same name:", 1)[1].split(". ", 1)[0])
    # otel_guard_http guards HTTP clients, not a runtime: it needs no extra (§8's last sentence).
    assert "`otel_guard_http`" in section(8)
    assert {f"otel_guard_{extra.replace('-', '_')}" for extra in extras} | {"otel_guard_http"} == registered
    assert set(extras) <= set(project["optional-dependencies"])
