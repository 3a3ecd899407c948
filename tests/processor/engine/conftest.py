"""The recorded corpus's readers (``tests/processor/dialects``) importable here, as for the reference."""

import sys
from pathlib import Path

_DIALECTS = str(Path(__file__).resolve().parent.parent / "dialects")
if _DIALECTS not in sys.path:
    sys.path.insert(0, _DIALECTS)
