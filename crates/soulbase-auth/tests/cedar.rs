#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Cedar decision point: deny by default, forbid wins, errors deny, schema checked
//! at load, tenant isolation structural, hot reload through the configuration.

use soulbase_auth::{AuthzRequest, CedarPolicy, CedarPolicySet, Decision};
use soulbase_config::{CedarConfig, Config, ConfigHandle, ConfigSnapshot};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{ActorId, Subject, TenantId, ToolId};

fn subject(tenant: &str, actor: &str, roles: &[&str]) -> Subject {
    let mut s = Subject::new(TenantId::new(tenant).unwrap(), ActorId::new(actor).unwrap());
    for r in roles {
        s = s.with_role(*r);
    }
    s
}

fn policy(text: &str) -> CedarPolicy {
    CedarPolicy::from_sources(&[("test.cedar".to_owned(), text.to_owned())]).unwrap()
}

fn ask_as(
    p: &CedarPolicy,
    who: &Subject,
    tool: &str,
    owner: Option<&str>,
    action: &str,
) -> Result<Decision, SoulError> {
    let action: soulbase_auth::Action = action.parse().unwrap();
    let tool = ToolId::new(tool).unwrap();
    let owner = owner.map(|o| TenantId::new(o).unwrap());
    p.decide(&AuthzRequest {
        subject: who,
        tool: &tool,
        tool_tenant: owner.as_ref(),
        action,
        tool_scopes: &[],
    })
}

fn ask(p: &CedarPolicy, tenant: &str, actor: &str, tool: &str) -> Result<Decision, SoulError> {
    ask_as(p, &subject(tenant, actor, &[]), tool, None, "invoke")
}

#[test]
fn an_empty_policy_set_denies_everything() {
    let p = policy("");
    let err = ask(&p, "acme", "alice", "fs.files.read").unwrap_err();
    assert_eq!(err.code(), ErrorCode::PolicyDenyTool);
    assert!(CedarPolicySet::compile(&[]).unwrap().is_empty());
}

#[test]
fn permits_by_tenant_role_and_tool_scope_and_forbid_wins() {
    let p = policy(
        r#"
        permit(principal in Soul::Tenant::"acme", action == Soul::Action::"invoke", resource in Soul::Package::"fs.files");
        permit(principal in Soul::Role::"admin", action, resource);
        forbid(principal, action == Soul::Action::"invoke", resource == Soul::Tool::"fs.files.delete")
          unless { principal in Soul::Role::"admin" };
        "#,
    );
    assert!(ask(&p, "acme", "alice", "fs.files.read").is_ok());
    assert!(
        ask(&p, "acme", "alice", "fs.filesx.read").is_err(),
        "package is exact"
    );
    assert!(
        ask(&p, "beta", "bob", "fs.files.read").is_err(),
        "other tenant"
    );
    assert_eq!(
        ask(&p, "acme", "alice", "fs.files.delete")
            .unwrap_err()
            .code(),
        ErrorCode::PolicyDenyTool,
        "forbid wins over the tenant permit"
    );
    let admin = subject("beta", "root", &["admin"]);
    assert!(ask_as(&p, &admin, "fs.files.delete", None, "invoke").is_ok());
    assert!(ask_as(&p, &admin, "sys.proc.exec", None, "register").is_ok());
    let decision = ask(&p, "acme", "alice", "fs.files.read").unwrap();
    assert!(decision.policy_hash.starts_with("sha256:"));
}

#[test]
fn conditions_see_scopes_and_tool_attributes() {
    let p = policy(
        r#"
        permit(principal, action == Soul::Action::"invoke", resource)
          when { principal.scopes.contains("tools:invoke") && resource.global };
        "#,
    );
    let with_scope = subject("acme", "alice", &[]).with_scope("tools:invoke");
    assert!(ask_as(&p, &with_scope, "a.b.c", None, "invoke").is_ok());
    assert!(
        ask_as(&p, &with_scope, "a.b.c", Some("acme"), "invoke").is_err(),
        "tenant tool is not global"
    );
    assert!(ask_as(&p, &subject("acme", "alice", &[]), "a.b.c", None, "invoke").is_err());
}

