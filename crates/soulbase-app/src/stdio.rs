//! MCP over stdio for one tenant and actor (`soulbased mcp`, `soulbase mcp`).

use std::sync::Arc;
use std::time::Duration;

use soulbase_types::{ActorId, Subject, TenantId};

use crate::app::App;
use crate::evidence::EvidenceFlush;

/// Serves MCP over stdin/stdout until the client closes the stream, acting for
/// `tenant` / `actor` on every call, then flushes the evidence spool (up to five
/// seconds) so no record of the session is lost.
///
/// With `skill`, the session is bound to that skill: its tool set is the skill's
/// and its calls are made as that skill (imports checked). Calls run through the
/// app's one stack (metrics, `execute_tool` spans, the skills' terms).
///
/// Errors are human-readable: `--tenant: …` / `--actor: …` for a malformed id, or
/// `CODE: message` when the stdio transport fails.
pub async fn serve_mcp(
    app: Arc<App>,
    flush: EvidenceFlush,
    tenant: &str,
    actor: &str,
    skill: Option<String>,
) -> Result<(), String> {
    let tenant = TenantId::new(tenant).map_err(|e| format!("--tenant: {}", e.reason))?;
    let actor = ActorId::new(actor).map_err(|e| format!("--actor: {}", e.reason))?;
    let mut server = soulbase_mcp::McpServer::for_subject(
        app.registry.clone(),
        app.stack.clone(),
        Subject::new(tenant, actor),
    )
    .with_bound_skill(skill)
    .with_consent(app.consent_desk.clone())
    .with_fixtures(app.config.current().config().server.mcp_conformance_tools);
    if let Some(s) = &app.skills {
        server = server.with_skills(s.terms.clone());
    }
    soulbase_mcp::serve_stdio(server)
        .await
        .map_err(|e| format!("{}: {}", e.code().as_str(), e.message()))?;
    flush.flush(Duration::from_secs(5)).await;
    Ok(())
}
