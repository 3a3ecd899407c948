"""Leaves out the runtimes whose tests need an environment of their own, where they are not installed.

google_adk, crewai and strands pin versions of mcp, OpenTelemetry or pydantic that cannot share the
main environment, and smolagents, agent_framework, llama_index, haystack and claude_agent_sdk are
kept apart the same way: scripts/test runs each folder in its ``.venv-runtimes/<extra>``
(``scripts/test tests/instrumentation/crewai`` picks it), and the main run leaves the folders out.

Installed means the distribution is, not that the name imports: with this folder on ``sys.path``,
``import crewai`` finds the test folder ``crewai/`` as a namespace package where CrewAI is absent.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution

OWN_ENVIRONMENT = {
    "google_adk": "google-adk",
    "crewai": "crewai",
    "strands": "strands-agents",
    "smolagents": "smolagents",
    "agent_framework": "agent-framework-core",
    "llama_index": "llama-index-core",
    "haystack": "haystack-ai",
    "claude_agent_sdk": "claude-agent-sdk",
}
"""Test folder -> the distribution of the runtime it tests."""


def _installed(name: str) -> bool:
    try:
        distribution(name)
    except PackageNotFoundError:
        return False
    return True


collect_ignore = [folder for folder, name in OWN_ENVIRONMENT.items() if not _installed(name)]
