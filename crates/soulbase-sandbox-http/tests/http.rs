//! The HTTP executor against a real loopback server, and the HTTP escape corpus.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_sandbox::{
    BuiltinExecutor, Capability, ExecOutput, ExecRequest, LocalSandbox, Profile, ProviderBinding,
    ProviderKind, Sandbox,
};
use soulbase_sandbox_http::{HttpExecutor, HttpOptions};
use soulbase_types::{CallId, TenantId, ToolId};

fn net(hosts: &[&str]) -> Profile {
    Profile::new(vec![Capability::Net {
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        schemes: vec![],
        ports: vec![],
        methods: vec![],
    }])
}

fn binding(endpoint: &str, path: &str) -> ProviderBinding {
    ProviderBinding::Http {
        endpoint: endpoint.into(),
        path: Some(path.into()),
        headers: BTreeMap::new(),
        timeout_ms: None,
    }
}

fn sandbox(options: HttpOptions) -> LocalSandbox {
    LocalSandbox::new(BuiltinExecutor::new())
        .with_executor(ProviderKind::Http, Arc::new(HttpExecutor::new(options)))
}

async fn call(
    sb: &LocalSandbox,
    provider: &ProviderBinding,
    profile: &Profile,
    timeout: Duration,
) -> Result<ExecOutput, SoulError> {
    let call_id = CallId::generate();
    let tenant = TenantId::new("t1").unwrap();
    let tool = ToolId::new("demo.http.echo").unwrap();
    let req = ExecRequest {
        call_id: &call_id,
        tenant: &tenant,
        tool: &tool,
        provider,
        args: json!({"q": "hi"}),
        profile,
        timeout,
        max_bytes_out: Some(16 * 1024),
        max_memory_bytes: None,
        max_processes: None,
        max_files: None,
        reporter: soulbase_sandbox::Reporter::none(),
    };
    sb.guard(&req)?;
    sb.execute(req).await
}

const T: Duration = Duration::from_secs(5);

#[tokio::test]
async fn posts_json_to_an_allowed_loopback_literal() {
    let addr = common::serve().await;
    let sb = sandbox(HttpOptions::default());
    let out = call(
        &sb,
        &binding(&format!("http://{addr}"), "/execute"),
        &net(&["127.0.0.1"]),
        T,
    )
    .await
    .unwrap();
    assert_eq!(out.output, json!({"echo": {"q": "hi"}}));
    assert_eq!(out.side_effects[0].kind, "net.request");
}

#[tokio::test]
async fn default_path_is_execute_and_headers_expand_allow_listed_env() {
    let addr = common::serve().await;
    let sb = sandbox(HttpOptions {
        env_allow: vec!["TOOL_TOKEN".into()],
        env_values: Some(HashMap::from([("TOOL_TOKEN".into(), "abc".into())])),
        ..HttpOptions::default()
    });
    let p = ProviderBinding::Http {
        endpoint: format!("http://{addr}/"),
        path: None,
        headers: BTreeMap::new(),
        timeout_ms: None,
    };
    let out = call(&sb, &p, &net(&["127.0.0.1"]), T).await.unwrap();
    assert_eq!(out.output["echo"]["q"], "hi");
    let h = ProviderBinding::Http {
        endpoint: format!("http://{addr}"),
        path: Some("/headers".into()),
        headers: BTreeMap::from([("x-token".into(), "t-${TOOL_TOKEN}".into())]),
        timeout_ms: None,
    };
    let out = call(&sb, &h, &net(&["127.0.0.1"]), T).await.unwrap();
    assert_eq!(out.output, json!({"token": "t-abc"}));
    let leak = ProviderBinding::Http {
        endpoint: format!("http://{addr}"),
        path: Some("/headers".into()),
        headers: BTreeMap::from([("x-token".into(), "${HOME}".into())]),
        timeout_ms: None,
    };
    let e = call(&sb, &leak, &net(&["127.0.0.1"]), T).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked);
}

#[tokio::test]
async fn restricted_literals_are_refused_without_a_grant() {
    let sb = sandbox(HttpOptions::default());
    let profile = net(&["example.com", "localhost"]);
    for endpoint in [
        "http://127.0.0.1:9",
        "http://[::1]:9",
        "http://169.254.169.254",
        "http://10.0.0.1",
    ] {
        let e = call(&sb, &binding(endpoint, "/execute"), &profile, T)
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked, "{endpoint}");
    }
}

