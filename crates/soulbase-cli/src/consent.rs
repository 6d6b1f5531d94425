//! `soulbase consent issue TOOL` and `soulbase consent revoke ID`.
//!
//! Tools whose manifest requires consent (every native tool, every `write` or
//! `destructive` skill tool) run only with a token proving a person approved the
//! call; send it as the `x-soulbase-consent` header (HTTP), metadata (gRPC) or
//! `--consent-token`.
//!
//! - With a server (`--server` or `$SOULBASE_SERVER`), the server issues the token
//!   (gRPC `Consent.Issue`): the caller must be an approver — policy allows them
//!   `consent_issue` on the tool — and consents for an actor of their own tenant
//!   (`--for`, default themselves). `revoke` works only this way.
//! - Without one, the command signs a `v1` token itself with the HMAC key in
//!   `$SOULBASED_CONSENT_HMAC_KEY` (the server's, hex, at least 32 bytes), for
//!   `--tenant` / `--actor`: the development counterpart of a consent UI, since
//!   whoever holds the key can approve any call.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::json;
use soulbase_app::app::CONSENT_KEY_ENV;
use soulbase_auth::{ConsentGrant, ConsentIssuer, HmacConsent};
use soulbase_grpc::roles::auth_proto as pb;
use soulbase_grpc::roles::auth_proto::consent_client::ConsentClient;
use soulbase_types::{ActorId, ToolId, UnixMillis};

use crate::duration::parse_millis;
use crate::options::{Common, TargetArgs};
use crate::target::{self, Failure, Global, soul};

/// Arguments of `soulbase consent`.
#[derive(Debug, Args)]
pub struct ConsentArgs {
    /// Where the command runs and as whom.
    #[command(flatten)]
    target: TargetArgs,
    #[command(subcommand)]
    command: ConsentCommand,
}

#[derive(Debug, Subcommand)]
enum ConsentCommand {
    /// Issue a consent token for one tool and print it: by the server (`--server`),
    /// else signed here with $SOULBASED_CONSENT_HMAC_KEY.
    Issue(IssueArgs),
    /// Revoke a consent token by id (needs `--server`).
    Revoke(RevokeArgs),
}

#[derive(Debug, Args)]
struct IssueArgs {
    /// The tool consented to (`group.pkg.name`).
    tool: String,
    /// The actor allowed to make the call (default: with a server, the caller;
    /// locally, --actor).
    #[arg(long = "for", value_name = "ACTOR")]
    for_actor: Option<String>,
    /// Bind the consent to calls with exactly these arguments (a JSON object).
    #[arg(long, value_name = "JSON")]
    args: Option<String>,
    /// How long the token is valid: `90s`, `15m`, `2h`, `7d` (default: the
    /// server's `auth.consent.default_ttl_ms`; locally 10m).
    #[arg(long)]
    ttl: Option<String>,
}

#[derive(Debug, Args)]
struct RevokeArgs {
    /// The token id (printed by `issue --json`, or the `id` of `POST /api/consent`).
    id: String,
}

/// Runs `soulbase consent …`; `common` are the options given before the
/// subcommand.
pub fn run(common: Common, args: ConsentArgs) -> ExitCode {
    let global = common.for_target(args.target);
    let done = match args.command {
        ConsentCommand::Issue(issue) => match global.server_url() {
            Some(url) => {
                target::runtime().and_then(|rt| rt.block_on(issue_remote(&global, &url, &issue)))
            }
            None => sign(&global, &issue),
        },
        ConsentCommand::Revoke(revoke) => match global.server_url() {
            Some(url) => target::runtime()
                .and_then(|rt| rt.block_on(revoke_remote(&global, &url, &revoke.id))),
            None => Err(Failure::Usage(
                "revoking needs a server: --server URL or $SOULBASE_SERVER".into(),
            )),
        },
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => f.report(),
    }
}

fn ttl_ms(ttl: Option<&str>) -> Result<Option<u64>, Failure> {
    let Some(ttl) = ttl else { return Ok(None) };
    let ms = parse_millis("--ttl", ttl).map_err(Failure::Usage)?;
    u64::try_from(ms)
        .ok()
        .filter(|ms| *ms > 0)
        .map(Some)
        .ok_or_else(|| Failure::Usage("--ttl: must be longer than 0".into()))
}

fn args_json(args: Option<&str>) -> Result<Option<serde_json::Value>, Failure> {
    let Some(text) = args else { return Ok(None) };
    match serde_json::from_str(text) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(Some(v)),
        _ => Err(Failure::Usage("--args: must be a JSON object".into())),
    }
}

