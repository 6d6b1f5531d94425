//! Consent requests over HTTP, through the one [`soulbase_edge::ConsentDesk`]:
//!
//! | Route | What |
//! |---|---|
//! | `GET /api/consent/requests` | the caller's tenant's requests, newest first (query: `status`, `limit`); action `consent_issue` on `soulbase.server.consent` |
//! | `GET /api/consent/requests/{id}` | one request: its requester sees it with the token once approved; an approver of the tenant without the token |
//! | `POST /api/consent/requests/{id}/approve` | `{"scope": "call" \| "tool", "ttl_ms"?}`: issues the requester's token (`consent_issue` on the tool and on `soulbase.server.consent`); audited |
//! | `POST /api/consent/requests/{id}/decline` | `{"reason"?}`; audited |
//!
//! A request is opened by the pipeline when it refuses a call `CONSENT.REQUIRED`
//! (on any surface); the refusal names it in `fields.consent_request`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use soulbase_auth::{ApprovalScope, ConsentRequestStatus};
use soulbase_edge::ConsentRequestView;
use soulbase_errors::SoulError;
use soulbase_grpc::convert;

use crate::app::App;
use crate::http_api::{Param, answer, error_response, subject};

/// How many requests a listing returns without `limit`.
pub const DEFAULT_LIMIT: u32 = 100;

/// The most requests one listing returns.
pub const MAX_LIMIT: u32 = 1_000;

/// `GET /api/consent/requests` query (values as text, so a bad one is refused
/// naming its field).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestsQuery {
    /// Only requests in this state (every state when absent).
    #[schemars(with = "Option<ConsentRequestStatus>")]
    pub status: Option<String>,
    /// At most this many requests (default 100).
    #[schemars(with = "Option<u32>", range(min = 1, max = MAX_LIMIT))]
    pub limit: Option<String>,
}

/// `GET /api/consent/requests`.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ConsentRequestList {
    /// The requests, newest first (never with a token).
    pub requests: Vec<ConsentRequestView>,
}

/// `POST /api/consent/requests/{id}/approve` body.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "ApproveConsentRequest")]
pub(crate) struct ApproveBody {
    /// `call` (default): the token covers only calls with exactly the refused
    /// call's arguments; `tool`: any call of the tool by the requester.
    #[serde(default)]
    scope: Option<ApprovalScope>,
    /// The token's lifetime, in milliseconds (default
    /// `auth.consent.default_ttl_ms`; capped like every token).
    #[serde(default)]
    #[schemars(range(min = 1))]
    ttl_ms: Option<u64>,
}

/// `POST /api/consent/requests/{id}/decline` body.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "DeclineConsentRequest")]
pub(crate) struct DeclineBody {
    /// Why, for the requester (at most 500 characters).
    #[serde(default)]
    #[schemars(length(max = 500))]
    reason: Option<String>,
}

/// A JSON body of `T`; an empty body is `T::default()`.
fn body_of<T: Default + for<'de> Deserialize<'de>>(
    body: &Bytes,
    shape: &str,
) -> Result<T, SoulError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| convert::invalid("body", format!("expected {shape}")).with_note(e.to_string()))
}

async fn list(
    app: &App,
    headers: &HeaderMap,
    q: &RequestsQuery,
) -> Result<ConsentRequestList, SoulError> {
    let status = q
        .status
        .as_deref()
        .map(str::parse::<ConsentRequestStatus>)
        .transpose()?;
    let limit = match q.limit.as_deref() {
        None => DEFAULT_LIMIT,
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                convert::invalid("limit", format!("limit must be between 1 and {MAX_LIMIT}"))
            })?,
    };
    let approver = subject(app, headers).await?;
    let requests = app.consent_desk.requests(&approver, status, limit).await?;
    Ok(ConsentRequestList { requests })
}

/// `GET /api/consent/requests?status=&limit=`.
pub(crate) async fn list_requests(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    query: Result<Query<RequestsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = query else {
        return error_response(&convert::invalid(
            "query",
            "unknown or malformed query parameter (status, limit)",
        ));
    };
    answer(&app, StatusCode::OK, list(&app, &headers, &q).await)
}

/// `GET /api/consent/requests/{id}`.
pub(crate) async fn get_request(
    State(app): State<Arc<App>>,
    Param(id): Param,
    headers: HeaderMap,
) -> Response {
    let result = match subject(&app, &headers).await {
        Ok(who) => app.consent_desk.request(&who, &id).await,
        Err(e) => Err(e),
    };
    answer(&app, StatusCode::OK, result)
}

/// `POST /api/consent/requests/{id}/approve`.
pub(crate) async fn approve_request(
    State(app): State<Arc<App>>,
    Param(id): Param,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        let ask: ApproveBody = body_of(
            &body,
            "{\"scope\": \"call\" | \"tool\", \"ttl_ms\"?: milliseconds}",
        )?;
        let approver = subject(&app, &headers).await?;
        app.consent_desk
            .approve(
                &approver,
                &id,
                ask.scope.unwrap_or(ApprovalScope::Call),
                ask.ttl_ms,
            )
            .await
    }
    .await;
    answer(&app, StatusCode::OK, result)
}

/// `POST /api/consent/requests/{id}/decline`.
pub(crate) async fn decline_request(
    State(app): State<Arc<App>>,
    Param(id): Param,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let result = async {
        let ask: DeclineBody = body_of(&body, "{\"reason\"?: text}")?;
        let approver = subject(&app, &headers).await?;
        app.consent_desk.decline(&approver, &id, ask.reason).await
    }
    .await;
    answer(&app, StatusCode::OK, result)
}
