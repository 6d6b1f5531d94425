//! The same invoke / deny / evidence suite against all roles in one `soulbased`, and
//! against a `tools`-only `soulbased` whose other roles each run in their own
//! `soulbased`: authorization, consent and quotas (`roles: [auth, qos]`, over
//! `soulbase.auth.v1` / `soulbase.qos.v1`), execution (`roles: [sandbox]`, over
//! `soulbase.sandbox.v1`) and evidence (`roles: [evidence]`, over
//! `soulbase.evidence.v1`), with the internal token required.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{DEV_CONFIG, Server, as_dev, code_of, http};
use serde_json::{Value, json};
use soulbase_grpc::proto;

const TOKEN_ENV: &str = "SB_TEST_INTERNAL_TOKEN";
const TOKEN: &str = "internal-token-for-tests-0123456789";
const CONSENT_ENV: &str = "SOULBASED_CONSENT_HMAC_KEY";

fn invoke_req(tool: &str, args: Value) -> proto::InvokeRequest {
    proto::InvokeRequest {
        tool_id: tool.into(),
        arguments_json: args.to_string(),
        ..Default::default()
    }
}

/// [`DEV_CONFIG`], where `acme` may also read its evidence.
fn config() -> String {
    DEV_CONFIG.replace("reload]", "reload, read_evidence]")
}

