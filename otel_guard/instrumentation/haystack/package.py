"""The runtime versions this instrumentor is tested with (pyproject's ``instruments-any`` names them too).

Checked before anything is patched: an installed version outside them is skipped, not half guarded.
"""

from typing import Final

_instruments: Final = ("haystack-ai >= 3.4, < 4",)
