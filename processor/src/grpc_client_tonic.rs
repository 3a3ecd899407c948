//! The engine's gRPC client's calls made by tonic (cargo feature `tonic-forwarder`): the well-kept
//! stack weighed beside the h2 one for the forwarder (`docs/processor.md`, *The forwarder's
//! client*). The same [`crate::grpc_client::Channel`] around it (calls in, answers out, the size
//! check and the deadline); here only the exchange.
//!
//! What a reader would not guess: tonic's channel reconnects by itself (no backoff of ours), its
//! codec copies the request into its own buffer, so a request in flight is held twice, as with
//! grpcio, and its own deadline ends a call CANCELLED, which is answered DEADLINE_EXCEEDED here.

use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use tokio::time::Instant;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::{MetadataKey, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

use crate::grpc::message::{Outcome, code};
use crate::grpc_client::{Call, Options};

/// Messages as the bytes they are, both ways.
#[derive(Clone, Copy)]
struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

pub(crate) struct TonicCaller {
    options: Options,
    channel: Result<Channel, String>,
}

impl TonicCaller {
    /// Made on the client's runtime (tonic's channel spawns its worker there); connects lazily.
    pub(crate) fn new(target: &str, options: Options) -> Self {
        let channel = Endpoint::from_shared(format!("http://{target}"))
            .map(|endpoint| {
                endpoint
                    .connect_timeout(options.connect_timeout)
                    .tcp_nodelay(true)
                    .initial_stream_window_size(1 << 20)
                    .initial_connection_window_size(2 << 20)
                    .connect_lazy()
            })
            .map_err(|error| format!("{target} is not an address: {error}"));
        TonicCaller { options, channel }
    }

    pub(crate) fn options(&self) -> &Options {
        &self.options
    }

    pub(crate) async fn exchange(&self, call: Call, deadline: Instant) -> Result<Outcome, Outcome> {
        let channel = self
            .channel
            .as_ref()
            .map_err(|why| Outcome::error(code::UNAVAILABLE, why.clone()))?;
        let path = PathAndQuery::try_from(call.method.as_str())
            .map_err(|error| Outcome::error(code::INTERNAL, error.to_string()))?;
        let mut grpc = tonic::client::Grpc::new(channel.clone())
            .max_encoding_message_size(usize::MAX)
            .max_decoding_message_size(self.options.max_receive_bytes)
            .accept_compressed(CompressionEncoding::Gzip);
        if self.options.gzip {
            grpc = grpc.send_compressed(CompressionEncoding::Gzip);
        }
        let mut request = Request::new(call.message);
        request.set_timeout(deadline.saturating_duration_since(Instant::now()));
        for (name, value) in &call.headers {
            let (Ok(name), Ok(value)) = (
                MetadataKey::from_bytes(name.as_bytes()),
                MetadataValue::try_from(value.as_str()),
            ) else {
                return Err(Outcome::error(
                    code::INTERNAL,
                    "a forwarded header cannot be sent as metadata",
                ));
            };
            request.metadata_mut().append(name, value);
        }
        grpc.ready().await.map_err(|error| {
            Outcome::error(
                code::UNAVAILABLE,
                format!("failed to connect to the downstream: {error}"),
            )
        })?;
        match grpc.unary(request, path, Raw).await {
            Ok(response) => Ok(Outcome::ok(response.into_inner().to_vec())),
            // tonic answers its own deadline CANCELLED ("Timeout expired"): what gRPC calls it.
            Err(status)
                if status.code() == tonic::Code::Cancelled && Instant::now() >= deadline =>
            {
                Ok(Outcome::error(code::DEADLINE_EXCEEDED, "Deadline Exceeded"))
            }
            Err(status) => {
                let mut outcome = Outcome::error(status.code() as u32, status.message());
                if !status.details().is_empty() {
                    outcome.details = Some(status.details().to_vec());
                }
                Ok(outcome)
            }
        }
    }
}
