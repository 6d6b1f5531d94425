//! `GET /api/quarantine`: the evidence records the database refused for good,
//! kept in the spool's quarantine file (`docs/evidence.md`, "Quarantine") — the
//! console's quarantine page.
//!
//! Reading needs action `read_evidence` on `soulbase.server.quarantine`
//! ([`Action::QUARANTINE_RESOURCE`]). A caller sees only its own tenant's
//! records; a caller of the `global` tenant (the operator) sees every one, the
//! unreadable lines included. Offering them to the database again needs the
//! spool to itself: stop the server, then `soulbase evidence quarantine retry`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use schemars::JsonSchema;
use serde::Serialize;
use soulbase_auth::{Action, AuthzRequest};
use soulbase_edge::{CallObserver, Surface};
use soulbase_errors::SoulError;
use soulbase_types::{TenantId, ToolId};

use crate::app::App;
use crate::http_api::{error_response, subject, typed_response};

/// How the records leave the quarantine.
pub const RETRY: &str = "stop the server, then run `soulbase evidence quarantine retry` \
                         (what the database takes leaves the file)";

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

async fn list(app: &App, headers: &HeaderMap) -> Result<QuarantineList, SoulError> {
    let subject = subject(app, headers).await?;
    let resource = ToolId::new(Action::QUARANTINE_RESOURCE).map_err(SoulError::internal)?;
    app.authorizer
        .authorize(AuthzRequest {
            subject: &subject,
            tool: &resource,
            tool_tenant: None,
            action: Action::ReadEvidence,
            tool_scopes: &[],
        })
        .await?;
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
    match list(&app, &headers).await {
        Ok(body) => typed_response(StatusCode::OK, &body),
        Err(e) => {
            app.metrics.refused(Surface::Http, e.code());
            error_response(&e)
        }
    }
}
