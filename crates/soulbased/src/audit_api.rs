//! `GET /api/audit`: the audit of changes — registry, skill states and set,
//! configuration reloads — newest first (see `soulbase_observe::AuditLog`).
//!
//! Reading needs action `read_evidence` on resource `soulbase.server.audit`
//! ([`Action::AUDIT_RESOURCE`]). A caller sees only its own tenant's records
//! (asking for another tenant is `AUTH.FORBIDDEN`, field `tenant`); a caller of
//! the global tenant — the operator — sees every tenant's, including the global
//! ones (configuration, skills, global tools), and may filter by `tenant`.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use schemars::JsonSchema;
use serde::Deserialize;
use soulbase_auth::{Action, AuthzRequest};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_grpc::convert;
use soulbase_observe::{AuditFilter, AuditKind, MAX_AUDIT_PAGE};
use soulbase_types::{Subject, TenantId, ToolId, UnixMillis};

use crate::app::App;
use crate::bodies::AuditList;
use crate::http_api::{answer, error_response, subject};

/// How many records a listing returns without `limit`.
pub const DEFAULT_LIMIT: u32 = 100;

/// The longest `target` accepted.
const MAX_TARGET: usize = 1024;

/// `GET /api/audit` query (every value as text, so a bad one is refused naming
/// its field; the schema says what is accepted).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Only this tenant's records (the caller's own unless it is of the
    /// `global` tenant).
    #[schemars(with = "Option<TenantId>")]
    pub tenant: Option<String>,
    /// Only this kind of change.
    #[schemars(with = "Option<AuditKind>")]
    pub kind: Option<String>,
    /// Only this target, exactly (a tool id, a tenant for `registry.allow_list`,
    /// a skill name, the skills directory, the configuration file).
    #[schemars(length(min = 1, max = MAX_TARGET))]
    pub target: Option<String>,
    /// Records at or after this instant (Unix milliseconds).
    #[schemars(with = "Option<u64>")]
    pub since: Option<String>,
    /// Records strictly before this instant (Unix milliseconds).
    #[schemars(with = "Option<u64>")]
    pub until: Option<String>,
    /// At most this many records (default 100).
    #[schemars(with = "Option<u32>", range(min = 1, max = MAX_AUDIT_PAGE))]
    pub limit: Option<String>,
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

/// The filter `q` asks for, before the caller's tenant is applied.
fn filter_of(q: &AuditQuery) -> Result<AuditFilter, SoulError> {
    let tenant = q
        .tenant
        .as_deref()
        .map(|t| TenantId::new(t).map_err(|e| convert::invalid("tenant", e.to_string())))
        .transpose()?;
    let kind = q.kind.as_deref().map(str::parse::<AuditKind>).transpose()?;
    let target = match q.target.as_deref() {
        Some(t) if t.is_empty() || t.len() > MAX_TARGET => {
            return Err(convert::invalid(
                "target",
                format!("target must be 1–{MAX_TARGET} bytes"),
            ));
        }
        t => t.map(str::to_owned),
    };
    let limit = match q.limit.as_deref() {
        None => DEFAULT_LIMIT,
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_AUDIT_PAGE).contains(n))
            .ok_or_else(|| {
                convert::invalid(
                    "limit",
                    format!("limit must be between 1 and {MAX_AUDIT_PAGE}"),
                )
            })?,
    };
    let filter = AuditFilter {
        tenant,
        kind,
        target,
        since: millis("since", q.since.as_deref())?,
        until: millis("until", q.until.as_deref())?,
        limit,
    };
    filter.validate()?;
    Ok(filter)
}

