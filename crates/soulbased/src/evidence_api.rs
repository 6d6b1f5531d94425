//! `GET /api/evidence`: the calls of the caller's tenant, newest first, one page
//! at a time (what the console's evidence explorer and `soulbase evidence list`
//! show) — each a Begin joined with its End, if any. `GET /api/denials`: the
//! calls refused before they ran (their Denial records), the same way.
//!
//! Only the caller's own tenant is read, and only calls of tools whose evidence
//! the caller may read (action `read_evidence` on the tool, as for
//! `GET /api/evidence/{call_id}`): the others are left out of the page, so a page
//! may hold fewer than `limit` calls while `next` still leads on. A denial that
//! names no tool id at all is shown to callers who may read the audit log
//! (`read_evidence` on `soulbase.server.audit`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use schemars::JsonSchema;
use serde::Deserialize;
use soulbase_auth::Action;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_grpc::convert;
use soulbase_observe::{
    CallPage, DenialPage, DenialSummary, EndStatus, EvidenceQuery, MAX_PAGE, PageCursor,
};
use soulbase_types::{ActorId, TenantId, ToolId, UnixMillis};

use crate::app::App;
use crate::http_api::{answer, error_response, may_read_evidence, subject};

/// How many calls a page holds without `limit`.
pub const DEFAULT_LIMIT: u32 = 50;

/// `GET /api/evidence` query (every value as text, so a bad one is refused
/// naming its field; the schema says what is accepted).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvidenceListQuery {
    /// Another tenant's calls: for a caller of the `global` tenant with
    /// `read_evidence` on `soulbase.server.evidence` (default: the caller's).
    #[schemars(with = "Option<soulbase_types::TenantId>")]
    pub tenant: Option<String>,
    /// Only calls of this tool.
    #[schemars(with = "Option<ToolId>")]
    pub tool: Option<String>,
    /// Only calls that ended so.
    #[schemars(with = "Option<EndStatus>")]
    pub status: Option<String>,
    /// Only calls made by this actor.
    #[schemars(with = "Option<soulbase_types::ActorId>")]
    pub actor: Option<String>,
    /// Only calls that ended with this stable error code (e.g. `PROVIDER.TIMEOUT`).
    #[schemars(with = "Option<soulbase_errors::ErrorCode>")]
    pub code: Option<String>,
    /// Calls that began at or after this instant (Unix milliseconds).
    #[schemars(with = "Option<u64>")]
    pub from: Option<String>,
    /// Calls that began strictly before this instant (Unix milliseconds).
    #[schemars(with = "Option<u64>")]
    pub to: Option<String>,
    /// At most this many calls (default 50).
    #[schemars(with = "Option<u32>", range(min = 1, max = MAX_PAGE))]
    pub limit: Option<String>,
    /// Continue after this cursor (the previous page's `next`).
    pub after: Option<String>,
}

fn millis(field: &str, value: Option<&str>) -> Result<Option<UnixMillis>, SoulError> {
    value
        .map(|v| {
            v.parse::<i64>()
                .ok()
                .filter(|ms| *ms >= 0)
                .map(UnixMillis)
                .ok_or_else(|| {
                    convert::invalid(field, format!("{field} must be Unix milliseconds (≥ 0)"))
                })
        })
        .transpose()
}

/// How long a listing waits for the spool to drain what this process
/// accepted a moment ago (a call just answered is listed too).
pub(crate) const DRAIN_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Waits, at most [`DRAIN_WAIT`], until what the spool holds is in the store
/// (at once when it is caught up); a listing read before then is still valid.
pub(crate) async fn drained(app: &App) {
    if let Some(p) = &app.persistence
        && let Err(e) = p.sink.wait_drained(DRAIN_WAIT).await
    {
        tracing::debug!(error = %e, "evidence listed before the spool drained");
    }
}

/// Whose evidence `subject` reads: its own tenant's (`asked` absent or its
/// own), checked tool by tool; or — for a caller of the `global` tenant with
/// `read_evidence` on [`Action::EVIDENCE_RESOURCE`] — another tenant's, all of
/// it (`true`: no per-tool check). Anyone else naming another tenant is
/// `AUTH.FORBIDDEN` naming `tenant`.
pub(crate) async fn tenant_to_read(
    app: &App,
    subject: &soulbase_types::Subject,
    asked: Option<&str>,
) -> Result<(TenantId, bool), SoulError> {
    let Some(asked) = asked.filter(|t| *t != subject.tenant.as_str()) else {
        return Ok((subject.tenant.clone(), false));
    };
    let tenant = TenantId::new(asked)
        .map_err(|e| convert::invalid("tenant", format!("tenant is invalid: {}", e.reason)))?;
    if subject.tenant != TenantId::global() {
        return Err(SoulError::new(
            ErrorCode::AuthForbidden,
            "only a caller of the global tenant may read another tenant's evidence",
        )
        .with_field("field", "tenant"));
    }
    let resource = ToolId::new(Action::EVIDENCE_RESOURCE).map_err(SoulError::internal)?;
    may_read_evidence(app, subject, &resource).await?;
    Ok((tenant, true))
}

