"""``python -m otel_guard_processor``: the same as ``otel-guard processor``."""

from otel_guard_processor.cli import main

raise SystemExit(main())
