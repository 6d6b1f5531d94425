//! The evidence records the database refused for good, kept in the spool's
//! quarantine file (`docs/evidence.md`, "Quarantine") — the console's quarantine
//! page:
//!
//! | Route | What |
//! |---|---|
//! | `GET /api/quarantine` | the records; action `read_evidence` on `soulbase.server.quarantine` |
//! | `POST /api/quarantine/retry` | offers them to the database again; action `update` on `soulbase.server.quarantine`, operators only |
//!
//! Reading: a caller sees only its own tenant's records; a caller of the
//! `global` tenant (the operator) sees every one, the unreadable lines included.
//!
//! Retrying offers the whole file — every tenant's records — so only a caller
//! of the `global` tenant may, and only with action `update` on
//! [`Action::QUARANTINE_RESOURCE`]; anyone else is refused (`AUTH.FORBIDDEN`,
//! field `tenant`, when policy would allow it). The running sink's drainer does
//! it, with the store it drains into (the database, or the remote evidence role):
//! what the store takes leaves the file, what it still refuses stays with its
//! reason now, unreadable lines stay. The retry is audited
//! (`evidence.quarantine_retry`) when it changed the file. Each process offers
//! its own spool's quarantine (replicas have one each).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use schemars::JsonSchema;
use serde::Serialize;
use soulbase_auth::{Action, AuthzRequest};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{TenantId, ToolId};

use crate::app::App;
use crate::http_api::{answer, subject};

/// How the records leave the quarantine.
pub const RETRY: &str = "an operator (a caller of the global tenant with action `update` on \
                         soulbase.server.quarantine) offers them to the database again with \
                         POST /api/quarantine/retry, or, with the server stopped, \
                         `soulbase evidence quarantine retry`; what the database takes leaves \
                         the file";

/// One quarantined line.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct QuarantinedRecord {
    /// Its line in the quarantine file, from 1.
    pub line: u64,
    /// Why the database refused it, as it said then.
    pub refused: String,
    /// Why the line cannot be read now, when it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
    /// The record's envelope id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `begin`, `end`, `denied` or `conversation`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The call (or conversation) it belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// Its tenant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// `GET /api/quarantine`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct QuarantineList {
    /// The records the caller may see, in file order.
    pub records: Vec<QuarantinedRecord>,
    /// How to offer them to the database again.
    pub retry: &'static str,
}

/// The caller, once policy allows it `action` on `soulbase.server.quarantine`.
async fn authorized(
    app: &App,
    headers: &HeaderMap,
    action: Action,
) -> Result<soulbase_types::Subject, SoulError> {
    let subject = subject(app, headers).await?;
    let resource = ToolId::new(Action::QUARANTINE_RESOURCE).map_err(SoulError::internal)?;
    app.authorizer
        .authorize(AuthzRequest {
            subject: &subject,
            tool: &resource,
            tool_tenant: None,
            action,
            tool_scopes: &[],
        })
        .await?;
    Ok(subject)
}

async fn list(app: &App, headers: &HeaderMap) -> Result<QuarantineList, SoulError> {
    let subject = authorized(app, headers, Action::ReadEvidence).await?;
    let operator = subject.tenant == TenantId::global();
    let entries = {
        let snap = app.config.current();
        soulbase_app::evidence::quarantined(snap.config())?
    };
    let records = entries
        .into_iter()
        .filter(|e| {
            operator
                || e.head
                    .as_ref()
                    .is_some_and(|h| h.tenant == subject.tenant.as_str())
        })
        .map(|e| {
            let head = e.head;
            QuarantinedRecord {
                line: e.line as u64,
                refused: e.refused,
                unreadable: e.unreadable,
                id: head.as_ref().map(|h| h.id.clone()),
                kind: head.as_ref().map(|h| h.kind.clone()),
                call_id: head.as_ref().map(|h| h.call_id.clone()),
                tenant: head.map(|h| h.tenant),
            }
        })
        .collect();
    Ok(QuarantineList {
        records,
        retry: RETRY,
    })
}

/// `GET /api/quarantine`: the quarantined evidence records the caller may see.
pub(crate) async fn list_quarantine(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    answer(&app, StatusCode::OK, list(&app, &headers).await)
}

/// `POST /api/quarantine/retry`: what offering the quarantine again did.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct QuarantineRetry {
    /// Records the database took: they left the quarantine file.
    pub stored: u64,
    /// Records it refused again: they stay, with the reason it gave now.
    pub still_refused: u64,
    /// Lines that cannot be read: they stay as they are.
    pub unreadable: u64,
    /// Lines the quarantine file holds now (`still_refused + unreadable`).
    pub remaining: u64,
}

async fn retry(app: &App, headers: &HeaderMap) -> Result<QuarantineRetry, SoulError> {
    let subject = authorized(app, headers, Action::Update).await?;
    if subject.tenant != TenantId::global() {
        return Err(SoulError::new(
            ErrorCode::AuthForbidden,
            "only an operator (a caller of the global tenant) offers the quarantine again: \
             it holds every tenant's records",
        )
        .with_field("field", "tenant"));
    }
    let report = app.retry_quarantine(&subject).await?;
    let count = |n: usize| n as u64;
    Ok(QuarantineRetry {
        stored: count(report.stored),
        still_refused: count(report.refused.len()),
        unreadable: count(report.unreadable.len()),
        remaining: count(report.remaining()),
    })
}

/// `POST /api/quarantine/retry`: offers the quarantined records to the
/// database again (operators only), through the running sink.
pub(crate) async fn retry_quarantine(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    answer(&app, StatusCode::OK, retry(&app, &headers).await)
}
