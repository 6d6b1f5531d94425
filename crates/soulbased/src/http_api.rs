//! The HTTP/JSON API, health, metrics and the MCP endpoint (axum).
//!
//! | route | what |
//! |---|---|
//! | `GET /api/tools` | the caller's governed tool list (query: `keyword`, `tag`, `group`; `state` other than `enabled`: the operator's view of the tools it may administer) |
//! | `POST /api/tools/{id}/preflight` | body = arguments object; the dry run |
//! | `POST /api/tools/{id}/invoke` | body = arguments object; `Idempotency-Key`, `X-Soulbase-Consent`, `traceparent`, `X-Soulbase-Skill` headers |
//! | `GET /api/skills` | the skills that show to the caller, with their tools (`?all=true`: every loaded skill, enabled or not, for a caller who may administer them) |
//! | `GET /api/model/tools`, `POST /api/model/tool_calls`, `GET /api/model/prompt`, `GET /api/skills/{name}` | the model-facing routes ([`crate::model_api`]) |
//! | `PATCH /api/skills/{name}` | `{"enabled": false}` / `{"enabled": true}` (action `enable` / `disable` on each of the skill's tools) |
//! | `POST /api/reload` | re-read the configuration and the skills directory (action `reload` on `soulbase.server.config`) |
//! | `GET /api/audit` | the audit of changes, newest first (query: `tenant`, `kind`, `target`, `since`, `until`, `limit`; action `read_evidence` on `soulbase.server.audit`; the caller's own tenant only, every tenant for the global tenant — [`crate::audit_api`]) |
//! | `GET /api/access`, `PUT /api/access/allow-list`, `PUT /api/access/overrides/{id}` | the caller's tenant's view of the global tools: its allow-list and states ([`crate::access_api`]) |
//! | `GET /api/evidence/{call_id}` | the call's evidence records and replay summary (the caller's tenant only, else `EVIDENCE.NOT_FOUND`; action `read_evidence` on the call's tool); for an agent-loop conversation's id (`conv_…`), its records and the conversation replayed — turns, their calls (each replayed, or `withheld` when the caller may not read its tool's evidence), end (action `read_evidence` on `soulbase.server.conversations`) |
//! | `GET /api/config/schema` | the JSON Schema of `config.yaml` (unauthenticated) |
//! | `GET /api/openapi.json` | the OpenAPI 3.1 document of these routes, `docs/openapi.json` (unauthenticated) |
//! | `GET /healthz` / `GET /readyz` | liveness / readiness (503 while starting or draining) |
//! | `GET /metrics` | Prometheus text format |
//! | `/mcp` | MCP streamable HTTP (Origin validated; sessions bounded per tenant and in total, idle ones closed) |
//!
//! Every route but `/mcp` is one of [`ROUTES`], which `docs/openapi.json` describes
//! (a test holds the two to each other and fuzzes a running server against the
//! document).
//!
//! Invocations, preflights and the tool list go through the one stack
//! ([`soulbase_edge::Stack`]), like every surface's. `X-Soulbase-Skill: NAME` makes
//! the call on behalf of skill `NAME` (its imports are checked), honoured only for
//! a subject holding scope `skill:NAME` (see [`soulbase_edge::binding`]).
//! Administration is authorized by the `Authorizer` like everything else.
//!
//! Errors are the public view of R5 (`{"error": {code, message, fields, retry,
//! retry_after_ms, correlation_id}}`) with the code's HTTP status; an invoke answers
//! the whole normalized `CallResult` with that status. An unknown route is 404 and
//! a wrong method 405, in the same envelope (`SCHEMA.VALIDATION_FAILED`, field
//! `path` / `method`). A body over
//! `server.max_body_bytes` is answered 413 in the same envelope
//! (`SCHEMA.VALIDATION_FAILED`, field `body`) on every route, and so is a body not
//! received whole within `server.body_read_timeout_ms` with 408 (closing an
//! HTTP/1 connection; only the request body is timed, never a streaming
//! answer); an MCP `initialize`
//! beyond `server.mcp_max_sessions` or `server.mcp_max_sessions_per_tenant` is
//! `QUOTA.RATE_LIMITED` (429) naming the limit, with a retry hint.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, patch, post, put};
use serde::Deserialize;
use serde_json::{Value, json};
use soulbase_auth::{Action, AuthzRequest};
use soulbase_config::ReloadStatus;
use soulbase_edge::{CallMeta, CallObserver, CallRequest, ConsentAsk, Surface, issued_json};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_grpc::convert;
use soulbase_mcp::sessions::McpSessions;
use soulbase_observe::EvidenceEvent;
use soulbase_tools::{ResolvedTool, ToolFilter, ToolOwner};
use soulbase_types::{CallId, Subject, ToolId};

use crate::app::App;

pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn http_status(code: ErrorCode) -> StatusCode {
    StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The JSON error response for `e`, with its code's HTTP status.
pub fn error_response(e: &SoulError) -> Response {
    error_response_with(http_status(e.code()), e)
}

/// The JSON error response for `e` with another `status` (a protocol condition
/// the stable codes have no status of their own for, e.g. 413).
pub fn error_response_with(status: StatusCode, e: &SoulError) -> Response {
    let body = json!({ "error": e.public() });
    json_response(status, &body)
}

/// The refusal of a body larger than `max` bytes: `SCHEMA.VALIDATION_FAILED`
/// (field `body`) with status 413.
fn body_too_large(max: usize) -> Response {
    error_response_with(
        StatusCode::PAYLOAD_TOO_LARGE,
        &SoulError::new(
            ErrorCode::SchemaValidationFailed,
            format!("the request body is larger than {max} bytes (server.max_body_bytes)"),
        )
        .with_field("field", "body")
        .with_field("max_bytes", max.to_string()),
    )
}

/// How much of a too-large body is read and dropped before the 413 is sent, so an
/// HTTP/1 client still writing it reads the answer instead of a reset.
const DRAIN_MAX: usize = 16 * 1024 * 1024;
/// How long that drain may take.
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// Why a body was not read whole.
enum BodyError {
    TooLarge,
    Unreadable,
}

/// Reads `body` whole if it is at most `max` bytes; a larger one is read on (and
/// dropped) up to [`DRAIN_MAX`] for at most [`DRAIN_TIME`].
async fn read_limited(body: axum::body::Body, max: usize) -> Result<Bytes, BodyError> {
    use futures_util::StreamExt as _;
    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| BodyError::Unreadable)?;
        if buf.len() + chunk.len() > max {
            let mut seen = buf.len() + chunk.len();
            drop(buf);
            let drain = async {
                while seen <= DRAIN_MAX {
                    match stream.next().await {
                        Some(Ok(c)) => seen += c.len(),
                        _ => return,
                    }
                }
            };
            let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
            return Err(BodyError::TooLarge);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}

fn body_error(e: BodyError, max: usize) -> Response {
    match e {
        BodyError::TooLarge => body_too_large(max),
        BodyError::Unreadable => error_response(&convert::invalid(
            "body",
            "the request body could not be read",
        )),
    }
}

/// The refusal of a body not received whole within `timeout`:
/// `SCHEMA.VALIDATION_FAILED` (field `body`) with status 408; an HTTP/1 connection
/// is closed after it (the rest of the body is not waited for).
fn body_too_slow(timeout: Duration, version: http::Version) -> Response {
    let mut response = error_response_with(
        StatusCode::REQUEST_TIMEOUT,
        &SoulError::new(
            ErrorCode::SchemaValidationFailed,
            format!(
                "the request body did not arrive within {} ms (server.body_read_timeout_ms)",
                timeout.as_millis()
            ),
        )
        .with_field("field", "body")
        .with_field("timeout_ms", timeout.as_millis().to_string()),
    );
    if version <= http::Version::HTTP_11 {
        response
            .headers_mut()
            .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
    }
    response
}

/// The body limits of every route: its size (`server.max_body_bytes`) and how
/// long it may take to arrive (`server.body_read_timeout_ms`).
#[derive(Debug, Clone, Copy)]
struct BodyLimits {
    max: usize,
    read_timeout: Duration,
}

/// The body limits of every route ([`BodyLimits`]). A body declared larger than
/// `max` is refused before any handler runs; any other body is read here, before
/// the handler, within `read_timeout` of its headers — found larger it is
/// answered 413, not received whole in time 408 — and a 413 from deeper down is
/// answered in the JSON error envelope too. Only reading the body is timed: the
/// handler and a streaming answer are not.
async fn body_limit(State(limits): State<BodyLimits>, request: Request, next: Next) -> Response {
    let max = limits.max;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        let e = read_limited(request.into_body(), max).await.err();
        return body_error(e.unwrap_or(BodyError::TooLarge), max);
    }
    let request = if http_body::Body::is_end_stream(request.body()) {
        request
    } else {
        let (parts, body) = request.into_parts();
        match tokio::time::timeout(limits.read_timeout, read_limited(body, max)).await {
            Ok(Ok(bytes)) => Request::from_parts(parts, axum::body::Body::from(bytes)),
            Ok(Err(e)) => return body_error(e, max),
            Err(_) => return body_too_slow(limits.read_timeout, parts.version),
        }
    };
    let response = next.run(request).await;
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE && !json {
        return body_too_large(max);
    }
    response
}

/// A route's path parameter, percent-decoded. Bytes that do not decode to UTF-8
/// read as U+FFFD, so such a parameter names nothing and is answered like any
/// other unknown or malformed one: in the JSON envelope (an invoke's in its
/// `CallResult`), never with axum's plain-text rejection.
pub(crate) struct Param(pub(crate) String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Param {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &S,
    ) -> Result<Self, Response> {
        use axum::extract::path::ErrorKind;
        use axum::extract::rejection::PathRejection;
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(p)) => Ok(Param(p)),
            Err(PathRejection::FailedToDeserializePathParams(e))
                if matches!(e.kind(), ErrorKind::InvalidUtf8InPathParam { .. }) =>
            {
                Ok(Param(lossy_param(parts)))
            }
            Err(e) => {
                let code = if e.status().is_server_error() {
                    ErrorCode::UnknownInternal
                } else {
                    ErrorCode::SchemaValidationFailed
                };
                Err(error_response_with(
                    e.status(),
                    &SoulError::new(code, e.body_text()).with_field("field", "path"),
                ))
            }
        }
    }
}

/// The request's path parameter that is not UTF-8 once percent-decoded (the
/// routes' own segments are ASCII, so the first such segment is it), with U+FFFD
/// for what is not UTF-8.
fn lossy_param(parts: &http::request::Parts) -> String {
    let hex = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    };
    let decode = |raw: &str| {
        let bytes = raw.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let pair = (bytes.get(i + 1).copied().and_then(hex))
                .zip(bytes.get(i + 2).copied().and_then(hex));
            match (bytes[i], pair) {
                (b'%', Some((high, low))) => {
                    out.push(high << 4 | low);
                    i += 3;
                }
                (b, _) => {
                    out.push(b);
                    i += 1;
                }
            }
        }
        out
    };
    parts
        .uri
        .path()
        .split('/')
        .map(decode)
        .find(|bytes| std::str::from_utf8(bytes).is_err())
        .map_or_else(
            || "\u{FFFD}".to_owned(),
            |bytes| String::from_utf8_lossy(&bytes).into_owned(),
        )
}

pub(crate) async fn subject(app: &App, headers: &HeaderMap) -> Result<Subject, SoulError> {
    app.auth.resolve(headers).await.inspect_err(|e| {
        app.metrics.refused(Surface::Http, e.code());
    })
}

