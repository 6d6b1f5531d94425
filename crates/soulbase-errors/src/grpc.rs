//! Conversion between [`SoulError`] and `tonic::Status` (feature `grpc`).
//!
//! A failed call carries, in `grpc-status-details-bin`, a standard
//! `google.rpc.Status` (the same gRPC code and safe message) whose details hold:
//!
//! - `google.rpc.ErrorInfo` — `reason` is the stable code (`TOOL.NOT_FOUND`),
//!   `domain` is [`DOMAIN`], `metadata` the error's safe fields plus `retry` (the
//!   retry class) and `correlation_id` when there is one: what `grpcio-status` and
//!   the Go/Java equivalents decode;
//! - `google.rpc.RetryInfo` when the error says when to retry;
//! - `google.rpc.BadRequest` with one field violation when the error names the
//!   offending input (`field` or `pointer`);
//! - `soulbase.errors.v1.ErrorDetail` — the whole public view, so a Soulbase client
//!   rebuilds it exactly on the other side.

use prost::Message;
use prost_types::Any;
use soulbase_proto::errors::v1::ErrorDetail;
use tonic_types::pb::{BadRequest, ErrorInfo, RetryInfo, Status as RpcStatus, bad_request};

use crate::{ErrorCode, GrpcCode, PublicError, SoulError};

/// The `ErrorInfo.domain` of every Soulbase error.
pub const DOMAIN: &str = "soulbase.dev";

const TYPE_PREFIX: &str = "type.googleapis.com/";

fn tonic_code(code: GrpcCode) -> tonic::Code {
    tonic::Code::from_i32(code as i32)
}

fn any<M: Message>(name: &str, message: &M) -> Any {
    Any {
        type_url: format!("{TYPE_PREFIX}{name}"),
        value: message.encode_to_vec(),
    }
}

fn retry_info(after_ms: u64) -> RetryInfo {
    let ms = i64::try_from(after_ms).unwrap_or(i64::MAX);
    RetryInfo {
        retry_delay: Some(prost_types::Duration {
            seconds: ms / 1000,
            // Below 1,000,000,000: fits.
            nanos: i32::try_from((ms % 1000) * 1_000_000).unwrap_or(0),
        }),
    }
}

impl SoulError {
    /// The `tonic::Status` for this error: table gRPC code, safe message, and a
    /// `google.rpc.Status` with the details the module doc lists.
    pub fn to_status(&self) -> tonic::Status {
        let p = self.public();
        let code = tonic_code(self.code().grpc());
        let detail = ErrorDetail {
            code: p.code.as_str().to_owned(),
            message: p.message.clone(),
            retry: p.retry_class_str().to_owned(),
            retry_after_ms: p.retry_after_ms.unwrap_or(0),
            correlation_id: p.correlation_id.clone().unwrap_or_default(),
            fields: p.fields.clone().into_iter().collect(),
        };
        let mut metadata: std::collections::HashMap<String, String> =
            p.fields.clone().into_iter().collect();
        metadata.insert("retry".into(), p.retry_class_str().to_owned());
        if let Some(c) = &p.correlation_id {
            metadata.insert("correlation_id".into(), c.clone());
        }
        let mut details = vec![any(
            "google.rpc.ErrorInfo",
            &ErrorInfo {
                reason: p.code.as_str().to_owned(),
                domain: DOMAIN.to_owned(),
                metadata,
            },
        )];
        if let Some(ms) = p.retry_after_ms {
            details.push(any("google.rpc.RetryInfo", &retry_info(ms)));
        }
        if let Some(field) = p.fields.get("field").or_else(|| p.fields.get("pointer")) {
            details.push(any(
                "google.rpc.BadRequest",
                &BadRequest {
                    field_violations: vec![bad_request::FieldViolation {
                        field: field.clone(),
                        description: p.message.clone(),
                        ..Default::default()
                    }],
                },
            ));
        }
        details.push(any("soulbase.errors.v1.ErrorDetail", &detail));
        let status = RpcStatus {
            code: code as i32,
            message: p.message.clone(),
            details,
        };
        tonic::Status::with_details(code, p.message, status.encode_to_vec().into())
    }

