"""``--dialects FILE``: a made-up vendor's spans taught to the processor by a file alone, and every
wrong file refused at start with one line naming the file, the line, the row and the field.

The vendor (``made_up_vendor.py``) marks its calls in an attribute no built-in row reads, one of its
values a JSON string with its quotes (as mlflow writes). Without the file its loop is not counted at
all; with it, by the engine, the reference and a running processor alike, one series.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from corpus_spans import to_request
from made_up_vendor import DIALECTS_FILE, spans
from otel_guard_processor.config import ConfigError, load_config
from otel_guard_processor.dialects_file import DialectsError, Spec, read_dialects, to_yaml
from otel_guard_processor.engine import DecodeError, EngineDetector, check, dialect_table
from processor_helpers import ProcessorFactory, export, scrape, series
from reference import dialects
from reference.reference import detect

LOOP_CYCLES = {("cross_function", "planner>budget>planner"): 1}
LOOP_EDGES = {("planner", "budget"): 3, ("budget", "planner"): 2}


def rows_of(tmp_path: Path, text: str = DIALECTS_FILE) -> tuple[Spec, ...]:
    path = tmp_path / "dialects.yaml"
    path.write_text(text, encoding="utf-8")
    return read_dialects(path, dialect_table()[0])


Counted = tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]


def counted(records: list[dict[str, Any]], rows: tuple[Spec, ...] = ()) -> Counted:
    """The engine's cycles and edges, each span sent alone as it ended (children first)."""
    detector = EngineDetector(dialects=rows)
    for record in reversed(records):
        detector.ingest(to_request([record]).SerializeToString(), 0.0)
    detector.expire(detector.limits.count_wait)
    return detector.cycles, detector.delegations


def test_without_the_file_the_vendors_loop_is_not_counted_and_with_it_is_one_series(tmp_path: Path) -> None:
    loop, healthy = spans(5), spans(1, trace=2)
    assert counted(loop) == ({}, {})
    rows = rows_of(tmp_path)
    assert rows[0][2] == '"AGENT"'  # the quotes are part of the value
    assert counted(loop, rows) == (LOOP_CYCLES, LOOP_EDGES)
    assert counted(healthy, rows) == ({}, {("planner", "budget"): 1})


def test_the_reference_reads_the_file_as_the_engine_does(tmp_path: Path) -> None:
    table = dialects.with_rows(rows_of(tmp_path))
    for records in (spans(5), spans(1, trace=2), spans(4, trace=3)):
        raws = [to_request([record]).SerializeToString() for record in reversed(records)]
        metrics = detect(raws, table)
        assert (metrics.cycles, metrics.delegations) == counted(records, rows_of(tmp_path))
        assert detect(raws).cycles == {}  # the built-in table alone reads no call


def test_the_built_in_table_is_a_dialects_file_that_reads_back_row_for_row(tmp_path: Path) -> None:
    builtin = dialect_table()[0]
    text = to_yaml(builtin)
    assert rows_of(tmp_path, "rows: []\n") == rows_of(tmp_path, "# nothing\n") == ()
    path = tmp_path / "builtin.yaml"
    path.write_text(text, encoding="utf-8")
    assert list(read_dialects(path, ())) == builtin
    # Given again after the built-in table, its first row can never match.
    with pytest.raises(
        DialectsError, match=r"builtin.yaml, line 4, row 1, field value: can never match: built-in row 1"
    ):
        read_dialects(path, builtin)


async def test_a_running_processor_reads_the_vendor_by_its_dialects_file(
    start_processor: ProcessorFactory, tmp_path: Path
) -> None:
    path = tmp_path / "dialects.yaml"
    path.write_text(DIALECTS_FILE, encoding="utf-8")
    processor = await start_processor(dialects=str(path))
    for record in reversed(spans(5)):
        await export(processor, to_request([record]).SerializeToString())
    samples = await scrape(processor)
    assert series(samples, "otel_guard_cycles_total") == {("planner>budget>planner", "cross_function"): 1}
    assert series(samples, "otel_guard_delegations_total") == {
        ("budget", "planner"): 3,
        ("planner", "budget"): 2,
    }


