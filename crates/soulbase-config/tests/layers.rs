//! Layer precedence, error reporting and snapshots.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use soulbase_config::{ConfigLoader, DurabilityMode, EvidenceBackend, Role};

fn write(dir: &tempfile::TempDir, text: &str) -> PathBuf {
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn defaults_are_the_embedded_setup() {
    let snap = ConfigLoader::new().load().unwrap();
    assert_eq!(snap.skills.dir, PathBuf::from("./skills"));
    assert_eq!(snap.evidence.backend, EvidenceBackend::Sqlite);
    assert_eq!(snap.evidence.durability, DurabilityMode::Sync);
    assert_eq!(snap.server.roles.len(), 5);
    assert!(snap.policy.rules.is_empty(), "deny by default");
    assert_eq!(snap.hash().len(), 64);
}

#[test]
fn file_overrides_defaults_field_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "skills:\n  dir: /srv/skills\nserver:\n  roles: [tools, auth]\n",
    );
    let snap = ConfigLoader::new().with_file(&path).load().unwrap();
    assert_eq!(snap.skills.dir, PathBuf::from("/srv/skills"));
    assert_eq!(
        snap.skills.poll_interval_ms, 5_000,
        "untouched sibling keeps its default"
    );
    assert_eq!(snap.server.roles, vec![Role::Tools, Role::Auth]);
}

#[test]
fn environment_overrides_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "skills:\n  dir: /from/file\n  poll_interval_ms: 900\n",
    );
    let snap = ConfigLoader::new()
        .with_file(&path)
        .with_env([
            ("SKILLS_DIR", "/from/env"),
            ("SOULBASE_SKILLS__POLL_INTERVAL_MS", "700"),
            ("SOULBASE_SKILLS__WATCH", "false"),
            ("SOULBASE_SERVER__ROLES", "qos,sandbox"),
            ("SOULBASE_TEST_SOMETHING_ELSE", "ignored"),
            ("HOME", "/root"),
        ])
        .load()
        .unwrap();
    assert_eq!(snap.skills.dir, PathBuf::from("/from/env"));
    assert_eq!(snap.skills.poll_interval_ms, 700);
    assert!(!snap.skills.watch);
    assert_eq!(snap.server.roles, vec![Role::Qos, Role::Sandbox]);
}

#[test]
fn flags_override_environment() {
    let snap = ConfigLoader::new()
        .with_env([("SKILLS_DIR", "/from/env")])
        .with_named_flag("--skills-dir", "skills.dir", "/from/flag")
        .with_flag("evidence.durability", "async")
        .load()
        .unwrap();
    assert_eq!(snap.skills.dir, PathBuf::from("/from/flag"));
    assert_eq!(snap.evidence.durability, DurabilityMode::Async);
}

#[test]
fn invalid_file_names_the_field_path_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "skills:\n  poll_interval_ms: soon\n");
    let err = ConfigLoader::new().with_file(&path).load().unwrap_err();
    let p = &err.problems[0];
    assert_eq!(p.path, "skills.poll_interval_ms");
    assert_eq!(p.source, path.display().to_string());
    let text = err.to_string();
    assert!(text.contains("skills.poll_interval_ms"), "{text}");
    assert!(text.contains("config.yaml"), "{text}");
}

#[test]
fn unknown_field_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "skills:\n  dri: /typo\n");
    let err = ConfigLoader::new().with_file(&path).load().unwrap_err();
    assert!(err.to_string().contains("dri"), "{err}");
    assert!(err.problems[0].path.starts_with("skills"), "{err}");
}

#[test]
fn nested_list_errors_name_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "quota:\n  limits:\n    - tool: a.b.c\n      rate: 10/min\n    - tool: a.b.c\n      rate: 10/fortnight\n",
    );
    let err = ConfigLoader::new().with_file(&path).load().unwrap_err();
    assert_eq!(err.problems[0].path, "quota.limits[1].rate", "{err}");
}

