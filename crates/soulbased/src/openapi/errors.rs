//! The error responses: one shared response per HTTP status, each the `Error`
//! envelope ([`ErrorBody`]) described by the stable codes answered with that
//! status (`soulbase_errors::CODES`); and an invoke's, which answers the whole
//! `CallResult` with its code's status.

use serde_json::{Map, Value, json};
use soulbase_errors::{CODES, ErrorCode};

use super::{Spec, described};
use crate::bodies::ErrorBody;

/// A status failures are answered with: its shared response's name and what it
/// means beyond the codes' own names.
struct Failure {
    status: u16,
    name: &'static str,
    note: &'static str,
}

/// Every status an operation may list among its failures.
const FAILURES: &[Failure] = &[
    Failure {
        status: 400,
        name: "BadRequest",
        note: "The request is at fault; for `SCHEMA.VALIDATION_FAILED`, `fields.field` names the part (a query parameter, a body member, a header, a path parameter).",
    },
    Failure {
        status: 401,
        name: "Unauthenticated",
        note: "No valid credential (the reason is never told).",
    },
    Failure {
        status: 402,
        name: "PaymentRequired",
        note: "A subscription the tool needs is missing.",
    },
    Failure {
        status: 403,
        name: "Forbidden",
        note: "Authenticated but not allowed (e.g. an `x-soulbase-skill` claim without its scope, or another tenant named).",
    },
    Failure {
        status: 404,
        name: "NotFound",
        note: "Nothing of that name for the caller: another tenant's tool, skill or call answers the same, and so does an `x-soulbase-skill` naming no loaded skill.",
    },
    Failure {
        status: 408,
        name: "RequestTimeout",
        note: "`SCHEMA.VALIDATION_FAILED` (`fields.field`: `body`): the body did not arrive within `server.body_read_timeout_ms`; an HTTP/1 connection is closed.",
    },
    Failure {
        status: 409,
        name: "Conflict",
        note: "The change conflicts with the state it was made against.",
    },
    Failure {
        status: 413,
        name: "PayloadTooLarge",
        note: "`SCHEMA.VALIDATION_FAILED` (`fields.field`: `body`): the body is larger than `server.max_body_bytes`.",
    },
    Failure {
        status: 429,
        name: "TooManyRequests",
        note: "A limit was hit; `retry_after_ms` says when to retry.",
    },
    Failure {
        status: 500,
        name: "InternalError",
        note: "A fault of the server.",
    },
    Failure {
        status: 502,
        name: "BadGateway",
        note: "A service the server needs could not be reached: e.g. the auth role that checks credentials, or the model upstream.",
    },
    Failure {
        status: 503,
        name: "ServiceUnavailable",
        note: "A backend the server needs is unavailable.",
    },
    Failure {
        status: 504,
        name: "GatewayTimeout",
        note: "An upstream (a model, or a tool's provider) did not answer in time.",
    },
];

/// The stable codes answered with `status`, as a sentence (empty when none is:
/// 408 and 413 are the body limits', not a code's).
fn codes_answered(status: u16, except: &[ErrorCode]) -> String {
    let ids: Vec<String> = CODES
        .iter()
        .filter(|c| c.http_status == status && !except.contains(&c.code))
        .map(|c| format!("`{}`", c.id))
        .collect();
    match ids.as_slice() {
        [] => String::new(),
        [one] => format!(" Code: {one}."),
        [init @ .., last] => format!(" Codes: {} or {last}.", init.join(", ")),
    }
}

/// The shared error responses (`#/components/responses/…`).
pub(crate) fn shared_responses(spec: &mut Spec) -> Map<String, Value> {
    let error = spec.response::<ErrorBody>();
    FAILURES
        .iter()
        .map(|f| {
            let description = format!("{}{}", f.note, codes_answered(f.status, &[]));
            (
                f.name.to_owned(),
                json!({
                    "description": description,
                    "content": {"application/json": {"schema": error}},
                }),
            )
        })
        .collect()
}

/// A reference to the shared response of `status`; `None` when there is none.
pub(crate) fn failure(status: u16) -> Option<Value> {
    FAILURES
        .iter()
        .find(|f| f.status == status)
        .map(|f| json!({"$ref": format!("#/components/responses/{}", f.name)}))
}

/// The statuses a stable code is answered with, in order.
fn code_statuses() -> Vec<u16> {
    let mut statuses: Vec<u16> = CODES.iter().map(|c| c.http_status).collect();
    statuses.sort_unstable();
    statuses.dedup();
    statuses
}

/// The codes no call's `CallResult` carries: an unauthenticated caller gets the
/// envelope, and the others belong to other routes.
const NEVER_A_CALLS: &[ErrorCode] = &[
    ErrorCode::AuthUnauthenticated,
    ErrorCode::EvidenceNotFound,
    ErrorCode::RegistryConflict,
    ErrorCode::ConfigInvalid,
];

/// An invoke's failures: every code's status with the `CallResult` (the call
/// refused or failed), but an unauthenticated caller's (the envelope, as the
/// body limits'), and 502, which is either (a tool's provider unreachable, or
/// the auth role that checks the credential).
pub(crate) fn invoke_failures(spec: &mut Spec) -> Vec<(u16, Value)> {
    let call_result = described::call_result(spec);
    let error = spec.response::<ErrorBody>();
    let mut out = Vec::new();
    for status in code_statuses() {
        if status == 401 {
            continue;
        }
        let codes = codes_answered(status, NEVER_A_CALLS);
        let schema = if status == 502 {
            json!({"anyOf": [call_result, error]})
        } else {
            call_result.clone()
        };
        let what = if status == 502 {
            "A `CallResult` when the tool's provider could not be reached; the `Error` envelope when the auth role could not check the credential."
        } else {
            "A `CallResult`: `status: denied` when the call was refused before execution, `error` when the tool ran and failed."
        };
        out.push((
            status,
            json!({
                "description": format!("{what}{codes}"),
                "content": {"application/json": {"schema": schema}},
            }),
        ));
    }
    for status in [401, 408, 413] {
        if let Some(r) = failure(status) {
            out.push((status, r));
        }
    }
    out
}