#[test]
fn conditions_see_the_tools_declared_scopes_in_the_context() {
    let p = policy(
        r#"
        permit(principal, action == Soul::Action::"invoke", resource)
          when { principal.scopes.containsAll(context.tool_scopes) };
        "#,
    );
    let tool = ToolId::new("fs.files.read").unwrap();
    let declared = ["soul:fs:/data#read".to_owned()];
    let ask = |who: &Subject, scopes: &[String]| {
        p.decide(&AuthzRequest {
            subject: who,
            tool: &tool,
            tool_tenant: None,
            action: soulbase_auth::Action::Invoke,
            tool_scopes: scopes,
        })
    };
    let holder = subject("acme", "alice", &[]).with_scope("soul:fs:/data#read");
    let lacker = subject("acme", "bob", &[]).with_scope("soul:fs:/tmp#read");
    assert!(ask(&holder, &declared).is_ok());
    assert!(ask(&lacker, &declared).is_err());
    // The decision cache keys on the declared scopes too.
    assert!(ask(&lacker, &[]).is_ok());
    assert!(ask(&lacker, &declared).is_err());
}

#[test]
fn a_policy_that_errors_at_evaluation_denies() {
    // Long overflow validates (Long + Long) but errors when evaluated.
    let erroring_permit =
        policy(r#"permit(principal, action, resource) when { 9223372036854775807 + 1 > 0 };"#);
    let err = ask(&erroring_permit, "acme", "alice", "a.b.c").unwrap_err();
    assert_eq!(err.code(), ErrorCode::PolicyDenyTool);

    // Cedar alone would skip the erroring forbid and allow: we must deny.
    let erroring_forbid = policy(
        r#"
        permit(principal, action, resource);
        forbid(principal, action, resource) when { 9223372036854775807 + 1 > 0 };
        "#,
    );
    let err = ask(&erroring_forbid, "acme", "alice", "a.b.c").unwrap_err();
    assert_eq!(err.code(), ErrorCode::PolicyDenyTool);
}

#[test]
fn policies_are_validated_against_the_schema_at_load() {
    let bad = [
        // unknown attribute
        r#"permit(principal, action, resource) when { principal.department == "x" };"#,
        // unknown entity type
        r#"permit(principal in Soul::Team::"x", action, resource);"#,
        // unknown action
        r#"permit(principal, action == Soul::Action::"explode", resource);"#,
        // type error
        r#"permit(principal, action, resource) when { principal.tenant > 3 };"#,
        // syntax error
        r#"permit(principal, action, resource"#,
        // templates are refused
        r#"permit(principal == ?principal, action, resource);"#,
    ];
    for text in bad {
        let err = CedarPolicy::from_sources(&[("bad.cedar".into(), text.into())])
            .err()
            .unwrap_or_else(|| panic!("{text} must be refused"));
        assert_eq!(err.code(), ErrorCode::ConfigInvalid, "{text}");
        assert_eq!(err.field("field"), Some("auth.cedar"));
        assert!(
            err.audit().causes.join(" ").contains("bad.cedar"),
            "{text}: names the source"
        );
    }
}

#[test]
fn a_subject_never_gets_another_tenants_tool_whatever_the_policy() {
    let p = policy(
        r#"
        permit(principal, action, resource);
        permit(principal in Soul::Tenant::"acme", action, resource == Soul::Tool::"beta.secret.read");
        "#,
    );
    let alice = subject("acme", "alice", &["admin"]);
    for action in ["invoke", "preflight", "list", "read_evidence", "register"] {
        let err = ask_as(&p, &alice, "beta.secret.read", Some("beta"), action).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ToolNotFound, "{action}");
        assert_eq!(
            err.public().message,
            SoulError::of(ErrorCode::ToolNotFound).public().message,
            "reveals nothing"
        );
    }
    assert!(ask_as(&p, &alice, "acme.own.read", Some("acme"), "invoke").is_ok());
}

