//! `soulbase keys new` and `soulbase consent issue` end to end: the real binary; what
//! it prints is loaded and checked by the same code the server uses.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

use soulbase_auth::{Authenticator, ConsentRequest, Credential, HmacConsent};
use soulbase_config::{ApiKeyConfig, ConfigHandle, ConfigLoader};
use soulbase_types::{ActorId, Subject, TenantId, ToolId, UnixMillis};

fn soulbase(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_soulbase"));
    for (k, _) in std::env::vars() {
        if k.starts_with("SOULBASE") {
            cmd.env_remove(k);
        }
    }
    cmd.args(args).envs(envs.iter().copied()).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// An authenticator over a `config.yaml` holding `api_keys` (YAML list items).
fn authenticator(api_keys: &str) -> Authenticator {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, format!("auth:\n  api_keys:\n{api_keys}")).unwrap();
    let snapshot = ConfigLoader::new().with_file(&path).load().unwrap();
    Authenticator::follow(ConfigHandle::new(snapshot)).unwrap()
}

#[test]
fn the_printed_entry_authenticates_the_printed_key_and_no_other() {
    let args = [
        "keys", "new", "--id", "ci-bot", "--tenant", "acme", "--actor", "ci-bot", "--role",
        "agent", "--scope", "skills:*",
    ];
    let o = soulbase(&args, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    let key = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("sbk_ci-bot_"))
        .unwrap_or_else(|| panic!("no key in {text}"));
    assert_eq!(text.matches(key).count(), 1, "the key is printed once");
    let entry = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("- {"))
        .unwrap_or_else(|| panic!("no entry in {text}"));
    assert!(!entry.contains(key), "the entry holds only the digest");

    let authn = authenticator(&format!("    {entry}\n"));
    let who = authn.authenticate(Credential::ApiKey(key)).unwrap();
    assert_eq!(who.tenant.as_str(), "acme");
    assert_eq!(who.actor.as_str(), "ci-bot");
    assert!(who.roles.contains("agent"), "{who:?}");
    assert!(who.scopes.contains("skills:*"), "{who:?}");

    let mut wrong = key.to_owned();
    let last = wrong.pop().unwrap();
    wrong.push(if last == 'A' { 'B' } else { 'A' });
    assert!(authn.authenticate(Credential::ApiKey(&wrong)).is_err());
    // Another key minted with the same id is not this entry's.
    let again = soulbase(&args, &[]);
    let other = stdout(&again)
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("sbk_ci-bot_"))
        .unwrap()
        .to_owned();
    assert_ne!(other, key);
    assert!(authn.authenticate(Credential::ApiKey(&other)).is_err());
}

#[test]
fn json_prints_the_key_and_the_entry() {
    let o = soulbase(
        &[
            "keys", "new", "--id", "k1", "--tenant", "true", "--actor", "123", "--json",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let key = doc["key"].as_str().unwrap();
    let entry: ApiKeyConfig = serde_json::from_value(doc["entry"].clone()).unwrap();
    assert_eq!(entry.sha256, soulbase_auth::api_key_digest(key));
    assert_eq!(
        (entry.tenant.as_str(), entry.actor.as_str()),
        ("true", "123")
    );
    // Ids that YAML would read as a boolean and a number stay strings (and
    // `keys create` is `keys new`).
    let text = soulbase(
        &[
            "keys", "create", "--id", "k2", "--tenant", "true", "--actor", "123",
        ],
        &[],
    );
    let entry = stdout(&text)
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("- {"))
        .unwrap()
        .to_owned();
    authenticator(&format!("    {entry}\n"));
}

#[test]
fn bad_input_is_a_usage_error_naming_the_flag() {
    for (args, flag) in [
        (vec!["--id", "", "--tenant", "acme", "--actor", "a"], "--id"),
        (
            vec!["--id", "ci_bot", "--tenant", "acme", "--actor", "a"],
            "--id",
        ),
        (
            vec!["--id", "ci bot", "--tenant", "acme", "--actor", "a"],
            "--id",
        ),
        (
            vec!["--id", "k", "--tenant", "ac me", "--actor", "a"],
            "--tenant",
        ),
        (vec!["--id", "k", "--actor", "a"], "--tenant"),
        (vec!["--id", "k", "--tenant", "acme"], "--actor"),
        (
            vec![
                "--id", "k", "--tenant", "acme", "--actor", "a", "--role", "a b",
            ],
            "--role",
        ),
        (
            vec![
                "--id", "k", "--tenant", "acme", "--actor", "a", "--scope", "",
            ],
            "--scope",
        ),
        (vec!["--tenant", "acme", "--actor", "a"], "--id"),
    ] {
        let all: Vec<&str> = ["keys", "new"]
            .iter()
            .copied()
            .chain(args.clone())
            .collect();
        let o = soulbase(&all, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stdout(&o));
        assert!(stderr(&o).contains(flag), "{args:?}: {}", stderr(&o));
        assert!(!stdout(&o).contains("sbk_"), "{args:?}: no key minted");
    }
}

/// A consent check of `token` for `subject` calling `tool` at `now`.
fn consent_request<'a>(
    subject: &'a Subject,
    tool: &'a ToolId,
    token: &'a str,
    now: UnixMillis,
) -> ConsentRequest<'a> {
    ConsentRequest {
        subject,
        tool,
        scope: None,
        args_digest: "sha256:any",
        token: Some(token),
        now,
        max_age_ms: None,
    }
}

