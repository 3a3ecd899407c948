"""The Collector tests build spans and sinks with the processor tests' helpers, and replay their corpus."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "processor"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "processor" / "dialects"))
