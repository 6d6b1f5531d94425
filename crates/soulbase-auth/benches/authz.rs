//! Authorization decisions with 1,000 Cedar policies (served by the exact decision
//! cache, and computed by the engine), the static rules for comparison, and API-key
//! authentication.
//!
//! `cargo xtask bench -p soulbase-auth --bench authz`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use soulbase_auth::{
    Action, Authenticator, AuthzRequest, CedarPolicy, Credential, StaticPolicy, generate_api_key,
};
use soulbase_config::{AuthConfig, PolicyConfig, PolicyEffect, PolicyRule};
use soulbase_types::{ActorId, Subject, TenantId, ToolId};

const N: usize = 100_000;

/// 1,000 policies: 100 tenants × (6 tool permits, 2 package permits, 1 role permit,
/// 1 forbid), the shape of a multi-tenant deployment.
fn cedar_policies() -> String {
    let mut text = String::new();
    for t in 0..100 {
        for tool in 0..6 {
            text.push_str(&format!(
                "permit(principal in Soul::Tenant::\"t{t}\", action == Soul::Action::\"invoke\", resource == Soul::Tool::\"g{tool}.pkg.tool{t}\");\n"
            ));
        }
        for p in 0..2 {
            text.push_str(&format!(
                "permit(principal in Soul::Tenant::\"t{t}\", action in [Soul::Action::\"invoke\", Soul::Action::\"preflight\"], resource in Soul::Package::\"shared.p{p}\") when {{ principal.scopes.contains(\"tools:invoke\") }};\n"
            ));
        }
        text.push_str(&format!(
            "permit(principal in Soul::Tenant::\"t{t}\", action, resource) when {{ principal in Soul::Role::\"admin\" && resource.global }};\n"
        ));
        text.push_str(&format!(
            "forbid(principal == Soul::Actor::\"t{t}/mallory\", action, resource);\n"
        ));
    }
    text
}

fn static_rules() -> PolicyConfig {
    let mut rules = Vec::new();
    for t in 0..100 {
        for tool in 0..9 {
            rules.push(PolicyRule {
                effect: PolicyEffect::Allow,
                tenant: format!("t{t}"),
                actors: vec!["*".into()],
                tools: vec![format!("g{tool}.pkg.*")],
                actions: vec!["invoke".into()],
                require_scopes: false,
                obligations: Vec::new(),
            });
        }
        rules.push(PolicyRule {
            effect: PolicyEffect::Deny,
            tenant: format!("t{t}"),
            actors: vec!["mallory".into()],
            tools: vec!["*".into()],
            actions: vec!["invoke".into()],
            require_scopes: false,
            obligations: Vec::new(),
        });
    }
    PolicyConfig { rules }
}

fn time(n: usize, mut f: impl FnMut(usize)) -> Vec<Duration> {
    for i in 0..n / 10 {
        f(i);
    }
    (0..n)
        .map(|i| {
            let t = Instant::now();
            f(i);
            t.elapsed()
        })
        .collect()
}