fn tool_json(t: &ResolvedTool) -> Value {
    let m = &t.tool.manifest;
    json!({
        "id": m.id.as_str(),
        "version": m.version.to_string(),
        "state": t.state.as_str(),
        "owner": match &t.owner { ToolOwner::Global => "global".to_owned(), ToolOwner::Tenant(x) => x.to_string() },
        "display_name": m.title(),
        "description": m.description,
        "tags": m.tags,
        "safety_class": m.safety_class.as_str(),
        "side_effect": m.side_effect.as_str(),
        "deprecations": m.deprecations,
        "consent_required": m.consent_required(),
        "input_schema": m.input_schema,
        "output_schema": m.output_schema,
        "digest": t.tool.digest,
    })
}

/// `GET /api/tools` query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Effective state (`registered`, `enabled`, `paused`, `deprecated`).
    pub state: Option<String>,
    /// Keyword in name, display name or description.
    pub keyword: Option<String>,
    /// Tag.
    pub tag: Option<String>,
    /// The id's first segment.
    pub group: Option<String>,
}

async fn list_tools(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let subject = match subject(&app, &headers).await {
        Ok(s) => s,
        Err(e) => return error_response(&e),
    };
    let Ok(Query(q)) = query else {
        return error_response(&convert::invalid(
            "query",
            "unknown or malformed query parameter (state, keyword, tag, group)",
        ));
    };
    let state = match q.state.as_deref() {
        None => None,
        Some(s) => match convert::enum_name("state", s) {
            Ok(s) => Some(s),
            Err(e) => return error_response(&e),
        },
    };
    let filter = ToolFilter {
        state,
        keyword: q.keyword,
        tag: q.tag,
        group: q.group,
        ..ToolFilter::default()
    };
    let binding = CallMeta::from_headers(&headers).binding;
    let tools = match app
        .stack
        .list(Surface::Http, &subject, &binding, &filter)
        .await
    {
        Ok(t) => t,
        Err(e) => return error_response(&e),
    };
    let list: Vec<Value> = tools.iter().map(tool_json).collect();
    json_response(StatusCode::OK, &json!({ "tools": list }))
}

