"""The processor's own metrics pushed over OTLP/gRPC (``--metrics-forward``), beside ``/metrics``.

Nothing is counted twice: each push reads the Prometheus registry that ``/metrics`` serves, in the
detection queue as a scrape does (so it counts every request acknowledged before it), and turns its
metric families into the OpenTelemetry SDK's metric data, which the SDK's OTLP/gRPC metric exporter
sends. The names and labels are those of ``/metrics`` (docs/processor.md, *Metrics*): a counter is
a cumulative monotonic sum named as its Prometheus sample (``otel_guard_cycles_total``), a gauge a
gauge, a histogram a cumulative histogram of the same buckets; a cycle's exemplar keeps its trace id
and span id (as OTLP's own fields) and its ``chain_root`` (an attribute). The resource is
``service.name`` ``otel-guard-processor`` (``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``
are read as the SDK reads them) and a ``service.instance.id`` of its own per process, so the
instances of a fleet stay apart downstream.

What a reader would not guess: the export is the SDK's blocking call (its retries of a retryable
status included, within ``timeout``), so it runs on a thread of its own, never on the event loop;
a push that fails is logged (once a minute at most) and the next push carries the same, cumulative
counts: nothing is lost but the points in between.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Iterable
from typing import Any, Final

from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Sample

from otel_guard_processor.detection import Detection

__all__ = ["MetricsPush", "metrics_data"]

_log = logging.getLogger("otel_guard_processor")

SCOPE: Final = "otel_guard_processor"
SERVICE_NAME: Final = "otel-guard-processor"
MAX_EXPORT_SECONDS: Final = 10.0
"""The longest one push waits for the downstream, its retries included (shorter with a shorter
interval): the drain's push holds the stop up at most this long."""
_FAILURE_LOG_SECONDS: Final = 60.0


class MetricsPush:
    """Pushes ``registry``'s metrics to ``target`` every ``interval`` seconds, and once more at
    :meth:`stop` (after the drain made the last counts)."""

    def __init__(
        self, target: str, interval: float, registry: CollectorRegistry, detection: Detection
    ) -> None:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        self.target = target
        self.interval = interval
        self.timeout = min(MAX_EXPORT_SECONDS, max(interval, 1.0))
        self._registry = registry
        self._detection = detection
        self._exporter = OTLPMetricExporter(endpoint=target, insecure=True, timeout=self.timeout)
        self._resource = _resource()
        self._started_ns = time.time_ns()
        self._task: asyncio.Task[None] | None = None
        self._failed_at: float | None = None
        self.pushes = 0  # pushes the downstream acknowledged

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._every_interval())

    async def push(self) -> bool:
        """Read the metrics now (in the detection queue) and send them; whether the downstream took them."""
        families = await self._detection.run(lambda: list(self._registry.collect()))
        data = metrics_data(families, self._resource, self._started_ns, time.time_ns())
        try:
            result = await asyncio.to_thread(self._exporter.export, data, self.timeout * 1000)
        except Exception as exc:  # the exporter logs and returns FAILURE; anything else is a bug
            self._failed(f"{type(exc).__name__}: {exc}")
            return False
        from opentelemetry.sdk.metrics.export import MetricExportResult

        if result is not MetricExportResult.SUCCESS:
            self._failed("the downstream did not take them")
            return False
        self.pushes += 1
        return True

    async def stop(self) -> None:
        """End the interval's pushes, push once more (the drain's last counts), close the channel."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.push()
        await asyncio.to_thread(self._exporter.shutdown)

    async def _every_interval(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.push()

    def _failed(self, why: str) -> None:
        now = time.monotonic()
        if self._failed_at is None or now - self._failed_at >= _FAILURE_LOG_SECONDS:
            self._failed_at = now
            _log.warning(
                "otel-guard processor: pushing its metrics to %s failed (%s); the next push carries "
                "the same cumulative counts",
                self.target,
                why[:200],
            )


def _resource() -> Any:
    from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, Resource
    from opentelemetry.sdk.resources import SERVICE_NAME as NAME

    resource = Resource.create({SERVICE_INSTANCE_ID: str(uuid.uuid4())})
    if str(resource.attributes.get(NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({NAME: SERVICE_NAME}))
    return resource


def metrics_data(families: Iterable[Any], resource: Any, started_ns: int, now_ns: int) -> Any:
    """The SDK's ``MetricsData`` of Prometheus metric families (see the module docstring)."""
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Histogram,
        Metric,
        MetricsData,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    cumulative = AggregationTemporality.CUMULATIVE
    metrics = []
    for family in families:
        data: Any
        if family.type == "counter":
            name = family.name + "_total"
            points = [_number(sample, started_ns, now_ns) for sample in family.samples if sample.name == name]
            data = Sum(data_points=points, aggregation_temporality=cumulative, is_monotonic=True)
        elif family.type == "gauge":
            name = family.name
            points = [_number(sample, None, now_ns) for sample in family.samples if sample.name == name]
            data = Gauge(data_points=points)
        elif family.type == "histogram":
            name = family.name
            data = Histogram(
                data_points=_histogram_points(family.name, family.samples, started_ns, now_ns),
                aggregation_temporality=cumulative,
            )
        else:
            continue
        if not data.data_points:
            continue  # as /metrics shows no sample of it
        metrics.append(Metric(name=name, description=family.documentation, unit="", data=data))
    scope = ScopeMetrics(scope=InstrumentationScope(SCOPE), metrics=metrics, schema_url="")
    return MetricsData(
        resource_metrics=[ResourceMetrics(resource=resource, scope_metrics=[scope], schema_url="")]
    )


