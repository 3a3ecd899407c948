//! Reading one span: its facts (its call by the dialect table, its decision, its flat kind), and
//! the path it continues (its parent's, the guard's chain, its first link's, or the caller it names).
//!
//! What a reader would not guess: a span whose parent or linked span has not arrived is not read
//! again later; what it needs is kept with it ([`Waiting`]) and it settles when that span comes
//! (`waiting.rs`), so the request's bytes can go as soon as it is read.
#![forbid(unsafe_code)]

use std::collections::HashMap;

use super::flat::{FlatKind, Timed};
use super::trace::{CallFacts, Facts, NONE, PathRef, Waiting};
use super::{
    Engine, MAX_CHAIN_BYTES, MAX_NAME_CHARS, MAX_PATH_NAMES, MAX_ROOT_BYTES, ScopeFacts, kept,
};
use crate::calls::Hop;
use crate::decode::{self, Request, Value};
use crate::dialects::{self, Attributes, Key};
use crate::ids::SpanId;
use crate::lru::Handle;

/// Whether a call span marks its call as a transfer (a handoff): the guard's
/// `otel_guard.hop.kind` `transfer`, or the conventions' `gen_ai.transfer.mode` `pass_control`.
fn transfer(attributes: &Attributes<'_, '_>) -> bool {
    attributes.text(Key::HopKind) == Some("transfer")
        || attributes.text(Key::TransferMode) == Some("pass_control")
}

impl Engine {
    pub(super) fn span<'a>(
        &mut self,
        request: &Request<'a>,
        span: &decode::Span<'a>,
        scope: &ScopeFacts<'a>,
        current: &mut Option<(&'a [u8], Handle, bool)>,
        trees: &mut HashMap<&'a str, i64>,
    ) {
        let (handle, full) = match *current {
            Some((trace_id, handle, full))
                if trace_id == span.trace_id && self.traces.alive(handle) =>
            {
                (handle, full)
            }
            _ => {
                let handle = self.touch(span.trace_id);
                let limits = &self.shared.limits;
                let full = self.traces.get(handle).is_some_and(|trace| {
                    trace.spans.len() >= limits.max_spans_per_trace
                        || trace.weighed >= limits.max_held_bytes
                });
                *current = Some((span.trace_id, handle, full));
                (handle, full)
            }
        };
        let keys = self.shared.keys;
        let span_id = SpanId::of(span.span_id, &keys);
        let Some(trace) = self.traces.get(handle) else {
            return;
        };
        if trace.spans.contains_key(&span_id) {
            self.shared.events.duplicates += 1;
            return;
        }
        let attributes = Attributes::of(request, span);
        if scope.guard
            && let (Some(hops), Some(root)) = (
                attributes.integer(Key::TreeHops),
                attributes.text(Key::ChainRoot),
            )
            && hops > 0
            && !root.is_empty()
            && root.len() <= MAX_ROOT_BYTES
        {
            let largest = trees.entry(root).or_insert(hops);
            *largest = (*largest).max(hops);
        }
        if scope.guard
            && let Some(root) = attributes.text(Key::ChainRoot)
            && !root.is_empty()
            && root.len() <= MAX_ROOT_BYTES
            && let Some(trace) = self.traces.get_mut(handle)
            && trace.root.is_none()
        {
            trace.root = Some(root.into());
        }
        if full {
            self.shared.events.dropped += 1;
            return;
        }
        let facts = self.facts(span, scope, &attributes);
        self.stored += 1;
        if facts.flat.is_some() {
            self.note_flat(handle, span, span_id, &facts);
        }
        if !span.parent_span_id.is_empty() {
            let parent_id = SpanId::of(span.parent_span_id, &keys);
            let trace = self.traces.get(handle);
            let parent = trace
                .and_then(|trace| trace.spans.get(&parent_id))
                .copied()
                .filter(|path| !path.waits());
            match parent {
                Some(_)
                    if facts.flat == Some(FlatKind::Agent)
                        && trace.is_some_and(|trace| trace.is_workflow(&parent_id)) =>
                {
                    let waiting = Waiting {
                        parent: true,
                        facts: facts.into_owned(),
                        chain: None,
                    };
                    self.hold_flat(handle, span_id, parent_id, Box::new(waiting));
                }
                Some(path) => self.settle_now(handle, span_id, &facts, path),
                None => {
                    let chain = self.chain(request, &facts, &attributes);
                    let waiting = Waiting {
                        parent: true,
                        facts: facts.into_owned(),
                        chain,
                    };
                    self.wait(handle, parent_id, handle, span_id, waiting);
                }
            }
            return;
        }
        if let Some(chain) = self.chain(request, &facts, &attributes) {
            let base = self.chain_path(handle, &chain);
            self.settle_now(handle, span_id, &facts, base);
            return;
        }
        if let Some(link) = request.links_of(span).first() {
            let holder = self.holder(link.trace_id, handle);
            let linked_id = SpanId::of(link.span_id, &keys);
            let linked = self
                .traces
                .get(holder)
                .and_then(|trace| trace.spans.get(&linked_id).copied())
                .filter(|path| !path.waits());
            match linked {
                Some(path) => {
                    let base = self.copy_path(holder, path, handle).across();
                    self.settle_now(handle, span_id, &facts, base);
                }
                None => {
                    let waiting = Waiting {
                        parent: false,
                        facts: facts.into_owned(),
                        chain: None,
                    };
                    self.wait(holder, linked_id, handle, span_id, waiting);
                }
            }
            return;
        }
        // The caller a server's span names ran in the trace before; the caller an invoke_agent
        // CLIENT span names (the conventions' caller-aware refinement) in this one.
        let caller = [Key::Caller, Key::CallerName].into_iter().find_map(|key| {
            let caller = attributes.text(key).filter(|caller| !caller.is_empty())?;
            Some((caller, key == Key::Caller))
        });
        let base = match (&facts.call, caller) {
            (Some(_), Some((caller, across))) => {
                let caller = self.shared.cut(caller, MAX_NAME_CHARS);
                let trace = self.traces.get_mut(handle).expect("the trace being read");
                let name = trace.intern(&caller, keys);
                let path = trace.plus(PathRef::ROOT, name, Hop::named_caller(), NONE);
                if across { path.across() } else { path }
            }
            _ => PathRef::ROOT,
        };
        self.settle_now(handle, span_id, &facts, base);
    }