/// The request of an invoke or preflight: its subject (or why there is none),
/// and the call it makes (or why it is malformed).
async fn call_request(
    app: &App,
    id: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(Subject, Result<CallRequest, SoulError>), SoulError> {
    let subject = subject(app, headers).await?;
    let args = std::str::from_utf8(body)
        .map_err(|_| convert::invalid("body", "the body is not UTF-8"))
        .and_then(|text| convert::arguments("body", text))
        .and_then(|args| {
            if args.is_object() {
                Ok(args)
            } else {
                Err(convert::invalid(
                    "body",
                    "the body must be a JSON object of arguments",
                ))
            }
        });
    let call = args.map(|args| CallRequest {
        meta: CallMeta::from_headers(headers),
        ..CallRequest::new(Surface::Http, subject.clone(), id, args)
    });
    Ok((subject, call))
}

async fn preflight(
    State(app): State<Arc<App>>,
    Param(id): Param,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let call = match call_request(&app, &id, &headers, &body).await {
        Ok((_, Ok(call))) => call,
        Ok((_, Err(e))) => {
            app.metrics.refused(Surface::Http, e.code());
            return error_response(&e);
        }
        Err(e) => return error_response(&e),
    };
    match app.stack.preflight(call).await {
        Ok(report) => json_response(
            StatusCode::OK,
            &serde_json::to_value(&report).unwrap_or(Value::Null),
        ),
        Err(e) => error_response(&e),
    }
}

async fn invoke(
    State(app): State<Arc<App>>,
    Param(id): Param,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (result, subject) = match call_request(&app, &id, &headers, &body).await {
        Ok((subject, Ok(call))) => (app.stack.invoke(call).await, subject),
        Ok((subject, Err(e))) => (
            app.stack.refuse(Surface::Http, &subject, &id, e).await,
            subject,
        ),
        Err(e) => return error_response(&e),
    };
    let status = result.error_code.map_or(StatusCode::OK, http_status);
    let mut response = json_response(
        status,
        &serde_json::to_value(&result).unwrap_or(Value::Null),
    );
    if !result.warnings.is_empty()
        && let Ok(tool) = ToolId::new(id.as_str())
        && let Ok(found) = app.registry.get(&subject.tenant, &tool)
    {
        deprecation_headers(response.headers_mut(), &found.tool.manifest.deprecations);
    }
    response
}

/// `Deprecation` (RFC 9745, when a note's `since` is a date) and `Sunset`
/// (RFC 8594, the earliest announced) for a deprecated tool's answer.
fn deprecation_headers(headers: &mut HeaderMap, deprecations: &[soulbase_tools::Deprecation]) {
    let since = deprecations
        .iter()
        .filter_map(|d| soulbase_tools::day_start_secs(&d.since))
        .min();
    if let Some(secs) = since
        && let Ok(v) = header::HeaderValue::from_str(&format!("@{secs}"))
    {
        headers.insert("deprecation", v);
    }
    let sunset = deprecations
        .iter()
        .filter_map(|d| d.sunset.as_deref())
        .filter_map(|day| Some((soulbase_tools::day_start_secs(day)?, day)))
        .min();
    if let Some((secs, day)) = sunset
        && let Some(date) = http_date(secs, day)
        && let Ok(v) = header::HeaderValue::from_str(&date)
    {
        headers.insert("sunset", v);
    }
}

/// The IMF-fixdate of midnight UTC on `day` (`YYYY-MM-DD`, starting at `secs`).
fn http_date(secs: i64, day: &str) -> Option<String> {
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let weekday = WEEKDAYS.get(usize::try_from(secs.div_euclid(86_400).rem_euclid(7)).ok()?)?;
    let month = MONTHS.get(day.get(5..7)?.parse::<usize>().ok()?.checked_sub(1)?)?;
    Some(format!(
        "{weekday}, {} {month} {} 00:00:00 GMT",
        day.get(8..10)?,
        day.get(0..4)?
    ))
}

/// The caller, when policy lets it perform `action` on every one of `tools`
/// (their owners as `tenant` sees them): administration goes through the
/// `Authorizer` like every other decision.
async fn administer(
    app: &App,
    headers: &HeaderMap,
    action: Action,
    tools: &[ToolId],
) -> Result<Subject, SoulError> {
    let subject = subject(app, headers).await?;
    for tool in tools {
        let owner = app
            .registry
            .get(&subject.tenant, tool)
            .ok()
            .map(|t| t.owner);
        app.authorizer
            .authorize(AuthzRequest {
                subject: &subject,
                tool,
                tool_tenant: owner.as_ref().and_then(ToolOwner::tenant_id),
                action,
                tool_scopes: &[],
            })
            .await
            .inspect_err(|e| app.metrics.refused(Surface::Http, e.code()))?;
    }
    Ok(subject)
}

/// The resource a [`Action::Reload`] is asked about.
fn reload_resource() -> Result<ToolId, SoulError> {
    ToolId::new(Action::RELOAD_RESOURCE).map_err(SoulError::internal)
}

/// The resources administering `skill` is asked about: its tools, or for a skill
/// of instructions only, `skills.<name>.instructions`.
fn skill_resources(skill: &soulbase_skills::Skill) -> Result<Vec<ToolId>, SoulError> {
    if skill.tools.is_empty() {
        let id = ToolId::new(format!("skills.{}.instructions", skill.name))
            .map_err(SoulError::internal)?;
        return Ok(vec![id]);
    }
    Ok(skill.tools.iter().map(|t| t.id().clone()).collect())
}

fn skills_json(report: &soulbase_skills::ReloadReport) -> Value {
    json!({
        "generation": report.generation,
        "added": report.added,
        "updated": report.updated,
        "removed": report.removed,
        "errors": report.errors().map(ToString::to_string).collect::<Vec<_>>(),
        "warnings": report
            .problems
            .iter()
            .filter(|p| !p.is_error())
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
    })
}

async fn reload(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let allowed = match reload_resource() {
        Ok(r) => administer(&app, &headers, Action::Reload, &[r]).await,
        Err(e) => Err(e),
    };
    let by = match allowed {
        Ok(by) => by,
        Err(e) => return error_response(&e),
    };
    let status = app.reload(&by).await;
    let needs_restart = app.needs_restart();
    let skills = match app.reload_skills(&by).await {
        None => Value::Null,
        Some(Ok(report)) => skills_json(&report),
        Some(Err(e)) => return error_response(&e),
    };
    match status {
        ReloadStatus::Loaded { hash } | ReloadStatus::Unchanged { hash } => json_response(
            StatusCode::OK,
            &json!({"status": "unchanged", "hash": hash, "skills": skills, "needs_restart": needs_restart}),
        ),
        ReloadStatus::Applied { hash, previous } => json_response(
            StatusCode::OK,
            &json!({"status": "applied", "hash": hash, "previous": previous, "skills": skills, "needs_restart": needs_restart}),
        ),
        ReloadStatus::Rejected { error, kept } => {
            let e = SoulError::new(
                ErrorCode::ConfigInvalid,
                "the new configuration is invalid; the previous one stays",
            )
            .with_field("kept", kept)
            .with_field("problems", error.to_string());
            error_response(&e)
        }
    }
}

fn skill_json(set: &soulbase_skills::SkillSet, s: &soulbase_skills::Skill) -> Value {
    json!({
        "name": s.name,
        "title": s.title,
        "description": s.description,
        "version": s.version,
        "kind": match s.kind {
            soulbase_skills::SkillKind::Package => "package",
            soulbase_skills::SkillKind::Descriptor => "descriptor",
        },
        "enabled": set.is_enabled(&s.name),
        "tools": s.tools.iter().map(|t| t.id().as_str()).collect::<Vec<_>>(),
    })
}

fn no_skills() -> SoulError {
    SoulError::new(ErrorCode::ToolNotFound, "this server serves no skills")
}

fn no_skill(name: &str) -> SoulError {
    SoulError::new(ErrorCode::ToolNotFound, format!("skill {name} not found"))
        .with_field("skill", name.to_owned())
}

/// `GET /api/skills` query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillsQuery {
    /// Every loaded skill, enabled or not (the operator's view).
    #[serde(default)]
    pub all: bool,
}

/// `GET /api/skills`: the skills that show to the caller (enabled, with at least
/// one tool in its governed list, or instructions only), in name order; with
/// `?all=true`, every loaded skill the caller may administer (`enable`).
async fn list_skills(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    query: Result<Query<SkillsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let subject = match subject(&app, &headers).await {
        Ok(s) => s,
        Err(e) => return error_response(&e),
    };
    let Ok(Query(q)) = query else {
        return error_response(&convert::invalid(
            "query",
            "unknown or malformed query parameter (all)",
        ));
    };
    let Some(skills) = &app.skills else {
        return json_response(StatusCode::OK, &json!({"skills": [], "generation": 0}));
    };
    let set = skills.catalog.current();
    let mut list = Vec::new();
    if q.all {
        for s in set.skills() {
            let may = match skill_resources(s) {
                Ok(tools) => {
                    let mut ok = true;
                    for t in &tools {
                        let owner = app.registry.get(&subject.tenant, t).ok().map(|r| r.owner);
                        let owner = owner.unwrap_or(ToolOwner::Global);
                        if !app
                            .invoker
                            .permits(&subject, t, &owner, Action::Enable)
                            .await
                        {
                            ok = false;
                            break;
                        }
                    }
                    ok
                }
                Err(_) => false,
            };
            if may {
                list.push(skill_json(&set, s));
            }
        }
    } else {
        let binding = CallMeta::from_headers(&headers).binding;
        let available = match app.stack.available(Surface::Http, &subject, &binding).await {
            Ok(a) => a,
            Err(e) => return error_response(&e),
        };
        for s in set.skills() {
            if soulbase_skills::skill_shows(&set, &available, &s.name) {
                list.push(skill_json(&set, s));
            }
        }
    }
    json_response(
        StatusCode::OK,
        &json!({"skills": list, "generation": set.generation()}),
    )
}

