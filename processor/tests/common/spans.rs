//! OTLP trace requests for the engine's tests, built with OpenTelemetry's own prost types.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue,
};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span};
use prost::Message as _;

pub const GUARD: &str = "otel_guard";
pub const SERVER: i32 = 2;
pub const CLIENT: i32 = 3;

pub fn trace_id(trace: u64) -> Vec<u8> {
    let mut id = vec![0; 8];
    id.extend(trace.to_be_bytes());
    id
}

pub fn span_id(span: u64) -> Vec<u8> {
    span.to_be_bytes().to_vec()
}

pub fn text(text: &str) -> AnyValue {
    AnyValue {
        value: Some(V::StringValue(text.into())),
    }
}

pub fn int(number: i64) -> AnyValue {
    AnyValue {
        value: Some(V::IntValue(number)),
    }
}

pub fn texts(items: &[&str]) -> AnyValue {
    AnyValue {
        value: Some(V::ArrayValue(ArrayValue {
            values: items.iter().map(|item| text(item)).collect(),
        })),
    }
}

/// A span of trace `trace`, id `id`, below `parent` (None: a trace root), started at `start`.
pub fn span(trace: u64, id: u64, parent: Option<u64>, name: &str, start: u64) -> Span {
    Span {
        trace_id: trace_id(trace),
        span_id: span_id(id),
        parent_span_id: parent.map(span_id).unwrap_or_default(),
        name: name.into(),
        kind: 1,
        start_time_unix_nano: start,
        end_time_unix_nano: start + 1,
        ..Default::default()
    }
}

pub fn with(mut span: Span, key: &str, value: AnyValue) -> Span {
    span.attributes.push(KeyValue {
        key: key.into(),
        value: Some(value),
        ..Default::default()
    });
    span
}

pub fn kind(mut span: Span, kind: i32) -> Span {
    span.kind = kind;
    span
}

pub fn linked(mut span: Span, trace: u64, id: u64) -> Span {
    span.links.push(span::Link {
        trace_id: trace_id(trace),
        span_id: span_id(id),
        ..Default::default()
    });
    span
}

/// The inline guard's attributes on a hop span whose chain (the hop's name last) is `chain`.
pub fn guarded(mut span: Span, chain: &[&str], decision: &str) -> Span {
    let name = chain.last().copied().unwrap_or("");
    let depth = chain.iter().filter(|hop| **hop == name).count();
    for (key, value) in [
        ("otel_guard.chain.agents", texts(chain)),
        ("otel_guard.chain.depth", int(chain.len() as i64)),
        ("otel_guard.name_depth", int(depth as i64)),
        ("otel_guard.decision", text(decision)),
    ] {
        span = with(span, key, value);
    }
    span
}

/// One request: a ScopeSpans per (scope, spans), in order.
pub fn encode(scopes: &[(&str, Vec<Span>)]) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: None,
            scope_spans: scopes
                .iter()
                .map(|(scope, spans)| ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: (*scope).into(),
                        ..Default::default()
                    }),
                    spans: spans.clone(),
                    schema_url: String::new(),
                })
                .collect(),
            schema_url: String::new(),
        }],
    }
    .encode_to_vec()
}
