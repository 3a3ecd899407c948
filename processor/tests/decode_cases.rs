//! The decoder on requests written by hand: each rule of protobuf it follows, and each way a
//! request can be malformed.

mod common;

use common::*;
use otel_guard_engine::decode::{Keys, decode};

fn keys() -> Keys {
    Keys::new(["gen_ai.agent.name", "n", "b", "a", "d"]).unwrap()
}

fn spans_of(bytes: &[u8]) -> Vec<OwnedSpan> {
    let keys = keys();
    owned(&decode(bytes, &keys).unwrap(), &keys).1
}

fn one_span(span: &[u8]) -> OwnedSpan {
    let mut spans = spans_of(&request(b"", &[span.to_vec()]));
    assert_eq!(spans.len(), 1);
    spans.remove(0)
}

fn error_of(bytes: &[u8]) -> String {
    match decode(bytes, &keys()) {
        Ok(_) => panic!("{bytes:?} decoded"),
        Err(error) => error.to_string(),
    }
}

fn attributes(span: &[u8]) -> Vec<(String, Owned)> {
    one_span(span).attributes
}

#[test]
fn an_empty_request_has_no_spans() {
    let keys = keys();
    let decoded = decode(b"", &keys).unwrap();
    assert!(decoded.spans.is_empty() && decoded.scopes.is_empty());
}

#[test]
fn every_field_of_a_span_is_read() {
    let link = cat(&[&len(1, &[7; 16]), &len(2, &[8; 8]), &len(3, b"state")]);
    let span = cat(&[
        &len(1, &[1; 16]),
        &len(2, &[2; 8]),
        &len(3, b"trace-state"),
        &len(4, &[3; 8]),
        &len(5, "invoke_agent planner é".as_bytes()),
        &int(6, 2),
        &fixed64(7, 1_700_000_000_000_000_000),
        &fixed64(8, 1_700_000_000_100_000_000),
        &len(9, &key_value("gen_ai.agent.name", &string_value("planner"))),
        &len(11, &len(2, b"an event")),
        &len(13, &link),
        &len(15, &len(2, b"status")),
    ]);
    let scope = cat(&[&len(1, b"otel_guard"), &len(2, b"0.1.0")]);
    let keys = keys();
    let bytes = request(&scope, &[span]);
    let decoded = decode(&bytes, &keys).unwrap();
    let (scopes, spans) = owned(&decoded, &keys);
    assert_eq!(
        scopes,
        vec![(0, "otel_guard".to_owned(), "0.1.0".to_owned())]
    );
    assert_eq!(
        spans,
        vec![OwnedSpan {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            parent_span_id: vec![3; 8],
            name: "invoke_agent planner é".to_owned(),
            kind: 2,
            start_time_unix_nano: 1_700_000_000_000_000_000,
            scope: 0,
            links: vec![(vec![7; 16], vec![8; 8])],
            attributes: vec![(
                "gen_ai.agent.name".to_owned(),
                Owned::Str("planner".to_owned())
            )],
        }]
    );
}

#[test]
fn only_the_keys_asked_for_are_kept_each_value_type_read() {
    let array = len(
        5,
        &cat(&[
            &len(1, &string_value("x")),
            &len(1, &int(3, 4)),
            &len(1, b""),
            &len(1, &string_value("")),
        ]),
    );
    let span = cat(&[
        &len(
            9,
            &key_value("prompt", &string_value("a long prompt nobody asked for")),
        ),
        &len(9, &key_value("n", &int(3, u64::MAX))), // -1, ten bytes
        &len(9, &key_value("b", &int(2, 1))),
        &len(9, &key_value("a", &array)),
        &len(9, &key_value("d", &fixed64(4, 1.5f64.to_bits()))),
        &len(9, &key_value("gen_ai.agent.name", &len(7, b"bytes"))),
        &len(9, &len(1, b"n")), // no value at all
    ]);
    assert_eq!(
        attributes(&span),
        vec![
            ("n".to_owned(), Owned::Int(-1)),
            ("b".to_owned(), Owned::Bool(true)),
            (
                "a".to_owned(),
                Owned::Array(vec![Some("x".to_owned()), None, None, Some(String::new())])
            ),
            ("d".to_owned(), Owned::Other),
            ("gen_ai.agent.name".to_owned(), Owned::Other),
            ("n".to_owned(), Owned::Other),
        ]
    );
}

#[test]
fn a_value_written_before_its_key_is_read_the_same() {
    let value_first = cat(&[
        &len(2, &string_value("planner")),
        &len(1, b"gen_ai.agent.name"),
    ]);
    assert_eq!(
        attributes(&len(9, &value_first)),
        vec![(
            "gen_ai.agent.name".to_owned(),
            Owned::Str("planner".to_owned())
        )]
    );
}