/// `PATCH /api/skills/{name}` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SkillPatch {
    enabled: bool,
}

/// `PATCH /api/skills/{name}` `{"enabled": bool}` (seed 003): a disabled skill
/// leaves every view from the next request on.
async fn patch_skill(
    State(app): State<Arc<App>>,
    Param(name): Param,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let patch: SkillPatch = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            return error_response(
                &convert::invalid("body", "expected {\"enabled\": true|false}")
                    .with_note(e.to_string()),
            );
        }
    };
    let Some(skills) = &app.skills else {
        return error_response(&no_skills());
    };
    let resources = match skills
        .catalog
        .current()
        .get(&name)
        .map(|s| skill_resources(s))
    {
        Some(Ok(r)) => r,
        Some(Err(e)) => return error_response(&e),
        None => return error_response(&no_skill(&name)),
    };
    let action = if patch.enabled {
        Action::Enable
    } else {
        Action::Disable
    };
    let by = match administer(&app, &headers, action, &resources).await {
        Ok(by) => by,
        Err(e) => return error_response(&e),
    };
    if let Err(e) = app.set_skill_enabled(&by, &name, patch.enabled).await {
        return error_response(&e);
    }
    let set = skills.catalog.current();
    match set.get(&name) {
        Some(s) => json_response(StatusCode::OK, &skill_json(&set, s)),
        None => error_response(&no_skills()),
    }
}

/// `POST /api/consent` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsentBody {
    tool: String,
    #[serde(default)]
    actor: Option<String>,
    #[serde(default)]
    args: Option<Value>,
    #[serde(default)]
    ttl_ms: Option<u64>,
}

/// `POST /api/consent` `{"tool", "actor"?, "args"?, "ttl_ms"?}`: a consent token
/// for a caller of the approver's tenant, issued if policy allows the approver
/// `consent_issue` on the tool (201 with the token, its id and expiry).
async fn issue_consent(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let ask: ConsentBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return error_response(
                &convert::invalid(
                    "body",
                    "expected {\"tool\": \"group.pkg.name\", \"actor\"?, \"args\"?, \"ttl_ms\"?}",
                )
                .with_note(e.to_string()),
            );
        }
    };
    let approver = match subject(&app, &headers).await {
        Ok(s) => s,
        Err(e) => return error_response(&e),
    };
    let ask = ConsentAsk {
        tool: ask.tool,
        actor: ask.actor,
        args: ask.args,
        ttl_ms: ask.ttl_ms,
    };
    match app.consent_desk.issue(&approver, ask).await {
        Ok(issued) => json_response(StatusCode::CREATED, &issued_json(&issued)),
        Err(e) => {
            app.metrics.refused(Surface::Http, e.code());
            error_response(&e)
        }
    }
}

/// `POST /api/consent/{id}/revoke`: calls carrying token `id` are refused from
/// now on (needs `consent_issue` on `soulbase.server.consent`).
async fn revoke_consent(
    State(app): State<Arc<App>>,
    Param(id): Param,
    headers: HeaderMap,
) -> Response {
    let approver = match subject(&app, &headers).await {
        Ok(s) => s,
        Err(e) => return error_response(&e),
    };
    match app.consent_desk.revoke(&approver, &id).await {
        Ok(()) => json_response(StatusCode::OK, &json!({"id": id, "revoked": true})),
        Err(e) => {
            app.metrics.refused(Surface::Http, e.code());
            error_response(&e)
        }
    }
}

/// How long a read waits for the spool to drain a call still in flight to the store.
const EVIDENCE_READ_WAIT: Duration = Duration::from_secs(2);

fn no_evidence() -> SoulError {
    SoulError::of(ErrorCode::EvidenceNotFound).with_field("field", "call_id")
}

/// `GET /api/evidence/{call_id}`: the records of one call of the caller's tenant
/// (another tenant's call answers 404 exactly like an unknown one) and what replay
/// rebuilds from them; needs action `read_evidence` on the call's tool.
async fn read_evidence(
    State(app): State<Arc<App>>,
    Param(call_id): Param,
    headers: HeaderMap,
) -> Response {
    match evidence_json(&app, &call_id, &headers).await {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(e) => {
            app.metrics.refused(Surface::Http, e.code());
            error_response(&e)
        }
    }
}

async fn evidence_json(app: &App, call_id: &str, headers: &HeaderMap) -> Result<Value, SoulError> {
    let subject = app.auth.resolve(headers).await?;
    let call_id = CallId::new(call_id)
        .map_err(|_| convert::invalid("call_id", "the call id is malformed"))?;
    let Some(p) = &app.persistence else {
        return Err(no_evidence());
    };
    let tenant = Some(&subject.tenant);
    let mut evidence = p.evidence.call(tenant, &call_id).await?;
    // A call that just ran may still be on its way from the spool to the store
    // (a keyed call's Begin and End are stored with its idempotency key, so its
    // halves may arrive in either order).
    if evidence.is_empty() || evidence.begins().count() != evidence.ends().count() {
        if let Err(e) = p.sink.wait_drained(EVIDENCE_READ_WAIT).await {
            tracing::debug!(error = %e, "evidence read before the spool drained");
        }
        evidence = p.evidence.call(tenant, &call_id).await?;
    }
    if soulbase_observe::is_conversation(&evidence) {
        return conversation_json(app, &subject, &call_id, evidence).await;
    }
    let tool = call_tool(&evidence).ok_or_else(no_evidence)?;
    may_read_evidence(app, &subject, &tool).await?;
    let replay = soulbase_observe::replay(&evidence)?;
    Ok(json!({
        "call_id": call_id.as_str(),
        "records": evidence.records,
        "replay": replay,
    }))
}

