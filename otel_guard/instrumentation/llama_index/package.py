"""The runtime versions this instrumentor is tested with (pyproject's ``instruments-any`` names them too).

Checked before anything is patched: an installed version outside them is skipped, not half guarded.
"""

from typing import Final

_instruments: Final = ("llama-index-core >= 0.14.25, < 0.15",)