#[test]
fn slicing_keeps_policies_to_their_tenant_and_resource() {
    let mut text = String::new();
    for t in 0..50 {
        for tool in 0..10 {
            text.push_str(&format!(
                "permit(principal in Soul::Tenant::\"t{t}\", action == Soul::Action::\"invoke\", resource == Soul::Tool::\"g{tool}.p.t\");\n"
            ));
        }
    }
    text.push_str("forbid(principal == Soul::Actor::\"t3/mallory\", action, resource);\n");
    let p = policy(&text);
    assert!(ask(&p, "t1", "a", "g1.p.t").is_ok());
    assert!(ask(&p, "t1", "a", "g11.p.t").is_err());
    assert!(ask(&p, "t99", "a", "g1.p.t").is_err());
    assert!(ask(&p, "t3", "a", "g1.p.t").is_ok());
    assert!(
        ask(&p, "t3", "mallory", "g1.p.t").is_err(),
        "actor forbid applies"
    );
    assert!(
        ask(&p, "t4", "mallory", "g1.p.t").is_ok(),
        "other tenant's mallory"
    );
}

#[test]
fn the_schema_declares_exactly_the_actions_asked() {
    // The set is closed: an unknown name is not an action at all...
    assert!("explode".parse::<soulbase_auth::Action>().is_err());
    // ...and every action the product asks about is one a policy can name.
    let p = policy("permit(principal, action, resource);");
    for a in soulbase_auth::Action::ALL {
        let text = format!(
            r#"permit(principal, action == Soul::Action::"{}", resource);"#,
            a.as_str()
        );
        assert!(
            CedarPolicy::from_sources(&[("one.cedar".into(), text)]).is_ok(),
            "{a}"
        );
        assert!(ask_as(&p, &subject("a", "b", &[]), "a.b.c", None, a.as_str()).is_ok());
    }
}

fn snapshot(policies: &str) -> ConfigSnapshot {
    let mut c = Config::default();
    c.auth.cedar = Some(CedarConfig {
        files: vec![],
        policies: Some(policies.to_owned()),
    });
    ConfigSnapshot::new(c, vec![])
}

#[test]
fn policies_follow_the_configuration_and_a_bad_reload_keeps_the_old_ones() {
    let handle = ConfigHandle::new(snapshot(
        r#"permit(principal, action, resource in Soul::Group::"fs");"#,
    ));
    let p = CedarPolicy::follow(handle.clone()).unwrap();
    assert!(ask(&p, "acme", "alice", "fs.files.read").is_ok());
    let first = p.hash();

    handle.publish(snapshot(
        r#"permit(principal, action, resource in Soul::Group::"net");"#,
    ));
    assert!(
        ask(&p, "acme", "alice", "fs.files.read").is_err(),
        "new policies at once"
    );
    assert!(ask(&p, "acme", "alice", "net.http.get").is_ok());
    let second = p.hash();
    assert_ne!(first, second);

    handle.publish(snapshot(
        "permit(principal, action, resource) when { nope };",
    ));
    assert!(
        ask(&p, "acme", "alice", "net.http.get").is_ok(),
        "old set kept"
    );
    assert_eq!(p.hash(), second);
}

#[test]
fn policy_files_are_read_and_reloaded_on_demand() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tools.cedar");
    std::fs::write(
        &file,
        r#"permit(principal, action, resource == Soul::Tool::"a.b.c");"#,
    )
    .unwrap();
    let mut c = Config::default();
    c.auth.cedar = Some(CedarConfig {
        files: vec![file.clone()],
        policies: None,
    });
    let handle = ConfigHandle::new(ConfigSnapshot::new(c, vec![]));
    let p = CedarPolicy::follow(handle).unwrap();
    assert!(ask(&p, "t", "a", "a.b.c").is_ok());
    std::fs::write(&file, "").unwrap();
    p.reload().unwrap();
    assert!(ask(&p, "t", "a", "a.b.c").is_err());

    let missing = CedarPolicy::from_config(&CedarConfig {
        files: vec![dir.path().join("missing.cedar")],
        policies: None,
    })
    .err()
    .unwrap();
    assert_eq!(missing.code(), ErrorCode::ConfigInvalid);
    assert_eq!(missing.field("field"), Some("auth.cedar.files[0]"));
}
