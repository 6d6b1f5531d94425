//! The table of stable codes.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// gRPC status codes, mirrored here so the table needs no gRPC dependency.
///
/// The discriminants are the canonical numeric codes of `google.rpc.Code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum GrpcCode {
    /// 3
    InvalidArgument = 3,
    /// 4
    DeadlineExceeded = 4,
    /// 5
    NotFound = 5,
    /// 6
    AlreadyExists = 6,
    /// 7
    PermissionDenied = 7,
    /// 8
    ResourceExhausted = 8,
    /// 9
    FailedPrecondition = 9,
    /// 13
    Internal = 13,
    /// 14
    Unavailable = 14,
    /// 16
    Unauthenticated = 16,
}

/// Whether and how a caller may retry after this error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RetryClass {
    /// Retrying the same request gives the same answer: fix the request.
    Never,
    /// A transient fault: retry with backoff (only if the tool is idempotent).
    Backoff,
    /// A limit was hit: retry after the hinted delay.
    AfterDelay,
    /// A person must act first (grant consent, buy a subscription), then retry.
    AfterUserAction,
}

macro_rules! codes {
    ($( $(#[$doc:meta])* $variant:ident = $id:literal, $http:literal, $grpc:ident, $retry:ident, $msg:literal; )*) => {
        /// A stable error code. The string form (e.g. `TOOL.NOT_FOUND`) never changes meaning.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum ErrorCode {
            $( $(#[$doc])* $variant, )*
        }

        /// Every code with its HTTP status, gRPC code, retry class and default safe message,
        /// in declaration order (`CODES[code as usize].code == code`).
        pub const CODES: &[CodeSpec] = &[
            $( CodeSpec {
                code: ErrorCode::$variant,
                id: $id,
                http_status: $http,
                grpc: GrpcCode::$grpc,
                retry: RetryClass::$retry,
                default_message: $msg,
            }, )*
        ];
    };
}

codes! {
    /// Input or output did not match its JSON Schema, or a required request field is missing.
    SchemaValidationFailed = "SCHEMA.VALIDATION_FAILED", 400, InvalidArgument, Never, "the request does not match the schema";
    /// No valid credentials were presented.
    AuthUnauthenticated = "AUTH.UNAUTHENTICATED", 401, Unauthenticated, Never, "authentication required";
    /// The subject is authenticated but not allowed to do this.
    AuthForbidden = "AUTH.FORBIDDEN", 403, PermissionDenied, Never, "not allowed";
    /// Policy denies this tool to this subject.
    PolicyDenyTool = "POLICY.DENY_TOOL", 403, PermissionDenied, Never, "policy denies this tool";
    /// The tool needs a valid consent token for this subject and call.
    ConsentRequired = "CONSENT.REQUIRED", 403, PermissionDenied, AfterUserAction, "consent is required for this tool";
    /// No consent request of that id is the caller's to see (another tenant's
    /// answers the same, so the answer reveals nothing).
    ConsentRequestNotFound = "CONSENT.REQUEST_NOT_FOUND", 404, NotFound, Never, "no such consent request";
    /// The consent request was already approved or declined, or expired while
    /// pending: it cannot be decided (again).
    ConsentRequestDecided = "CONSENT.REQUEST_DECIDED", 409, FailedPrecondition, Never, "the consent request is no longer pending";
    /// The tool belongs to a skill that requires a subscription.
    SubscriptionRequired = "SUBSCRIPTION.REQUIRED", 402, FailedPrecondition, AfterUserAction, "a subscription is required for this tool";
    /// A skill called a tool it does not import.
    SkillNotImported = "SKILL.NOT_IMPORTED", 403, PermissionDenied, Never, "the calling skill does not import this tool";
    /// No such tool is visible to the caller.
    ToolNotFound = "TOOL.NOT_FOUND", 404, NotFound, Never, "tool not found";
    /// The tool exists but is not enabled (paused, deprecated or never enabled).
    ToolDisabled = "TOOL.DISABLED", 403, FailedPrecondition, Never, "tool is disabled";
    /// An idempotency key was reused with different arguments.
    IdempotencyConflict = "IDEMPOTENCY.CONFLICT", 409, AlreadyExists, Never, "idempotency key reused with different arguments";
    /// A budget (calls, bytes, CPU) is exhausted for the window.
    QuotaBudgetExceeded = "QUOTA.BUDGET_EXCEEDED", 429, ResourceExhausted, AfterDelay, "budget exceeded";
    /// A rate limit is hit.
    QuotaRateLimited = "QUOTA.RATE_LIMITED", 429, ResourceExhausted, AfterDelay, "rate limited";
    /// The quota backend (Redis) cannot be reached, and quota fails closed: the call
    /// is refused before execution because its limits cannot be checked — not
    /// because a limit was hit.
    QuotaUnavailable = "QUOTA.UNAVAILABLE", 503, Unavailable, Backoff, "quota backend unavailable; call refused";
    /// The planned operation is outside the call's capability profile.
    SandboxCapabilityBlocked = "SANDBOX.CAPABILITY_BLOCKED", 403, PermissionDenied, Never, "operation outside the granted capabilities";
    /// The tool ran and failed, or produced output that violates its contract.
    ToolExecutionFailed = "TOOL.EXECUTION_FAILED", 500, Internal, Never, "tool execution failed";
    /// The tool's provider (service, process, module) could not be reached or started.
    ProviderUnavailable = "PROVIDER.UNAVAILABLE", 502, Unavailable, Backoff, "tool provider unavailable";
    /// The tool did not finish within its timeout.
    ProviderTimeout = "PROVIDER.TIMEOUT", 504, DeadlineExceeded, Backoff, "tool timed out";
    /// Evidence cannot be recorded, so the call is refused before execution (fail closed).
    EvidenceUnavailable = "EVIDENCE.UNAVAILABLE", 503, Unavailable, Backoff, "evidence store unavailable; call refused";
    /// No evidence is recorded for this call, or the call is not the caller's
    /// tenant's (the two answers are the same, so the second reveals nothing).
    EvidenceNotFound = "EVIDENCE.NOT_FOUND", 404, NotFound, Never, "no evidence is recorded for this call";
    /// A tool manifest failed registration-time validation.
    ManifestInvalid = "MANIFEST.INVALID", 400, InvalidArgument, Never, "the tool manifest is invalid";
    /// A registry operation conflicts with the current state (illegal transition, version rule).
    RegistryConflict = "REGISTRY.CONFLICT", 409, FailedPrecondition, Never, "the registry change conflicts with the current state";
    /// Configuration is invalid.
    ConfigInvalid = "CONFIG.INVALID", 400, InvalidArgument, Never, "the configuration is invalid";
    /// Truly unclassified: a bug. Kept under 0.1% of errors (SLO-5).
    UnknownInternal = "UNKNOWN.INTERNAL", 500, Internal, Backoff, "internal error";
}

/// One row of [`CODES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeSpec {
    /// The code.
    pub code: ErrorCode,
    /// Its stable string form, `DOMAIN.REASON`.
    pub id: &'static str,
    /// The HTTP status an HTTP adapter answers with.
    pub http_status: u16,
    /// The gRPC status code a gRPC adapter answers with.
    pub grpc: GrpcCode,
    /// Whether and how to retry.
    pub retry: RetryClass,
    /// A safe message used when the raiser gives none.
    pub default_message: &'static str,
}

impl ErrorCode {
    /// Every code, in table order.
    pub fn all() -> impl Iterator<Item = ErrorCode> {
        CODES.iter().map(|s| s.code)
    }

    /// This code's row in [`CODES`].
    pub fn spec(self) -> &'static CodeSpec {
        // The macro emits CODES in declaration order; a test proves the invariant.
        &CODES[self as usize]
    }

    /// The stable string form, e.g. `TOOL.NOT_FOUND`.
    pub fn as_str(self) -> &'static str {
        self.spec().id
    }

    /// The HTTP status for this code.
    pub fn http_status(self) -> u16 {
        self.spec().http_status
    }

    /// The gRPC status code for this code.
    pub fn grpc(self) -> GrpcCode {
        self.spec().grpc
    }

    /// The retry class for this code.
    pub fn retry(self) -> RetryClass {
        self.spec().retry
    }

    /// Looks a code up by its string form.
    pub fn parse(id: &str) -> Option<ErrorCode> {
        CODES.iter().find(|s| s.id == id).map(|s| s.code)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ErrorCode::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown error code {s:?}")))
    }
}