async fn issue_remote(global: &Global, url: &str, args: &IssueArgs) -> Result<(), Failure> {
    let body = pb::IssueConsentRequest {
        tool_id: args.tool.clone(),
        actor: args.for_actor.clone().unwrap_or_default(),
        args_json: args_json(args.args.as_deref())?
            .map(|v| v.to_string())
            .unwrap_or_default(),
        ttl_ms: ttl_ms(args.ttl.as_deref())?.unwrap_or(0),
    };
    let mut req = tonic::Request::new(body);
    global.authenticate(&mut req)?;
    let r = ConsentClient::new(target::channel(url).await?)
        .issue(req)
        .await
        .map_err(|s| soul(&soulbase_errors::SoulError::from_status(&s)))?
        .into_inner();
    if global.json {
        let doc = json!({
            "token": r.token,
            "id": r.id,
            "tool": r.tool_id,
            "tenant": r.tenant,
            "actor": r.actor,
            "args_digest": (!r.args_digest.is_empty()).then_some(&r.args_digest),
            "issued_at": r.issued_at_ms,
            "expires_at": r.expires_at_ms,
        });
        println!("{}", crate::output::pretty(&doc));
    } else {
        println!("{}", r.token);
    }
    Ok(())
}

async fn revoke_remote(global: &Global, url: &str, id: &str) -> Result<(), Failure> {
    let mut req = tonic::Request::new(pb::RevokeConsentRequest { id: id.to_owned() });
    global.authenticate(&mut req)?;
    ConsentClient::new(target::channel(url).await?)
        .revoke(req)
        .await
        .map_err(|s| soul(&soulbase_errors::SoulError::from_status(&s)))?;
    if global.json {
        println!(
            "{}",
            crate::output::pretty(&json!({"id": id, "revoked": true}))
        );
    } else {
        println!("revoked {id}");
    }
    Ok(())
}

/// Decodes the consent key: hex, at least 32 bytes (what the server accepts).
fn consent_key(hex_key: &str) -> Result<Vec<u8>, Failure> {
    let bad = || {
        Failure::Usage(format!(
            "${CONSENT_KEY_ENV}: must be at least 64 hex digits (32 bytes), the key the server \
             verifies consent with"
        ))
    };
    let bytes = hex::decode(hex_key.trim()).map_err(|_| bad())?;
    if bytes.len() < 32 {
        return Err(bad());
    }
    Ok(bytes)
}

fn sign(global: &Global, args: &IssueArgs) -> Result<(), Failure> {
    let tool = ToolId::new(args.tool.as_str())
        .map_err(|e| Failure::Usage(format!("{:?} is not a tool id: {}", args.tool, e.reason)))?;
    let ttl = ttl_ms(args.ttl.as_deref())?.unwrap_or(600_000);
    let mut subject = global.subject()?;
    if let Some(a) = &args.for_actor {
        subject.actor =
            ActorId::new(a.as_str()).map_err(|e| Failure::Usage(format!("--for: {}", e.reason)))?;
    }
    let key = std::env::var(CONSENT_KEY_ENV).map_err(|_| {
        Failure::Usage(format!(
            "${CONSENT_KEY_ENV} is not set: export the key the server verifies consent with \
             (hex, at least 32 bytes), or ask the server with --server"
        ))
    })?;
    let now = UnixMillis::now();
    let mut grant =
        ConsentGrant::for_tool(&subject, &tool, now, i64::try_from(ttl).unwrap_or(i64::MAX));
    grant.args_digest = args_json(args.args.as_deref())?
        .map(|v| soulbase_observe::digest_bytes(&soulbase_observe::canonical_json(&v)));
    let token = HmacConsent::new(consent_key(&key)?)
        .issue_token(&grant, now)
        .map_err(|e| soul(&e))?;
    if global.json {
        let doc = json!({
            "token": token,
            "id": grant.id,
            "tool": tool.as_str(),
            "tenant": subject.tenant.as_str(),
            "actor": subject.actor.as_str(),
            "args_digest": grant.args_digest,
            "issued_at": now.0,
            "expires_at": grant.expires_at.0,
        });
        println!("{}", crate::output::pretty(&doc));
    } else {
        println!("{token}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_hex_of_at_least_32_bytes() {
        assert_eq!(consent_key(&"ab".repeat(32)).unwrap(), vec![0xab; 32]);
        assert!(consent_key(&"ab".repeat(31)).is_err());
        assert!(consent_key("not hex").is_err());
    }
}
