//! `GET /api/evidence`: the calls of the caller's tenant, newest first, one page
//! at a time (what the console's evidence explorer and `soulbase evidence list`
//! show) — each a Begin joined with its End, if any.
//!
//! Only the caller's own tenant is read, and only calls of tools whose evidence
//! the caller may read (action `read_evidence` on the tool, as for
//! `GET /api/evidence/{call_id}`): the others are left out of the page, so a page
//! may hold fewer than `limit` calls while `next` still leads on.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use schemars::JsonSchema;
use serde::Deserialize;
use soulbase_edge::{CallObserver, Surface};
use soulbase_errors::SoulError;
use soulbase_grpc::convert;
use soulbase_observe::{CallPage, EndStatus, EvidenceQuery, MAX_PAGE, PageCursor};
use soulbase_types::{ToolId, UnixMillis};

use crate::app::App;
use crate::http_api::{error_response, may_read_evidence, subject, typed_response};

/// How many calls a page holds without `limit`.
pub const DEFAULT_LIMIT: u32 = 50;

/// `GET /api/evidence` query (every value as text, so a bad one is refused
/// naming its field; the schema says what is accepted).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvidenceListQuery {
    /// Only calls of this tool.
    #[schemars(with = "Option<ToolId>")]
    pub tool: Option<String>,
    /// Only calls that ended so.
    #[schemars(with = "Option<EndStatus>")]
    pub status: Option<String>,
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
    let query = query_of(subject.tenant.clone(), q)?;
    let Some(p) = &app.persistence else {
        return Ok(CallPage::default());
    };
    let mut page = p.evidence.list(&query).await?;
    // Each tool's answer once per page.
    let mut readable: HashMap<ToolId, bool> = HashMap::new();
    let mut kept = Vec::with_capacity(page.calls.len());
    for call in page.calls {
        let may = match readable.get(&call.tool_id) {
            Some(may) => *may,
            None => {
                let may = may_read_evidence(app, &subject, &call.tool_id)
                    .await
                    .is_ok();
                readable.insert(call.tool_id.clone(), may);
                may
            }
        };
        if may {
            kept.push(call);
        }
    }
    page.calls = kept;
    Ok(page)
}

/// `GET /api/evidence?tool=&status=&from=&to=&limit=&after=`: the caller's
/// tenant's calls whose evidence it may read, newest first.
pub(crate) async fn list_evidence(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    query: Result<Query<EvidenceListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = query else {
        return error_response(&convert::invalid(
            "query",
            "unknown or malformed query parameter (tool, status, from, to, limit, after)",
        ));
    };
    match list(&app, &headers, &q).await {
        Ok(page) => typed_response(StatusCode::OK, &page),
        Err(e) => {
            app.metrics.refused(Surface::Http, e.code());
            error_response(&e)
        }
    }
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
        let cases: [(EvidenceListQuery, &str); 6] = [
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
            from: Some("10".into()),
            limit: Some("7".into()),
            ..Default::default()
        };
        let query = query_of(tenant(), &q).unwrap();
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
