"""The Collector configurations otel-guard ships (processor/collector/*.yaml), loaded by a real Collector.

The Collector is built as distributions are made, by the Collector Builder (ocb) from the manifest
``processor/collector/ocb/manifest.yaml`` at one pinned release (``scripts/build-collector``, which
``scripts/bootstrap`` runs): the OTLP receiver and exporter, the batch, memory_limiter and filter
processors, the debug and loadbalancing exporters. A config the Collector
refuses to load would meet the first user who deploys it; ``otelcol validate`` is the Collector's own
check of every component's settings.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR = ROOT / ".collector" / "otelcol-otel-guard"
CONFIGS = sorted((ROOT / "processor" / "collector").glob("*.yaml"))


def collector() -> str:
    """The built Collector; its absence is a failure that says how to build it, never a skip."""
    if not COLLECTOR.exists():
        raise AssertionError(
            f"{COLLECTOR} is missing: scripts/build-collector builds it (it needs Go; scripts/test runs it)"
        )
    return str(COLLECTOR)


def test_every_shipped_config_is_there() -> None:
    assert {path.stem for path in CONFIGS} == {"inline", "fanout", "scaleout", "scaleout-by-chain"}


def test_the_collector_has_the_components_the_configs_use() -> None:
    result = subprocess.run(
        [collector(), "components"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    # Newer releases spell some types anew (load_balancing, otlp_grpc) and still load the names the
    # configs use, which older releases know too.
    components = [
        ("otlp",),
        ("batch",),
        ("memory_limiter",),
        ("filter",),
        ("debug",),
        ("load_balancing", "loadbalancing"),
        ("otlp_grpc", "otlp"),
    ]
    for spellings in components:
        assert any(f"name: {name}\n" in result.stdout for name in spellings), spellings


@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.stem)
def test_the_collector_loads_the_shipped_config(config: Path) -> None:
    result = subprocess.run(
        [collector(), "validate", f"--config={config}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"{config.name}:\n{result.stdout}\n{result.stderr}"