ROW = "  - dialect: Acme\n    key: acme.kind\n    value: agent\n    kind: agent\n    named_by: [acme.name]\n"
BAD_FILES = {
    "unknown-key": (
        ROW + "    nmaed_by: [x]\n",
        r"line 7, row 1, field nmaed_by: unknown field; did you mean named_by\?",
    ),
    "unknown-top-key": ("rows: []\nrow: []\n", r"line 2: unknown key 'row'; the file has rows only"),
    "wrong-type": (
        ROW.replace("value: agent", "value: 3"),
        r"line 4, row 1, field value: must be text, got the number 3 \(quote it",
    ),
    "wrong-type-list": (
        ROW.replace("named_by: [acme.name]", "named_by: acme.name"),
        r"line 6, row 1, field named_by: must be a list",
    ),
    "wrong-kind": (
        ROW.replace("kind: agent", "kind: agents"),
        r"line 5, row 1, field kind: must be one of agent, tool, none",
    ),
    "empty-name": (
        ROW.replace("named_by: [acme.name]", "named_by: ['']"),
        r"line 6, row 1, field named_by: must not be empty",
    ),
    "empty-dialect": (
        ROW.replace("dialect: Acme", "dialect: ''"),
        r"line 2, row 1, field dialect: must not be empty",
    ),
    "cannot-match": (
        ROW + ROW.replace("acme.kind", "openinference.span.kind").replace("value: agent", "value: AGENT"),
        r"line 9, row 2, field value: can never match: built-in row 7 \(OpenInference: "
        r"openinference.span.kind 'AGENT'\) reads every span it would",
    ),
    "cannot-match-file-row": (ROW + ROW, r"line 9, row 2, field value: can never match: row 1 \(Acme"),
    "cannot-match-span-name": (
        ROW.replace("key: acme.kind", "key: the span name").replace(
            "value: agent", "value: invoke_agent planner"
        ),
        r"row 1, field value: can never match: built-in row 2",
    ),
    "no-names": (
        ROW.replace("    named_by: [acme.name]\n", ""),
        r"row 1, field named_by: a row of kind agent or tool names",
    ),
    "alias": ("rows: &a []\n", r"line 1: anchors and aliases are not accepted"),
    "not-yaml": ("rows: [\n", r"not valid YAML"),
}


def bad(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "dialects.yaml"
    path.write_text("rows:\n" + text if not text.startswith("rows") else text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("text", "error"), BAD_FILES.values(), ids=BAD_FILES)
def test_a_wrong_dialects_file_is_one_clear_error(tmp_path: Path, text: str, error: str) -> None:
    path = bad(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        load_config({"dialects": str(path)})
    assert str(raised.value).startswith(f"dialects (from flag --dialects): {path}, "), raised.value
    assert re.search(error, str(raised.value)), raised.value


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "otel_guard_processor", "--listen", "127.0.0.1:0", "--prometheus", "off"]
    started = time.monotonic()
    result = subprocess.run(
        [*command, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, **(env or {})},
    )
    assert time.monotonic() - started < 15
    return result


@pytest.mark.parametrize("source", ["flag", "config", "environment"])
def test_the_processor_does_not_start_with_a_wrong_file_from_any_source(tmp_path: Path, source: str) -> None:
    path = bad(tmp_path, BAD_FILES["cannot-match"][0])
    if source == "flag":
        result = run("--dialects", str(path))
    elif source == "config":
        config = tmp_path / "processor.yaml"
        config.write_text(yaml.safe_dump({"dialects": str(path)}))
        result = run("--config", str(config))
    else:
        result = run(env={"OTEL_GUARD_PROCESSOR_DIALECTS": str(path)})
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.splitlines()[-1]
    assert last.startswith("otel-guard processor: error: dialects (from "), last
    assert f"{path}, line 9, row 2, field value: can never match" in last
    assert "ready:" not in result.stderr


def test_a_missing_dialects_file_is_a_usage_error(tmp_path: Path) -> None:
    result = run("--dialects", str(tmp_path / "nowhere.yaml"))
    assert result.returncode == 2
    assert "nowhere.yaml: cannot read it: No such file or directory" in result.stderr


def test_a_request_is_checked_with_the_files_keys_as_detection_reads_it(tmp_path: Path) -> None:
    """A string that is not UTF-8 under a key only the file reads: the detector's check refuses it
    as its ingest does (the built-in check, which keeps no such key, takes it)."""
    record = spans(1)[0]
    record["attributes"]["acme.entity"] = "PLACEHOLDER"
    raw = (
        to_request([record])
        .SerializeToString()
        .replace(b"PLACEHOLDER", b"\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8\xf7\xf6\xf5")
    )
    detector = EngineDetector(dialects=rows_of(tmp_path))
    assert check(raw) == 1
    with pytest.raises(DecodeError):
        detector.check(raw)
    with pytest.raises(DecodeError):
        detector.ingest(raw, 0.0)
    assert EngineDetector().check(raw) == 1
