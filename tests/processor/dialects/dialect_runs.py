"""Running the recorder (``record_app.py``) in the dialects environment, exporting to a processor.

The third-party instrumentations live in their own environment, ``.venv-dialects`` (made by
``scripts/bootstrap``), because ``opentelemetry-instrument`` loads every instrumentor it finds: in
the main environment they would wrap the runtimes under every other test as well.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
DIALECTS_PYTHON = ROOT / ".venv-dialects" / "bin" / "python"
RECORDER = Path(__file__).with_name("record_app.py")
RUN_TIMEOUT = 60.0


def dialects_python() -> str:
    """The dialects environment's interpreter; its absence is a failure, never a skip."""
    if not DIALECTS_PYTHON.exists():
        raise AssertionError(
            f"{DIALECTS_PYTHON} is missing: scripts/bootstrap makes it (scripts/test runs bootstrap)"
        )
    return str(DIALECTS_PYTHON)


async def record(endpoint: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``record_app.py *args`` exporting to ``endpoint`` (host:port); its RESULT line, parsed.

    Runs as an asyncio subprocess so that a processor served by the same event loop keeps serving.
    """
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "OPENAI_"))
    }
    environment.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{endpoint}",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="",
        PYTHONPATH="",
        **(env or {}),
    )
    process = await asyncio.create_subprocess_exec(
        dialects_python(),
        str(RECORDER),
        *args,
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), RUN_TIMEOUT)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = out.decode()
    assert process.returncode == 0, f"recorder {args} failed:\n{text}\n{err.decode()}"
    lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
    assert lines, f"recorder {args} printed no RESULT:\n{text}\n{err.decode()}"
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result
