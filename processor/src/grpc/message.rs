//! gRPC's framing of a unary call, on bytes: the request's one length-prefixed message (gzip or
//! not) in, the status and the response's message out.
//!
//! A call's body is a 5-byte prefix (a compressed flag, then the length, big-endian) and the
//! message. What a reader would not guess: nothing is reserved ahead of the bytes that arrived.
//! [`Body`] keeps the chunks as HTTP/2 handed them (small ones copied together), every byte drawn
//! from a [`ByteBudget`] before it is kept, and every allocation fallible: a call the budget or
//! the allocator cannot hold is answered RESOURCE_EXHAUSTED, never held, never an abort. Gzip is
//! inflated block by block, each block drawn from the budget before it is filled, and stops at
//! the limit while it runs.

use std::io::{self, Read};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use bytes::Bytes;
use flate2::read::GzDecoder;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

use crate::budget::Taken;

/// gRPC status codes this module answers with itself.
pub mod code {
    pub const OK: u32 = 0;
    pub const CANCELLED: u32 = 1;
    pub const DEADLINE_EXCEEDED: u32 = 4;
    pub const INTERNAL: u32 = 13;
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    pub const UNIMPLEMENTED: u32 = 12;
    pub const UNAVAILABLE: u32 = 14;
}

pub(crate) const PREFIX: usize = 5;
/// Chunks smaller than this are copied together rather than kept one by one (a sender of 1-byte
/// DATA frames must not cost a chunk's bookkeeping a byte).
const SMALL: usize = 16 << 10;
/// The most the copied-together bytes grow to before they become one chunk.
const SMALL_BLOCK: usize = 64 << 10;
/// The block that inflation fills at a time (drawn from the budget before it is filled).
const INFLATE_BLOCK: usize = 256 << 10;

/// What a call is answered with: OK and the response's message, or an error status with its
/// message and, when there is one, a serialized `google.rpc.Status` for `grpc-status-details-bin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub code: u32,
    pub message: String,
    pub response: Vec<u8>,
    pub details: Option<Vec<u8>>,
}

impl Outcome {
    pub fn ok(response: Vec<u8>) -> Self {
        Outcome {
            code: code::OK,
            message: String::new(),
            response,
            details: None,
        }
    }

    pub fn error(code: u32, message: impl Into<String>) -> Self {
        Outcome {
            code,
            message: message.into(),
            response: Vec::new(),
            details: None,
        }
    }

    /// RESOURCE_EXHAUSTED with a `RetryInfo` of `retry_after` in its details: the shape the
    /// Python side gives a retryable error (a `google.rpc.Status` of the code, the message and
    /// one `Any` packing the `RetryInfo`), which the Collector's exporters read.
    pub fn busy(message: impl Into<String>, retry_after: Duration) -> Self {
        let mut outcome = Outcome::error(code::RESOURCE_EXHAUSTED, message);
        outcome.details = Some(retry_status(outcome.code, &outcome.message, retry_after));
        outcome
    }

    /// The response's body: the prefix (not compressed) and the message.
    pub fn framed(&self) -> Vec<u8> {
        let mut framed = Vec::with_capacity(PREFIX + self.response.len());
        framed.push(0);
        framed.extend_from_slice(&(self.response.len() as u32).to_be_bytes());
        framed.extend_from_slice(&self.response);
        framed
    }

    /// `grpc-message`: percent-encoded, as gRPC's wire format asks (every byte outside the
    /// printable ASCII range, and `%`).
    pub fn encoded_message(&self) -> String {
        const ESCAPED: &AsciiSet = &CONTROLS.add(b'%');
        utf8_percent_encode(&self.message, ESCAPED).to_string()
    }

    /// `grpc-status-details-bin`: base64, without padding.
    pub fn encoded_details(&self) -> Option<String> {
        self.details
            .as_ref()
            .map(|details| STANDARD_NO_PAD.encode(details))
    }
}