#[test]
fn consent_tokens_verify_with_the_servers_key() {
    let key = "ab".repeat(32);
    let env = [("SOULBASED_CONSENT_HMAC_KEY", key.as_str())];
    let o = soulbase(
        &[
            "consent",
            "issue",
            "skills.hello-native.hello",
            "--tenant",
            "acme",
            "--actor",
            "alice",
            "--ttl",
            "2m",
        ],
        &env,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let token = stdout(&o).trim().to_owned();
    let verifier = HmacConsent::new(vec![0xab; 32]);
    let alice = Subject::new(
        TenantId::new("acme").unwrap(),
        ActorId::new("alice").unwrap(),
    );
    let tool = ToolId::new("skills.hello-native.hello").unwrap();
    let request = |subject, tool, now| consent_request(subject, tool, &token, now);
    let now = UnixMillis::now();
    verifier.check(&request(&alice, &tool, now)).unwrap();
    // Not for another actor or tool, nor after the ttl.
    let bob = Subject::new(TenantId::new("acme").unwrap(), ActorId::new("bob").unwrap());
    assert!(verifier.check(&request(&bob, &tool, now)).is_err());
    let other = ToolId::new("skills.greet.greet").unwrap();
    assert!(verifier.check(&request(&alice, &other, now)).is_err());
    let later = UnixMillis(now.0 + 3 * 60_000);
    assert!(verifier.check(&request(&alice, &tool, later)).is_err());

    // No key, a short key, a bad ttl: usage errors naming what is wrong.
    for (args, env, named) in [
        (vec!["--ttl", "5m"], vec![], "SOULBASED_CONSENT_HMAC_KEY"),
        (
            vec![],
            vec![("SOULBASED_CONSENT_HMAC_KEY", "abcd")],
            "SOULBASED_CONSENT_HMAC_KEY",
        ),
        (vec!["--ttl", "soon"], env.to_vec(), "--ttl"),
    ] {
        let all: Vec<&str> = [
            "consent",
            "issue",
            "skills.hello-native.hello",
            "--tenant",
            "acme",
            "--actor",
            "alice",
        ]
        .iter()
        .copied()
        .chain(args)
        .collect();
        let o = soulbase(&all, &env);
        assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
        assert!(stderr(&o).contains(named), "{}", stderr(&o));
    }
}

/// Output into a pipe whose reader has gone (`soulbase … | head`) ends the
/// command quietly, as Unix tools do, instead of a panic on the write.
#[test]
fn a_closed_pipe_ends_the_output_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_soulbase"))
        .args([
            "keys", "new", "--id", "k1", "--tenant", "acme", "--actor", "bot",
        ])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        out.status.signal(),
        Some(libc_sigpipe()),
        "{:?}",
        out.status
    );
}

/// `SIGPIPE`'s number on Linux.
fn libc_sigpipe() -> i32 {
    13
}