    /// Rebuilds an error from a status received from a peer.
    ///
    /// Read from the `soulbase.errors.v1.ErrorDetail` in the `google.rpc.Status`
    /// (or, from an older peer, sent bare), else from its `ErrorInfo` when the
    /// reason is a stable code. A status with neither (e.g. a transport failure)
    /// maps to `PROVIDER.UNAVAILABLE` for `Unavailable`, `PROVIDER.TIMEOUT` for
    /// deadlines, and `UNKNOWN.INTERNAL` otherwise, with the status kept in the
    /// audit chain.
    pub fn from_status(status: &tonic::Status) -> SoulError {
        if let Some(public) = public_of(status.details()) {
            return SoulError::from_public(public);
        }
        let code = match status.code() {
            tonic::Code::Unavailable => ErrorCode::ProviderUnavailable,
            tonic::Code::DeadlineExceeded => ErrorCode::ProviderTimeout,
            tonic::Code::Unauthenticated => ErrorCode::AuthUnauthenticated,
            _ => ErrorCode::UnknownInternal,
        };
        SoulError::of(code).with_note(format!(
            "grpc status {:?}: {}",
            status.code(),
            status.message()
        ))
    }
}

/// The public view in a status's details (see [`SoulError::from_status`]).
fn public_of(details: &[u8]) -> Option<PublicError> {
    if let Ok(status) = RpcStatus::decode(details) {
        let of = |name: &str| {
            let url = format!("{TYPE_PREFIX}{name}");
            status.details.iter().find(|a| a.type_url == url)
        };
        if let Some(a) = of("soulbase.errors.v1.ErrorDetail")
            && let Some(p) = ErrorDetail::decode(a.value.as_slice())
                .ok()
                .and_then(from_detail)
        {
            return Some(p);
        }
        if let Some(a) = of("google.rpc.ErrorInfo")
            && let Ok(info) = ErrorInfo::decode(a.value.as_slice())
            && let Some(code) = ErrorCode::parse(&info.reason)
        {
            let mut fields: std::collections::BTreeMap<String, String> =
                info.metadata.into_iter().collect();
            fields.remove("retry");
            let correlation_id = fields.remove("correlation_id");
            let retry_after_ms = of("google.rpc.RetryInfo")
                .and_then(|a| RetryInfo::decode(a.value.as_slice()).ok())
                .and_then(|r| r.retry_delay)
                .map(|d| {
                    u64::try_from(d.seconds).unwrap_or(0) * 1000
                        + u64::try_from(d.nanos).unwrap_or(0) / 1_000_000
                });
            return Some(PublicError {
                code,
                message: status.message,
                fields,
                retry: code.retry(),
                retry_after_ms,
                correlation_id,
            });
        }
    }
    ErrorDetail::decode(details).ok().and_then(from_detail)
}

fn from_detail(detail: ErrorDetail) -> Option<PublicError> {
    let code = ErrorCode::parse(&detail.code)?;
    Some(PublicError {
        code,
        message: detail.message,
        fields: detail.fields.into_iter().collect(),
        retry: code.retry(),
        retry_after_ms: (detail.retry_after_ms > 0).then_some(detail.retry_after_ms),
        correlation_id: (!detail.correlation_id.is_empty()).then_some(detail.correlation_id),
    })
}

impl PublicError {
    fn retry_class_str(&self) -> &'static str {
        match self.retry {
            crate::RetryClass::Never => "never",
            crate::RetryClass::Backoff => "backoff",
            crate::RetryClass::AfterDelay => "after_delay",
            crate::RetryClass::AfterUserAction => "after_user_action",
        }
    }
}