/// The store query `q` asks for, for `tenant`.
fn query_of(
    tenant: soulbase_types::TenantId,
    q: &EvidenceListQuery,
) -> Result<EvidenceQuery, SoulError> {
    let limit = match q.limit.as_deref() {
        None => DEFAULT_LIMIT,
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_PAGE).contains(n))
            .ok_or_else(|| {
                convert::invalid("limit", format!("limit must be between 1 and {MAX_PAGE}"))
            })?,
    };
    let query = EvidenceQuery {
        tenant,
        from: millis("from", q.from.as_deref())?,
        to: millis("to", q.to.as_deref())?,
        tool: q
            .tool
            .as_deref()
            .map(|t| convert::tool_id("tool", t))
            .transpose()?,
        status: q
            .status
            .as_deref()
            .map(|s| convert::enum_name::<EndStatus>("status", s))
            .transpose()?,
        actor: q
            .actor
            .as_deref()
            .map(|a| {
                ActorId::new(a).map_err(|e| {
                    convert::invalid("actor", format!("actor is invalid: {}", e.reason))
                })
            })
            .transpose()?,
        code: q
            .code
            .as_deref()
            .map(|c| {
                ErrorCode::parse(c).ok_or_else(|| {
                    convert::invalid("code", format!("{c} is not a stable error code"))
                })
            })
            .transpose()?,
        limit,
        after: q.after.as_deref().map(PageCursor::parse).transpose()?,
    };
    query.validate()?;
    Ok(query)
}

async fn list(
    app: &App,
    headers: &HeaderMap,
    q: &EvidenceListQuery,
) -> Result<CallPage, SoulError> {
    let subject = subject(app, headers).await?;
    let (tenant, whole) = tenant_to_read(app, &subject, q.tenant.as_deref()).await?;
    let query = query_of(tenant, q)?;
    let Some(p) = &app.persistence else {
        return Ok(CallPage::default());
    };
    drained(app).await;
    let mut page = p.evidence.list(&query).await?;
    if whole {
        return Ok(page);
    }
    page.calls = readable(
        app,
        &subject,
        page.calls,
        |c| c.tool_id.clone(),
        &mut HashMap::new(),
    )
    .await;
    Ok(page)
}

/// `GET /api/evidence?tool=&status=&actor=&code=&from=&to=&limit=&after=`: the caller's
/// tenant's calls whose evidence it may read, newest first.
pub(crate) async fn list_evidence(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    query: Result<Query<EvidenceListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = query else {
        return error_response(&convert::invalid(
            "query",
            "unknown or malformed query parameter (tenant, tool, status, actor, code, from, to, limit, after)",
        ));
    };
    answer(&app, StatusCode::OK, list(&app, &headers, &q).await)
}

/// `GET /api/denials` query: the listing's filters, without `status` (a
/// denied call never ran).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DenialListQuery {
    /// Another tenant's denials: for a caller of the `global` tenant with
    /// `read_evidence` on `soulbase.server.evidence` (default: the caller's).
    #[schemars(with = "Option<soulbase_types::TenantId>")]
    pub tenant: Option<String>,
    /// Only calls of this tool.
    #[schemars(with = "Option<ToolId>")]
    pub tool: Option<String>,
    /// Only calls made by this actor.
    #[schemars(with = "Option<soulbase_types::ActorId>")]
    pub actor: Option<String>,
    /// Only calls refused with this stable error code (e.g. `POLICY.DENY_TOOL`).
    #[schemars(with = "Option<soulbase_errors::ErrorCode>")]
    pub code: Option<String>,
    /// Calls refused at or after this instant (Unix milliseconds).
    #[schemars(with = "Option<u64>")]
    pub from: Option<String>,
    /// Calls refused strictly before this instant (Unix milliseconds).
    #[schemars(with = "Option<u64>")]
    pub to: Option<String>,
    /// At most this many denials (default 50).
    #[schemars(with = "Option<u32>", range(min = 1, max = MAX_PAGE))]
    pub limit: Option<String>,
    /// Continue after this cursor (the previous page's `next`).
    pub after: Option<String>,
}

impl DenialListQuery {
    fn as_listing(&self) -> EvidenceListQuery {
        EvidenceListQuery {
            tenant: self.tenant.clone(),
            tool: self.tool.clone(),
            status: None,
            actor: self.actor.clone(),
            code: self.code.clone(),
            from: self.from.clone(),
            to: self.to.clone(),
            limit: self.limit.clone(),
            after: self.after.clone(),
        }
    }
}

async fn denials(
    app: &App,
    headers: &HeaderMap,
    q: &DenialListQuery,
) -> Result<DenialPage, SoulError> {
    let subject = subject(app, headers).await?;
    let (tenant, whole) = tenant_to_read(app, &subject, q.tenant.as_deref()).await?;
    let query = query_of(tenant, &q.as_listing())?;
    query.validate_denials()?;
    let Some(p) = &app.persistence else {
        return Ok(DenialPage::default());
    };
    drained(app).await;
    let mut page = p.evidence.list_denials(&query).await?;
    if whole {
        return Ok(page);
    }
    page.denials = readable_denials(app, &subject, page.denials, &mut HashMap::new()).await?;
    Ok(page)
}

