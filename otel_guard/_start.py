"""Where the guard starts (an instrumentor, the ASGI middleware): settings checked, the store asked.

Apart from :mod:`otel_guard.settings` because asking the budget store needs the stores, which need the
settings: this module stands above both.
"""

from __future__ import annotations

from otel_guard.budget import probe_store
from otel_guard.settings import Settings, checked_settings, report_unknown_variables


def settings_at_start() -> Settings:
    """The settings in force, checked (:func:`~otel_guard.settings.checked_settings`: a bad value ends
    the program in one line), an ``OTEL_GUARD_*`` variable that names no setting said once, and a
    budget store that cannot be reached said once, each as a warning."""
    report_unknown_variables()
    settings = checked_settings()
    probe_store(settings)
    return settings
