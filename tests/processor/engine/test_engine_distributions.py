"""The two distributions, built as a release builds them and installed into a clean environment.

``otel-guard`` (hatchling, pure Python) builds with no Rust toolchain on PATH and ships no
processor; ``otel-guard-processor`` (maturin) builds its sdist, then its abi3 wheel from that
sdist, so a file missing from the sdist fails here. Both wheels install into a new venv, where
``otel-guard processor`` runs and the engine decodes. From a checkout, one pip command installs
both without asking an index for ``otel-guard-processor``. The builds reuse cargo's build directory
(``CARGO_TARGET_DIR`` where set, as CI sets it; else processor/target), so only the crate itself
compiles again.
"""

from __future__ import annotations

import email
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[3]
PROCESSOR = ROOT / "processor"


def clean_environ() -> dict[str, str]:
    """This process's environment without ``PYTHONPATH``: a clean venv imports what it installed."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def run(command: list[str | Path], **kwargs: object) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("env", clean_environ())
    completed = subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, timeout=600, check=False, **kwargs
    )  # type: ignore[call-overload]
    assert completed.returncode == 0, f"{command}:\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
    return completed  # type: ignore[no-any-return]


def without_rust() -> dict[str, str]:
    """The environment with no cargo or rustc to be found."""
    path = [
        entry
        for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry and not (Path(entry, "cargo").exists() or Path(entry, "rustc").exists())
    ]
    env = {
        **clean_environ(),
        "PATH": os.pathsep.join(path),
        "CARGO_HOME": "/nonexistent",
        "RUSTUP_HOME": "/nonexistent",
    }
    assert shutil.which("cargo", path=env["PATH"]) is None
    return env


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    cargo_cache = {
        **clean_environ(),
        "CARGO_TARGET_DIR": os.environ.get("CARGO_TARGET_DIR", str(PROCESSOR / "target")),
    }
    run([sys.executable, "-m", "build", "--outdir", out, PROCESSOR], env=cargo_cache)
    run([sys.executable, "-m", "build", "--outdir", out, ROOT], env=without_rust())
    return out


def one(dist: Path, pattern: str) -> Path:
    (found,) = dist.glob(pattern)
    return found


def test_the_agent_side_builds_without_rust_and_ships_no_processor(dist: Path) -> None:
    wheel = one(dist, "otel_guard-0.1.0-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read("otel_guard-0.1.0.dist-info/METADATA").decode()
    assert "otel_guard/cli.py" in names
    assert not [name for name in names if name.startswith("otel_guard_processor")]
    listing = run(["tar", "tzf", one(dist, "otel_guard-0.1.0.tar.gz")]).stdout.split()
    assert not [name for name in listing if name.startswith("otel_guard-0.1.0/processor/")]
    requires = email.message_from_string(metadata).get_all("Requires-Dist") or []
    assert "otel-guard-processor<0.2,>=0.1; extra == 'processor'" in requires
    assert not [line for line in requires if line.startswith("grpcio")]  # the processor's own


def test_the_processor_is_one_abi3_wheel_with_its_engine_built_from_its_sdist(dist: Path) -> None:
    sdist = one(dist, "otel_guard_processor-0.1.0.tar.gz")
    listing = run(["tar", "tzf", sdist]).stdout.split()
    top = "otel_guard_processor-0.1.0/"
    for needed in (
        "Cargo.toml",
        "Cargo.lock",
        "src/lib.rs",
        "src/decode.rs",
        "src/binding.rs",
        "pyproject.toml",
    ):
        assert top + needed in listing
    assert not [name for name in listing if name.startswith(top + "collector/")]

    wheel = one(dist, "otel_guard_processor-0.1.0-cp311-abi3-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    package = sorted(path.name for path in (PROCESSOR / "otel_guard_processor").glob("*.py*"))
    assert {f"otel_guard_processor/{name}" for name in package} <= names
    assert {"otel_guard_processor/_engine.abi3.so", "otel_guard_processor/py.typed"} <= names


def test_both_wheels_install_into_a_clean_environment_and_run(dist: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv])
    python = venv / "bin" / "python"
    agent = one(dist, "otel_guard-0.1.0-py3-none-any.whl")
    processor = one(dist, "otel_guard_processor-0.1.0-cp311-abi3-*.whl")
    run([python, "-m", "pip", "install", "--quiet", f"{agent}[processor]", processor], env=without_rust())
    run([python, "-m", "pip", "check"])
    helped = run([venv / "bin" / "otel-guard", "processor", "--help"])
    assert helped.stdout.startswith("usage: otel-guard processor")
    program = (
        "from otel_guard_processor import engine\n"
        "print(engine.__file__)\n"
        "print(engine.decode_counts(b'\\x0a\\x04\\x12\\x02\\x12\\x00', []))\n"
    )
    decoded = run([python, "-c", program], cwd=tmp_path).stdout.splitlines()
    assert decoded[0].startswith(str(venv))  # the installed package, not this checkout's
    assert decoded[1] == "(1, 0, 0)"


def test_one_pip_command_installs_both_from_a_checkout_without_asking_an_index(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv])
    report = tmp_path / "report.json"
    log = run(
        [venv / "bin" / "python", "-m", "pip", "install", "--dry-run", "-vv", "--report", report,
         "./processor", ".[processor]"],
        cwd=ROOT,
    ).stdout  # fmt: skip
    chosen = {
        item["metadata"]["name"]: item["download_info"]["url"]
        for item in json.loads(report.read_text())["install"]
    }
    assert chosen["otel-guard-processor"] == PROCESSOR.as_uri()
    assert chosen["otel-guard"] == ROOT.as_uri()
    assert "/simple/otel-guard-processor" not in log
    assert "/simple/grpcio" in log  # the log is the one that shows index pages


def test_otel_guard_processor_without_the_processor_says_what_to_install() -> None:
    program = (
        "import sys\n"
        "sys.modules['otel_guard_processor'] = None\n"
        "from otel_guard.cli import main\n"
        "sys.exit(main(['processor', '--help']))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == 1
    assert "pip install 'otel-guard[processor]'" in completed.stderr
    assert "from a checkout: pip install ./processor '.[processor]'" in completed.stderr
    assert "Rust toolchain" in completed.stderr