/// A serialized `google.rpc.Status {code, message, details: [Any(RetryInfo {retry_delay})]}`.
fn retry_status(code: u32, message: &str, retry_after: Duration) -> Vec<u8> {
    let mut delay = Vec::new();
    if retry_after.as_secs() > 0 {
        field_varint(&mut delay, 1, retry_after.as_secs());
    }
    if retry_after.subsec_nanos() > 0 {
        field_varint(&mut delay, 2, u64::from(retry_after.subsec_nanos()));
    }
    let mut retry_info = Vec::new();
    field_bytes(&mut retry_info, 1, &delay);
    let mut any = Vec::new();
    field_bytes(&mut any, 1, b"type.googleapis.com/google.rpc.RetryInfo");
    field_bytes(&mut any, 2, &retry_info);
    let mut status = Vec::new();
    if code != 0 {
        field_varint(&mut status, 1, u64::from(code));
    }
    if !message.is_empty() {
        field_bytes(&mut status, 2, message.as_bytes());
    }
    field_bytes(&mut status, 3, &any);
    status
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn field_varint(out: &mut Vec<u8>, field: u64, value: u64) {
    varint(out, field << 3);
    varint(out, value);
}

fn field_bytes(out: &mut Vec<u8>, field: u64, value: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

/// The compression a call's `grpc-encoding` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
}

impl Encoding {
    /// The encoding of a `grpc-encoding` header (absent: identity), or the UNIMPLEMENTED outcome
    /// for one this receiver does not read.
    pub fn of(header: Option<&[u8]>) -> Result<Self, Outcome> {
        match header {
            None | Some(b"identity") => Ok(Encoding::Identity),
            Some(b"gzip") => Ok(Encoding::Gzip),
            Some(other) => Err(Outcome::error(
                code::UNIMPLEMENTED,
                format!(
                    "grpc-encoding {:?} is not supported (identity, gzip)",
                    String::from_utf8_lossy(other)
                ),
            )),
        }
    }
}

/// The limits a call's body is read against.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// The largest message as it arrives (compressed or not).
    pub max: usize,
    /// The largest message once inflated.
    pub max_inflated: usize,
    /// The retry delay a refusal for want of budget suggests.
    pub retry_after: Duration,
}

impl Bounds {
    /// `max` for both, and a retry delay of a second.
    pub fn new(max: usize) -> Self {
        Bounds {
            max,
            max_inflated: max,
            retry_after: Duration::from_secs(1),
        }
    }
}

/// A unary call's body as its chunks arrive: one message, at most `max` bytes (compressed or
/// not), every byte kept drawn from the budget first.
#[derive(Debug)]
pub struct Body {
    bounds: Bounds,
    held: Taken,
    prefix: [u8; PREFIX],
    prefix_len: usize,
    /// The message's length, once the prefix arrived.
    expected: Option<usize>,
    received: usize,
    parts: Vec<Bytes>,
    small: Vec<u8>,
}

/// A request message read whole, as chunks, with the budget it holds (given back when dropped).
#[derive(Debug)]
pub struct Message {
    parts: Vec<Bytes>,
    len: usize,
    held: Taken,
}

