//! Authorized registry changes: the one place a tool's state is changed on
//! someone's behalf, whichever door the request came through (gRPC
//! `SetToolState`, the CLI's local mode).

use soulbase_auth::{Action, Authorizer, AuthzRequest};
use soulbase_errors::SoulError;
use soulbase_types::{Subject, ToolId};

use super::{Registry, ToolOwner};

/// A change of a tool's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateChange {
    /// Enable it (action `enable`).
    Enable,
    /// Pause it (action `disable`).
    Pause,
    /// Mark it deprecated (action `deprecate`).
    Deprecate,
}

impl StateChange {
    /// The action the change is authorized as.
    pub fn action(self) -> Action {
        match self {
            StateChange::Enable => Action::Enable,
            StateChange::Pause => Action::Disable,
            StateChange::Deprecate => Action::Deprecate,
        }
    }
}

/// Whether `subject` may perform `action` on tool `id` of `owner`: the
/// authorizer's decision, its refusal as it gave it.
pub async fn authorize(
    authorizer: &dyn Authorizer,
    subject: &Subject,
    owner: &ToolOwner,
    id: &ToolId,
    action: Action,
) -> Result<(), SoulError> {
    authorizer
        .authorize(AuthzRequest {
            subject,
            tool: id,
            tool_tenant: owner.tenant_id(),
            action,
        })
        .await
        .map(|_| ())
}

/// Applies `change` to tool `id` of `owner` for `subject`, once the authorizer
/// allows the change's action.
pub async fn change_state(
    authorizer: &dyn Authorizer,
    registry: &Registry,
    subject: &Subject,
    owner: &ToolOwner,
    id: &ToolId,
    change: StateChange,
) -> Result<(), SoulError> {
    authorize(authorizer, subject, owner, id, change.action()).await?;
    match change {
        StateChange::Enable => registry.enable(owner, id),
        StateChange::Pause => registry.pause(owner, id),
        StateChange::Deprecate => registry.deprecate(owner, id),
    }
}