#[test]
fn a_singular_field_given_twice_counts_its_last_value() {
    let span = cat(&[
        &len(5, b"first"),
        &len(1, &[1; 16]),
        &len(5, b"second"),
        &len(1, &[9; 16]),
        &int(6, 3),
        &int(6, 1),
        &len(
            9,
            &cat(&[
                &len(1, b"decoy"),
                &len(2, &string_value("v")),
                &len(1, b"n"),
            ]),
        ),
    ]);
    let read = one_span(&span);
    assert_eq!(
        (read.name.as_str(), read.trace_id, read.kind),
        ("second", vec![9; 16], 1)
    );
    assert_eq!(
        read.attributes,
        vec![("n".to_owned(), Owned::Str("v".to_owned()))]
    );
}

#[test]
fn a_message_field_given_twice_merges() {
    // The scope in two parts, after the spans; an array value in two parts; a string replaced by
    // an array and an array by a string (the oneof's last case wins).
    let mut scope_spans = len(2, &len(5, b"s"));
    scope_spans.extend(len(1, &len(1, b"scope-name")));
    scope_spans.extend(len(1, &len(2, b"9.9")));
    let bytes = len(1, &len(2, &scope_spans));
    let keys = keys();
    let (scopes, _) = owned(&decode(&bytes, &keys).unwrap(), &keys);
    assert_eq!(scopes, vec![(0, "scope-name".to_owned(), "9.9".to_owned())]);

    let part = |text: &str| len(5, &len(1, &string_value(text)));
    let merged = cat(&[
        &len(1, b"a"),
        &len(2, &part("x")),
        &len(2, &cat(&[&part("y"), &part("z")])),
    ]);
    let replaced = cat(&[
        &len(1, b"b"),
        &len(2, &part("x")),
        &len(2, &string_value("s")),
    ]);
    let then_array = cat(&[
        &len(1, b"n"),
        &len(2, &string_value("s")),
        &len(2, &part("y")),
    ]);
    let strings =
        |items: &[&str]| Owned::Array(items.iter().map(|i| Some((*i).to_owned())).collect());
    assert_eq!(
        attributes(&cat(&[
            &len(9, &merged),
            &len(9, &replaced),
            &len(9, &then_array)
        ])),
        vec![
            ("a".to_owned(), strings(&["x", "y", "z"])),
            ("b".to_owned(), Owned::Str("s".to_owned())),
            ("n".to_owned(), strings(&["y"])),
        ]
    );
}

#[test]
fn a_field_of_the_wrong_wire_type_is_an_unknown_field() {
    // kind written length-delimited, a name as a varint, a key as a fixed64: skipped, as upb does.
    let span = cat(&[
        &len(6, &[5]),
        &int(5, 7),
        &len(5, b"named"),
        &len(
            9,
            &cat(&[
                &fixed64(1, 0),
                &len(1, b"n"),
                &int(2, 3),
                &len(2, &int(3, 5)),
            ]),
        ),
    ]);
    let read = one_span(&span);
    assert_eq!((read.kind, read.name.as_str()), (0, "named"));
    assert_eq!(read.attributes, vec![("n".to_owned(), Owned::Int(5))]);
}

#[test]
fn unknown_fields_of_every_wire_type_are_skipped() {
    let group = cat(&[
        &tag(40, 3),
        &int(1, 1),
        &tag(41, 3),
        &tag(41, 4),
        &fixed64(2, 0),
        &tag(40, 4),
    ]);
    let noise = cat(&[
        &int(30, 1),
        &fixed64(31, 2),
        &len(32, b"\xff\xfe not UTF-8, never read"),
        &tag(33, 5),
        &[0, 0, 0, 0],
        &group,
    ]);
    let span = cat(&[&noise, &len(5, b"n"), &noise]);
    let scope_spans = cat(&[&noise, &len(2, &span), &noise]);
    let resource_spans = cat(&[&noise, &len(2, &scope_spans)]);
    let bytes = cat(&[&noise, &len(1, &resource_spans), &noise]);
    assert_eq!(spans_of(&bytes)[0].name, "n");
}

#[test]
fn a_kind_past_32_bits_keeps_its_low_32() {
    assert_eq!(one_span(&int(6, (1 << 40) + (1 << 32) - 3)).kind, -3);
    assert_eq!(one_span(&int(6, u64::MAX)).kind, -1);
}

