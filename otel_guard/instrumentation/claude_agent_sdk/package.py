"""The runtime versions this instrumentor is tested with (pyproject's ``instruments-any`` names them too).

Checked before anything is patched: an installed version outside them is skipped, not half guarded.
"""

from typing import Final

_instruments: Final = ("claude-agent-sdk >= 0.2.184, < 0.3",)
