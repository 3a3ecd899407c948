"""A refused MCP tool call, as the tool error a model reads.

MCP reports a tool's own failure inside the result (``isError: true``) rather than as a protocol
error, so that the model sees it and carries on. A refusal takes that shape, with
:func:`~otel_guard.instrumentation._base.refusal_text` as its only content block: the reason, the
path, and that calling again will not help. The same facts, for programs rather than models, sit in
the result's ``_meta`` under ``otel-guard/refusal``.
"""

from __future__ import annotations

from typing import Final

from mcp_types import CallToolResult, TextContent

from otel_guard.errors import DelegationRefused
from otel_guard.instrumentation._base import refusal_text

REFUSAL_META_KEY: Final = "otel-guard/refusal"
"""The result ``_meta`` key of a refusal's machine-readable details."""


def refusal_result(err: DelegationRefused) -> CallToolResult:
    """The ``CallToolResult`` (``is_error=True``) that stands for a refused call."""
    details = {
        "code": err.code,
        "reason": err.reason,
        "status": err.status,
        "retryable": err.retryable,
        "agent": err.hop.agent,
    }
    return CallToolResult(
        content=[TextContent(type="text", text=refusal_text(err))],
        is_error=True,
        _meta={REFUSAL_META_KEY: details},
    )
