//! Soulbase's stable error codes and the one error type every layer returns.
//!
//! A caller (an LLM, an API client, an operator) only ever sees a [`PublicError`]:
//! a stable code such as `TOOL.NOT_FOUND`, a safe message, a retry hint and a
//! correlation id. The cause chain — driver errors, file paths, stack context — goes
//! only to the [`AuditError`] view, which is for logs and evidence.
//!
//! [`CODES`] is the single table mapping each [`ErrorCode`] to its HTTP status, gRPC
//! code and [`RetryClass`]; every protocol adapter reads it rather than keeping its
//! own mapping. With the `grpc` feature, [`SoulError`] converts to and from a
//! `tonic::Status` whose details carry `soulbase.errors.v1.ErrorDetail`.
//!
//! This crate does no IO.

mod codes;
mod error;
#[cfg(feature = "grpc")]
mod grpc;

pub use codes::{CODES, CodeSpec, ErrorCode, GrpcCode, RetryClass};
pub use error::{AuditError, PublicError, SoulError};

/// Shorthand for results whose error is a [`SoulError`].
pub type SoulResult<T> = Result<T, SoulError>;