/// The stable string of every code, in table order: the schema of what
/// [`Serialize`] writes.
impl JsonSchema for ErrorCode {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ErrorCode".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let ids: Vec<&str> = CODES.iter().map(|c| c.id).collect();
        schemars::json_schema!({
            "description": "A stable error code (`DOMAIN.REASON`); its meaning never changes, and each has one HTTP status.",
            "type": "string",
            "enum": ids,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// The R5 codes that PRODUCT.md requires, with the statuses it names.
    const REQUIRED: &[(&str, u16)] = &[
        ("SCHEMA.VALIDATION_FAILED", 400),
        ("AUTH.UNAUTHENTICATED", 401),
        ("AUTH.FORBIDDEN", 403),
        ("POLICY.DENY_TOOL", 403),
        ("CONSENT.REQUIRED", 403),
        ("SUBSCRIPTION.REQUIRED", 402),
        ("SKILL.NOT_IMPORTED", 403),
        ("TOOL.NOT_FOUND", 404),
        ("TOOL.DISABLED", 403),
        ("IDEMPOTENCY.CONFLICT", 409),
        ("QUOTA.BUDGET_EXCEEDED", 429),
        ("QUOTA.RATE_LIMITED", 429),
        ("SANDBOX.CAPABILITY_BLOCKED", 403),
        ("TOOL.EXECUTION_FAILED", 500),
        ("PROVIDER.UNAVAILABLE", 502),
        ("PROVIDER.TIMEOUT", 504),
        ("UNKNOWN.INTERNAL", 500),
        ("EVIDENCE.UNAVAILABLE", 503),
        ("QUOTA.UNAVAILABLE", 503),
    ];

    #[test]
    fn table_is_indexed_by_discriminant() {
        for (i, spec) in CODES.iter().enumerate() {
            assert_eq!(spec.code as usize, i, "{} is out of order", spec.id);
            assert_eq!(spec.code.spec(), spec);
        }
    }

    #[test]
    fn every_required_code_is_present_with_its_status() {
        for (id, http) in REQUIRED {
            let code = ErrorCode::parse(id).unwrap_or_else(|| panic!("{id} missing"));
            assert_eq!(code.http_status(), *http, "{id}");
        }
    }

    #[test]
    fn codes_are_unique_and_well_formed() {
        let mut seen = HashSet::new();
        for spec in CODES {
            assert!(seen.insert(spec.id), "duplicate {}", spec.id);
            let (domain, reason) = spec.id.split_once('.').expect("DOMAIN.REASON");
            assert!(!domain.is_empty() && !reason.is_empty());
            assert!(
                spec.id
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '.' || c == '_'),
                "{}",
                spec.id
            );
            assert!((400..600).contains(&spec.http_status), "{}", spec.id);
            assert!(!spec.default_message.is_empty());
        }
    }

    #[test]
    fn status_classes_agree() {
        for spec in CODES {
            match spec.http_status {
                429 => assert_eq!(spec.retry, RetryClass::AfterDelay, "{}", spec.id),
                502..=504 => assert_eq!(spec.retry, RetryClass::Backoff, "{}", spec.id),
                _ => {}
            }
            if spec.grpc == GrpcCode::ResourceExhausted {
                assert_eq!(spec.http_status, 429, "{}", spec.id);
            }
        }
    }

    #[test]
    fn serde_uses_the_stable_string() {
        let json = serde_json::to_string(&ErrorCode::ToolNotFound).unwrap();
        assert_eq!(json, "\"TOOL.NOT_FOUND\"");
        let back: ErrorCode = serde_json::from_str(&json).unwrap();
        assert_eq!(back, ErrorCode::ToolNotFound);
        assert!(serde_json::from_str::<ErrorCode>("\"NOPE.NOPE\"").is_err());
    }
}
