//! `PUT /api/tools/{id}/state`: enable, pause or deprecate a tool of the
//! caller's own tenant (or, with `owner: global`, a global tool) — what gRPC's
//! `SetToolState` does, over HTTP, for the console and for curl.
//!
//! The change is authorized as its action (`enable`, `disable`, `deprecate`) on
//! the tool, applied through the one [`RegistryAdmin`](soulbase_tools::registry::admin::RegistryAdmin)
//! (optimistic concurrency, announced to replicas, audited naming the caller),
//! and answered with the tool as the caller now sees it. A tenant's view of a
//! global tool (pause it for this tenant only) is `PUT /api/access/overrides/{id}`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use schemars::JsonSchema;
use serde::Deserialize;
use soulbase_edge::{CallObserver, Surface};
use soulbase_errors::SoulError;
use soulbase_grpc::convert;
use soulbase_tools::ToolOwner;
use soulbase_tools::registry::admin::{self, StateChange};
use soulbase_types::ToolId;

use crate::app::App;
use crate::bodies::ToolView;
use crate::http_api::{Param, error_response, subject, typed_response};

/// The change asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChangeName {
    /// Enable it (action `enable`).
    Enable,
    /// Pause it: calls are refused `TOOL.DISABLED` (action `disable`).
    Pause,
    /// Mark it deprecated, for good (action `deprecate`).
    Deprecate,
}

/// Whose tool it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OwnerName {
    /// The caller's own tenant (the default).
    #[default]
    Tenant,
    /// A global tool, for every tenant (the policy must allow it).
    Global,
}

/// `PUT /api/tools/{id}/state` body.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolStateBody {
    /// What to do.
    pub change: ChangeName,
    /// Whose tool (default `tenant`).
    #[serde(default)]
    pub owner: OwnerName,
}

async fn change(
    app: &App,
    headers: &HeaderMap,
    id: &str,
    body: &Bytes,
) -> Result<Response, SoulError> {
    let id = ToolId::new(id)
        .map_err(|e| convert::invalid("id", format!("not a tool id: {}", e.reason)))?;
    let body: ToolStateBody = serde_json::from_slice(body).map_err(|e| {
        convert::invalid(
            "change",
            "expected {\"change\": \"enable\" | \"pause\" | \"deprecate\", \"owner\"?: \"tenant\" | \"global\"}",
        )
        .with_source(e)
    })?;
    let subject = subject(app, headers).await?;
    let owner = match body.owner {
        OwnerName::Tenant => ToolOwner::tenant(subject.tenant.clone()),
        OwnerName::Global => ToolOwner::Global,
    };
    let change = match body.change {
        ChangeName::Enable => StateChange::Enable,
        ChangeName::Pause => StateChange::Pause,
        ChangeName::Deprecate => StateChange::Deprecate,
    };
    admin::change_state(
        app.authorizer.as_ref(),
        &app.admin,
        &subject,
        &owner,
        &id,
        change,
    )
    .await?;
    let now = app.registry.get(&subject.tenant, &id)?;
    Ok(typed_response(StatusCode::OK, &ToolView::from(&now)))
}

/// `PUT /api/tools/{id}/state`.
pub(crate) async fn put_tool_state(
    State(app): State<Arc<App>>,
    Param(id): Param,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match change(&app, &headers, &id, &body).await {
        Ok(r) => r,
        Err(e) => {
            app.metrics.refused(Surface::Http, e.code());
            error_response(&e)
        }
    }
}
