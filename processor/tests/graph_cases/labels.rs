//! Names and labels: cut to their bound, and a name holding the separator or the escape escaped
//! in its label.
//!
//! What a reader would not guess: any label reads back into its names ([`label_names`]), so a
//! label is a faithful key whatever the names hold.

use crate::common::spans::*;
use crate::{a_loop, one, run};
use opentelemetry_proto::tonic::trace::v1::Span;
use otel_guard_engine::graph::{label_names, push_name};

#[test]
fn names_and_labels_are_cut_to_their_bound() {
    let long = "p".repeat(300);
    let spans = vec![
        span(1, 1, None, &format!("invoke_agent {long}"), 1),
        span(1, 2, Some(1), &format!("invoke_agent {long}"), 2),
    ];
    let counted = run(&one("pydantic-ai", spans));
    let (kind, label) = counted.cycles()[0];
    assert_eq!(kind, "direct");
    assert_eq!(label.chars().count(), 2 * 256 + 1);
    assert!(label.contains("p…>p"));
    assert_eq!(counted.truncated.0, 2);
    let many: Vec<Span> = (0..6)
        .map(|at| {
            let name = format!("invoke_agent {at}{}", "x".repeat(300));
            span(1, at + 1, at.checked_sub(1).map(|p| p + 1), &name, at)
        })
        .chain([span(1, 7, Some(6), "invoke_agent 0", 7)])
        .collect();
    let counted = run(&one("pydantic-ai", many));
    assert!(counted.cycles.is_empty()); // "0" is no name cut short of "0xxx…"
}

#[test]
fn a_name_holding_the_separator_or_the_escape_is_escaped_in_its_label() {
    // An agent `planner>budget` calling itself: one name, not a two-agent loop.
    let spans = vec![
        span(1, 1, None, "invoke_agent planner>budget", 1),
        span(1, 2, Some(1), "invoke_agent planner>budget", 2),
    ];
    let counted = run(&one("pydantic-ai", spans));
    assert_eq!(
        counted.cycles(),
        [("direct", r"planner\>budget>planner\>budget")]
    );
    assert_eq!(
        label_names(counted.cycles()[0].1),
        ["planner>budget", "planner>budget"]
    );
    // ... and the two-agent loop reads otherwise.
    let two = run(&one("pydantic-ai", a_loop())).cycles()[0].1.to_owned();
    assert_eq!(label_names(&two), ["planner", "budget", "planner"]);
    // A backslash, alone, at the end, and before a `>`.
    let names = [r"a\b", "c", r"d\", r"e\>f"];
    let spans: Vec<Span> = names
        .iter()
        .chain(&names[..1])
        .enumerate()
        .map(|(at, name)| {
            let id = at as u64 + 1;
            span(
                1,
                id,
                (at > 0).then(|| id - 1),
                &format!("invoke_agent {name}"),
                id,
            )
        })
        .collect();
    let counted = run(&one("pydantic-ai", spans));
    let (kind, label) = counted.cycles()[0];
    assert_eq!(kind, "cross_function");
    assert_eq!(label, r"a\\b>c>d\\>e\\\>f>a\\b");
    assert_eq!(label_names(label), [r"a\b", "c", r"d\", r"e\>f", r"a\b"]);
}

#[test]
fn any_label_reads_back_into_its_names() {
    for names in [
        vec![""],
        vec!["", ""],
        vec![">", "\\"],
        vec![r"\\>>", "x>", ">y", r"\"],
        vec!["plain", "names"],
    ] {
        let mut label = String::new();
        for (at, name) in names.iter().enumerate() {
            if at > 0 {
                label.push('>');
            }
            push_name(&mut label, name);
        }
        assert_eq!(label_names(&label), names, "{label}");
    }
}