/// The tool a call was for: its Begin's, else its denial's (which may name an id
/// that never parsed — then no policy can allow reading it). An End alone names
/// no tool and is not shown.
fn call_tool(evidence: &soulbase_observe::CallEvidence) -> Option<ToolId> {
    evidence.records.iter().find_map(|r| match &r.payload {
        EvidenceEvent::Begin(b) => Some(b.tool_id.clone()),
        EvidenceEvent::Denied(d) => ToolId::new(d.tool.as_str()).ok(),
        EvidenceEvent::End(_) | EvidenceEvent::Conversation(_) => None,
    })
}

/// Whether `subject` may read the evidence of calls of `tool` (action
/// `read_evidence` on it).
async fn may_read_evidence(app: &App, subject: &Subject, tool: &ToolId) -> Result<(), SoulError> {
    let owner = app
        .registry
        .get(&subject.tenant, tool)
        .ok()
        .map(|t| t.owner);
    app.authorizer
        .authorize(AuthzRequest {
            subject,
            tool,
            tool_tenant: owner.as_ref().and_then(ToolOwner::tenant_id),
            action: Action::ReadEvidence,
            tool_scopes: &[],
        })
        .await
        .map(drop)
}

/// An agent-loop conversation's evidence (action `read_evidence` on
/// `soulbase.server.conversations`): its records and its replay, each call it
/// made replayed when the caller may read that call's evidence (else marked
/// `withheld`).
async fn conversation_json(
    app: &App,
    subject: &Subject,
    id: &CallId,
    mut evidence: soulbase_observe::CallEvidence,
) -> Result<Value, SoulError> {
    let resource = ToolId::new(Action::CONVERSATION_RESOURCE).map_err(SoulError::internal)?;
    may_read_evidence(app, subject, &resource).await?;
    let Some(p) = &app.persistence else {
        return Err(no_evidence());
    };
    let tenant = Some(&subject.tenant);
    let ended = |e: &soulbase_observe::CallEvidence| {
        e.records.iter().any(|r| {
            matches!(&r.payload, EvidenceEvent::Conversation(c)
                if matches!(c.step, soulbase_observe::ConversationStep::End { .. }))
        })
    };
    if !ended(&evidence) {
        if let Err(e) = p.sink.wait_drained(EVIDENCE_READ_WAIT).await {
            tracing::debug!(error = %e, "evidence read before the spool drained");
        }
        evidence = p.evidence.call(tenant, id).await?;
    }
    let mut calls = std::collections::BTreeMap::new();
    let mut withheld = std::collections::BTreeSet::new();
    for call in soulbase_observe::conversation_calls(&evidence) {
        let ev = p.evidence.call(tenant, &call).await?;
        let readable = match call_tool(&ev) {
            Some(tool) => may_read_evidence(app, subject, &tool).await.is_ok(),
            None => true,
        };
        if readable {
            calls.insert(call, ev);
        } else {
            withheld.insert(call);
        }
    }
    let replay = soulbase_observe::replay_conversation(&evidence, &calls, &withheld)?;
    Ok(json!({
        "call_id": id.as_str(),
        "records": evidence.records,
        "conversation": replay,
    }))
}

/// An unknown route: 404 in the JSON error envelope.
async fn no_route(uri: axum::http::Uri) -> Response {
    error_response_with(
        StatusCode::NOT_FOUND,
        &SoulError::new(
            ErrorCode::SchemaValidationFailed,
            format!("there is no route {}", uri.path()),
        )
        .with_field("field", "path"),
    )
}

/// A route asked with a method it does not serve: 405 in the JSON error envelope.
async fn wrong_method(method: Method, uri: axum::http::Uri) -> Response {
    error_response_with(
        StatusCode::METHOD_NOT_ALLOWED,
        &SoulError::new(
            ErrorCode::SchemaValidationFailed,
            format!("{} does not serve {method}", uri.path()),
        )
        .with_field("field", "method"),
    )
}

/// The JSON Schema of `config.yaml`, for editors: derived from the config model,
/// the same document as `docs/config.schema.json`. It holds no configuration
/// values, so it is served to anyone who can reach the port, like `/healthz`.
async fn config_schema() -> Response {
    static SCHEMA: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    json_response(
        StatusCode::OK,
        SCHEMA.get_or_init(soulbase_config::reference::json_schema),
    )
}

async fn healthz() -> Response {
    json_response(StatusCode::OK, &json!({"status": "ok"}))
}

async fn readyz(State(app): State<Arc<App>>) -> Response {
    if app.is_ready() {
        json_response(StatusCode::OK, &json!({"status": "ready"}))
    } else {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "not ready"}),
        )
    }
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    app.metrics
        .set_registry_version(app.registry.snapshot_version());
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
        .into_response()
}

/// The OpenAPI 3.1 document of the HTTP API, as committed.
const OPENAPI: &str = include_str!("../../../docs/openapi.json");

/// `GET /api/openapi.json`: the OpenAPI document of these routes. It holds no
/// configuration, so it is served to anyone who can reach the port, like
/// `/healthz`.
async fn openapi() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
        .into_response()
}

/// One route of the HTTP API (every route but `/mcp`).
#[derive(Debug, Clone)]
pub struct Route {
    /// The method it serves.
    pub method: Method,
    /// Its path, with `{param}` segments as axum and OpenAPI write them.
    pub path: &'static str,
    /// Served by every process; otherwise only by one with the `tools` role.
    pub every_role: bool,
}

impl Route {
    /// A route of the `tools` role only.
    const fn tools(method: Method, path: &'static str) -> Route {
        Route {
            method,
            path,
            every_role: false,
        }
    }

    /// A route every process serves (operations).
    const fn always(method: Method, path: &'static str) -> Route {
        Route {
            method,
            path,
            every_role: true,
        }
    }
}

