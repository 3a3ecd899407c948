"""The runtime versions this instrumentor is tested with (pyproject's ``instruments-any`` names them too).

Checked before anything is patched: an installed version outside them is skipped, not half guarded.
"""

from typing import Final

_instruments: Final = ("agent-framework-core >= 1.23, < 2",)

_handoff_instruments: Final = ("agent-framework-orchestrations >= 1.4, < 2",)
"""Where handoff workflows come from: guarded at these versions; another (or none) is left alone."""
