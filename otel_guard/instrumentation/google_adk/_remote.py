"""Remote ADK agents (``RemoteA2aAgent``): their A2A send is the hop, not their ADK run.

A ``RemoteA2aAgent`` stands in for an agent in another process: running it sends an A2A message
through the a2a-sdk client. When otel-guard's A2A instrumentation is on, that send is already a hop
``invoke_agent {agent card name}`` (kind CLIENT) that carries the chain to the server in the request's
headers, and the server checks it again. Another hop of ours for the same call (the remote agent's run,
or the ``AgentTool`` / transfer that leads to it) would put the agent in the chain twice for one call,
a false cycle. So with the A2A instrumentation on, a remote agent's run and the calls into it make no
hop here; with it off, they are hops like any agent's (the chain then stays in this process).
"""

from __future__ import annotations

import sys
from typing import Final

from otel_guard.instrumentation.a2a import A2AInstrumentor  # imports without a2a-sdk

_REMOTE_AGENT_MODULE: Final = "google.adk.a2a.agent._remote_a2a_agent"


def hopped_by_a2a(agent: object) -> bool:
    """Whether ``agent`` is a ``RemoteA2aAgent`` whose A2A send otel-guard's A2A instrumentation guards."""
    # ADK's module is looked up, not imported: it imports a2a-sdk, which may be absent, and an agent
    # can be a RemoteA2aAgent only once the module is loaded.
    remote = sys.modules.get(_REMOTE_AGENT_MODULE)
    if remote is None or not isinstance(agent, remote.RemoteA2aAgent):
        return False
    return bool(A2AInstrumentor().is_instrumented_by_opentelemetry)
