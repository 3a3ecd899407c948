//! The decoder against OpenTelemetry's own generated types (prost): random requests, encoded by
//! prost, then with their fields reordered and split as other encoders may write them, decode to
//! what the request holds; random and mutated bytes are an answer, never a panic.

mod common;

use common::mutations::*;
use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span};
use otel_guard_engine::decode::{Keys, decode};
use proptest::collection::vec;
use proptest::prelude::*;
use prost::Message as _;

const WANTED: [&str; 5] = [
    "gen_ai.agent.name",
    "gen_ai.operation.name",
    "otel_guard.chain.agents",
    "k",
    "",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![3 => "[a-z_. ]{0,12}", 1 => any::<String>()]
}

fn key() -> impl Strategy<Value = String> {
    let known = prop::sample::select(vec![
        "gen_ai.agent.name",
        "gen_ai.operation.name",
        "otel_guard.chain.agents",
        "k",
        "",
        "prompt",
        "gen_ai.agent.nam",
        "gen_ai.agent.namf",
    ]);
    prop_oneof![3 => known.prop_map(String::from), 1 => text()]
}

fn any_value() -> impl Strategy<Value = AnyValue> {
    let leaf = prop_oneof![
        4 => text().prop_map(V::StringValue),
        1 => any::<bool>().prop_map(V::BoolValue),
        1 => any::<i64>().prop_map(V::IntValue),
        1 => any::<f64>().prop_map(V::DoubleValue),
        1 => vec(any::<u8>(), 0..6).prop_map(V::BytesValue),
        1 => any::<i32>().prop_map(V::StringValueStrindex),
    ];
    let leaf = prop_oneof![
        8 => leaf.prop_map(|value| AnyValue { value: Some(value) }),
        1 => Just(AnyValue { value: None }),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            3 => vec(inner.clone(), 0..4)
                .prop_map(|values| AnyValue { value: Some(V::ArrayValue(ArrayValue { values })) }),
            1 => vec((key(), inner), 0..3).prop_map(|pairs| AnyValue {
                value: Some(V::KvlistValue(KeyValueList {
                    values: pairs
                        .into_iter()
                        .map(|(key, value)| KeyValue { key, value: Some(value), ..Default::default() })
                        .collect(),
                })),
            }),
        ]
    })
}

fn key_value() -> impl Strategy<Value = KeyValue> {
    (key(), prop::option::weighted(0.95, any_value())).prop_map(|(key, value)| KeyValue {
        key,
        value,
        ..Default::default()
    })
}

fn id(length: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![4 => vec(any::<u8>(), length), 1 => vec(any::<u8>(), 0..=length + 1)]
}

fn link() -> impl Strategy<Value = span::Link> {
    (id(16), id(8), vec(key_value(), 0..2), any::<u32>()).prop_map(
        |(trace_id, span_id, attributes, flags)| span::Link {
            trace_id,
            span_id,
            attributes,
            flags,
            ..Default::default()
        },
    )
}

fn a_span() -> impl Strategy<Value = Span> {
    (
        (
            id(16),
            id(8),
            id(8),
            text(),
            prop_oneof![4 => 0..6i32, 1 => any::<i32>()],
        ),
        (any::<u64>(), any::<u64>(), text(), any::<u32>()),
        vec(key_value(), 0..6),
        vec((text(), vec(key_value(), 0..2)), 0..2),
        vec(link(), 0..3),
        prop::option::of((text(), 0..3i32)),
    )
        .prop_map(
            |(
                (trace_id, span_id, parent_span_id, name, kind),
                (start, end, state, flags),
                attributes,
                events,
                links,
                status,
            )| Span {
                trace_id,
                span_id,
                parent_span_id,
                name,
                kind,
                start_time_unix_nano: start,
                end_time_unix_nano: end,
                trace_state: state,
                flags,
                attributes,
                events: events
                    .into_iter()
                    .map(|(name, attributes)| span::Event {
                        name,
                        attributes,
                        ..Default::default()
                    })
                    .collect(),
                links,
                status: status.map(|(message, code)| Status { message, code }),
                ..Default::default()
            },
        )
}