/// The `items` whose evidence `subject` may read: those whose resource (the
/// tool, as `resource_of` names it) it may read the evidence of (action
/// `read_evidence`). `cache` keeps each resource's answer, so a page asks once
/// per tool.
pub(crate) async fn readable<T>(
    app: &App,
    subject: &soulbase_types::Subject,
    items: Vec<T>,
    resource_of: impl Fn(&T) -> ToolId,
    cache: &mut HashMap<ToolId, bool>,
) -> Vec<T> {
    let mut kept = Vec::with_capacity(items.len());
    for item in items {
        let resource = resource_of(&item);
        let may = match cache.get(&resource) {
            Some(may) => *may,
            None => {
                let may = may_read_evidence(app, subject, &resource).await.is_ok();
                cache.insert(resource, may);
                may
            }
        };
        if may {
            kept.push(item);
        }
    }
    kept
}

/// The `denials` whose evidence `subject` may read ([`readable`]); a denial
/// naming no tool id is asked about as the audit log.
pub(crate) async fn readable_denials(
    app: &App,
    subject: &soulbase_types::Subject,
    denials: Vec<DenialSummary>,
    cache: &mut HashMap<ToolId, bool>,
) -> Result<Vec<DenialSummary>, SoulError> {
    let audit = ToolId::new(Action::AUDIT_RESOURCE).map_err(SoulError::internal)?;
    let resource_of =
        |d: &DenialSummary| ToolId::new(d.tool.as_str()).unwrap_or_else(|_| audit.clone());
    Ok(readable(app, subject, denials, resource_of, cache).await)
}

/// `GET /api/denials?tool=&actor=&code=&from=&to=&limit=&after=`: the caller's
/// tenant's calls refused before they ran, newest first.
pub(crate) async fn list_denials(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    query: Result<Query<DenialListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = query else {
        return error_response(&convert::invalid(
            "query",
            "unknown or malformed query parameter (tenant, tool, actor, code, from, to, limit, after)",
        ));
    };
    answer(&app, StatusCode::OK, denials(&app, &headers, &q).await)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn tenant() -> soulbase_types::TenantId {
        soulbase_types::TenantId::new("acme").unwrap()
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases: [(EvidenceListQuery, &str); 8] = [
            (
                EvidenceListQuery {
                    actor: Some("".into()),
                    ..Default::default()
                },
                "actor",
            ),
            (
                EvidenceListQuery {
                    code: Some("NOT.A_CODE".into()),
                    ..Default::default()
                },
                "code",
            ),
            (
                EvidenceListQuery {
                    tool: Some("nope".into()),
                    ..Default::default()
                },
                "tool",
            ),
            (
                EvidenceListQuery {
                    status: Some("fine".into()),
                    ..Default::default()
                },
                "status",
            ),
            (
                EvidenceListQuery {
                    from: Some("-1".into()),
                    ..Default::default()
                },
                "from",
            ),
            (
                EvidenceListQuery {
                    to: Some("soon".into()),
                    ..Default::default()
                },
                "to",
            ),
            (
                EvidenceListQuery {
                    limit: Some("0".into()),
                    ..Default::default()
                },
                "limit",
            ),
            (
                EvidenceListQuery {
                    after: Some("x".into()),
                    ..Default::default()
                },
                "after",
            ),
        ];
        for (q, field) in cases {
            let e = query_of(tenant(), &q).unwrap_err();
            assert_eq!(
                e.code(),
                soulbase_errors::ErrorCode::SchemaValidationFailed,
                "{field}"
            );
            assert_eq!(e.field("field"), Some(field), "{field}: {e:?}");
        }
    }

    #[test]
    fn a_query_reads_the_callers_tenant_with_its_filters() {
        let q = EvidenceListQuery {
            tool: Some("soulbase.builtin.echo".into()),
            status: Some("error".into()),
            actor: Some("alice".into()),
            code: Some("PROVIDER.TIMEOUT".into()),
            from: Some("10".into()),
            limit: Some("7".into()),
            ..Default::default()
        };
        let query = query_of(tenant(), &q).unwrap();
        assert_eq!(query.actor.as_ref().unwrap().as_str(), "alice");
        assert_eq!(query.code, Some(ErrorCode::ProviderTimeout));
        assert_eq!(query.tenant, tenant());
        assert_eq!(query.tool.unwrap().as_str(), "soulbase.builtin.echo");
        assert_eq!(query.status, Some(EndStatus::Error));
        assert_eq!(query.from, Some(UnixMillis(10)));
        assert_eq!(query.limit, 7);
        assert_eq!(
            query_of(tenant(), &EvidenceListQuery::default())
                .unwrap()
                .limit,
            DEFAULT_LIMIT
        );
    }
}
