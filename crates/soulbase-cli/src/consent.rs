//! `soulbase consent issue TOOL`: a consent token for one tool, signed with the
//! server's consent key.
//!
//! Tools whose manifest requires consent (every native tool, every `write` or
//! `destructive` skill tool) run only with a token proving a person approved the
//! call. A server verifies `v1` tokens with the HMAC key in
//! `$SOULBASED_CONSENT_HMAC_KEY` (hex, at least 32 bytes); this command signs one
//! with the same variable, for `--tenant` / `--actor`, valid for `--ttl`. Send it
//! as the `x-soulbase-consent` header (HTTP), metadata (gRPC) or `--consent-token`.
//! It is the development counterpart of a consent UI: whoever holds the key can
//! approve any call.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::json;
use soulbase_app::app::CONSENT_KEY_ENV;
use soulbase_auth::{ConsentGrant, ConsentIssuer, HmacConsent};
use soulbase_types::{ToolId, UnixMillis};

use crate::duration::parse_millis;
use crate::options::{Common, IdentityArgs, OutputArgs};
use crate::target::{Failure, soul};

/// Arguments of `soulbase consent`.
#[derive(Debug, Args)]
pub struct ConsentArgs {
    #[command(subcommand)]
    command: ConsentCommand,
}

#[derive(Debug, Subcommand)]
enum ConsentCommand {
    /// Sign a consent token for one tool with $SOULBASED_CONSENT_HMAC_KEY (the
    /// server's key) and print it.
    Issue(IssueArgs),
}

#[derive(Debug, Args)]
struct IssueArgs {
    /// The tool consented to (`group.pkg.name`).
    tool: String,
    /// The tenant of the caller consented to (required).
    #[arg(long)]
    tenant: Option<String>,
    /// The actor consented to make the call (required).
    #[arg(long)]
    actor: Option<String>,
    /// How long the token is valid: `90s`, `15m`, `2h`, `7d`.
    #[arg(long, default_value = "10m")]
    ttl: String,
    #[command(flatten)]
    output: OutputArgs,
}

/// Runs `soulbase consent …`; `common` are the options given before the
/// subcommand.
pub fn run(common: Common, args: ConsentArgs) -> ExitCode {
    if let Err(f) = common.refuse_server("consent") {
        return f.report();
    }
    let ConsentCommand::Issue(issue) = args.command;
    match sign(common, issue) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => f.report(),
    }
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

fn sign(common: Common, args: IssueArgs) -> Result<(), Failure> {
    let json = args.output.json;
    let identity = IdentityArgs {
        tenant: args.tenant,
        actor: args.actor,
    };
    let global = common.local(identity, None, None, json);
    let tool = ToolId::new(args.tool.as_str())
        .map_err(|e| Failure::Usage(format!("{:?} is not a tool id: {}", args.tool, e.reason)))?;
    let ttl = parse_millis("--ttl", &args.ttl).map_err(Failure::Usage)?;
    if ttl <= 0 {
        return Err(Failure::Usage("--ttl: must be longer than 0".into()));
    }
    let subject = global.subject()?;
    let key = std::env::var(CONSENT_KEY_ENV).map_err(|_| {
        Failure::Usage(format!(
            "${CONSENT_KEY_ENV} is not set: export the key the server verifies consent with \
             (hex, at least 32 bytes)"
        ))
    })?;
    let now = UnixMillis::now();
    let grant = ConsentGrant::for_tool(&subject, &tool, now, ttl);
    let token = HmacConsent::new(consent_key(&key)?)
        .issue_token(&grant, now)
        .map_err(|e| soul(&e))?;
    if json {
        let doc = json!({
            "token": token,
            "tool": tool.as_str(),
            "tenant": subject.tenant.as_str(),
            "actor": subject.actor.as_str(),
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