/// Narrows `filter` to what `subject` may see: its own tenant, or anything for
/// a caller of the global tenant.
fn visible(subject: &Subject, mut filter: AuditFilter) -> Result<AuditFilter, SoulError> {
    if subject.tenant == TenantId::global() {
        return Ok(filter);
    }
    match &filter.tenant {
        Some(t) if *t != subject.tenant => Err(SoulError::new(
            ErrorCode::AuthForbidden,
            "a caller reads only its own tenant's audit records",
        )
        .with_field("field", "tenant")),
        _ => {
            filter.tenant = Some(subject.tenant.clone());
            Ok(filter)
        }
    }
}

async fn list(app: &App, headers: &HeaderMap, q: &AuditQuery) -> Result<AuditList, SoulError> {
    let subject = subject(app, headers).await?;
    let filter = filter_of(q)?;
    let resource = ToolId::new(Action::AUDIT_RESOURCE).map_err(SoulError::internal)?;
    app.authorizer
        .authorize(AuthzRequest {
            subject: &subject,
            tool: &resource,
            tool_tenant: None,
            action: Action::ReadEvidence,
            tool_scopes: &[],
        })
        .await?;
    let filter = visible(&subject, filter)?;
    let records = app.audit.list(&filter).await?;
    Ok(AuditList { records })
}

/// `GET /api/audit?tenant=&kind=&target=&since=&until=&limit=`: the audit records
/// the caller may see, newest first.
pub(crate) async fn list_audit(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    query: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = query else {
        return error_response(&convert::invalid(
            "query",
            "unknown or malformed query parameter (tenant, kind, target, since, until, limit)",
        ));
    };
    answer(&app, StatusCode::OK, list(&app, &headers, &q).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use soulbase_types::ActorId;

    fn q(pairs: &[(&str, &str)]) -> AuditQuery {
        let mut q = AuditQuery::default();
        for (k, v) in pairs {
            let v = Some((*v).to_owned());
            match *k {
                "tenant" => q.tenant = v,
                "kind" => q.kind = v,
                "target" => q.target = v,
                "since" => q.since = v,
                "until" => q.until = v,
                "limit" => q.limit = v,
                _ => unreachable!(),
            }
        }
        q
    }

    #[test]
    fn bad_values_name_their_field() {
        for (pairs, field) in [
            (&[("tenant", "a b")][..], "tenant"),
            (&[("kind", "registry.explode")], "kind"),
            (&[("target", "")], "target"),
            (&[("since", "yesterday")], "since"),
            (&[("until", "-1")], "until"),
            (&[("limit", "0")], "limit"),
            (&[("limit", "1001")], "limit"),
            (&[("since", "5"), ("until", "4")], "since"),
        ] {
            let e = filter_of(&q(pairs)).unwrap_err();
            assert_eq!(e.code(), ErrorCode::SchemaValidationFailed, "{pairs:?}");
            assert_eq!(e.field("field"), Some(field), "{pairs:?}");
        }
        let f = filter_of(&q(&[("kind", "config.reload"), ("since", "5")])).unwrap();
        assert_eq!(f.kind, Some(AuditKind::ConfigReload));
        assert_eq!(f.limit, DEFAULT_LIMIT);
    }

    #[test]
    fn a_tenant_sees_its_own_records_and_the_global_tenant_every_one() {
        let acme = Subject::new(TenantId::new("acme").unwrap(), ActorId::new("a").unwrap());
        let ops = Subject::new(TenantId::global(), ActorId::new("ops").unwrap());
        let any = filter_of(&q(&[])).unwrap();
        assert_eq!(
            visible(&acme, any.clone()).unwrap().tenant,
            Some(acme.tenant.clone())
        );
        assert_eq!(visible(&ops, any).unwrap().tenant, None);
        let globex = filter_of(&q(&[("tenant", "globex")])).unwrap();
        let e = visible(&acme, globex.clone()).unwrap_err();
        assert_eq!(e.code(), ErrorCode::AuthForbidden);
        assert_eq!(e.field("field"), Some("tenant"));
        assert_eq!(
            visible(&ops, globex).unwrap().tenant.map(|t| t.to_string()),
            Some("globex".to_owned())
        );
    }
}
