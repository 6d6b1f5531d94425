//! Structural tenant isolation, checked before any policy.

use soulbase_errors::{ErrorCode, SoulError};

use crate::AuthzRequest;

/// Refuses a request for a tool owned by another tenant, whatever any policy says.
///
/// The answer is `TOOL.NOT_FOUND`, the same as for a tool that does not exist, so a
/// subject learns nothing about other tenants' tools.
pub fn check_tenant(req: &AuthzRequest<'_>) -> Result<(), SoulError> {
    match req.tool_tenant {
        Some(owner) if owner != &req.subject.tenant => {
            Err(SoulError::of(ErrorCode::ToolNotFound).with_note("tool of another tenant"))
        }
        _ => Ok(()),
    }
}
