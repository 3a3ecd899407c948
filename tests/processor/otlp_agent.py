"""An agent process exporting all three OTLP signals, as ``OTEL_EXPORTER_OTLP_ENDPOINT`` says.

``python otlp_agent.py grpc`` (or ``http``) sets up the OpenTelemetry SDK with the OTLP exporters
of traces, metrics and logs, records a span with a log line inside it and two metrics, shuts the
providers down (which exports everything), and prints one JSON object: for each signal, the bytes
of every export request it sent (hex) and the answer it got (a gRPC status name, an HTTP status).

The bytes are taken where the exporters hand them to the wire: for OTLP/gRPC, a client interceptor
on the exporters' channel (the request message as the stub's serializer encodes it); for OTLP/HTTP,
the ``requests`` session the exporters are given.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import Any

import grpc
import requests
from opentelemetry import trace
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

SIGNAL_OF = {"TraceService": "traces", "MetricsService": "metrics", "LogsService": "logs"}
sent: dict[str, list[str]] = {"traces": [], "metrics": [], "logs": []}
answers: dict[str, list[str]] = {"traces": [], "metrics": [], "logs": []}


class _Recorder(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def intercept_unary_unary(
        self, continuation: Callable[[Any, Any], Any], details: Any, request: Any
    ) -> Any:
        signal = next(s for name, s in SIGNAL_OF.items() if name in details.method)
        sent[signal].append(request.SerializeToString().hex())
        outcome = continuation(details, request)
        answers[signal].append(outcome.code().name)
        return outcome


class _RecordingSession(requests.Session):
    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        signal = str(url).rsplit("/v1/", 1)[1]
        sent[signal].append(bytes(kwargs["data"]).hex())
        response = super().request(method, url, *args, **kwargs)
        answers[signal].append(str(response.status_code))
        return response


def exporters(protocol: str) -> tuple[Any, Any, Any]:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc import exporter as grpc_exporter
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        plain = grpc_exporter.insecure_channel
        grpc_exporter.insecure_channel = lambda target, **options: grpc.intercept_channel(  # type: ignore[assignment]
            plain(target, **options), _Recorder()
        )
        return OTLPSpanExporter(), OTLPMetricExporter(), OTLPLogExporter()
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogs
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans

    session = _RecordingSession()
    return HttpSpans(session=session), HttpMetrics(session=session), HttpLogs(session=session)


def main(protocol: str) -> None:
    span_exporter, metric_exporter, log_exporter = exporters(protocol)
    resource = Resource.create({"service.name": "travel-agents"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    reader = PeriodicExportingMetricReader(metric_exporter, export_interval_millis=3_600_000)
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
    log = logging.getLogger("travel-agents")
    log.propagate = False
    log.addHandler(LoggingHandler(logger_provider=logger_provider))
    log.setLevel(logging.INFO)

    meter = meter_provider.get_meter("travel-agents")
    hops = meter.create_counter("agent.hops")
    latency = meter.create_histogram("agent.latency", unit="s")
    tracer = tracer_provider.get_tracer("travel-agents")
    with (
        tracer.start_as_current_span("invoke_agent planner"),
        tracer.start_as_current_span("invoke_agent budget"),
    ):
        log.info("budget asked for a three-day trip")  # carries the span's trace and span ids
        hops.add(2, {"gen_ai.agent.name": "budget"})
        latency.record(0.25)
    assert trace.get_current_span() is trace.INVALID_SPAN
    tracer_provider.shutdown()
    meter_provider.shutdown()
    logger_provider.shutdown()
    print(json.dumps({"sent": sent, "answers": answers}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