impl From<SoulError> for tonic::Status {
    fn from(err: SoulError) -> Self {
        err.to_status()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::CODES;

    #[test]
    fn every_code_round_trips_through_status() {
        for spec in CODES {
            let err = SoulError::of(spec.code)
                .with_field("pointer", "/a")
                .with_correlation_id("c1")
                .retry_after(Duration::from_millis(7))
                .with_note("secret internal");
            let status = err.to_status();
            assert_eq!(status.code() as i32, spec.grpc as i32, "{}", spec.id);
            assert!(!status.message().contains("secret"));
            let back = SoulError::from_status(&status);
            assert_eq!(back.public(), err.public(), "{}", spec.id);
        }
    }

    #[test]
    fn the_status_is_a_standard_google_rpc_status() {
        let err = SoulError::of(ErrorCode::SchemaValidationFailed)
            .with_field("pointer", "/a")
            .with_correlation_id("c1")
            .retry_after(Duration::from_millis(1500));
        let status = err.to_status();
        let rpc = RpcStatus::decode(status.details()).unwrap();
        assert_eq!(rpc.code, status.code() as i32);
        assert_eq!(rpc.message, status.message());
        let urls: Vec<&str> = rpc.details.iter().map(|a| a.type_url.as_str()).collect();
        assert_eq!(
            urls,
            [
                "type.googleapis.com/google.rpc.ErrorInfo",
                "type.googleapis.com/google.rpc.RetryInfo",
                "type.googleapis.com/google.rpc.BadRequest",
                "type.googleapis.com/soulbase.errors.v1.ErrorDetail",
            ]
        );
        let info = ErrorInfo::decode(rpc.details[0].value.as_slice()).unwrap();
        assert_eq!(info.reason, "SCHEMA.VALIDATION_FAILED");
        assert_eq!(info.domain, DOMAIN);
        assert_eq!(info.metadata["pointer"], "/a");
        assert_eq!(info.metadata["correlation_id"], "c1");
        let retry = RetryInfo::decode(rpc.details[1].value.as_slice()).unwrap();
        let delay = retry.retry_delay.unwrap();
        assert_eq!((delay.seconds, delay.nanos), (1, 500_000_000));
        let bad = BadRequest::decode(rpc.details[2].value.as_slice()).unwrap();
        assert_eq!(bad.field_violations[0].field, "/a");
    }

    #[test]
    fn error_info_alone_and_a_bare_error_detail_are_understood() {
        let err = SoulError::of(ErrorCode::QuotaRateLimited)
            .with_field("tool_id", "x.y.z")
            .with_correlation_id("c2")
            .retry_after(Duration::from_millis(250));
        let mut rpc = RpcStatus::decode(err.to_status().details()).unwrap();
        // A peer that keeps only the standard details (a proxy re-encoding them).
        rpc.details.retain(|a| !a.type_url.ends_with("ErrorDetail"));
        let status = tonic::Status::with_details(
            tonic::Code::ResourceExhausted,
            err.public().message,
            rpc.encode_to_vec().into(),
        );
        assert_eq!(SoulError::from_status(&status).public(), err.public());
        // An older peer that sent the ErrorDetail bare.
        let p = err.public();
        let bare = ErrorDetail {
            code: p.code.as_str().to_owned(),
            message: p.message.clone(),
            retry: p.retry_class_str().to_owned(),
            retry_after_ms: 250,
            correlation_id: "c2".into(),
            fields: p.fields.clone().into_iter().collect(),
        };
        let status = tonic::Status::with_details(
            tonic::Code::ResourceExhausted,
            p.message.clone(),
            bare.encode_to_vec().into(),
        );
        assert_eq!(SoulError::from_status(&status).public(), err.public());
    }

    #[test]
    fn bare_statuses_map_sensibly() {
        let s = tonic::Status::unavailable("connection refused");
        assert_eq!(
            SoulError::from_status(&s).code(),
            ErrorCode::ProviderUnavailable
        );
        let s = tonic::Status::deadline_exceeded("slow");
        assert_eq!(
            SoulError::from_status(&s).code(),
            ErrorCode::ProviderTimeout
        );
        let s = tonic::Status::internal("boom");
        let e = SoulError::from_status(&s);
        assert_eq!(e.code(), ErrorCode::UnknownInternal);
        assert!(e.audit().causes[0].contains("boom"));
    }
}