/// Every route of the HTTP API but `/mcp`: the router is built from this table,
/// and `docs/openapi.json` describes exactly these (checked by tests).
pub const ROUTES: &[Route] = &[
    Route::tools(Method::GET, "/api/tools"),
    Route::tools(Method::POST, "/api/tools/{id}/preflight"),
    Route::tools(Method::POST, "/api/tools/{id}/invoke"),
    Route::tools(Method::GET, "/api/skills"),
    Route::tools(Method::GET, "/api/skills/{name}"),
    Route::tools(Method::PATCH, "/api/skills/{name}"),
    Route::tools(Method::GET, "/api/model/tools"),
    Route::tools(Method::POST, "/api/model/tool_calls"),
    Route::tools(Method::GET, "/api/model/prompt"),
    Route::tools(Method::POST, "/v1/chat/completions"),
    Route::always(Method::POST, "/api/reload"),
    Route::always(Method::GET, "/api/config/schema"),
    Route::always(Method::GET, "/api/openapi.json"),
    Route::tools(Method::GET, "/api/evidence/{call_id}"),
    Route::always(Method::GET, "/api/audit"),
    Route::tools(Method::POST, "/api/consent"),
    Route::tools(Method::POST, "/api/consent/{id}/revoke"),
    Route::tools(Method::GET, "/api/access"),
    Route::tools(Method::PUT, "/api/access/allow-list"),
    Route::tools(Method::PUT, "/api/access/overrides/{id}"),
    Route::always(Method::GET, "/healthz"),
    Route::always(Method::GET, "/readyz"),
    Route::always(Method::GET, "/metrics"),
];

/// The handler of `route` in this module; `None` for the model-facing routes,
/// which [`crate::model_api::routes`] serves.
fn endpoint(route: &Route) -> Option<MethodRouter<Arc<App>>> {
    Some(match (route.method.as_str(), route.path) {
        ("GET", "/api/tools") => get(list_tools),
        ("POST", "/api/tools/{id}/preflight") => post(preflight),
        ("POST", "/api/tools/{id}/invoke") => post(invoke),
        ("GET", "/api/skills") => get(list_skills),
        ("PATCH", "/api/skills/{name}") => patch(patch_skill),
        ("POST", "/api/reload") => post(reload),
        ("GET", "/api/config/schema") => get(config_schema),
        ("GET", "/api/openapi.json") => get(openapi),
        ("GET", "/api/evidence/{call_id}") => get(read_evidence),
        ("GET", "/api/audit") => get(crate::audit_api::list_audit),
        ("POST", "/api/consent") => post(issue_consent),
        ("POST", "/api/consent/{id}/revoke") => post(revoke_consent),
        ("GET", "/api/access") => get(crate::access_api::get_access),
        ("PUT", "/api/access/allow-list") => put(crate::access_api::put_allow_list),
        ("PUT", "/api/access/overrides/{id}") => put(crate::access_api::put_override),
        ("GET", "/healthz") => get(healthz),
        ("GET", "/readyz") => get(readyz),
        ("GET", "/metrics") => get(metrics),
        _ => return None,
    })
}

/// The routes of [`ROUTES`] a process with (or without) the `tools` role serves.
fn api_routes(tools_role: bool) -> Router<Arc<App>> {
    let mut router = Router::new();
    for route in ROUTES.iter().filter(|r| tools_role || r.every_role) {
        if let Some(endpoint) = endpoint(route) {
            router = router.route(route.path, endpoint);
        }
    }
    if tools_role {
        router = router.merge(crate::model_api::routes());
    }
    router
}

/// What the `/mcp` gate needs.
#[derive(Clone)]
struct McpGate {
    app: Arc<App>,
    sessions: Arc<McpSessions>,
    max_body: usize,
}

/// The MCP session id header.
const MCP_SESSION_ID: &str = "mcp-session-id";

/// Whether `origin` is this server's own origin on a loopback address: the page
/// was served by this very listener (`Origin` and `Host` name the same loopback
/// host and port), which no other site's page can claim — a DNS-rebinding page
/// sends its own name, not `127.0.0.1`.
fn own_loopback_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(authority) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    let name = authority
        .rsplit_once(':')
        .map_or(authority, |(name, _)| name);
    matches!(name, "127.0.0.1" | "localhost" | "[::1]") && host == Some(authority)
}

/// Origin validation, authentication and session limits in front of MCP: a
/// browser `Origin` must be this server's own loopback origin or listed in
/// `server.mcp_allowed_origins`; the caller must
/// authenticate; an `initialize` needs room under `server.mcp_max_sessions*`; a
/// session is used by its own tenant only, and is busy (never idle-expired) while
/// a request on it is answered.
async fn mcp_gate(State(gate): State<McpGate>, mut request: Request, next: Next) -> Response {
    let app = &gate.app;
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let allowed = app
            .config
            .current()
            .config()
            .server
            .mcp_allowed_origins
            .clone();
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok());
        let ok = origin
            .to_str()
            .is_ok_and(|o| allowed.iter().any(|a| a == o) || own_loopback_origin(o, host));
        if !ok {
            return error_response(
                &SoulError::new(ErrorCode::AuthForbidden, "this Origin may not use MCP")
                    .with_field("field", "origin"),
            );
        }
    }
    let tenant = match subject(app, request.headers()).await {
        // Handed on, so MCP does not authenticate the request a second time.
        Ok(s) => {
            let tenant = s.tenant.clone();
            request.extensions_mut().insert(s);
            tenant
        }
        Err(e) => return error_response(&e),
    };
    let session = request
        .headers()
        .get(MCP_SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let method = request.method().clone();
    let mut hold = None;
    let mut reservation = None;
    match &session {
        Some(id) => match gate.sessions.use_session(id, &tenant) {
            Ok(u) => hold = u,
            Err(e) => {
                app.metrics.refused(Surface::Mcp, e.code());
                return error_response(&e);
            }
        },
        None if method == Method::POST => {
            // Only an `initialize` creates a session: look before passing it on.
            let (parts, body) = request.into_parts();
            let bytes = match read_limited(body, gate.max_body).await {
                Ok(b) => b,
                Err(e) => return body_error(e, gate.max_body),
            };
            if soulbase_mcp::sessions::is_initialize(&bytes) {
                match gate.sessions.reserve(&tenant) {
                    Ok(r) => reservation = Some(r),
                    Err(e) => {
                        app.metrics.refused(Surface::Mcp, e.code());
                        return error_response(&e);
                    }
                }
            }
            request = Request::from_parts(parts, axum::body::Body::from(bytes));
        }
        None => {}
    }
    let mut response = next.run(request).await;
    if session.is_none()
        && let Some(id) = response
            .headers()
            .get(MCP_SESSION_ID)
            .and_then(|v| v.to_str().ok())
    {
        let used = match reservation.take() {
            Some(r) => r.commit(id),
            None => match gate.sessions.adopt(id, &tenant).await {
                Ok(u) => u,
                Err(e) => {
                    app.metrics.refused(Surface::Mcp, e.code());
                    return error_response(&e);
                }
            },
        };
        hold = Some(used);
    }
    if method == Method::DELETE
        && response.status().is_success()
        && let Some(id) = &session
    {
        gate.sessions.forget(id);
        hold = None;
        // The session is gone: `200 OK`, as the reference SDKs' servers answer
        // (rmcp says `202 Accepted`, which the Python client reports as a
        // failed termination).
        *response.status_mut() = StatusCode::OK;
    }
    match hold {
        Some(h) => response.map(|b| crate::listener::holding(b, h)),
        None => response,
    }
}