#[test]
fn semantic_errors_are_all_reported_with_their_layer() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "evidence:\n  backend: postgres\nquota:\n  backend: redis\npolicy:\n  rules:\n    - effect: allow\n      tools: [\"Bad Pattern\"]\n",
    );
    let err = ConfigLoader::new()
        .with_file(&path)
        .with_env([("SOULBASE_SKILLS__POLL_INTERVAL_MS", "5")])
        .load()
        .unwrap_err();
    let paths: Vec<&str> = err.problems.iter().map(|p| p.path.as_str()).collect();
    assert!(paths.contains(&"evidence.url"), "{err}");
    assert!(paths.contains(&"quota.redis_url"), "{err}");
    assert!(paths.contains(&"policy.rules[0].tools[0]"), "{err}");
    let poll = err
        .problems
        .iter()
        .find(|p| p.path == "skills.poll_interval_ms")
        .unwrap();
    assert_eq!(poll.source, "environment SOULBASE_SKILLS__POLL_INTERVAL_MS");
}

#[test]
fn env_value_of_the_wrong_type_names_the_variable() {
    let err = ConfigLoader::new()
        .with_env([("SOULBASE_SKILLS__WATCH", "maybe")])
        .load()
        .unwrap_err();
    assert_eq!(err.problems[0].path, "skills.watch");
    assert_eq!(err.problems[0].source, "environment SOULBASE_SKILLS__WATCH");
}

#[test]
fn yaml_syntax_errors_give_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "skills:\n  dir: [unclosed\n");
    let err = ConfigLoader::new().with_file(&path).load().unwrap_err();
    assert!(err.to_string().contains("line"), "{err}");
}

#[test]
fn missing_required_file_is_an_error_but_optional_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.yaml");
    assert!(ConfigLoader::new().with_file(&missing).load().is_err());
    assert!(
        ConfigLoader::new()
            .with_optional_file(&missing)
            .load()
            .is_ok()
    );
}

#[test]
fn equal_configs_hash_equally_whatever_the_layers() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "skills:\n  dir: /x\n");
    let a = ConfigLoader::new().with_file(&path).load().unwrap();
    let b = ConfigLoader::new()
        .with_env([("SKILLS_DIR", "/x")])
        .load()
        .unwrap();
    let c = ConfigLoader::new().load().unwrap();
    assert_eq!(a.hash(), b.hash());
    assert_ne!(a.hash(), c.hash());
}

#[test]
fn config_error_maps_to_the_stable_code() {
    let err = ConfigLoader::new()
        .with_env([("SOULBASE_SKILLS__WATCH", "maybe")])
        .load()
        .unwrap_err();
    let soul: soulbase_errors::SoulError = err.into();
    assert_eq!(soul.code(), soulbase_errors::ErrorCode::ConfigInvalid);
    assert_eq!(soul.field("paths"), Some("skills.watch"));
}

#[test]
fn remote_role_endpoints_must_be_plain_http_uris() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "server:\n  roles: [tools]\n  remote:\n    sandbox: https://sandbox:50051\n    \
         evidence: evidence:50051\n    auth: http://policy:50051\n",
    );
    let err = ConfigLoader::new().with_file(&path).load().unwrap_err();
    let paths: Vec<&str> = err.problems.iter().map(|p| p.path.as_str()).collect();
    assert!(paths.contains(&"server.remote.sandbox"), "{err}");
    assert!(paths.contains(&"server.remote.evidence"), "{err}");
    assert!(!paths.contains(&"server.remote.auth"), "{err}");
}

