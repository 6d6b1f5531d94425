//! The gRPC surface of a real `soulbased`: registry, invoker, health, reflection
//! and authentication, with the generated client.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{DEV_CONFIG, Server, as_dev, code_of};
use futures_util::StreamExt;
use serde_json::{Value, json};
use soulbase_grpc::proto::{self, OwnerScope, RegistryEventKind, StateChange, ToolState};
use soulbase_grpc::{Credentials, RemoteInvoker};
use soulbase_tools::pipeline::{CallStatus, ToolCall};
use soulbase_types::{ActorId, Subject, TenantId, ToolId};

fn invoke_req(tool: &str, args: Value) -> proto::InvokeRequest {
    proto::InvokeRequest {
        tool_id: tool.into(),
        arguments_json: args.to_string(),
        ..Default::default()
    }
}

fn demo_manifest(id: &str, extra: Value) -> String {
    let mut m = json!({
        "id": id,
        "version": "1.0.0",
        "description": "a demo tool backed by the echo handler",
        "tags": ["demo"],
        "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "output_schema": {"type": "object"},
        "side_effect": "none",
        "provider": {"type": "builtin", "handler": "soulbase.builtin.echo"}
    });
    if let (Some(m), Some(extra)) = (m.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            m.insert(k.clone(), v.clone());
        }
    }
    m.to_string()
}

