//! Conversion between [`SoulError`] and `tonic::Status` (feature `grpc`).
//!
//! The status carries the gRPC code from the table, the safe message, and an encoded
//! `soulbase.errors.v1.ErrorDetail` in its details so that a Soulbase client can
//! rebuild the exact public view on the other side.

use prost::Message;
use soulbase_proto::errors::v1::ErrorDetail;

use crate::{ErrorCode, GrpcCode, PublicError, SoulError};

fn tonic_code(code: GrpcCode) -> tonic::Code {
    tonic::Code::from_i32(code as i32)
}

impl SoulError {
    /// The `tonic::Status` for this error: table gRPC code, safe message, `ErrorDetail` details.
    pub fn to_status(&self) -> tonic::Status {
        let p = self.public();
        let detail = ErrorDetail {
            code: p.code.as_str().to_owned(),
            message: p.message.clone(),
            retry: p.retry_class_str().to_owned(),
            retry_after_ms: p.retry_after_ms.unwrap_or(0),
            correlation_id: p.correlation_id.clone().unwrap_or_default(),
            fields: p.fields.clone().into_iter().collect(),
        };
        tonic::Status::with_details(
            tonic_code(self.code().grpc()),
            p.message,
            detail.encode_to_vec().into(),
        )
    }

    /// Rebuilds an error from a status received from a peer.
    ///
    /// A status without a decodable `ErrorDetail` (e.g. a transport failure) maps to
    /// `PROVIDER.UNAVAILABLE` for `Unavailable`, `PROVIDER.TIMEOUT` for deadlines, and
    /// `UNKNOWN.INTERNAL` otherwise, with the status kept in the audit chain.
    pub fn from_status(status: &tonic::Status) -> SoulError {
        if let Ok(detail) = ErrorDetail::decode(status.details())
            && let Some(code) = ErrorCode::parse(&detail.code)
        {
            let public = PublicError {
                code,
                message: detail.message,
                fields: detail.fields.into_iter().collect(),
                retry: code.retry(),
                retry_after_ms: (detail.retry_after_ms > 0).then_some(detail.retry_after_ms),
                correlation_id: (!detail.correlation_id.is_empty())
                    .then_some(detail.correlation_id),
            };
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
