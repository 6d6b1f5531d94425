//! The `sandbox` section of the configuration: parsed, validated with field paths, and
//! turned into profiles.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use soulbase_config::Config;
use soulbase_errors::ErrorCode;
use soulbase_sandbox::{Capability, IntersectingProfiles, ProfileBuilder};
use soulbase_types::TenantId;

#[test]
fn a_sandbox_section_builds_profiles() {
    let yaml = r#"
sandbox:
  ceiling:
    - {kind: net, hosts: ["*.example.com"], schemes: [https]}
    - {kind: tmp, max_bytes: 1048576}
  grants:
    - tenant: acme
      capabilities:
        - {kind: net, hosts: [api.example.com]}
    - tenant: trusted
      capabilities: null
  http_env_allow: [SEARCH_TOKEN]
  http_max_redirects: 2
"#;
    let config: Config = serde_saphyr::from_str(yaml).unwrap();
    assert!(config.validate().is_empty(), "{:?}", config.validate());
    assert_eq!(config.sandbox.default_grant, Some(vec![]));
    let profiles = IntersectingProfiles::from_config(&config.sandbox).unwrap();
    let declared = [
        Capability::Net {
            hosts: vec!["api.example.com".into(), "evil.io".into()],
            schemes: vec![],
            ports: vec![443],
            methods: vec![],
        },
        Capability::Tmp { max_bytes: 1 << 30 },
    ];
    let acme = profiles
        .build(&TenantId::new("acme").unwrap(), "d", &declared)
        .unwrap();
    assert_eq!(
        acme.capabilities(),
        &[Capability::Net {
            hosts: vec!["api.example.com".into()],
            schemes: vec!["https".into()],
            ports: vec![443],
            methods: vec![],
        }]
    );
    let trusted = profiles
        .build(&TenantId::new("trusted").unwrap(), "d", &declared)
        .unwrap();
    assert_eq!(trusted.capabilities().len(), 2);
    assert_eq!(
        trusted.capabilities()[1],
        Capability::Tmp { max_bytes: 1 << 20 }
    );
    let stranger = profiles
        .build(&TenantId::new("stranger").unwrap(), "d", &declared)
        .unwrap();
    assert!(stranger.capabilities().is_empty());
}

#[test]
fn bad_sandbox_settings_name_their_fields() {
    let yaml = r#"
sandbox:
  wasm_max_memory_bytes: 10
  http_max_redirects: 50
  http_env_allow: ["OK_VAR", "bad-name"]
  grants:
    - {tenant: a, capabilities: []}
    - {tenant: a, capabilities: []}
"#;
    let config: Config = serde_saphyr::from_str(yaml).unwrap();
    let fields: Vec<String> = config.validate().into_iter().map(|p| p.0).collect();
    assert_eq!(
        fields,
        [
            "sandbox.wasm_max_memory_bytes",
            "sandbox.http_max_redirects",
            "sandbox.http_env_allow[1]",
            "sandbox.grants[1].tenant"
        ]
    );
    assert!(serde_saphyr::from_str::<Config>("sandbox:\n  celing: []\n").is_err());
    let bad: Config =
        serde_saphyr::from_str("sandbox:\n  ceiling:\n    - {kind: fs, paths: ['../x']}\n")
            .unwrap();
    let e = IntersectingProfiles::from_config(&bad.sandbox)
        .err()
        .unwrap();
    assert_eq!(e.code(), ErrorCode::ConfigInvalid);
    assert_eq!(e.field("field"), Some("sandbox.ceiling[0].paths[0]"));
}