/// The MCP endpoint: the streamable HTTP service and its session limits.
pub struct Mcp {
    /// The rmcp service mounted at `/mcp`.
    pub service: McpService,
    /// Bounds its sessions (sharing its session manager).
    pub sessions: Arc<McpSessions>,
}

/// The MCP streamable HTTP service type.
pub type McpService = soulbase_mcp::transport::StreamableHttpService<
    soulbase_mcp::McpServer,
    soulbase_mcp::transport::LocalSessionManager,
>;

/// The whole HTTP router: [`ROUTES`], with `mcp` mounted at `/mcp`. Without the
/// `tools` role only the operations routes are served (`/api/reload`,
/// `/api/config/schema`, `/api/openapi.json`, `/healthz`, `/readyz`, `/metrics`).
/// Every route
/// takes bodies up to `server.max_body_bytes`, arriving within
/// `server.body_read_timeout_ms` (both read at start-up).
pub fn router(app: Arc<App>, mcp: Mcp) -> Router {
    let (tools_role, body) = {
        let snap = app.config.current();
        let server = &snap.config().server;
        (
            server.roles.contains(&soulbase_config::Role::Tools),
            BodyLimits {
                max: server.max_body_bytes,
                read_timeout: Duration::from_millis(server.body_read_timeout_ms),
            },
        )
    };
    let max_body = body.max;
    let limit = |router: Router| {
        router
            .layer(DefaultBodyLimit::max(max_body))
            .layer(middleware::from_fn_with_state(body, body_limit))
    };
    if !tools_role {
        // A role-only process (auth, qos, sandbox, evidence) answers other
        // processes over gRPC; its HTTP side is operations only.
        return limit(
            api_routes(false)
                .fallback(no_route)
                .method_not_allowed_fallback(wrong_method)
                .with_state(app),
        );
    }
    let gate = McpGate {
        app: app.clone(),
        sessions: mcp.sessions,
        max_body,
    };
    let mcp_routes = Router::new()
        .route_service("/mcp", mcp.service)
        .layer(middleware::from_fn_with_state(gate, mcp_gate));
    let all = api_routes(true)
        .with_state(app)
        .merge(mcp_routes)
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method);
    limit(all)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// Whether `router` already serves `method` on `path`: adding it again
    /// overlaps, which axum refuses (by panicking).
    fn serves(router: Router<Arc<App>>, method: &Method, path: &str) -> bool {
        let filter = axum::routing::MethodFilter::try_from(method.clone()).unwrap();
        let probe = Router::new().route(path, axum::routing::on(filter, || async {}));
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| router.merge(probe))).is_err()
    }

    /// The paths `router` routes, as its `Debug` output names them (its
    /// `path_router`, before its fallback's).
    fn paths_of(router: &Router<Arc<App>>) -> std::collections::BTreeSet<String> {
        let debug = format!("{router:?}");
        let (routes, fallback) = debug.split_once("fallback_router").unwrap();
        assert!(routes.contains("path_router"), "{debug}");
        assert!(!fallback.is_empty());
        routes
            .split('"')
            .filter(|s| s.starts_with('/'))
            .map(str::to_owned)
            .collect()
    }

    /// Every route of the table is served, by this module or by the model-facing
    /// routes, and those serve nothing the table does not list: the table is the
    /// router.
    #[test]
    fn the_route_table_is_what_the_router_serves() {
        let mut seen = std::collections::BTreeSet::new();
        for r in ROUTES {
            assert!(
                seen.insert((r.method.as_str(), r.path)),
                "{} {} twice",
                r.method,
                r.path
            );
        }
        let model: Vec<&Route> = ROUTES.iter().filter(|r| endpoint(r).is_none()).collect();
        for r in &model {
            assert!(
                serves(crate::model_api::routes(), &r.method, r.path),
                "{} {} is served by nothing",
                r.method,
                r.path
            );
            assert!(!r.every_role, "{} is served by the tools role only", r.path);
        }
        let model_paths: std::collections::BTreeSet<String> =
            model.iter().map(|r| r.path.to_owned()).collect();
        assert_eq!(paths_of(&crate::model_api::routes()), model_paths);
        // Nothing else of the model-facing routes' methods on those paths.
        for path in &model_paths {
            for method in [
                Method::GET,
                Method::POST,
                Method::PUT,
                Method::PATCH,
                Method::DELETE,
            ] {
                let listed = model
                    .iter()
                    .any(|r| r.path == path.as_str() && r.method == method);
                assert_eq!(
                    serves(crate::model_api::routes(), &method, path),
                    listed,
                    "{method} {path}"
                );
            }
        }
    }

    /// The served document is the committed one, and it is JSON.
    #[test]
    fn the_openapi_document_is_json() {
        let doc: Value = serde_json::from_str(OPENAPI).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
    }
}