impl Message {
    /// A message that arrived in one buffer, holding `held` of its budget.
    #[cfg(feature = "tonic-receiver")]
    pub(crate) fn whole(bytes: Bytes, held: Taken) -> Self {
        Message {
            len: bytes.len(),
            parts: vec![bytes],
            held,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes it holds of its budget.
    pub fn held(&self) -> usize {
        self.held.bytes()
    }

    /// Let go of the chunks and keep what they held of the budget: for the holder of a copy.
    pub fn into_held(self) -> Taken {
        self.held
    }

    /// Copy the message into `out`, which is [`Message::len`] bytes long.
    pub fn copy_to(&self, out: &mut [u8]) {
        let mut at = 0;
        for part in &self.parts {
            out[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
    }

    /// The message in one buffer (a copy, unless it arrived in one chunk).
    pub fn to_bytes(&self) -> Bytes {
        match self.parts.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            _ => {
                let mut out = vec![0; self.len];
                self.copy_to(&mut out);
                Bytes::from(out)
            }
        }
    }
}

impl Body {
    /// A body read against `bounds`, holding its bytes in `held` (an empty take of the budget).
    pub fn new(bounds: Bounds, held: Taken) -> Self {
        Body {
            bounds,
            held,
            prefix: [0; PREFIX],
            prefix_len: 0,
            expected: None,
            received: 0,
            parts: Vec::new(),
            small: Vec::new(),
        }
    }

    /// Take the next chunk; an error outcome once the message is larger than `max`, a second
    /// message follows it, or the budget or the allocator cannot hold it.
    pub fn push(&mut self, mut chunk: Bytes) -> Result<(), Outcome> {
        if chunk.is_empty() {
            return Ok(());
        }
        if self.prefix_len < PREFIX {
            let take = (PREFIX - self.prefix_len).min(chunk.len());
            self.prefix[self.prefix_len..self.prefix_len + take].copy_from_slice(&chunk[..take]);
            self.prefix_len += take;
            chunk = chunk.slice(take..);
            if self.prefix_len == PREFIX {
                let [_, a, b, c, d] = self.prefix;
                let length = u32::from_be_bytes([a, b, c, d]) as usize;
                if length > self.bounds.max {
                    return Err(too_large(length, self.bounds.max));
                }
                // Refused at once when it cannot fit now (nothing is taken for it yet); its
                // length is its claim to a room kept for it, this time and when it comes again.
                self.held.declare(length);
                if !self.held.could_grow(length) {
                    return Err(self.busy(length));
                }
                self.expected = Some(length);
            }
        }
        let Some(expected) = self.expected else {
            return Ok(());
        };
        if self.received + chunk.len() > expected {
            return Err(Outcome::error(
                code::UNIMPLEMENTED,
                "more than one request message in a unary call",
            ));
        }
        if chunk.is_empty() {
            return Ok(());
        }
        if !self.held.try_grow(chunk.len()) {
            return Err(self.busy(expected));
        }
        self.received += chunk.len();
        if chunk.len() >= SMALL {
            self.flush_small();
            self.parts.push(chunk);
        } else {
            if self.small.try_reserve(chunk.len()).is_err() {
                return Err(out_of_memory(expected));
            }
            self.small.extend_from_slice(&chunk);
            if self.small.len() >= SMALL_BLOCK {
                self.flush_small();
            }
        }
        Ok(())
    }

    fn flush_small(&mut self) {
        if !self.small.is_empty() {
            self.parts
                .push(Bytes::from(std::mem::take(&mut self.small)));
        }
    }

    fn busy(&self, length: usize) -> Outcome {
        Outcome::busy(
            format!(
                "the processor holds as many bytes of requests as it may (max_pending_bytes; \
                 {} free for a message of {length}); retry later",
                self.held.available()
            ),
            self.bounds.retry_after,
        )
    }

    /// Whether the message is flagged compressed (so [`Body::finish`] inflates it).
    pub fn compressed(&self) -> bool {
        self.prefix_len == PREFIX && self.prefix[0] == 1
    }

    /// The message, once the client ended the body: inflated when its flag says so. Inflation
    /// costs CPU: call it off the thread that serves connections when [`Body::compressed`].
    pub fn finish(mut self, encoding: Encoding) -> Result<Message, Outcome> {
        let Some(expected) = self.expected else {
            return Err(Outcome::error(
                code::INTERNAL,
                "the call has no request message",
            ));
        };
        if self.received < expected {
            return Err(Outcome::error(
                code::INTERNAL,
                format!(
                    "the request message ended after {} of its {expected} bytes",
                    self.received
                ),
            ));
        }
        self.flush_small();
        match (self.prefix[0], encoding) {
            (0, _) => Ok(Message {
                parts: self.parts,
                len: self.received,
                held: self.held,
            }),
            (1, Encoding::Gzip) => self.gunzip(),
            (1, Encoding::Identity) => Err(Outcome::error(
                code::INTERNAL,
                "the request message is flagged compressed, but the call has no grpc-encoding",
            )),
            (flag, _) => Err(Outcome::error(
                code::INTERNAL,
                format!("the request message's compressed flag is {flag}, not 0 or 1"),
            )),
        }
    }

    /// The message inflated, at most `max_inflated` bytes of it, block by block.
    fn gunzip(self) -> Result<Message, Outcome> {
        let Body {
            bounds,
            mut held,
            parts,
            received,
            ..
        } = self;
        let max = bounds.max_inflated;
        let compressed = held.bytes();
        let mut decoder = GzDecoder::new(Parts::new(&parts));
        let mut inflated = Vec::new();
        let mut len = 0usize;
        loop {
            // One byte past the limit says the message is larger than it.
            let want = INFLATE_BLOCK.min(max + 1 - len);
            if !held.try_grow(want) {
                return Err(Outcome::busy(
                    format!(
                        "the processor holds as many bytes of requests as it may \
                         (max_pending_bytes; {len} inflated of a message of {received}); retry later"
                    ),
                    bounds.retry_after,
                ));
            }
            let mut block = Vec::new();
            if block.try_reserve_exact(want).is_err() {
                return Err(out_of_memory(len + want));
            }
            let read = (&mut decoder)
                .take(want as u64)
                .read_to_end(&mut block)
                .map_err(|error| {
                    Outcome::error(
                        code::INTERNAL,
                        format!("the request message does not inflate as gzip: {error}"),
                    )
                })?;
            held.shrink(want - read);
            len += read;
            if len > max {
                return Err(Outcome::error(
                    code::RESOURCE_EXHAUSTED,
                    format!("Received message larger than max (more than {max} bytes inflated)"),
                ));
            }
            if read > 0 {
                inflated.push(Bytes::from(block));
            }
            if read < want {
                break;
            }
        }
        drop(decoder);
        drop(parts);
        held.shrink(compressed);
        Ok(Message {
            parts: inflated,
            len,
            held,
        })
    }
}

/// The chunks of a message read in order.
struct Parts<'a> {
    parts: &'a [Bytes],
    at: usize,
}

impl<'a> Parts<'a> {
    fn new(parts: &'a [Bytes]) -> Self {
        Parts { parts, at: 0 }
    }
}

impl Read for Parts<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while let Some((first, rest)) = self.parts.split_first() {
            if self.at < first.len() {
                let read = (first.len() - self.at).min(out.len());
                out[..read].copy_from_slice(&first[self.at..self.at + read]);
                self.at += read;
                return Ok(read);
            }
            self.parts = rest;
            self.at = 0;
        }
        Ok(0)
    }
}