#[test]
fn server_limits_default_and_bad_values_name_their_field() {
    let snap = ConfigLoader::new().load().unwrap();
    assert_eq!(snap.server.max_connections, 1024);
    assert_eq!(snap.server.grpc_max_connections, 1024);
    assert_eq!(snap.server.body_read_timeout_ms, 30_000);
    assert_eq!(snap.server.max_body_bytes, 2 * 1024 * 1024);
    assert_eq!(snap.server.mcp_max_sessions, 256);
    assert_eq!(snap.server.mcp_max_sessions_per_tenant, 32);
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "server:\n  max_connections: 0\n  grpc_max_connections: 0\n  header_read_timeout_ms: 0\n  \
         body_read_timeout_ms: 1\n  idle_timeout_ms: 5\n  max_body_bytes: 100\n  http2_max_concurrent_streams: 0\n  \
         http2_keepalive_interval_ms: 0\n  http2_keepalive_timeout_ms: 0\n  \
         tcp_keepalive_ms: 10\n  mcp_max_sessions: 10\n  mcp_max_sessions_per_tenant: 11\n  \
         mcp_session_idle_ms: 0\n",
    );
    let err = ConfigLoader::new().with_file(&path).load().unwrap_err();
    let paths: Vec<&str> = err.problems.iter().map(|p| p.path.as_str()).collect();
    for field in [
        "server.max_connections",
        "server.grpc_max_connections",
        "server.header_read_timeout_ms",
        "server.body_read_timeout_ms",
        "server.idle_timeout_ms",
        "server.max_body_bytes",
        "server.http2_max_concurrent_streams",
        "server.http2_keepalive_interval_ms",
        "server.http2_keepalive_timeout_ms",
        "server.tcp_keepalive_ms",
        "server.mcp_max_sessions_per_tenant",
        "server.mcp_session_idle_ms",
    ] {
        assert!(paths.contains(&field), "{field} not named in {err}");
    }
    assert!(!paths.contains(&"server.mcp_max_sessions"), "{err}");
    // tcp_keepalive_ms 0 is "off", and valid.
    let path = write(&dir, "server:\n  tcp_keepalive_ms: 0\n");
    assert_eq!(
        ConfigLoader::new()
            .with_file(&path)
            .load()
            .unwrap()
            .server
            .tcp_keepalive_ms,
        0
    );
}

#[test]
fn secrets_are_read_from_files_named_by_the_config_or_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("evidence-url");
    let redis = dir.path().join("redis-url");
    std::fs::write(&db, "postgres://u:p@db:5432/soul\n").unwrap();
    std::fs::write(&redis, "redis://cache:6379").unwrap();
    let path = write(
        &dir,
        &format!(
            "evidence:\n  backend: postgres\n  url_file: {}\nquota:\n  backend: redis\n",
            db.display()
        ),
    );
    let snap = ConfigLoader::new()
        .with_file(&path)
        .with_env([(
            "SOULBASE_QUOTA__REDIS_URL_FILE".to_owned(),
            redis.display().to_string(),
        )])
        .load()
        .unwrap();
    assert_eq!(
        snap.evidence.url.as_deref(),
        Some("postgres://u:p@db:5432/soul"),
        "trailing newline trimmed"
    );
    assert_eq!(snap.quota.redis_url.as_deref(), Some("redis://cache:6379"));
    // The file is read on every load (a reload sees what the file holds now).
    std::fs::write(&db, "postgres://u:rotated@db:5432/soul").unwrap();
    let snap = ConfigLoader::new()
        .with_file(&path)
        .with_env([(
            "SOULBASE_QUOTA__REDIS_URL_FILE".to_owned(),
            redis.display().to_string(),
        )])
        .load()
        .unwrap();
    assert_eq!(
        snap.evidence.url.as_deref(),
        Some("postgres://u:rotated@db:5432/soul")
    );

    // Both ways at once, a missing file, an empty file: refused, naming the field
    // and never the contents.
    let both = write(
        &dir,
        &format!(
            "evidence:\n  backend: postgres\n  url: postgres://x@y/z\n  url_file: {}\n",
            db.display()
        ),
    );
    let err = ConfigLoader::new().with_file(&both).load().unwrap_err();
    assert_eq!(err.problems[0].path, "evidence.url_file", "{err}");
    assert!(err.to_string().contains("not both"), "{err}");
    let missing = write(
        &dir,
        "evidence:\n  backend: postgres\n  url_file: /nonexistent/evidence-url\n",
    );
    let err = ConfigLoader::new().with_file(&missing).load().unwrap_err();
    assert_eq!(err.problems[0].path, "evidence.url_file", "{err}");
    assert!(err.to_string().contains("cannot read"), "{err}");
    std::fs::write(&db, " \n").unwrap();
    let empty = write(
        &dir,
        &format!(
            "evidence:\n  backend: postgres\n  url_file: {}\n",
            db.display()
        ),
    );
    let err = ConfigLoader::new().with_file(&empty).load().unwrap_err();
    assert!(err.to_string().contains("is empty"), "{err}");

    // The internal token: a file or a variable, not both.
    let token = write(
        &dir,
        "server:\n  internal_token_env: T\n  internal_token_file: /run/token\n",
    );
    let err = ConfigLoader::new().with_file(&token).load().unwrap_err();
    assert_eq!(err.problems[0].path, "server.internal_token_file", "{err}");
}