/// GETs a call's evidence from `server`'s HTTP API as `acme`, as JSON.
async fn evidence_of(server: &Server, call_id: &str) -> Value {
    let (status, body) = http(
        &server.http,
        "GET",
        &format!("/api/evidence/{call_id}"),
        &[("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "bob")],
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The checks both deployments must pass: invoke, preflight, policy denial,
/// rate limit with a retry hint, idempotent replay, consent, HTTP invoke, and the
/// call's Begin/End evidence read back.
async fn suite(tools: &Server) {
    let mut invoker = tools.invoker().await;
    let ok = invoker
        .invoke(as_dev(
            invoke_req("soulbase.builtin.echo", json!({"n": 1})),
            "acme",
            "bob",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        serde_json::from_str::<Value>(&ok.output_json).unwrap(),
        json!({"echo": {"n": 1}})
    );
    let pre = invoker
        .preflight(as_dev(
            invoke_req("soulbase.builtin.echo", json!({})),
            "acme",
            "bob",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pre.version, "1.0.0");

    // The call's evidence: Begin and End, and a replay naming the same Begin.
    let ev = evidence_of(tools, &ok.call_id).await;
    let events: Vec<&str> = ev["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["payload"]["event"].as_str().unwrap())
        .collect();
    assert_eq!(events, ["begin", "end"], "{ev}");
    assert_eq!(
        ev["replay"]["outcome"]["begin_id"],
        ok.evidence_ref.as_str()
    );
    assert_eq!(ev["replay"]["outcome"]["status"], "ok", "{ev}");

    // Policy: no rule for `other`.
    let st = invoker
        .invoke(as_dev(
            invoke_req("soulbase.builtin.echo", json!({})),
            "other",
            "eve",
        ))
        .await
        .unwrap_err();
    assert_eq!(code_of(&st), "POLICY.DENY_TOOL");
    let st = invoker
        .preflight(as_dev(
            invoke_req("soulbase.builtin.echo", json!({})),
            "other",
            "eve",
        ))
        .await
        .unwrap_err();
    assert_eq!(code_of(&st), "POLICY.DENY_TOOL");

    // Quota: `limited` may call echo once a minute.
    invoker
        .invoke(as_dev(
            invoke_req("soulbase.builtin.echo", json!({})),
            "limited",
            "l",
        ))
        .await
        .unwrap();
    let st = invoker
        .invoke(as_dev(
            invoke_req("soulbase.builtin.echo", json!({})),
            "limited",
            "l",
        ))
        .await
        .unwrap_err();
    assert_eq!(code_of(&st), "QUOTA.RATE_LIMITED");
    let e = soulbase_errors::SoulError::from_status(&st);
    assert!(e.public().retry_after_ms.is_some_and(|ms| ms > 0));

    // Idempotent retry: the counter runs once.
    let keyed = || {
        let mut r = invoke_req("soulbase.builtin.counter", json!({}));
        r.idempotency_key = "k-1".into();
        as_dev(r, "acme", "bob")
    };
    let first = invoker.invoke(keyed()).await.unwrap().into_inner();
    let again = invoker.invoke(keyed()).await.unwrap().into_inner();
    assert_eq!(first.output_json, again.output_json);
    assert!(again.replayed);

    // Consent, verified by whichever process serves the auth role.
    let manifest = json!({
        "id": "demo.consent.tool",
        "version": "1.0.0",
        "description": "needs consent",
        "input_schema": {"type": "object"},
        "output_schema": {"type": "object"},
        "side_effect": "none",
        "consent": {"required": true},
        "provider": {"type": "builtin", "handler": "soulbase.builtin.echo"}
    });
    tools
        .registry()
        .await
        .register_tool(as_dev(
            proto::RegisterToolRequest {
                manifest: manifest.to_string(),
                owner: proto::OwnerScope::Tenant as i32,
                enable: true,
            },
            "acme",
            "bob",
        ))
        .await
        .unwrap();
    let st = invoker
        .invoke(as_dev(
            invoke_req("demo.consent.tool", json!({})),
            "acme",
            "bob",
        ))
        .await
        .unwrap_err();
    assert_eq!(code_of(&st), "CONSENT.REQUIRED");
    let mut forged = invoke_req("demo.consent.tool", json!({}));
    forged.consent_token = consent_token("bob").replace("v1.", "v1.x");
    let st = invoker
        .invoke(as_dev(forged, "acme", "bob"))
        .await
        .unwrap_err();
    assert_eq!(code_of(&st), "CONSENT.REQUIRED");
    let mut other = invoke_req("demo.consent.tool", json!({}));
    other.consent_token = consent_token("mallory");
    let st = invoker
        .invoke(as_dev(other, "acme", "bob"))
        .await
        .unwrap_err();
    assert_eq!(code_of(&st), "CONSENT.REQUIRED");
    let mut valid = invoke_req("demo.consent.tool", json!({"x": 1}));
    valid.consent_token = consent_token("bob");
    invoker.invoke(as_dev(valid, "acme", "bob")).await.unwrap();

    // HTTP goes through the same seams.
    let (status, body) = http(
        &tools.http,
        "POST",
        "/api/tools/soulbase.builtin.echo/invoke",
        &[("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "bob")],
        "{}",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (_, body) = http(
        &tools.http,
        "POST",
        "/api/tools/soulbase.builtin.echo/invoke",
        &[("x-soulbase-tenant", "other"), ("x-soulbase-actor", "eve")],
        "{}",
    )
    .await;
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error_code"],
        "POLICY.DENY_TOOL"
    );
}

/// The consent key every test process gets (hex, 32 bytes).
const CONSENT_KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// A consent token for `actor` of `acme` on `demo.consent.tool`, valid 10 min.
fn consent_token(actor: &str) -> String {
    use soulbase_auth::ConsentIssuer;
    let key: Vec<u8> = (0..CONSENT_KEY.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&CONSENT_KEY[i..i + 2], 16).unwrap())
        .collect();
    let now = soulbase_types::UnixMillis::now();
    soulbase_auth::HmacConsent::new(key)
        .issue_token(
            &soulbase_auth::ConsentGrant {
                id: None,
                issued_at: None,
                tenant: soulbase_types::TenantId::new("acme").unwrap(),
                actor: soulbase_types::ActorId::new(actor).unwrap(),
                tool: Some(soulbase_types::ToolId::new("demo.consent.tool").unwrap()),
                scope: None,
                args_digest: None,
                expires_at: soulbase_types::UnixMillis(now.0 + 600_000),
            },
            now,
        )
        .unwrap()
}

/// A `tools`-only config reaching auth and qos at `grpc`; its own policy is empty
/// (deny everything), so every allow must come from the remote role.
fn tools_only(grpc: &str, token: bool) -> String {
    let token = if token {
        format!("  internal_token_env: {TOKEN_ENV}\n")
    } else {
        String::new()
    };
    format!(
        "server:\n  dev_insecure: true\n  roles: [tools]\n{token}  remote:\n    auth: http://{grpc}\n    qos: http://{grpc}\n"
    )
}

/// A config serving exactly `roles`, requiring the internal token.
fn serving(roles: &str) -> String {
    config().replace(
        "server:\n",
        &format!("server:\n  roles: [{roles}]\n  internal_token_env: {TOKEN_ENV}\n"),
    )
}

fn roles_only() -> String {
    serving("auth, qos")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_roles_in_one_process() {
    let server = Server::start_env(&config(), |_| {}, &[(CONSENT_ENV, CONSENT_KEY)]);
    suite(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_with_each_role_in_its_own_process() {
    let token = [(TOKEN_ENV, TOKEN)];
    // Only the policy process knows the consent key; only the sandbox process runs
    // builtin handlers; only the evidence process stores evidence.
    let policy = Server::start_env(
        &roles_only(),
        |_| {},
        &[(TOKEN_ENV, TOKEN), (CONSENT_ENV, CONSENT_KEY)],
    );
    let sandbox = Server::start_env(&serving("sandbox"), |_| {}, &token);
    let evidence = Server::start_env(&serving("evidence"), |_| {}, &token);
    let tools_config = format!(
        "{}    sandbox: http://{}\n    evidence: http://{}\n",
        tools_only(&policy.grpc, true),
        sandbox.grpc,
        evidence.grpc
    );
    let tools = Server::start_env(&tools_config, |_| {}, &token);
    suite(&tools).await;

    // The records are in the evidence process's store, readable there too.
    let ok = tools
        .invoker()
        .await
        .invoke(as_dev(
            invoke_req("soulbase.builtin.echo", json!({"where": "remote"})),
            "acme",
            "bob",
        ))
        .await
        .unwrap()
        .into_inner();
    evidence_of(&tools, &ok.call_id).await;
    assert_eq!(stored(&evidence, &ok.call_id).await, ["begin", "end"]);
    // A role-only process serves operations over HTTP, not the tools API.
    let (status, _) = http(&evidence.http, "GET", "/api/tools", &[], "").await;
    assert_eq!(status, 404);
    let (status, _) = http(&evidence.http, "GET", "/readyz", &[], "").await;
    assert_eq!(status, 200);
    // Neither role process serves tools.
    for role in [&sandbox, &evidence] {
        let st = role
            .invoker()
            .await
            .invoke(as_dev(
                invoke_req("soulbase.builtin.echo", json!({})),
                "acme",
                "bob",
            ))
            .await
            .unwrap_err();
        assert_eq!(st.code(), tonic::Code::Unimplemented);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_with_auth_and_qos_in_another_process() {
    // Only the roles process knows the consent key: the tools process must ask it.
    let roles = Server::start_env(
        &roles_only(),
        |_| {},
        &[(TOKEN_ENV, TOKEN), (CONSENT_ENV, CONSENT_KEY)],
    );
    let tools = Server::start_env(
        &tools_only(&roles.grpc, true),
        |_| {},
        &[(TOKEN_ENV, TOKEN)],
    );
    suite(&tools).await;

    // The roles process does not serve tools.
    let st = roles
        .invoker()
        .await
        .invoke(as_dev(
            invoke_req("soulbase.builtin.echo", json!({})),
            "acme",
            "bob",
        ))
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::Unimplemented);
}

/// Obligations the remote auth role's policy decides travel with its decision:
/// the tools process applies them to the output it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn obligations_decided_by_a_remote_auth_role_bind_the_output() {
    let rule = "    - { effect: allow, tenant: masked, tools: [soulbase.builtin.echo], \
                obligations: [{ kind: redact, pointer: /echo/ssn }] }\n";
    let roles_config = roles_only().replace("  rules:\n", &format!("  rules:\n{rule}"));
    let roles = Server::start_env(&roles_config, |_| {}, &[(TOKEN_ENV, TOKEN)]);
    let tools = Server::start_env(
        &tools_only(&roles.grpc, true),
        |_| {},
        &[(TOKEN_ENV, TOKEN)],
    );
    let out = tools
        .invoker()
        .await
        .invoke(as_dev(
            invoke_req(
                "soulbase.builtin.echo",
                json!({"ssn": "123-45-6789", "n": 1}),
            ),
            "masked",
            "bob",
        ))
        .await
        .unwrap()
        .into_inner();
    let output: Value = serde_json::from_str(&out.output_json).unwrap();
    assert_eq!(output, json!({"echo": {"ssn": "[REDACTED]", "n": 1}}));
}

/// Polls `server`'s evidence of `call_id` until it shows Begin and End (the spool
/// drains in the background); panics after 30 s.
async fn wait_for_evidence(server: &Server, call_id: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (status, body) = http(
            &server.http,
            "GET",
            &format!("/api/evidence/{call_id}"),
            &[("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "bob")],
            "",
        )
        .await;
        if status == 200 {
            let v: Value = serde_json::from_str(&body).unwrap();
            if v["records"].as_array().map(Vec::len) == Some(2) {
                return v;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "evidence of {call_id} never arrived: {status} {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_made_while_the_evidence_role_is_down_lose_no_evidence() {
    let token = [(TOKEN_ENV, TOKEN)];
    let addr = common::free_addr();
    let evidence = Server::start_at(&serving("evidence"), &token, &addr);
    // Every role but evidence in the tools process.
    let tools_config = config().replace(
        "server:\n",
        &format!(
            "server:\n  roles: [tools, auth, qos, sandbox]\n  internal_token_env: {TOKEN_ENV}\n  \
             remote:\n    evidence: http://{addr}\n"
        ),
    );
    let tools = Server::start_env(&tools_config, |_| {}, &token);
    let mut invoker = tools.invoker().await;
    let call = || {
        as_dev(
            invoke_req("soulbase.builtin.echo", json!({})),
            "acme",
            "bob",
        )
    };
    let before = invoker.invoke(call()).await.unwrap().into_inner();
    wait_for_evidence(&tools, &before.call_id).await;

    // The evidence role goes away; calls still run, their evidence spooled locally.
    let mut evidence = evidence;
    evidence.stop();
    let during = invoker.invoke(call()).await.unwrap().into_inner();
    let (status, body) = http(
        &tools.http,
        "GET",
        &format!("/api/evidence/{}", during.call_id),
        &[("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "bob")],
        "",
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("EVIDENCE.UNAVAILABLE"), "{body}");

    // Back on the same address: the spool drains and nothing is missing.
    let evidence = evidence.start_again();
    let ev = wait_for_evidence(&tools, &during.call_id).await;
    assert_eq!(
        ev["replay"]["outcome"]["begin_id"],
        during.evidence_ref.as_str()
    );
    assert_eq!(stored(&evidence, &during.call_id).await, ["begin", "end"]);
}

/// The events the evidence role stores for `call_id` of `acme`, read over
/// `soulbase.evidence.v1` with the internal token.
async fn stored(evidence: &Server, call_id: &str) -> Vec<String> {
    use soulbase_observe::EvidenceStore;
    let remote = soulbase_grpc::RemoteEvidence::new(evidence.channel().await, Some(TOKEN.into()));
    let tenant = soulbase_types::TenantId::new("acme").unwrap();
    let call_id = soulbase_types::CallId::new(call_id).unwrap();
    let records = remote.call(Some(&tenant), &call_id).await.unwrap().records;
    records
        .iter()
        .map(|r| {
            serde_json::to_value(r).unwrap()["payload"]["event"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_internal_token_role_services_are_not_served() {
    // The embedded default: every role in one process, no token, no dev mode.
    let config = "policy:\n  rules:\n    - { effect: allow, tenant: acme, tools: [\"*\"] }\n";
    let server = Server::start(config);
    let mut sandbox =
        soulbase_grpc::sandbox_proto::sandbox_client::SandboxClient::new(server.channel().await);
    let st = sandbox
        .execute(soulbase_grpc::sandbox_proto::ExecuteRequest::default())
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::Unimplemented);
    let mut evidence =
        soulbase_grpc::evidence_proto::evidence_client::EvidenceClient::new(server.channel().await);
    let st = evidence
        .get_call(soulbase_grpc::evidence_proto::GetCallRequest::default())
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::Unimplemented);

    // A process serving only role services refuses to start without the token.
    let err = common::refused_start("server:\n  roles: [sandbox]\n", &[]);
    assert!(err.contains("server.internal_token_env"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_services_refuse_callers_without_the_internal_token() {
    let env = [(TOKEN_ENV, TOKEN)];
    let roles = Server::start_env(&roles_only(), |_| {}, &env);
    let tools = Server::start(&tools_only(&roles.grpc, false));
    let st = tools
        .invoker()
        .await
        .invoke(as_dev(
            invoke_req("soulbase.builtin.echo", json!({})),
            "acme",
            "bob",
        ))
        .await
        .unwrap_err();
    // The end user is not at fault: the deployment's tokens disagree.
    assert_eq!(code_of(&st), "PROVIDER.UNAVAILABLE");
    assert!(st.metadata().get("x-soulbase-evidence-ref").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_role_fails_closed() {
    // Nothing listens on port 1: every decision fails, and no call executes.
    let tools = Server::start(&tools_only("127.0.0.1:1", false));
    let st = tools
        .invoker()
        .await
        .invoke(as_dev(
            invoke_req("soulbase.builtin.echo", json!({})),
            "acme",
            "bob",
        ))
        .await
        .unwrap_err();
    // The authorizer cannot be reached: the call is refused before execution.
    assert_eq!(code_of(&st), "PROVIDER.UNAVAILABLE");
    assert!(st.metadata().get("x-soulbase-evidence-ref").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_internal_token_variable_refuses_start_up() {
    let err = common::refused_start(&roles_only(), &[TOKEN_ENV]);
    assert!(err.contains("server.internal_token_env"), "{err}");
}

/// `roles_only` knowing an API key for acme/ci; the key.
fn auth_with_key() -> (String, String) {
    let subject = soulbase_types::Subject::new(
        soulbase_types::TenantId::new("acme").unwrap(),
        soulbase_types::ActorId::new("ci").unwrap(),
    );
    let issued = soulbase_auth::generate_api_key("ci", &subject);
    let config = format!(
        "{}auth:\n  api_keys:\n    - {{ id: ci, sha256: \"{}\", tenant: acme, actor: ci, roles: [admin] }}\n",
        roles_only(),
        issued.config.sha256
    );
    (config, issued.key)
}

fn with_key<T>(body: T, key: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(body);
    req.metadata_mut().insert("x-api-key", key.parse().unwrap());
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_process_has_the_auth_role_check_credentials() {
    let (auth_config, key) = auth_with_key();
    let policy = Server::start_env(&auth_config, |_| {}, &[(TOKEN_ENV, TOKEN)]);
    // No keys and no development headers here: only the auth role can vouch.
    let strict = tools_only(&policy.grpc, true).replace("  dev_insecure: true\n", "");
    let tools = Server::start_env(&strict, |_| {}, &[(TOKEN_ENV, TOKEN)]);
    let mut invoker = tools.invoker().await;

    let ok = invoker
        .invoke(with_key(
            invoke_req("soulbase.builtin.echo", json!({"k": 1})),
            &key,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        serde_json::from_str::<Value>(&ok.output_json).unwrap(),
        json!({"echo": {"k": 1}})
    );
    let (status, body) = http(
        &tools.http,
        "POST",
        "/api/tools/soulbase.builtin.echo/invoke",
        &[("x-api-key", key.as_str())],
        "{}",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // The subject's roles come from the auth role too: `admin` may reload.
    let (status, body) = http(
        &tools.http,
        "POST",
        "/api/reload",
        &[("x-api-key", key.as_str())],
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = http(
        &tools.http,
        "POST",
        "/api/tools/soulbase.builtin.echo/invoke",
        &[("x-api-key", &format!("{key}x"))],
        "{}",
    )
    .await;
    assert_eq!(status, 401, "{body}");

    let wrong = invoker
        .invoke(with_key(
            invoke_req("soulbase.builtin.echo", json!({})),
            &format!("{key}x"),
        ))
        .await
        .unwrap_err();
    assert_eq!(code_of(&wrong), "AUTH.UNAUTHENTICATED");
    let dev = invoker
        .invoke(as_dev(
            invoke_req("soulbase.builtin.echo", json!({})),
            "acme",
            "ci",
        ))
        .await
        .unwrap_err();
    assert_eq!(code_of(&dev), "AUTH.UNAUTHENTICATED");

    // An auth role that cannot be reached is an outage, not a bad key.
    let orphan = Server::start_env(
        &tools_only("127.0.0.1:1", true).replace("  dev_insecure: true\n", ""),
        |_| {},
        &[(TOKEN_ENV, TOKEN)],
    );
    let unreachable = orphan
        .invoker()
        .await
        .invoke(with_key(
            invoke_req("soulbase.builtin.echo", json!({})),
            &key,
        ))
        .await
        .unwrap_err();
    assert_eq!(code_of(&unreachable), "PROVIDER.UNAVAILABLE");
}
