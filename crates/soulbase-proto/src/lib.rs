//! Rust types and gRPC stubs generated from the `.proto` contracts in `proto/`.
//!
//! The files under `src/gen/` are written by `cargo xtask codegen` (protox +
//! tonic-prost-build, no system `protoc`) and committed; `cargo xtask codegen --check`
//! fails when they are stale. Never edit them by hand.
//!
//! Modules mirror proto packages: `soulbase.errors.v1` is [`soulbase::errors::v1`],
//! re-exported for brevity as [`errors`]; `soulbase.tools.v1` (tool registry and
//! invoker services, clients and servers) as [`tools`].

#![allow(missing_docs, clippy::all, clippy::pedantic)]

include!("gen/mod.rs");

pub use soulbase::errors;
pub use soulbase::tools;

/// The encoded `FileDescriptorSet` of every contract, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("gen/descriptor.bin");