fn main() {
    let subjects: Vec<Subject> = (0..100)
        .map(|t| {
            Subject::new(
                TenantId::new(format!("t{t}")).unwrap(),
                ActorId::new("alice").unwrap(),
            )
            .with_role("agent")
            .with_scope("tools:invoke")
        })
        .collect();
    let tools: Vec<ToolId> = (0..100)
        .map(|t| ToolId::new(format!("g{}.pkg.tool{t}", t % 6)).unwrap())
        .collect();
    let shared = ToolId::new("shared.p1.run").unwrap();

    let cedar = CedarPolicy::from_sources(&[("bench.cedar".into(), cedar_policies())]).unwrap();
    assert_eq!(cedar.current().len(), 1_000);
    let samples = time(N, |i| {
        let k = i % 100;
        let d = cedar.decide(&AuthzRequest {
            subject: &subjects[k],
            tool: &tools[k],
            tool_tenant: None,
            action: Action::Invoke,
            tool_scopes: &[],
        });
        assert!(d.is_ok());
    });
    soulbase_testkit::report("cedar 1000 policies: allow (tool)", samples);
    let samples = time(N, |i| {
        let k = i % 100;
        let d = cedar.decide(&AuthzRequest {
            subject: &subjects[k],
            tool: &shared,
            tool_tenant: None,
            action: Action::Invoke,
            tool_scopes: &[],
        });
        assert!(d.is_ok());
    });
    soulbase_testkit::report("cedar 1000 policies: allow (package+cond)", samples);
    let other = ToolId::new("zz.none.here").unwrap();
    let samples = time(N, |i| {
        let k = i % 100;
        let d = cedar.decide(&AuthzRequest {
            subject: &subjects[k],
            tool: &other,
            tool_tenant: None,
            action: Action::Invoke,
            tool_scopes: &[],
        });
        assert!(d.is_err());
    });
    soulbase_testkit::report("cedar 1000 policies: deny", samples);

    // The same decisions computed by the engine every time (decision cache bypassed):
    // what the first call of a (subject, tool, action) costs once the subject and the
    // tool have been seen. No state is kept per (subject, tool) pair, so this is also
    // the cost of a pair never asked about before.
    let set = cedar.current();
    let samples = time(N / 5, |i| {
        let k = i % 100;
        let d = set.evaluate_uncached(&AuthzRequest {
            subject: &subjects[k],
            tool: &tools[k],
            tool_tenant: None,
            action: Action::Invoke,
            tool_scopes: &[],
        });
        assert!(d.is_ok());
    });
    soulbase_testkit::report("cedar 1000 policies: allow, uncached", samples);
    let samples = time(N / 5, |i| {
        let k = i % 100;
        let d = set.evaluate_uncached(&AuthzRequest {
            subject: &subjects[k],
            tool: &shared,
            tool_tenant: None,
            action: Action::Invoke,
            tool_scopes: &[],
        });
        assert!(d.is_ok());
    });
    soulbase_testkit::report("cedar 1000 policies: pkg+cond, uncached", samples);

    // Worst case of the computed path: every call is a subject never seen before (a new
    // actor), so the decision cache misses and the subject's entity is built too; only
    // the tool's entity is already known.
    let fresh: Vec<Subject> = (0..N / 5)
        .map(|i| {
            Subject::new(
                TenantId::new(format!("t{}", i % 100)).unwrap(),
                ActorId::new(format!("new{i}")).unwrap(),
            )
            .with_role("agent")
            .with_scope("tools:invoke")
        })
        .collect();
    let fresh_warmup: Vec<Subject> = (0..N / 50)
        .map(|i| {
            Subject::new(
                TenantId::new(format!("t{}", i % 100)).unwrap(),
                ActorId::new(format!("warm{i}")).unwrap(),
            )
        })
        .collect();
    for (i, s) in fresh_warmup.iter().enumerate() {
        let _ = cedar.decide(&AuthzRequest {
            subject: s,
            tool: &tools[i % 100],
            tool_tenant: None,
            action: Action::Invoke,
            tool_scopes: &[],
        });
    }
    let samples: Vec<Duration> = fresh
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let req = AuthzRequest {
                subject: s,
                tool: &tools[i % 100],
                tool_tenant: None,
                action: Action::Invoke,
                tool_scopes: &[],
            };
            let t = Instant::now();
            let d = cedar.decide(&req);
            let elapsed = t.elapsed();
            assert!(d.is_ok());
            elapsed
        })
        .collect();
    soulbase_testkit::report("cedar 1000 policies: new subject, cold", samples);

    let static_policy = StaticPolicy::new(&static_rules());
    let samples = time(N, |i| {
        let k = i % 100;
        let d = static_policy.decide(&AuthzRequest {
            subject: &subjects[k],
            tool: &tools[k],
            tool_tenant: None,
            action: Action::Invoke,
            tool_scopes: &[],
        });
        assert!(d.is_ok());
    });
    soulbase_testkit::report("static 1000 rules: allow", samples);

    let keys: Vec<_> = (0..100)
        .map(|i| generate_api_key(&format!("k{i}"), &subjects[i]))
        .collect();
    let authn = Authenticator::new(&AuthConfig {
        api_keys: keys.iter().map(|k| k.config.clone()).collect(),
        ..AuthConfig::default()
    })
    .unwrap();
    let samples = time(N, |i| {
        assert!(
            authn
                .authenticate(Credential::ApiKey(&keys[i % 100].key))
                .is_ok()
        );
    });
    soulbase_testkit::report("api key authentication", samples);
}
