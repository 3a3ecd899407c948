"""The runtime versions this instrumentor is tested with (pyproject's ``instruments-any`` names them too).

Checked before anything is patched: an installed version outside them is skipped, not half guarded.
"""

from typing import Final

_instruments: Final = ("langgraph >= 1.2, < 2", "langchain-core >= 1.8, < 2")

_instruments_agents: Final = ("langchain >= 1.5, < 2",)
"""LangChain's agents (``create_agent``), optional: outside these, they get no guidance middleware."""
