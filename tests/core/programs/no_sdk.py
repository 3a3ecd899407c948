"""The guard in a fresh interpreter with no OpenTelemetry SDK: no provider set, or the SDK not importable.

Reads ``{"block_sdk": bool}`` on stdin; runs Planner -> Budget -> Planner under the strict rule and
prints what happened as JSON on stdout.
"""

from __future__ import annotations

import importlib.abc
import json
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


class BlockSDK(importlib.abc.MetaPathFinder):
    """Makes ``import opentelemetry.sdk`` fail, as on a machine where it is not installed."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname == "opentelemetry.sdk" or fullname.startswith("opentelemetry.sdk."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def main() -> None:
    options = json.load(sys.stdin)
    if options["block_sdk"]:
        sys.meta_path.insert(0, BlockSDK())

    from opentelemetry import propagate

    import otel_guard

    otel_guard.configure(cycle_rule="agent")
    report: dict[str, object] = {}
    body_runs: list[str] = []
    with otel_guard.delegate("planner", "plan") as planner:
        body_runs.append("planner")
        with otel_guard.delegate("budget", "price") as budget:
            body_runs.append("budget")
            chain = otel_guard.current_chain()
            report["chain"] = list(chain.agents) if chain else None
            report["name_depth"] = otel_guard.name_depth("budget")
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            report["carrier_has_chain"] = "otel_guard.chain=" in carrier.get("baggage", "")
            try:
                with otel_guard.delegate("planner", "itinerary"):
                    body_runs.append("planner again")
            except otel_guard.DelegationRefused as refused:
                report["refused"] = {"reason": refused.reason, "code": refused.code, "message": str(refused)}
    report["recording"] = [planner.span.is_recording(), budget.span.is_recording()]
    report["decisions"] = [planner.decision, budget.decision]
    report["body_runs"] = body_runs
    report["after"] = otel_guard.current_chain() is None
    report["sdk_imported"] = any(name.startswith("opentelemetry.sdk") for name in sys.modules)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
