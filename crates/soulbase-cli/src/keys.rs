//! `soulbase keys new`: mints an API key.
//!
//! The key (`sbk_<id>_<secret>`, from [`soulbase_auth::generate_api_key`]) is
//! printed once; what the server stores is the `auth.api_keys` entry beside it,
//! which holds only the key's SHA-256. `--json` prints `{"key": …, "entry": …}`.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::json;
use soulbase_config::ApiKeyConfig;
use soulbase_types::Subject;

use crate::options::{Common, IdentityArgs, OutputArgs};
use crate::target::{Failure, Global};

/// Arguments of `soulbase keys`.
#[derive(Debug, Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    command: KeysCommand,
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Mint an API key: prints the key once, and the auth.api_keys entry to paste
    /// into config.yaml (it holds only the key's SHA-256).
    #[command(visible_alias = "create")]
    New(NewKeyArgs),
}

#[derive(Debug, Args)]
struct NewKeyArgs {
    /// The key id: letters, digits and `-` (the key is `sbk_<id>_<secret>`); unique
    /// among auth.api_keys.
    #[arg(long)]
    id: String,
    /// The tenant the key acts for (required).
    #[arg(long)]
    tenant: Option<String>,
    /// The actor the key acts as (required).
    #[arg(long)]
    actor: Option<String>,
    /// A role of the key's subject (repeat for several).
    #[arg(long = "role", value_name = "ROLE")]
    roles: Vec<String>,
    /// A scope of the key's subject, e.g. `skill:NAME` (repeat for several).
    #[arg(long = "scope", value_name = "SCOPE")]
    scopes: Vec<String>,
    #[command(flatten)]
    output: OutputArgs,
}

/// Runs `soulbase keys …`; `common` are the options given before the subcommand.
pub fn run(common: Common, args: KeysArgs) -> ExitCode {
    if let Err(f) = common.refuse_server("keys") {
        return f.report();
    }
    let KeysCommand::New(new) = args.command;
    let identity = IdentityArgs {
        tenant: new.tenant.clone(),
        actor: new.actor.clone(),
    };
    let global = common.local(identity, None, None, new.output.json);
    match mint(&global, &new) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => f.report(),
    }
}

/// Checks the key id against what the key format and `auth.api_keys` accept.
fn check_id(id: &str) -> Result<(), Failure> {
    if id.is_empty() {
        return Err(Failure::Usage("--id: must not be empty".into()));
    }
    if !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(Failure::Usage(format!(
            "--id {id:?}: may contain only letters, digits and - (the key is sbk_<id>_<secret>)"
        )));
    }
    Ok(())
}

/// Checks a role or scope: non-empty, no whitespace or control characters.
fn check_word(flag: &str, value: &str) -> Result<(), Failure> {
    if value.is_empty() || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Failure::Usage(format!(
            "{flag} {value:?}: must be non-empty, without spaces or control characters"
        )));
    }
    Ok(())
}

fn mint(global: &Global, args: &NewKeyArgs) -> Result<(), Failure> {
    check_id(&args.id)?;
    let mut subject: Subject = global.subject()?;
    for role in &args.roles {
        check_word("--role", role)?;
        subject = subject.with_role(role.as_str());
    }
    for scope in &args.scopes {
        check_word("--scope", scope)?;
        subject = subject.with_scope(scope.as_str());
    }
    let issued = soulbase_auth::generate_api_key(&args.id, &subject);
    if global.json {
        let doc = json!({ "key": issued.key, "entry": issued.config });
        println!("{}", crate::output::pretty(&doc));
    } else {
        println!(
            "API key {} for tenant {}, actor {}, shown once (Soulbase keeps only its SHA-256): \
             hand it to the client, e.g. as $SOULBASE_API_KEY or the x-api-key header.\n",
            issued.config.id, issued.config.tenant, issued.config.actor
        );
        println!("  {}\n", issued.key);
        println!(
            "Add this entry under auth.api_keys in config.yaml (it holds only the key's \
             SHA-256; a reload applies it):\n"
        );
        println!("  {}", yaml_entry(&issued.config));
    }
    Ok(())
}

/// The entry as one YAML flow-mapping list item, every string quoted (a tenant
/// named `true` or `123` stays a string).
pub fn yaml_entry(entry: &ApiKeyConfig) -> String {
    let q = |s: &str| json!(s).to_string();
    let list = |items: &[String]| {
        let quoted: Vec<String> = items.iter().map(|s| q(s)).collect();
        format!("[{}]", quoted.join(", "))
    };
    let mut fields = vec![
        format!("id: {}", q(&entry.id)),
        format!("sha256: {}", q(&entry.sha256)),
        format!("tenant: {}", q(&entry.tenant)),
        format!("actor: {}", q(&entry.actor)),
    ];
    if !entry.roles.is_empty() {
        fields.push(format!("roles: {}", list(&entry.roles)));
    }
    if !entry.scopes.is_empty() {
        fields.push(format!("scopes: {}", list(&entry.scopes)));
    }
    format!("- {{ {} }}", fields.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_key_format() {
        assert!(check_id("ci-bot-2").is_ok());
        for bad in ["", "ci_bot", "ci bot", "é"] {
            assert!(
                matches!(check_id(bad), Err(Failure::Usage(m)) if m.starts_with("--id")),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_entry_quotes_every_string() {
        let entry = ApiKeyConfig {
            id: "k".into(),
            sha256: "ab".into(),
            tenant: "true".into(),
            actor: "123".into(),
            roles: vec!["agent".into()],
            scopes: vec!["skills:*".into()],
            revoked: false,
        };
        assert_eq!(
            yaml_entry(&entry),
            r#"- { id: "k", sha256: "ab", tenant: "true", actor: "123", roles: ["agent"], scopes: ["skills:*"] }"#
        );
    }
}
