//! The compiled engine of otel-guard-processor.
//!
//! Layers, each fed by the one before: [`decode`] (a request's bytes -> spans, read once, in
//! place), [`dialects`] (a span -> a call or not, by the dialect table), [`calls`] (the one-call
//! rules: calls -> hops), [`graph`] (paths, cycles, edges, decisions, trees, in bounded state:
//! [`graph::Engine`]). The Python service calls in once per request through the binding
//! (`binding.rs`, built with the `python` feature), never once per span.
#![deny(unsafe_code)]

pub mod budget;
pub mod calls;
pub mod decode;
pub mod dialects;
pub mod graph;
#[cfg(feature = "grpc")]
pub mod grpc;
#[cfg(feature = "h2-forwarder")]
pub mod grpc_client;
#[cfg(feature = "tonic-forwarder")]
mod grpc_client_tonic;
mod ids;
pub mod kept_room;
mod keys;
mod lru;

#[cfg(feature = "python")]
mod binding;
#[cfg(feature = "python")]
mod budget_binding;
#[cfg(feature = "python")]
mod grpc_binding;
#[cfg(all(feature = "python", feature = "h2-forwarder"))]
mod grpc_client_binding;
