//! gRPC's framing of a unary call, on bytes: the request's one length-prefixed message (gzip or
//! not) in, the status and the response's message out.
//!
//! A call's body is a 5-byte prefix (a compressed flag, then the length, big-endian) and the
//! message. The message is kept where it arrived: [`Body`] fills one buffer, sized from the prefix
//! (up to 1 MiB ahead of the bytes), and the request's bytes are a range of it.

use std::io::Read;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use flate2::read::GzDecoder;
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

/// gRPC status codes this module answers with itself.
pub mod code {
    pub const OK: u32 = 0;
    pub const CANCELLED: u32 = 1;
    pub const INTERNAL: u32 = 13;
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    pub const UNIMPLEMENTED: u32 = 12;
    pub const UNAVAILABLE: u32 = 14;
}

const PREFIX: usize = 5;
/// The most a call's buffer takes ahead of its bytes (a larger message grows it as it arrives).
const RESERVE: usize = 1 << 20;

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

/// A unary call's body as its chunks arrive: one message, at most `max` bytes (compressed or not).
#[derive(Debug)]
pub struct Body {
    max: usize,
    buffer: Vec<u8>,
    expected: Option<usize>,
}

/// A request message read whole: `bytes[start..]` is the message.
#[derive(Debug)]
pub struct Message {
    pub bytes: Vec<u8>,
    pub start: usize,
}

impl Message {
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[self.start..]
    }
}

impl Body {
    pub fn new(max: usize) -> Self {
        Body {
            max,
            buffer: Vec::new(),
            expected: None,
        }
    }

    /// Take the next chunk; an error outcome once the message is larger than `max` or a second
    /// message follows it.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), Outcome> {
        self.buffer.extend_from_slice(chunk);
        if self.expected.is_none() && self.buffer.len() >= PREFIX {
            let length = u32::from_be_bytes([
                self.buffer[1],
                self.buffer[2],
                self.buffer[3],
                self.buffer[4],
            ]) as usize;
            if length > self.max {
                return Err(too_large(length, self.max));
            }
            // Sized from the prefix, but no more than RESERVE before the bytes come: a prefix
            // alone must not hold memory.
            let wanted = (PREFIX + length).min(RESERVE);
            self.buffer
                .reserve_exact(wanted.saturating_sub(self.buffer.len()));
            self.expected = Some(PREFIX + length);
        }
        match self.expected {
            Some(expected) if self.buffer.len() > expected => Err(Outcome::error(
                code::UNIMPLEMENTED,
                "more than one request message in a unary call",
            )),
            _ => Ok(()),
        }
    }

    /// The message, once the client ended the body: decompressed when its flag says so.
    pub fn finish(self, encoding: Encoding) -> Result<Message, Outcome> {
        let Some(expected) = self.expected else {
            return Err(Outcome::error(
                code::INTERNAL,
                "the call has no request message",
            ));
        };
        if self.buffer.len() < expected {
            return Err(Outcome::error(
                code::INTERNAL,
                format!(
                    "the request message ended after {} of its {} bytes",
                    self.buffer.len() - PREFIX,
                    expected - PREFIX
                ),
            ));
        }
        match (self.buffer[0], encoding) {
            (0, _) => Ok(Message {
                bytes: self.buffer,
                start: PREFIX,
            }),
            (1, Encoding::Gzip) => {
                gunzip(&self.buffer[PREFIX..], self.max).map(|bytes| Message { bytes, start: 0 })
            }
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
}

fn too_large(length: usize, max: usize) -> Outcome {
    Outcome::error(
        code::RESOURCE_EXHAUSTED,
        format!("Received message larger than max ({length} vs. {max})"),
    )
}

/// The message inflated, at most `max` bytes of it.
fn gunzip(compressed: &[u8], max: usize) -> Result<Vec<u8>, Outcome> {
    let mut inflated = Vec::with_capacity(compressed.len().saturating_mul(4).min(max));
    let read = GzDecoder::new(compressed)
        .take(max as u64 + 1)
        .read_to_end(&mut inflated);
    match read {
        Err(error) => Err(Outcome::error(
            code::INTERNAL,
            format!("the request message does not inflate as gzip: {error}"),
        )),
        Ok(length) if length > max => Err(Outcome::error(
            code::RESOURCE_EXHAUSTED,
            format!("Received message larger than max (more than {max} bytes inflated)"),
        )),
        Ok(_) => Ok(inflated),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::Compression;
    use flate2::write::GzEncoder;
    use std::io::Write;

    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut body = vec![flag];
        body.extend_from_slice(&(message.len() as u32).to_be_bytes());
        body.extend_from_slice(message);
        body
    }

    fn read(chunks: &[&[u8]], max: usize, encoding: Encoding) -> Result<Vec<u8>, Outcome> {
        let mut body = Body::new(max);
        for chunk in chunks {
            body.push(chunk)?;
        }
        body.finish(encoding)
            .map(|message| message.as_slice().to_vec())
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