#[tokio::test]
async fn a_name_resolving_to_loopback_is_refused() {
    let addr = common::serve().await;
    let sb = sandbox(HttpOptions::default());
    // `localhost` is granted by name, but its addresses are loopback and not
    // listed literally: refused at resolution, never connected.
    let e = call(
        &sb,
        &binding(&format!("http://localhost:{}", addr.port()), "/execute"),
        &net(&["localhost"]),
        T,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked, "{e:?}");
}

#[tokio::test]
async fn suffix_hosts_are_not_granted() {
    let sb = sandbox(HttpOptions::default());
    let e = call(
        &sb,
        &binding("https://evilexample.com", "/execute"),
        &net(&["example.com"]),
        T,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked);
    let e = call(
        &sb,
        &binding("https://evil.example.com.attacker.io", "/execute"),
        &net(&["*.example.com"]),
        T,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked);
}

#[tokio::test]
async fn redirects_are_not_followed_unless_allowed_and_then_rechecked() {
    let addr = common::serve().await;
    let ep = format!("http://{addr}");
    let profile = net(&["127.0.0.1", "localhost"]);
    let strict = sandbox(HttpOptions::default());
    let e = call(&strict, &binding(&ep, "/redirect-home"), &profile, T)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ToolExecutionFailed);

    let follow = sandbox(HttpOptions {
        max_redirects: 3,
        ..HttpOptions::default()
    });
    let out = call(&follow, &binding(&ep, "/redirect-home"), &profile, T)
        .await
        .unwrap();
    assert_eq!(out.output["echo"]["q"], "hi");
    // To a private address the profile does not name: refused.
    let e = call(&follow, &binding(&ep, "/redirect-private"), &profile, T)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked);
    // To a granted name that resolves to a loopback address the profile does not
    // name literally (it names 127.0.0.2, where this server listens): refused by the
    // address check, not by a failed connection.
    let other = common::serve_on("127.0.0.2").await;
    let profile2 = net(&["127.0.0.2", "localhost"]);
    let e = call(
        &follow,
        &binding(&format!("http://{other}"), "/redirect-localhost"),
        &profile2,
        T,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked, "{e:?}");
}

#[tokio::test]
async fn non_json_bad_status_and_oversized_responses_fail() {
    let addr = common::serve().await;
    let ep = format!("http://{addr}");
    let sb = sandbox(HttpOptions::default());
    let p = net(&["127.0.0.1"]);
    let code = |r: Result<ExecOutput, SoulError>| r.unwrap_err().code();
    assert_eq!(
        code(call(&sb, &binding(&ep, "/html"), &p, T).await),
        ErrorCode::ToolExecutionFailed
    );
    assert_eq!(
        code(call(&sb, &binding(&ep, "/fail"), &p, T).await),
        ErrorCode::ToolExecutionFailed
    );
    assert_eq!(
        code(call(&sb, &binding(&ep, "/busy"), &p, T).await),
        ErrorCode::ProviderUnavailable
    );
    assert_eq!(
        code(call(&sb, &binding(&ep, "/big"), &p, T).await),
        ErrorCode::ToolExecutionFailed
    );
    assert_eq!(
        code(call(&sb, &binding(&ep, "/nolength"), &p, T).await),
        ErrorCode::ToolExecutionFailed
    );
}

#[tokio::test]
async fn a_slow_server_times_out() {
    let addr = common::serve().await;
    let sb = sandbox(HttpOptions::default());
    let started = Instant::now();
    let e = call(
        &sb,
        &binding(&format!("http://{addr}"), "/slow"),
        &net(&["127.0.0.1"]),
        Duration::from_millis(200),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ProviderTimeout);
    assert!(started.elapsed() < Duration::from_millis(1500));
}

#[tokio::test]
async fn nothing_listening_is_provider_unavailable() {
    // Bind then drop to find a closed port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let sb = sandbox(HttpOptions::default());
    let e = call(
        &sb,
        &binding(&format!("http://127.0.0.1:{port}"), "/execute"),
        &net(&["127.0.0.1"]),
        T,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ProviderUnavailable);
}