#[test]
fn a_policy_rule_naming_an_unknown_action_is_refused_naming_it() {
    let mut config = soulbase_config::Config::default();
    config.policy.rules = vec![soulbase_config::PolicyRule {
        effect: soulbase_config::PolicyEffect::Allow,
        tenant: "acme".into(),
        actors: vec!["*".into()],
        tools: vec!["*".into()],
        actions: vec!["invoke".into(), "invok".into()],
        require_scopes: false,
        obligations: Vec::new(),
    }];
    let problems = config.validate();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].0, "policy.rules[0].actions[1]");
    assert!(problems[0].1.contains("unknown action"), "{problems:?}");
}

#[test]
fn consent_settings_are_validated_naming_the_field() {
    use soulbase_config::ConsentSigning;
    let paths = |edit: &dyn Fn(&mut soulbase_config::Config)| {
        let mut config = soulbase_config::Config::default();
        edit(&mut config);
        config
            .validate()
            .into_iter()
            .map(|(path, _)| path)
            .collect::<Vec<_>>()
    };
    assert!(paths(&|_| {}).is_empty());
    assert_eq!(
        paths(&|c| c.auth.consent.max_ttl_ms = 0),
        ["auth.consent.max_ttl_ms", "auth.consent.default_ttl_ms"]
    );
    assert_eq!(
        paths(&|c| c.auth.consent.default_ttl_ms = 7_200_000),
        ["auth.consent.default_ttl_ms"]
    );
    assert_eq!(
        paths(&|c| c.auth.consent.public_key = Some("zz".into())),
        ["auth.consent.public_key"]
    );
    assert_eq!(
        paths(&|c| {
            c.auth.consent.public_key = Some("ab".repeat(32));
            c.auth.consent.signing = Some(ConsentSigning::Hmac);
            c.auth.consent.key_file = Some("k".into());
        }),
        ["auth.consent.public_key", "auth.consent.public_key"]
    );
}

#[test]
fn the_dev_preset_sits_between_the_defaults_and_the_file() {
    let snap = ConfigLoader::new().with_dev_preset("--dev").load().unwrap();
    assert!(snap.server.dev_insecure);
    let who = snap.server.dev_identity.clone().unwrap();
    assert_eq!((who.tenant.as_str(), who.actor.as_str()), ("dev", "dev"));
    assert_eq!(snap.policy.rules.len(), 1);
    assert_eq!(snap.policy.rules[0].tenant, "dev");
    assert!(
        snap.sources().iter().any(|s| s == "preset --dev"),
        "{:?}",
        snap.sources()
    );
    // Without it: nothing trusted, nothing allowed.
    let plain = ConfigLoader::new().load().unwrap();
    assert!(!plain.server.dev_insecure && plain.policy.rules.is_empty());
    // The file overrides the preset field by field; an error names the preset.
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "server:\n  dev_identity: { tenant: acme, actor: me }\n",
    );
    let snap = ConfigLoader::new()
        .with_dev_preset("--dev")
        .with_file(&path)
        .load()
        .unwrap();
    assert_eq!(snap.server.dev_identity.clone().unwrap().tenant, "acme");
    assert!(snap.server.dev_insecure, "the preset's sibling stays");
    let path = write(&dir, "server:\n  dev_insecure: false\n");
    let err = ConfigLoader::new()
        .with_dev_preset("--dev")
        .with_file(&path)
        .load()
        .unwrap_err();
    assert!(err.to_string().contains("preset --dev"), "{err}");
}

#[test]
fn a_check_from_a_layer_above_refuses_a_load_naming_the_field_and_its_layer() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "data_dir: /forbidden\n");
    let loader = ConfigLoader::new().with_file(&path).with_check(|c| {
        if c.data_dir.starts_with("/forbidden") {
            vec![("data_dir".into(), "is forbidden here".into())]
        } else {
            Vec::new()
        }
    });
    let err = loader.load().unwrap_err();
    assert_eq!(err.problems.len(), 1);
    assert_eq!(err.problems[0].path, "data_dir");
    assert!(err.problems[0].source.ends_with("config.yaml"), "{err}");
    assert!(
        ConfigLoader::new()
            .with_check(|_| Vec::new())
            .load()
            .is_ok()
    );
}