/// Registers `manifest` (see [`demo_manifest`]) as `acme`'s tool, enabled, acting
/// as `actor` of `acme` through the registry RPC.
async fn register_enabled(server: &Server, manifest: String, actor: &str) {
    server
        .registry()
        .await
        .register_tool(as_dev(
            proto::RegisterToolRequest {
                manifest,
                owner: OwnerScope::Tenant as i32,
                enable: true,
            },
            "acme",
            actor,
        ))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_preflight_invoke_and_idempotent_retry() {
    let server = Server::start(DEV_CONFIG);
    let mut registry = server.registry().await;
    let list = registry
        .list_tools(as_dev(proto::ListToolsRequest::default(), "acme", "bob"))
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<&str> = list.tools.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "soulbase.builtin.counter",
            "soulbase.builtin.echo",
            "soulbase.builtin.sleep"
        ]
    );
    assert!(
        list.tools
            .iter()
            .all(|t| t.state == ToolState::Enabled as i32)
    );

    let mut invoker = server.invoker().await;
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
    assert!(!pre.policy_hash.is_empty());

    // Integers and floats survive the round trip as JSON text.
    let out = invoker
        .invoke(as_dev(
            invoke_req("soulbase.builtin.echo", json!({"i": 7, "f": 7.5})),
            "acme",
            "bob",
        ))
        .await
        .unwrap()
        .into_inner();
    let v: Value = serde_json::from_str(&out.output_json).unwrap();
    assert!(v["echo"]["i"].is_u64());
    assert!(v["echo"]["f"].is_f64());
    assert!(!out.evidence_ref.is_empty());

    // Idempotent retry: the same key executes once; a new key executes again.
    let keyed = |key: &str| {
        let mut r = invoke_req("soulbase.builtin.counter", json!({}));
        r.idempotency_key = key.into();
        as_dev(r, "acme", "bob")
    };
    let first = invoker.invoke(keyed("k-1")).await.unwrap().into_inner();
    let again = invoker.invoke(keyed("k-1")).await.unwrap().into_inner();
    assert_eq!(first.output_json, again.output_json);
    assert!(!first.replayed);
    assert!(again.replayed);
    // The key may also come from metadata.
    let mut by_meta = as_dev(
        invoke_req("soulbase.builtin.counter", json!({})),
        "acme",
        "bob",
    );
    by_meta
        .metadata_mut()
        .insert("idempotency-key", "k-1".parse().unwrap());
    let meta = invoker.invoke(by_meta).await.unwrap().into_inner();
    assert!(meta.replayed);
    let other = invoker.invoke(keyed("k-2")).await.unwrap().into_inner();
    let n = |s: &str| {
        serde_json::from_str::<Value>(s).unwrap()["count"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(n(&other.output_json), n(&first.output_json) + 1);

    // Concurrent retries of one key still execute once.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut c = invoker.clone();
        tasks.push(tokio::spawn(async move {
            c.invoke(keyed("k-concurrent")).await.unwrap().into_inner()
        }));
    }
    let mut outputs = Vec::new();
    for t in tasks {
        outputs.push(t.await.unwrap());
    }
    assert!(
        outputs
            .iter()
            .all(|o| o.output_json == outputs[0].output_json)
    );
    assert_eq!(outputs.iter().filter(|o| !o.replayed).count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_carry_stable_codes_in_status_details() {
    let server = Server::start(DEV_CONFIG);
    let mut invoker = server.invoker().await;
    let echo = || invoke_req("soulbase.builtin.echo", json!({}));

    // No credentials.
    let st = invoker
        .invoke(tonic::Request::new(echo()))
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::Unauthenticated);
    assert_eq!(code_of(&st), "AUTH.UNAUTHENTICATED");

    // No allow rule for this tenant.
    let st = invoker
        .invoke(as_dev(echo(), "other", "eve"))
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::PermissionDenied);
    assert_eq!(code_of(&st), "POLICY.DENY_TOOL");
    assert_eq!(
        st.metadata()
            .get("x-soulbase-outcome")
            .unwrap()
            .to_str()
            .unwrap(),
        "denied"
    );
    assert!(st.metadata().get("x-soulbase-call-id").is_some());

    // Unknown tool.
    let st = invoker
        .invoke(as_dev(
            invoke_req("demo.nothing.here", json!({})),
            "acme",
            "bob",
        ))
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::NotFound);
    assert_eq!(code_of(&st), "TOOL.NOT_FOUND");

    // Input schema, with the offending pointer.
    let st = invoker
        .invoke(as_dev(
            invoke_req("soulbase.builtin.sleep", json!({"ms": "soon"})),
            "acme",
            "bob",
        ))
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::InvalidArgument);
    assert_eq!(code_of(&st), "SCHEMA.VALIDATION_FAILED");
    // Refused before execution: `denied`, whatever the reason.
    assert_eq!(
        st.metadata()
            .get("x-soulbase-outcome")
            .unwrap()
            .to_str()
            .unwrap(),
        "denied"
    );

    // Malformed request fields name the field.
    let st = invoker
        .invoke(as_dev(
            proto::InvokeRequest {
                tool_id: "soulbase.builtin.echo".into(),
                arguments_json: "{oops".into(),
                ..Default::default()
            },
            "acme",
            "bob",
        ))
        .await
        .unwrap_err();
    let err = soulbase_errors::SoulError::from_status(&st);
    assert_eq!(err.code().as_str(), "SCHEMA.VALIDATION_FAILED");
    assert_eq!(err.field("field"), Some("arguments_json"));

    // Rate limit: 1/min for tenant `limited`.
    invoker
        .invoke(as_dev(echo(), "limited", "l"))
        .await
        .unwrap();
    let st = invoker
        .invoke(as_dev(echo(), "limited", "l"))
        .await
        .unwrap_err();
    assert_eq!(st.code(), tonic::Code::ResourceExhausted);
    assert_eq!(code_of(&st), "QUOTA.RATE_LIMITED");
    assert!(
        soulbase_errors::SoulError::from_status(&st)
            .retry_after_ms()
            .is_some()
    );

    // Registered but not enabled; consent required.
    let mut registry = server.registry().await;
    registry
        .register_tool(as_dev(
            proto::RegisterToolRequest {
                manifest: demo_manifest("demo.off.tool", json!({})),
                owner: OwnerScope::Tenant as i32,
                enable: false,
            },
            "acme",
            "bob",
        ))
        .await
        .unwrap();
    let st = invoker
        .invoke(as_dev(
            invoke_req("demo.off.tool", json!({})),
            "acme",
            "bob",
        ))
        .await
        .unwrap_err();
    assert_eq!(code_of(&st), "TOOL.DISABLED");
    registry
        .register_tool(as_dev(
            proto::RegisterToolRequest {
                manifest: demo_manifest(
                    "demo.consent.tool",
                    json!({"consent": {"required": true}}),
                ),
                owner: OwnerScope::Tenant as i32,
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
    // A tenant's tool is invisible to another tenant: NOT_FOUND, never FORBIDDEN.
    let st = invoker
        .invoke(as_dev(
            invoke_req("demo.consent.tool", json!({})),
            "limited",
            "l",
        ))
        .await
        .unwrap_err();
    assert_eq!(code_of(&st), "TOOL.NOT_FOUND");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_writes_queries_and_watch() {
    let server = Server::start(DEV_CONFIG);
    let mut registry = server.registry().await;
    let mut watch = registry
        .watch_registry(as_dev(proto::WatchRegistryRequest {}, "acme", "bob"))
        .await
        .unwrap()
        .into_inner();
    // Another tenant's change must not reach acme's watcher.
    registry
        .register_tool(as_dev(
            proto::RegisterToolRequest {
                manifest: demo_manifest("demo.limited.only", json!({})),
                owner: OwnerScope::Tenant as i32,
                enable: false,
            },
            "other",
            "eve",
        ))
        .await
        .unwrap_err(); // `other` has no register permission
    let registered = registry
        .register_tool(as_dev(
            proto::RegisterToolRequest {
                manifest: demo_manifest("demo.mine.tool", json!({"tags": ["mine"]})),
                owner: OwnerScope::Tenant as i32,
                enable: true,
            },
            "acme",
            "bob",
        ))
        .await
        .unwrap()
        .into_inner()
        .tool
        .unwrap();
    assert_eq!(registered.state, ToolState::Enabled as i32);
    assert_eq!(registered.owner_tenant, "acme");
    let ev = watch.next().await.unwrap().unwrap();
    assert_eq!(ev.kind, RegistryEventKind::Registered as i32);
    assert_eq!(ev.tool_id, "demo.mine.tool");
    assert_eq!(ev.tenant, "acme");
    let ev = watch.next().await.unwrap().unwrap();
    assert_eq!(ev.kind, RegistryEventKind::StateChanged as i32);
    assert_eq!(ev.to_state, ToolState::Enabled as i32);

    // `limited` may invoke but not register: nothing is registered for it.
    let st = registry
        .register_tool(as_dev(
            proto::RegisterToolRequest {
                manifest: demo_manifest("demo.limited.tool", json!({})),
                owner: OwnerScope::Tenant as i32,
                enable: true,
            },
            "limited",
            "l",
        ))
        .await
        .unwrap_err();
    assert_eq!(code_of(&st), "POLICY.DENY_TOOL");
    let none = registry
        .list_tools(as_dev(
            proto::ListToolsRequest {
                owner: OwnerScope::Tenant as i32,
                ..Default::default()
            },
            "limited",
            "l",
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(none.tools.is_empty());

    // Filters: by tag and by owner.
    let mine = registry
        .list_tools(as_dev(
            proto::ListToolsRequest {
                tag: "mine".into(),
                include_manifest: true,
                ..Default::default()
            },
            "acme",
            "bob",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(mine.tools.len(), 1);
    let manifest: Value = serde_json::from_str(&mine.tools[0].manifest_json).unwrap();
    assert_eq!(manifest["id"], "demo.mine.tool");
    let own = registry
        .list_tools(as_dev(
            proto::ListToolsRequest {
                owner: OwnerScope::Tenant as i32,
                ..Default::default()
            },
            "acme",
            "bob",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(own.tools.len(), 1);
    // Pagination is by id and complete.
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = registry
            .list_tools(as_dev(
                proto::ListToolsRequest {
                    page_size: 2,
                    page_token: token.clone(),
                    ..Default::default()
                },
                "acme",
                "bob",
            ))
            .await
            .unwrap()
            .into_inner();
        seen.extend(page.tools.into_iter().map(|t| t.id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen.len(), 4);
    assert!(seen.windows(2).all(|w| w[0] < w[1]));
    // Bad filter values name the field.
    let st = registry
        .list_tools(as_dev(
            proto::ListToolsRequest {
                side_effect: "explosive".into(),
                ..Default::default()
            },
            "acme",
            "bob",
        ))
        .await
        .unwrap_err();
    assert_eq!(
        soulbase_errors::SoulError::from_status(&st).field("field"),
        Some("side_effect")
    );

    // Update (a patch release), pause, get, unregister.
    let updated = registry
        .update_tool(as_dev(
            proto::UpdateToolRequest {
                manifest: demo_manifest(
                    "demo.mine.tool",
                    json!({"version": "1.0.1", "tags": ["mine"]}),
                ),
                owner: OwnerScope::Tenant as i32,
            },
            "acme",
            "bob",
        ))
        .await
        .unwrap()
        .into_inner()
        .tool
        .unwrap();
    assert_eq!(updated.version, "1.0.1");
    let ev = watch.next().await.unwrap().unwrap();
    assert_eq!(ev.kind, RegistryEventKind::Updated as i32);
    assert_eq!(
        (ev.from_version.as_str(), ev.to_version.as_str()),
        ("1.0.0", "1.0.1")
    );
    let paused = registry
        .set_tool_state(as_dev(
            proto::SetToolStateRequest {
                tool_id: "demo.mine.tool".into(),
                owner: OwnerScope::Tenant as i32,
                change: StateChange::Pause as i32,
            },
            "acme",
            "bob",
        ))
        .await
        .unwrap()
        .into_inner()
        .tool
        .unwrap();
    assert_eq!(paused.state, ToolState::Paused as i32);
    // A manifest that is not valid names its problems.
    let st = registry
        .register_tool(as_dev(
            proto::RegisterToolRequest {
                manifest: "{\"id\": \"demo.bad.tool\"}".into(),
                ..Default::default()
            },
            "acme",
            "bob",
        ))
        .await
        .unwrap_err();
    assert_eq!(code_of(&st), "MANIFEST.INVALID");
    registry
        .unregister_tool(as_dev(
            proto::UnregisterToolRequest {
                tool_id: "demo.mine.tool".into(),
                owner: OwnerScope::Tenant as i32,
            },
            "acme",
            "bob",
        ))
        .await
        .unwrap();
    let st = registry
        .get_tool(as_dev(
            proto::GetToolRequest {
                tool_id: "demo.mine.tool".into(),
                include_manifest: false,
            },
            "acme",
            "bob",
        ))
        .await
        .unwrap_err();
    assert_eq!(code_of(&st), "TOOL.NOT_FOUND");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_invoker_is_a_drop_in() {
    let server = Server::start(DEV_CONFIG);
    let remote = RemoteInvoker::new(server.channel().await, Credentials::DevHeaders);
    let subject = Subject::new(TenantId::new("acme").unwrap(), ActorId::new("bob").unwrap());
    let echo = ToolId::new("soulbase.builtin.echo").unwrap();
    let ok = remote
        .invoke(ToolCall::new(
            subject.clone(),
            echo.clone(),
            json!({"x": 1}),
        ))
        .await;
    assert_eq!(ok.status, CallStatus::Ok);
    assert_eq!(ok.output, Some(json!({"echo": {"x": 1}})));
    assert!(ok.evidence_ref.is_some());
    let report = remote
        .preflight(&ToolCall::new(subject.clone(), echo.clone(), json!({})))
        .await
        .unwrap();
    assert_eq!(report.version, "1.0.0");
    let other = Subject::new(
        TenantId::new("other").unwrap(),
        ActorId::new("eve").unwrap(),
    );
    let call = ToolCall::new(other, echo.clone(), json!({}));
    let call_id = call.call_id.clone();
    let denied = remote.invoke(call).await;
    assert_eq!(denied.status, CallStatus::Denied);
    assert_eq!(denied.call_id, call_id);
    assert_eq!(denied.error_code.unwrap().as_str(), "POLICY.DENY_TOOL");
    // Without credentials the server refuses; the result says so.
    let anonymous = RemoteInvoker::new(server.channel().await, Credentials::None);
    let refused = anonymous
        .invoke(ToolCall::new(subject, echo, json!({})))
        .await;
    assert_eq!(refused.status, CallStatus::Denied);
    assert_eq!(refused.error_code.unwrap().as_str(), "AUTH.UNAUTHENTICATED");
    // An unreachable server is PROVIDER.UNAVAILABLE, not a panic.
    let err = RemoteInvoker::connect("http://127.0.0.1:1", Credentials::None)
        .await
        .unwrap_err();
    assert_eq!(err.code().as_str(), "PROVIDER.UNAVAILABLE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_are_served() {
    let server = Server::start(DEV_CONFIG);
    let channel = server.channel().await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in [
        "",
        "soulbase.tools.v1.ToolInvoker",
        "soulbase.tools.v1.ToolRegistry",
    ] {
        let resp = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            resp.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service}"
        );
    }
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut reflection = ServerReflectionClient::new(channel);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = reflection
        .server_reflection_info(futures_util::stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let resp = stream.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!("unexpected reflection answer");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.contains(&"soulbase.tools.v1.ToolInvoker".to_owned()));
    assert!(names.contains(&"soulbase.tools.v1.ToolRegistry".to_owned()));
    assert!(names.contains(&"grpc.health.v1.Health".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_headers_are_refused_without_the_flag_and_api_keys_work() {
    let subject = Subject::new(TenantId::new("acme").unwrap(), ActorId::new("ci").unwrap());
    let issued = soulbase_auth::generate_api_key("ci", &subject);
    let config = format!(
        r#"
auth:
  api_keys:
    - {{ id: ci, sha256: "{}", tenant: acme, actor: ci }}
policy:
  rules:
    - {{ effect: allow, tenant: acme, tools: ["*"] }}
"#,
        issued.config.sha256
    );
    let server = Server::start(&config);
    let mut invoker = server.invoker().await;
    let st = invoker
        .invoke(as_dev(
            invoke_req("soulbase.builtin.echo", json!({})),
            "acme",
            "bob",
        ))
        .await
        .unwrap_err();
    assert_eq!(code_of(&st), "AUTH.UNAUTHENTICATED");
    let remote = RemoteInvoker::new(
        server.channel().await,
        Credentials::ApiKey(issued.key.clone()),
    );
    let ok = remote
        .invoke(ToolCall::new(
            subject.clone(),
            ToolId::new("soulbase.builtin.echo").unwrap(),
            json!({}),
        ))
        .await;
    assert_eq!(ok.status, CallStatus::Ok, "{ok:?}");
    let wrong = RemoteInvoker::new(
        server.channel().await,
        Credentials::ApiKey(format!("{}x", issued.key)),
    );
    let refused = wrong
        .invoke(ToolCall::new(
            subject,
            ToolId::new("soulbase.builtin.echo").unwrap(),
            json!({}),
        ))
        .await;
    assert_eq!(refused.error_code.unwrap().as_str(), "AUTH.UNAUTHENTICATED");
}

/// A client's `grpc-timeout` is kept by the server: a call still running at its
/// deadline is dropped and answered at once with a status (trailers only), not
/// after the tool's 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_deadlines_are_kept_by_the_server() {
    let server = Server::start(DEV_CONFIG);
    let mut h2 = common::H2::connect(&server.grpc).await;
    // InvokeRequest { tool_id = 1, arguments_json = 2 }, encoded by hand.
    let mut message = Vec::new();
    for (field, value) in [(1u8, "soulbase.builtin.sleep"), (2, r#"{"ms": 5000}"#)] {
        message.push(field << 3 | 2);
        message.push(u8::try_from(value.len()).unwrap());
        message.extend_from_slice(value.as_bytes());
    }
    let started = std::time::Instant::now();
    h2.grpc_call(
        1,
        "/soulbase.tools.v1.ToolInvoker/Invoke",
        &[
            ("grpc-timeout", "300m"),
            ("x-soulbase-tenant", "acme"),
            ("x-soulbase-actor", "a"),
        ],
        &message,
    )
    .await;
    const HEADERS: u8 = 1;
    let (flags, _) = tokio::time::timeout(std::time::Duration::from_secs(10), h2.until(HEADERS, 1))
        .await
        .expect("no answer")
        .expect("the connection closed");
    let elapsed = started.elapsed();
    assert_ne!(
        flags & 0x1,
        0,
        "the answer should be trailers only (a status)"
    );
    assert!(
        elapsed >= std::time::Duration::from_millis(300),
        "{elapsed:?}"
    );
    assert!(elapsed < std::time::Duration::from_secs(4), "{elapsed:?}");
}

/// `provider_compat` decides the exports: a tool for some OpenAI models only is
/// offered to those models, never to Anthropic, over HTTP and gRPC alike; MCP,
/// not a model API, is unaffected; a manifest naming an unknown provider is
/// refused at registration, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_compat_decides_which_exports_offer_a_tool() {
    let server = Server::start(DEV_CONFIG);
    let compat = json!({"provider_compat": {"openai": "gpt-4o*", "anthropic": "none"}});
    register_enabled(&server, demo_manifest("demo.compat.narrow", compat), "bob").await;
    let dev = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "bob")];
    let offered = |query: &'static str| {
        let http = server.http.clone();
        async move {
            let (status, body) =
                common::http(&http, "GET", &format!("/api/model/tools?{query}"), &dev, "").await;
            assert_eq!(status, 200, "{body}");
            body.contains("demo__compat__narrow") || body.contains("\"demo.compat.narrow\"")
        }
    };
    assert!(offered("format=openai&model=gpt-4o-mini").await);
    assert!(offered("format=openai-strict&model=GPT-4o").await);
    assert!(offered("format=openai").await, "no model named");
    assert!(!offered("format=openai&model=o3-mini").await);
    assert!(!offered("format=anthropic").await);
    assert!(!offered("format=anthropic&model=claude-sonnet-4").await);
    assert!(offered("format=mcp").await);
    // gRPC: the same filter.
    async fn export(server: &Server, format: proto::ExportFormat, model: &str) -> String {
        let req = proto::ExportToolsRequest {
            format: format as i32,
            model: model.into(),
        };
        let mut invoker = server.invoker().await;
        let resp = invoker.export_tools(as_dev(req, "acme", "bob")).await;
        resp.unwrap().into_inner().tools_json
    }
    let narrow = "demo__compat__narrow";
    assert!(
        export(&server, proto::ExportFormat::Openai, "gpt-4o")
            .await
            .contains(narrow)
    );
    assert!(
        !export(&server, proto::ExportFormat::Openai, "o1")
            .await
            .contains(narrow)
    );
    assert!(
        !export(&server, proto::ExportFormat::Anthropic, "")
            .await
            .contains(narrow)
    );
    // Refused at registration: the field is named.
    let refused = server
        .registry()
        .await
        .register_tool(as_dev(
            proto::RegisterToolRequest {
                manifest: demo_manifest(
                    "demo.compat.bad",
                    json!({"provider_compat": {"mistral": "*"}}),
                ),
                owner: OwnerScope::Tenant as i32,
                enable: true,
            },
            "acme",
            "bob",
        ))
        .await
        .unwrap_err();
    assert!(
        refused.message().contains("provider_compat.mistral"),
        "{refused:?}"
    );
}

/// A deprecated tool says so on every surface: its description in lists and
/// exports, `_meta` in MCP, a warning in every successful call's result, and
/// `Deprecation` / `Sunset` headers over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deprecated_tool_says_so_on_every_surface() {
    use rmcp::ServiceExt;
    let server = Server::start(DEV_CONFIG);
    let deprecations = json!({"deprecations": [{
        "since": "2026-01-15",
        "message": "use demo.dep.v2.",
        "replacement": "demo.dep.v2",
        "sunset": "2027-03-01"
    }]});
    register_enabled(&server, demo_manifest("demo.dep.old", deprecations), "bob").await;
    let note = "Deprecated since 2026-01-15: use demo.dep.v2. Replaced by demo.dep.v2. \
                Removed on 2027-03-01.";

    // gRPC: the result's warnings.
    let r = server
        .invoker()
        .await
        .invoke(as_dev(
            invoke_req("demo.dep.old", json!({"n": 1})),
            "acme",
            "bob",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.warnings, [note]);

    // HTTP: the same warning, and the RFC headers.
    let dev = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "bob")];
    let raw = common::http_raw(
        &server.http,
        "POST",
        "/api/tools/demo.dep.old/invoke",
        &dev,
        r#"{"args":{"n":1}}"#,
    )
    .await;
    assert!(raw.contains("\r\ndeprecation: @1768435200\r\n"), "{raw}");
    assert!(
        raw.contains("\r\nsunset: Mon, 01 Mar 2027 00:00:00 GMT\r\n"),
        "{raw}"
    );
    assert!(raw.contains(note), "{raw}");
    let (_, body) = common::http(
        &server.http,
        "GET",
        "/api/model/tools?format=openai",
        &dev,
        "",
    )
    .await;
    assert!(body.contains("Deprecated since 2026-01-15"), "{body}");

    // MCP: the description, the list entry's _meta and the call result's _meta.
    let client = ().serve(common::mcp_transport(&server.http, "acme")).await.unwrap();
    let tools = client.list_all_tools().await.unwrap();
    let tool = tools.iter().find(|t| t.name == "demo.dep.old").unwrap();
    assert!(
        tool.description
            .as_deref()
            .unwrap_or_default()
            .contains(note)
    );
    let meta = serde_json::to_value(&tool.meta).unwrap();
    assert_eq!(
        meta["soulbase/deprecations"][0]["sunset"], "2027-03-01",
        "{meta}"
    );
    let result = client
        .call_tool(
            rmcp::model::CallToolRequestParams::new("demo.dep.old")
                .with_arguments(json!({"n": 1}).as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    let meta = serde_json::to_value(&result.meta).unwrap();
    assert_eq!(meta["soulbase/warnings"][0], note, "{meta}");
    client.cancel().await.unwrap();
}

/// A tool's manifest `scopes` reach the authorizer: an allow rule with
/// `require_scopes` admits only a caller whose credentials hold every one, for
/// calls and for the governed list alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifest_scopes_are_required_by_a_rule_that_asks_for_them() {
    let holder = "sbk_holder_0123456789abcdef0123456789abcdef";
    let lacker = "sbk_lacker_0123456789abcdef0123456789abcdef";
    let config = format!(
        r#"
server:
  dev_insecure: true
auth:
  api_keys:
    - {{ id: holder, sha256: "{}", tenant: acme, actor: holder, scopes: ["soul:fs:/data#read"] }}
    - {{ id: lacker, sha256: "{}", tenant: acme, actor: lacker, scopes: ["soul:fs:/other#read"] }}
policy:
  rules:
    - {{ effect: allow, tenant: acme, actors: [admin], tools: ["*"], actions: [register, enable] }}
    - {{ effect: allow, tenant: acme, tools: ["demo.*"], actions: [invoke], require_scopes: true }}
"#,
        soulbase_auth::api_key_digest(holder),
        soulbase_auth::api_key_digest(lacker),
    );
    let server = Server::start(&config);
    let scoped = json!({"scopes": [{"resource": "soul:fs:/data", "action": "read"}]});
    register_enabled(&server, demo_manifest("demo.files.read", scoped), "admin").await;
    let invoke = |key: &'static str| {
        let http = server.http.clone();
        async move {
            common::http(
                &http,
                "POST",
                "/api/tools/demo.files.read/invoke",
                &[("x-api-key", key)],
                r#"{"args":{"n":1}}"#,
            )
            .await
        }
    };
    let (status, body) = invoke(holder).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = invoke(lacker).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("POLICY.DENY_TOOL"), "{body}");
    for (key, listed) in [(holder, true), (lacker, false)] {
        let (_, body) =
            common::http(&server.http, "GET", "/api/tools", &[("x-api-key", key)], "").await;
        assert_eq!(body.contains("demo.files.read"), listed, "{key}: {body}");
    }
}