fn a_request() -> impl Strategy<Value = ExportTraceServiceRequest> {
    let scope =
        prop::option::weighted(0.9, (text(), text(), vec(key_value(), 0..2))).prop_map(|scope| {
            scope.map(|(name, version, attributes)| InstrumentationScope {
                name,
                version,
                attributes,
                ..Default::default()
            })
        });
    let scope_spans =
        (scope, vec(a_span(), 0..4), text()).prop_map(|(scope, spans, schema_url)| ScopeSpans {
            scope,
            spans,
            schema_url,
        });
    let resource = prop::option::of(vec(key_value(), 0..3)).prop_map(|attributes| {
        attributes.map(|attributes| Resource {
            attributes,
            ..Default::default()
        })
    });
    let resource_spans =
        (resource, vec(scope_spans, 0..3)).prop_map(|(resource, scope_spans)| ResourceSpans {
            resource,
            scope_spans,
            ..Default::default()
        });
    vec(resource_spans, 0..3)
        .prop_map(|resource_spans| ExportTraceServiceRequest { resource_spans })
}

/// What the decoder must answer for `request`, from the generated types.
fn expected(request: &ExportTraceServiceRequest) -> OwnedRequest {
    let mut scopes = Vec::new();
    let mut spans = Vec::new();
    for (resource, resource_spans) in request.resource_spans.iter().enumerate() {
        for scope_spans in &resource_spans.scope_spans {
            let scope = scope_spans.scope.clone().unwrap_or_default();
            let index = scopes.len() as u32;
            scopes.push((resource as u32, scope.name, scope.version));
            for span in &scope_spans.spans {
                spans.push(OwnedSpan {
                    trace_id: span.trace_id.clone(),
                    span_id: span.span_id.clone(),
                    parent_span_id: span.parent_span_id.clone(),
                    name: span.name.clone(),
                    kind: span.kind,
                    start_time_unix_nano: span.start_time_unix_nano,
                    scope: index,
                    links: span
                        .links
                        .iter()
                        .map(|l| (l.trace_id.clone(), l.span_id.clone()))
                        .collect(),
                    attributes: span
                        .attributes
                        .iter()
                        .filter(|kv| WANTED.contains(&kv.key.as_str()))
                        .map(|kv| (kv.key.clone(), owned_value(kv.value.as_ref())))
                        .collect(),
                });
            }
        }
    }
    (scopes, spans)
}

fn owned_value(value: Option<&AnyValue>) -> Owned {
    match value.and_then(|value| value.value.as_ref()) {
        Some(V::StringValue(text)) => Owned::Str(text.clone()),
        Some(V::BoolValue(flag)) => Owned::Bool(*flag),
        Some(V::IntValue(number)) => Owned::Int(*number),
        Some(V::ArrayValue(array)) => Owned::Array(
            array
                .values
                .iter()
                .map(|item| match &item.value {
                    Some(V::StringValue(text)) => Some(text.clone()),
                    _ => None,
                })
                .collect(),
        ),
        _ => Owned::Other,
    }
}

fn decoded(bytes: &[u8]) -> Result<OwnedRequest, String> {
    let keys = Keys::new(WANTED).unwrap();
    decode(bytes, &keys)
        .map(|request| owned(&request, &keys))
        .map_err(|error| error.to_string())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_field_order_decodes_to_what_the_request_holds(request in a_request(), seed in any::<u64>()) {
        let encoded = request.encode_to_vec();
        let want = expected(&request);
        prop_assert_eq!(decoded(&encoded), Ok(want.clone()));
        let reordered = reorder(&encoded, Message::Request, &mut Rng(seed));
        prop_assert_eq!(decoded(&reordered), Ok(want));
    }

    #[test]
    fn mutated_requests_are_an_answer_and_agree_with_prost_where_it_decodes(
        request in a_request(),
        seed in any::<u64>(),
        mutations in vec(mutation(), 1..4),
    ) {
        let encoded = reorder(&request.encode_to_vec(), Message::Request, &mut Rng(seed));
        let mutated = mutate(encoded, &mutations);
        let answer = decoded(&mutated); // a panic fails the test
        if let Ok(parsed) = ExportTraceServiceRequest::decode(mutated.as_slice()) {
            prop_assert_eq!(answer, Ok(expected(&parsed)));
        }
    }

    #[test]
    fn random_bytes_are_an_answer(bytes in vec(any::<u8>(), 0..600)) {
        let _ = decoded(&bytes);
    }
}
