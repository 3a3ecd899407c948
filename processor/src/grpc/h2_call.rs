//! One Export call on the h2 transport: its deadline, its message read whole within the budget,
//! and its answer.
//!
//! What a reader would not guess: a refusal is sent trailers-only (the status in the one header
//! block), and an accepted call waits in the inbox until its reply, its client's reset or its
//! deadline, whichever comes first; a reset or a passed deadline reaches Python as `cancelled`.

use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use h2::RecvStream;
use h2::server::SendResponse;
use http::{HeaderMap, HeaderValue, Request, Response};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::h2_connections::{Open, Peer};
use super::{
    Body, Call, Encoding, GRPC_TIMEOUT_DIGITS, Inbox, Message, Outcome, Reply, Serving, code,
};
use crate::budget::ByteBudget;

pub(super) async fn call(
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    peer: Arc<Peer>,
    budget: Arc<ByteBudget>,
    inbox: Arc<Inbox>,
    serving: Arc<Serving>,
) {
    let _open = Open::new(&peer, &serving);
    let started = Instant::now();
    let deadline = match grpc_timeout(request.headers().get("grpc-timeout")) {
        Ok(timeout) => timeout.map(|timeout| started + timeout),
        Err(refused) => return send(respond, &refused),
    };
    let read_by = started + serving.limits.read_timeout;
    let reading = read(request, &serving, &budget);
    let outcome = match tokio::time::timeout_at(
        deadline.map_or(read_by, |at| at.min(read_by)),
        reading,
    )
    .await
    {
        Err(_) if deadline.is_some_and(|at| at <= read_by) => deadline_exceeded(),
        Err(_) => Outcome::error(
            code::DEADLINE_EXCEEDED,
            format!(
                "the request message did not arrive within read_timeout ({} s)",
                serving.limits.read_timeout.as_secs_f64()
            ),
        ),
        Ok(Err(refused)) => {
            if refused.code == code::RESOURCE_EXHAUSTED && refused.details.is_some() {
                serving.refused_busy.fetch_add(1, Ordering::Relaxed);
            }
            refused
        }
        Ok(Ok((method, message, headers))) => {
            let (answer, mut answered) = oneshot::channel();
            let id = inbox.next_id.fetch_add(1, Ordering::Relaxed);
            inbox.add(|arrived| {
                arrived.calls.push(Call {
                    id,
                    method,
                    message,
                    reply: Reply(answer),
                    headers,
                })
            });
            let past_deadline = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                outcome = &mut answered => outcome.unwrap_or_else(|_| {
                    Outcome::error(code::UNAVAILABLE, "the processor stopped before it answered")
                }),
                _ = poll_fn(|context| respond.poll_reset(context)) => {
                    inbox.add(|arrived| arrived.cancelled.push(id));
                    return;
                }
                () = past_deadline => {
                    inbox.add(|arrived| arrived.cancelled.push(id));
                    deadline_exceeded()
                }
            }
        }
    };
    send(respond, &outcome);
}

fn deadline_exceeded() -> Outcome {
    Outcome::error(
        code::DEADLINE_EXCEEDED,
        "the call's deadline (grpc-timeout) passed before it was answered",
    )
}

/// A call's `grpc-timeout` (absent: none), or the outcome that refuses a malformed one.
fn grpc_timeout(header: Option<&HeaderValue>) -> Result<Option<Duration>, Outcome> {
    let Some(header) = header else {
        return Ok(None);
    };
    let malformed = || {
        Outcome::error(
            code::INTERNAL,
            format!(
                "malformed grpc-timeout {:?}",
                String::from_utf8_lossy(header.as_bytes())
            ),
        )
    };
    let (digits, unit) = header
        .as_bytes()
        .split_last_chunk::<1>()
        .ok_or_else(malformed)?;
    if digits.is_empty()
        || digits.len() > GRPC_TIMEOUT_DIGITS
        || !digits.iter().all(u8::is_ascii_digit)
    {
        return Err(malformed());
    }
    let amount = digits
        .iter()
        .fold(0u64, |amount, digit| amount * 10 + u64::from(digit - b'0'));
    let timeout = match unit {
        [b'H'] => Duration::from_secs(amount * 3600),
        [b'M'] => Duration::from_secs(amount * 60),
        [b'S'] => Duration::from_secs(amount),
        [b'm'] => Duration::from_millis(amount),
        [b'u'] => Duration::from_micros(amount),
        [b'n'] => Duration::from_nanos(amount),
        _ => return Err(malformed()),
    };
    Ok(Some(timeout))
}

