//! Elicitation for consent: a `tools/call` of a tool that needs consent, made
//! without a token by a client that declared `elicitation`, asks the user
//! (`elicitation/create`) what the tool will do — its description, side effect,
//! safety class, consent scope and lifetime — before it runs. On approval the
//! server mints a token through the one [`ConsentDesk`] every surface issues
//! with (issued as the caller, who must hold `consent_issue` on the tool; bound
//! to the caller's tenant and actor, the tool and the arguments' digest) and the
//! call runs with it, its Begin recording the token. Declined, cancelled, not
//! issuable, or a client that cannot be asked: the call goes on without one and
//! is refused `CONSENT.REQUIRED`, as on every surface.

use rmcp::RoleServer;
use rmcp::model::{ElicitRequestParams, ElicitationAction, ElicitationSchema};
use serde_json::{Value, json};
use soulbase_edge::{CallMeta, CallRequest, ConsentAsk, ConsentDesk, Stack, Surface};
use soulbase_tools::ToolManifest;
use soulbase_types::{Origin, Subject, ToolId};

/// The form the user answers: one yes/no.
fn approval_form() -> Option<ElicitationSchema> {
    serde_json::from_value(json!({
        "type": "object",
        "properties": {"approve": {
            "type": "boolean",
            "title": "Approve this call",
            "description": "Allow this one call, with these arguments",
            "default": false
        }},
        "required": ["approve"]
    }))
    .ok()
}

/// What the user is asked about a call of `manifest`'s tool.
fn question(manifest: &ToolManifest, subject: &Subject) -> String {
    let consent = &manifest.consent;
    let lasts = consent.ttl_ms.map_or_else(
        || "the server's consent lifetime".to_owned(),
        |ms| format!("{} s", ms.div_ceil(1000)),
    );
    format!(
        "{actor} asks to call {tool}: {description}\n\
         Side effect: {side_effect:?}; safety class: {safety:?}; consent scope: {scope}.\n\
         Your consent covers this one call with exactly these arguments and lasts {lasts}.",
        actor = subject.actor,
        tool = manifest.id,
        description = manifest.description,
        side_effect = manifest.side_effect,
        safety = manifest.safety_class,
        scope = consent.scope.as_deref().unwrap_or("this tool"),
    )
}

/// The consent token for a call of `tool` with `args` by `subject`, asked of
/// the user through `peer` (see the module docs); `None` when nothing is to be
/// asked or the user did not approve.
pub(crate) async fn ask(
    peer: &rmcp::Peer<RoleServer>,
    stack: &Stack,
    desk: &ConsentDesk,
    subject: &Subject,
    tool: &str,
    args: &Value,
    meta: &CallMeta,
) -> Option<String> {
    if meta.consent.is_some() {
        return None;
    }
    let declared = peer
        .peer_info()
        .is_some_and(|client| client.capabilities.elicitation.is_some());
    if !declared {
        return None;
    }
    // Asked only when consent is all that stands in the call's way.
    let dry_run = CallRequest {
        surface: Surface::Mcp,
        subject: subject.clone(),
        tool: tool.to_owned(),
        args: args.clone(),
        origin: Origin::Llm,
        meta: meta.clone(),
    };
    if !stack.wants_consent_only(dry_run).await {
        return None;
    }
    let id = ToolId::new(tool).ok()?;
    let resolved = stack.invoker().resolve(&subject.tenant, &id).ok()?;
    let params = ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: question(&resolved.tool.manifest, subject),
        requested_schema: approval_form()?,
    };
    let answer = match peer.create_elicitation(params).await {
        Ok(a) => a,
        Err(e) => {
            tracing::info!(error = %e, %tool, "the client could not be asked for consent");
            return None;
        }
    };
    let approved = answer.action == ElicitationAction::Accept
        && answer
            .content
            .as_ref()
            .and_then(|c| c.get("approve"))
            .and_then(Value::as_bool)
            == Some(true);
    if !approved {
        return None;
    }
    let ask = ConsentAsk {
        tool: tool.to_owned(),
        actor: None,
        args: Some(args.clone()),
        ttl_ms: None,
    };
    match desk.issue(subject, ask).await {
        Ok(issued) => Some(issued.token),
        Err(e) => {
            tracing::info!(error = %e, %tool, "consent approved by the user could not be issued");
            None
        }
    }
}