#[test]
fn scopes_are_counted_across_resources() {
    let scope_spans = |name: &[u8]| len(2, &cat(&[&len(1, &len(1, name)), &len(2, &len(5, b"s"))]));
    let bytes = cat(&[
        &len(1, &cat(&[&scope_spans(b"a"), &scope_spans(b"b")])),
        &len(1, b""),
        &len(1, &scope_spans(b"c")),
    ]);
    let keys = keys();
    let (scopes, spans) = owned(&decode(&bytes, &keys).unwrap(), &keys);
    let names: Vec<_> = scopes.iter().map(|(r, n, _)| (*r, n.as_str())).collect();
    assert_eq!(names, vec![(0, "a"), (0, "b"), (2, "c")]);
    assert_eq!(
        spans.iter().map(|s| s.scope).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
}

#[test]
fn a_value_never_read_is_never_checked() {
    // Not UTF-8, in an attribute nobody asked for: upb would refuse the request, the walker does
    // not look (a downstream that decodes the value answers for it).
    let span = len(9, &key_value("prompt", &len(1, b"\xff")));
    assert!(one_span(&span).attributes.is_empty());
}

#[test]
fn malformed_requests_are_errors_that_say_where() {
    let cases: &[(&[u8], &str)] = &[
        (
            b"\x0a\x05",
            "at byte 2, in ExportTraceServiceRequest: a length past the end",
        ),
        (b"\x08", "truncated"),
        (
            b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
            "a varint longer than 10 bytes",
        ),
        (b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff", "truncated"),
        (b"\x00\x01", "field number 0"),
        (b"\x0e", "wire type 6 or 7"),
        (b"\x0f", "wire type 6 or 7"),
        (b"\x0c", "an end-group tag with no group open"),
        (b"\x13\x18\x01", "a group with no end"),
        (b"\x13\x1c", "a group ended by another field's end tag"),
        (b"\x80\x80\x80\x80\x80\x01", "a tag longer than 5 bytes"),
        (b"\x80\x80\x80\x80\x10\x01", "a tag past 32 bits"),
        (b"\x09\x00\x00", "truncated"),
    ];
    for (bytes, expected) in cases {
        let error = error_of(bytes);
        assert!(error.contains(expected), "{bytes:?}: {error}");
    }
    // A span's name, a scope's name, a string value asked for, an array item: not UTF-8.
    let bad = |span: &[u8]| error_of(&request(b"", &[span.to_vec()]));
    assert!(bad(&len(5, b"\xc3")).contains("in Span: a span name not UTF-8"));
    assert!(error_of(&request(&len(1, b"\xff"), &[])).contains("a scope name not UTF-8"));
    assert!(bad(&len(9, &key_value("n", &len(1, b"\xff")))).contains("a string value not UTF-8"));
    let array = len(5, &len(1, &len(1, b"\xff")));
    assert!(
        bad(&len(9, &key_value("a", &array))).contains("in AnyValue: a string value not UTF-8")
    );
    // A length past the end of the span, though not of the request.
    let span = cat(&[&len(5, b"n"), &tag(9, 2), &[50]]);
    let bytes = cat(&[&request(b"", &[span]), &[0x78; 60]]);
    assert!(error_of(&bytes).contains("in Span: a length past the end of its message"));
}

#[test]
fn a_deeply_nested_unknown_group_costs_no_stack() {
    let depth = 100_000;
    let mut bytes = tag(40, 3).repeat(depth);
    bytes.extend(tag(40, 4).repeat(depth));
    assert!(decode(&bytes, &keys()).unwrap().spans.is_empty());
}

#[test]
fn every_cut_of_a_request_is_an_answer_never_a_panic() {
    let span = cat(&[
        &len(1, &[1; 16]),
        &len(5, b"invoke_agent planner"),
        &len(9, &key_value("gen_ai.agent.name", &string_value("planner"))),
        &len(13, &cat(&[&len(1, &[7; 16]), &len(2, &[8; 8])])),
    ]);
    let bytes = request(&len(1, b"scope"), &[span.clone(), span]);
    let keys = keys();
    let mut refused = 0;
    for cut in 0..bytes.len() {
        refused += usize::from(decode(&bytes[..cut], &keys).is_err());
    }
    assert_eq!(refused, bytes.len() - 1); // only the empty request is whole
}

#[test]
fn keys_drop_repeats_and_know_their_names() {
    let keys = Keys::new(["x", "yy", "x", ""]).unwrap();
    assert_eq!(keys.len(), 3);
    assert_eq!(
        (keys.index(b"x"), keys.index(b"yy"), keys.index(b"")),
        (Some(0), Some(1), Some(2))
    );
    assert_eq!((keys.index(b"y"), keys.index(b"xyz")), (None, None));
    assert_eq!(keys.name(1), "yy");
    let many: Vec<String> = (0..=u32::from(u16::MAX) + 1)
        .map(|n| n.to_string())
        .collect();
    assert!(Keys::new(&many).is_err());
}