def _value(value: float) -> int | float:
    return int(value) if math.isfinite(value) and float(value).is_integer() else value


def _number(sample: Sample, started_ns: int | None, now_ns: int) -> Any:
    from opentelemetry.sdk.metrics.export import NumberDataPoint

    return NumberDataPoint(
        attributes=dict(sample.labels),
        start_time_unix_nano=started_ns or 0,
        time_unix_nano=now_ns,
        value=_value(sample.value),
        exemplars=_exemplars(sample),
    )


def _exemplars(sample: Sample) -> list[Any]:
    exemplar = sample.exemplar
    if exemplar is None:
        return []
    from opentelemetry.sdk.metrics import Exemplar

    labels = dict(exemplar.labels)
    trace_id, span_id = labels.pop("trace_id", None), labels.pop("span_id", None)
    when = exemplar.timestamp
    return [
        Exemplar(
            filtered_attributes=labels,
            value=_value(exemplar.value),
            time_unix_nano=int(float(when) * 1e9) if when is not None else 0,
            span_id=int(span_id, 16) if span_id else None,
            trace_id=int(trace_id, 16) if trace_id else None,
        )
    ]


def _histogram_points(name: str, samples: list[Sample], started_ns: int, now_ns: int) -> list[Any]:
    """One point per label set, from the family's cumulative ``_bucket`` samples and its ``_sum``."""
    from opentelemetry.sdk.metrics.export import HistogramDataPoint

    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for sample in samples:
        labels = {key: value for key, value in sample.labels.items() if key != "le"}
        entry = series.setdefault(
            tuple(sorted(labels.items())), {"labels": labels, "buckets": [], "sum": 0.0}
        )
        if sample.name == name + "_bucket":
            entry["buckets"].append((float(sample.labels["le"]), int(sample.value)))
        elif sample.name == name + "_sum":
            entry["sum"] = sample.value
    points = []
    for entry in series.values():
        buckets = sorted(entry["buckets"])
        bounds = [bound for bound, _ in buckets if math.isfinite(bound)]
        cumulative = [count for _, count in buckets]
        counts = [count - before for count, before in zip(cumulative, [0, *cumulative[:-1]], strict=True)]
        points.append(
            HistogramDataPoint(
                attributes=entry["labels"],
                start_time_unix_nano=started_ns,
                time_unix_nano=now_ns,
                count=cumulative[-1] if cumulative else 0,
                sum=_value(entry["sum"]),
                bucket_counts=counts,
                explicit_bounds=bounds,
                # Unset in OTLP (optional fields): the tallies keep buckets, not the extremes.
                min=None,  # type: ignore[arg-type]
                max=None,  # type: ignore[arg-type]
            )
        )
    return points
