//! A tenant's view of the global tools over HTTP — its allow-list and its states
//! of global tools — through the one code path of
//! [`soulbase_tools::registry::access`] (the gRPC registry and the CLI use it
//! too):
//!
//! | Route | What |
//! |---|---|
//! | `GET /api/access` | the caller's tenant's view rules: the stored allow-list and overrides, and what the configuration (`tenants[]`) decides on top |
//! | `PUT /api/access/allow-list` | `{"tools": ["a.b.c", …]}` or `{"tools": null}` (every global tool); action `update` on `soulbase.server.access` |
//! | `PUT /api/access/overrides/{id}` | `{"state": "enabled" \| "paused" \| null}`; action `enable`, `disable`, or both to clear |
//!
//! A caller changes only its own tenant's view; the next call sees the change.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use schemars::JsonSchema;
use serde::Deserialize;
use soulbase_grpc::convert;
use soulbase_tools::registry::TenantOverride;
use soulbase_tools::registry::access::{self};
use soulbase_types::ToolId;

use crate::app::App;
use crate::http_api::{Param, answer, error_response, subject, typed_response};

/// `PUT /api/access/allow-list` body.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "AllowListRequest")]
pub(crate) struct AllowListBody {
    /// The only global tools the tenant sees (tool ids); `null`: all of them.
    /// Required, `null` included.
    #[serde(deserialize_with = "present")]
    #[schemars(schema_with = "crate::openapi::nullable::<Vec<String>>")]
    tools: Option<Vec<String>>,
}

/// `PUT /api/access/overrides/{id}` body.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "OverrideRequest")]
pub(crate) struct OverrideBody {
    /// `enabled`, `paused`, or `null` to clear. Required, as `tools` above.
    #[serde(deserialize_with = "present")]
    #[schemars(schema_with = "crate::openapi::nullable::<TenantOverride>")]
    state: Option<TenantOverride>,
}

/// A field that must be present, `null` included (`None`): with
/// `deserialize_with`, serde refuses a body without it rather than reading
/// `None`.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d)
}

/// `GET /api/access`.
pub(crate) async fn get_access(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    match subject(&app, &headers).await {
        Ok(s) => typed_response(
            StatusCode::OK,
            &access::access_of(&app.registry.view(), &s.tenant),
        ),
        Err(e) => error_response(&e),
    }
}

/// `PUT /api/access/allow-list`.
pub(crate) async fn put_allow_list(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body = match serde_json::from_slice::<AllowListBody>(&body) {
        Ok(AllowListBody { tools }) => tools,
        Err(e) => {
            return error_response(
                &convert::invalid("tools", "expected {\"tools\": [tool ids] | null}")
                    .with_note(e.to_string()),
            );
        }
    };
    let allow = match body {
        None => None,
        Some(list) => {
            let mut ids = BTreeSet::new();
            for (i, t) in list.iter().enumerate() {
                match ToolId::new(t.as_str()) {
                    Ok(id) => ids.insert(id),
                    Err(e) => {
                        return error_response(&convert::invalid(
                            &format!("tools[{i}]"),
                            format!("tools[{i}] is not a tool id: {}", e.reason),
                        ));
                    }
                };
            }
            Some(ids)
        }
    };
    let result = match subject(&app, &headers).await {
        Ok(s) => access::set_allow_list(app.authorizer.as_ref(), &app.admin, &s, allow).await,
        Err(e) => Err(e),
    };
    answer(&app, StatusCode::OK, result)
}

/// `PUT /api/access/overrides/{id}`.
pub(crate) async fn put_override(
    State(app): State<Arc<App>>,
    Param(id): Param,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let id = match ToolId::new(id.as_str()) {
        Ok(id) => id,
        Err(e) => {
            return error_response(&convert::invalid(
                "id",
                format!("not a tool id: {}", e.reason),
            ));
        }
    };
    let state = match serde_json::from_slice::<OverrideBody>(&body) {
        Ok(OverrideBody { state }) => state,
        Err(e) => {
            return error_response(
                &convert::invalid(
                    "state",
                    "expected {\"state\": \"enabled\" | \"paused\" | null}",
                )
                .with_note(e.to_string()),
            );
        }
    };
    let result = match subject(&app, &headers).await {
        Ok(s) => access::set_override(app.authorizer.as_ref(), &app.admin, &s, &id, state).await,
        Err(e) => Err(e),
    };
    answer(&app, StatusCode::OK, result)
}
