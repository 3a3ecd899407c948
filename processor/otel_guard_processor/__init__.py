"""otel-guard processor: find agent delegation cycles in OpenTelemetry traces.

The inline guard (``otel_guard``) stops loops whose chain it carries. Loops it cannot see -- agents
that drop the chain, runtimes instrumented by other GenAI instrumentations, work handed over through
queues into new traces -- are visible only in the telemetry. The processor reads every trace that
passes through the OpenTelemetry pipeline and counts the cycles it finds, as Prometheus metrics.

Run it::

    pip install 'otel-guard[processor]'
    otel-guard processor --listen 127.0.0.1:4317 --forward tempo:4317 --prometheus 127.0.0.1:4390

- Receivers: OTLP/gRPC (``--listen``; HTTP/2 in the compiled engine, on a thread of its own:
  :mod:`otel_guard_processor.grpc_receiver`) and OTLP/HTTP ``/v1/traces`` (``--http-listen``,
  protobuf or JSON). A malformed request is answered INVALID_ARGUMENT (HTTP 400) and changes nothing. Metrics
  and logs (``/v1/metrics``, ``/v1/logs`` and their gRPC services) are taken unread: forwarded as
  they came, or answered OK without ``--forward`` (:mod:`otel_guard_processor.signals`).
- Detection (the compiled engine, :mod:`otel_guard_processor.engine`): a call span
  (``invoke_agent X`` / ``execute_tool X``, or a call in another dialect) whose name is already on
  its own path of named ancestors is a cycle: ``direct`` (A -> A), ``cross_function``
  (A -> B -> A) or ``cross_trace`` (through a span link or an ``otel_guard.chain.root`` shared
  across traces). Incremental, in any arrival order, bounded; one call into the engine a request.
  It runs behind the answers (:mod:`otel_guard_processor.detection`): no client waits for
  another's detection; past ``--max-pending-bytes`` waiting, a request gets a retryable
  RESOURCE_EXHAUSTED (HTTP 429).
- Forwarding (``--forward``): each request goes downstream byte for byte and is acknowledged only
  after the downstream did; a downstream that is down or slow gets the client a retryable
  UNAVAILABLE / RESOURCE_EXHAUSTED (HTTP 503 / 429). Without it the processor is a sink for a
  fan-out pipeline. SIGTERM drains requests in flight.
- Metrics (``--prometheus``, ``/metrics``): ``otel_guard_cycles_total{kind,cycle}``,
  ``otel_guard_delegations_total{caller,callee}``,
  ``otel_guard_span_decisions_total{decision,reason,agent}``,
  ``otel_guard_processor_spans_total{outcome}`` and the processor's health metrics
  (:mod:`otel_guard_processor.metrics`).
- Configuration (:mod:`otel_guard_processor.config`): flags, a YAML file, ``OTEL_GUARD_PROCESSOR_*``.

Programmatic use: ``Processor(ProcessorConfig(...))``, ``await processor.start()``,
``await processor.stop()``; ``EngineDetector`` alone reads requests' bytes and needs no network.
"""

from otel_guard_processor.bounds import DetectorLimits
from otel_guard_processor.cli import main
from otel_guard_processor.config import ConfigError, ProcessorConfig, load_config
from otel_guard_processor.engine import EngineDetector
from otel_guard_processor.otlp import MalformedRequest, json_to_protobuf
from otel_guard_processor.service import Processor

__all__ = [
    "ConfigError",
    "DetectorLimits",
    "EngineDetector",
    "MalformedRequest",
    "Processor",
    "ProcessorConfig",
    "json_to_protobuf",
    "load_config",
    "main",
]