pub(crate) fn too_large(length: usize, max: usize) -> Outcome {
    Outcome::error(
        code::RESOURCE_EXHAUSTED,
        format!("Received message larger than max ({length} vs. {max})"),
    )
}

fn out_of_memory(length: usize) -> Outcome {
    Outcome::error(
        code::RESOURCE_EXHAUSTED,
        format!("the processor could not allocate memory for a message of {length} bytes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::ByteBudget;
    use flate2::Compression;
    use flate2::write::GzEncoder;
    use std::io::Write;
    use std::sync::Arc;

    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut body = vec![flag];
        body.extend_from_slice(&(message.len() as u32).to_be_bytes());
        body.extend_from_slice(message);
        body
    }

    fn read(chunks: &[&[u8]], max: usize, encoding: Encoding) -> Result<Vec<u8>, Outcome> {
        let budget = ByteBudget::new(1 << 20);
        let result = read_within(&budget, chunks, Bounds::new(max), encoding);
        assert_eq!(
            budget.used(),
            0,
            "a finished read holds nothing once its message is gone"
        );
        result
    }

    fn read_within(
        budget: &Arc<ByteBudget>,
        chunks: &[&[u8]],
        bounds: Bounds,
        encoding: Encoding,
    ) -> Result<Vec<u8>, Outcome> {
        let mut body = Body::new(bounds, budget.empty());
        for chunk in chunks {
            body.push(Bytes::copy_from_slice(chunk))?;
        }
        body.finish(encoding)
            .map(|message| message.to_bytes().to_vec())
    }

    #[test]
    fn a_message_split_anywhere_is_read_whole() {
        let body = framed(0, b"spans and more spans");
        for cut in 0..body.len() {
            let (first, second) = body.split_at(cut);
            assert_eq!(
                read(&[first, second], 100, Encoding::Identity).unwrap(),
                b"spans and more spans"
            );
        }
    }

    #[test]
    fn an_empty_message_is_a_message() {
        assert_eq!(
            read(&[&framed(0, b"")], 0, Encoding::Identity).unwrap(),
            b""
        );
    }

    #[test]
    fn a_message_over_the_limit_is_refused_from_its_prefix() {
        let prefix = &framed(0, &[7; 101])[..5];
        let refused = read(&[prefix], 100, Encoding::Identity).unwrap_err();
        assert_eq!(refused.code, code::RESOURCE_EXHAUSTED);
        assert_eq!(
            refused.message,
            "Received message larger than max (101 vs. 100)"
        );
    }

    #[test]
    fn what_is_not_one_whole_message_is_refused() {
        let body = framed(0, b"abc");
        let mut longer = framed(0, b"a");
        longer.extend_from_slice(b"and more in the same chunk");
        assert_eq!(
            read(&[&longer], 100, Encoding::Identity).unwrap_err().code,
            code::UNIMPLEMENTED
        );
        let cases: [(&[&[u8]], u32); 4] = [
            (&[], code::INTERNAL),
            (&[&body[..3]], code::INTERNAL),
            (&[&body[..6]], code::INTERNAL),
            (&[&body, &body], code::UNIMPLEMENTED),
        ];
        for (chunks, expected) in cases {
            assert_eq!(
                read(chunks, 100, Encoding::Identity).unwrap_err().code,
                expected
            );
        }
        let flagged = framed(2, b"abc");
        assert_eq!(
            read(&[&flagged], 100, Encoding::Gzip).unwrap_err().code,
            code::INTERNAL
        );
    }

    #[test]
    fn gzip_is_inflated_within_the_limit() {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
        encoder.write_all(&[b'x'; 1000]).unwrap();
        let compressed = encoder.finish().unwrap();
        let body = framed(1, &compressed);
        assert_eq!(
            read(&[&body], 1000, Encoding::Gzip).unwrap(),
            vec![b'x'; 1000]
        );
        let bomb = read(&[&body], 999, Encoding::Gzip).unwrap_err();
        assert_eq!(bomb.code, code::RESOURCE_EXHAUSTED);
        let flagged_without_encoding = read(&[&body], 1000, Encoding::Identity).unwrap_err();
        assert_eq!(flagged_without_encoding.code, code::INTERNAL);
        let cut = framed(1, &compressed[..compressed.len() - 6]);
        assert_eq!(
            read(&[&cut], 1000, Encoding::Gzip).unwrap_err().code,
            code::INTERNAL
        );
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_in_any_chunks_give_an_outcome_never_a_panic(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
            cuts in proptest::collection::vec(0usize..64, 0..4),
            gzip in proptest::bool::ANY,
        ) {
            let mut cuts = cuts.into_iter().map(|cut| cut.min(bytes.len())).collect::<Vec<_>>();
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut start = 0;
            for cut in cuts.into_iter().chain([bytes.len()]) {
                chunks.push(&bytes[start..cut]);
                start = cut;
            }
            let encoding = if gzip { Encoding::Gzip } else { Encoding::Identity };
            let _ = read(&chunks, 32, encoding);
        }

        #[test]
        fn a_framed_message_in_any_chunks_is_read_as_sent(
            message in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
            cut in 0usize..70,
        ) {
            let body = framed(0, &message);
            let (first, second) = body.split_at(cut.min(body.len()));
            proptest::prop_assert_eq!(read(&[first, second], 64, Encoding::Identity).unwrap(), message);
        }
    }

    #[test]
    fn encodings_other_than_identity_and_gzip_are_unimplemented() {
        assert_eq!(Encoding::of(None), Ok(Encoding::Identity));
        assert_eq!(Encoding::of(Some(b"gzip")), Ok(Encoding::Gzip));
        assert_eq!(
            Encoding::of(Some(b"snappy")).unwrap_err().code,
            code::UNIMPLEMENTED
        );
    }

    #[test]
    fn the_answer_is_framed_and_its_headers_encoded() {
        assert_eq!(Outcome::ok(b"ok".to_vec()).framed(), framed(0, b"ok"));
        let mut error = Outcome::error(code::UNAVAILABLE, "100% gone\nélan");
        error.details = Some(vec![0xff, 0, 1]);
        assert_eq!(error.encoded_message(), "100%25 gone%0A%C3%A9lan");
        assert_eq!(error.encoded_details().as_deref(), Some("/wAB"));
    }
}