/// The call's method, message and kept headers, or the outcome that refuses it.
async fn read(
    request: Request<RecvStream>,
    serving: &Serving,
    budget: &Arc<ByteBudget>,
) -> Result<(usize, Message, Vec<(String, Vec<u8>)>), Outcome> {
    let path = request.uri().path();
    let Some(method) = serving.methods.iter().position(|method| method == path) else {
        return Err(Outcome::error(
            code::UNIMPLEMENTED,
            format!("no method {path} here: this is an OTLP receiver"),
        ));
    };
    let headers = request.headers();
    let grpc = headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|kind| kind.as_bytes().starts_with(b"application/grpc"));
    if !grpc {
        return Err(Outcome::error(
            code::INTERNAL,
            "content-type is not application/grpc",
        ));
    }
    let encoding = Encoding::of(headers.get("grpc-encoding").map(HeaderValue::as_bytes))?;
    let kept = serving
        .headers
        .iter()
        .flat_map(|name| {
            headers
                .get_all(name.as_str())
                .iter()
                .map(move |value| (name.clone(), value.as_bytes().to_vec()))
        })
        .collect();
    let mut stream = request.into_body();
    let mut body = Body::new(serving.bounds, budget.empty());
    while let Some(chunk) = stream.data().await {
        let chunk = chunk.map_err(|error| {
            Outcome::error(
                code::CANCELLED,
                format!("the request stream failed: {error}"),
            )
        })?;
        let _ = stream.flow_control().release_capacity(chunk.len());
        body.push(chunk)?;
    }
    let message = if body.compressed() {
        // Off this thread, two at a time: inflating must not stall every other connection.
        let permit = Arc::clone(&serving.inflating)
            .acquire_owned()
            .await
            .map_err(|_| Outcome::error(code::UNAVAILABLE, "the processor is stopping"))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            body.finish(encoding)
        })
        .await
        .map_err(|_| Outcome::error(code::INTERNAL, "inflating the request message failed"))??
    } else {
        body.finish(encoding)?
    };
    Ok((method, message, kept))
}
fn send(mut respond: SendResponse<Bytes>, outcome: &Outcome) {
    let mut response = Response::new(());
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(
        "grpc-accept-encoding",
        HeaderValue::from_static("identity,gzip"),
    );
    if outcome.code != code::OK {
        // Trailers only: the status in the one header block, ending the stream.
        status_headers(headers, outcome);
        let _ = respond.send_response(response, true);
        return;
    }
    let Ok(mut stream) = respond.send_response(response, false) else {
        return;
    };
    if stream
        .send_data(Bytes::from(outcome.framed()), false)
        .is_ok()
    {
        let mut trailers = HeaderMap::new();
        status_headers(&mut trailers, outcome);
        let _ = stream.send_trailers(trailers);
    }
}

fn status_headers(headers: &mut HeaderMap, outcome: &Outcome) {
    headers.insert("grpc-status", HeaderValue::from(outcome.code));
    if !outcome.message.is_empty()
        && let Ok(message) = HeaderValue::from_str(&outcome.encoded_message())
    {
        headers.insert("grpc-message", message);
    }
    if let Some(details) = outcome.encoded_details()
        && let Ok(details) = HeaderValue::from_str(&details)
    {
        headers.insert("grpc-status-details-bin", details);
    }
}