    /// Keep what the flat reading needs of a span of the flat instrumentation: a workflow span's
    /// id, a tool span's interval.
    fn note_flat(
        &mut self,
        handle: Handle,
        span: &decode::Span<'_>,
        span_id: SpanId,
        facts: &Facts<'_>,
    ) {
        let keys = self.shared.keys;
        let Some(trace) = self.traces.get_mut(handle) else {
            return;
        };
        match facts.flat {
            Some(FlatKind::Workflow) => trace.flat().workflows.push(span_id),
            Some(FlatKind::Tool) => trace.flat().tools.push(Timed {
                span: span_id,
                parent: SpanId::of(span.parent_span_id, &keys),
                start: facts.start,
                end: facts.end,
            }),
            _ => {}
        }
    }

    fn facts<'a>(
        &mut self,
        span: &decode::Span<'a>,
        scope: &ScopeFacts<'a>,
        attributes: &Attributes<'_, 'a>,
    ) -> Facts<'a> {
        let call = dialects::call_of(span.name, scope.name, attributes, &self.dialects);
        let call = call.and_then(|call| {
            let name = call.name?;
            Some(CallFacts {
                name: self.shared.cut(name, MAX_NAME_CHARS),
                hop: Hop::of_span(
                    call.kind(),
                    call.row,
                    scope.hash,
                    span.kind,
                    scope.guard,
                    attributes.integer(Key::NameDepth).unwrap_or(0),
                    transfer(attributes),
                ),
                conditional: call.conditional,
            })
        });
        let decision = match (&call, attributes.text(Key::Decision)) {
            (Some(_), Some(verdict)) => {
                let reason = if verdict == "allow" {
                    ""
                } else {
                    attributes.text(Key::Reason).unwrap_or("")
                };
                Some((
                    self.shared.cut(verdict, MAX_NAME_CHARS),
                    self.shared.cut(reason, MAX_NAME_CHARS),
                ))
            }
            _ => None,
        };
        let (flat, end) = match scope.flat {
            true => (
                FlatKind::of(attributes.text(Key::TlKind), call.is_some()),
                span.end_time_unix_nano,
            ),
            false => (None, 0),
        };
        Facts {
            span_id: kept(span.span_id, self.shared.keys),
            start: span.start_time_unix_nano,
            end,
            flat,
            call,
            decision,
        }
    }

    /// The earlier hops of the guard's chain that a call span carries (more than one hop): its
    /// `otel_guard.chain.agents` but the span's own call when it is the last.
    fn chain(
        &mut self,
        request: &Request<'_>,
        facts: &Facts<'_>,
        attributes: &Attributes<'_, '_>,
    ) -> Option<Vec<Box<str>>> {
        let call = facts.call.as_ref()?;
        if attributes.integer(Key::ChainDepth).unwrap_or(0) <= 1 {
            return None;
        }
        let Some(Value::Array(items)) = attributes.value(Key::ChainAgents) else {
            return None;
        };
        let mut names: Vec<Box<str>> = request
            .items_of(items)
            .iter()
            .map(|item| {
                self.shared
                    .cut(item.unwrap_or(""), MAX_NAME_CHARS)
                    .into_owned()
                    .into_boxed_str()
            })
            .collect();
        if names.last().is_some_and(|last| **last == *call.name) {
            names.pop();
        }
        if names.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let kept = names
            .iter()
            .rev()
            .take(MAX_PATH_NAMES)
            .take_while(|name| {
                bytes += name.len();
                bytes <= MAX_CHAIN_BYTES
            })
            .count();
        names.drain(..names.len() - kept);
        (!names.is_empty()).then_some(names)
    }

    /// The path of the earlier hops of a chain.
    pub(super) fn chain_path(&mut self, handle: Handle, chain: &[Box<str>]) -> PathRef {
        let keys = self.shared.keys;
        let Some(trace) = self.traces.get_mut(handle) else {
            return PathRef::ROOT;
        };
        let mut path = PathRef::ROOT;
        for name in chain {
            let name = trace.intern(name, keys);
            path = trace.plus(path, name, Hop::chained(), NONE);
        }
        path.across()
    }
}
