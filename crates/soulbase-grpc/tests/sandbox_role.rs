#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The sandbox role over real gRPC on loopback.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_grpc::sandbox_proto::{ExecuteRequest, sandbox_client::SandboxClient};
use soulbase_grpc::{RemoteSandbox, SandboxRoleService};
use soulbase_observe::SideEffectRecord;
use soulbase_sandbox::{
    BuiltinExecutor, BuiltinHandler, Capability, ExecOutput, ExecRequest, IntersectingProfiles,
    LocalSandbox, Profile, ProviderBinding, Sandbox,
};
use soulbase_types::{CallId, TenantId, ToolId};
use tonic::transport::{Channel, Endpoint};

struct Echo;

#[tonic::async_trait]
impl BuiltinHandler for Echo {
    async fn call(&self, args: Value) -> Result<ExecOutput, SoulError> {
        Ok(ExecOutput {
            output: json!({ "echo": args }),
            side_effects: vec![SideEffectRecord {
                kind: "fs.write".into(),
                target: "/tmp/echo".into(),
            }],
            cpu_ms: Some(7),
        })
    }
}

/// The sandbox role's own profiles: `ceiling`, and every tenant granted everything.
fn profiles(ceiling: Option<Vec<Capability>>) -> IntersectingProfiles {
    IntersectingProfiles::new(ceiling).default_grant(None)
}

async fn serve(ceiling: Option<Vec<Capability>>, token: Option<&str>) -> Channel {
    serve_with(profiles(ceiling), token).await
}

async fn serve_with(profiles: IntersectingProfiles, token: Option<&str>) -> Channel {
    let builtin = BuiltinExecutor::new();
    builtin.register("soulbase.test.echo", Arc::new(Echo));
    let service = SandboxRoleService::new(
        Arc::new(LocalSandbox::new(builtin)),
        Arc::new(profiles),
        token.map(str::to_owned),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service.into_server())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy()
}

struct Call {
    call_id: CallId,
    tenant: TenantId,
    tool: ToolId,
    provider: ProviderBinding,
    profile: Profile,
}

impl Call {
    fn new(provider: ProviderBinding, caps: Vec<Capability>) -> Self {
        Self {
            call_id: CallId::generate(),
            tenant: TenantId::new("acme").unwrap(),
            tool: ToolId::new("soulbase.test.echo").unwrap(),
            provider,
            profile: Profile::new(caps),
        }
    }

    fn request(&self, args: Value) -> ExecRequest<'_> {
        ExecRequest {
            call_id: &self.call_id,
            tenant: &self.tenant,
            tool: &self.tool,
            provider: &self.provider,
            args,
            profile: &self.profile,
            timeout: Duration::from_secs(5),
            max_bytes_out: None,
            max_memory_bytes: None,
            max_processes: None,
            max_files: None,
            reporter: soulbase_sandbox::Reporter::none(),
        }
    }
}

fn builtin() -> ProviderBinding {
    serde_json::from_value(json!({"type": "builtin"})).unwrap()
}

fn process() -> ProviderBinding {
    serde_json::from_value(json!({"type": "process", "command": "/usr/bin/jq"})).unwrap()
}

fn http() -> ProviderBinding {
    serde_json::from_value(json!({"type": "http", "endpoint": "https://api.example.com"})).unwrap()
}

fn net(host: &str) -> Capability {
    serde_json::from_value(json!({"kind": "net", "hosts": [host]})).unwrap()
}

fn raw_request(provider: Value, caps: Value) -> ExecuteRequest {
    ExecuteRequest {
        call_id: CallId::generate().to_string(),
        tenant: "acme".into(),
        tool_id: "soulbase.test.echo".into(),
        provider_json: provider.to_string(),
        arguments_json: "{}".into(),
        capabilities_json: caps.to_string(),
        timeout_ms: 1_000,
        max_bytes_out: 0,
        max_memory_bytes: 0,
        max_processes: 0,
        max_files: 0,
    }
}

#[tokio::test]
async fn execute_round_trips_output_and_side_effects() {
    let remote = RemoteSandbox::new(serve(None, Some("s3cret")).await, Some("s3cret".into()));
    let call = Call::new(builtin(), vec![]);
    let req = call.request(json!({"a": 1}));
    remote.guard(&req).unwrap();
    let out = remote.execute(req).await.unwrap();
    assert_eq!(out.output, json!({"echo": {"a": 1}}));
    assert_eq!(
        out.side_effects,
        vec![SideEffectRecord {
            kind: "fs.write".into(),
            target: "/tmp/echo".into()
        }]
    );
    assert_eq!(out.cpu_ms, Some(7));
    // An unknown builtin handler is the server's executor-level refusal.
    let mut unknown = Call::new(builtin(), vec![]);
    unknown.tool = ToolId::new("soulbase.test.missing").unwrap();
    let e = remote
        .execute(unknown.request(json!({})))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ProviderUnavailable);
}

#[tokio::test]
async fn ungranted_providers_are_blocked_locally_and_remotely() {
    let channel = serve(None, None).await;
    let remote = RemoteSandbox::new(channel.clone(), None);
    for provider in [process(), http()] {
        let call = Call::new(provider, vec![]);
        let e = remote.guard(&call.request(json!({}))).unwrap_err();
        assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked);
        // Guard bypassed: the server guards too.
        let e = remote.execute(call.request(json!({}))).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked);
    }
    let mut raw = SandboxClient::new(channel);
    let status = raw
        .execute(raw_request(
            json!({"type": "process", "command": "/usr/bin/jq"}),
            json!([]),
        ))
        .await
        .unwrap_err();
    assert_eq!(
        SoulError::from_status(&status).code(),
        ErrorCode::SandboxCapabilityBlocked
    );
}

#[tokio::test]
async fn the_ceiling_narrows_the_profile() {
    let remote = RemoteSandbox::new(
        serve(Some(vec![net("other.example.com")]), None).await,
        None,
    );
    let call = Call::new(http(), vec![net("api.example.com")]);
    // The caller's profile allows it ...
    remote.guard(&call.request(json!({}))).unwrap();
    // ... the sandbox role's ceiling does not.
    let e = remote.execute(call.request(json!({}))).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked);

    // A plan inside the ceiling passes it unchanged (the guard allows the host).
    let inside = RemoteSandbox::new(serve(Some(vec![net("*.example.com")]), None).await, None);
    let e = inside
        .execute(call.request(json!({})))
        .await
        .expect_err("no HTTP executor is plugged in here");
    assert_eq!(e.code(), ErrorCode::ProviderUnavailable, "{e:?}");
}

#[tokio::test]
async fn the_role_applies_its_own_grant_for_the_tenant() {
    // This role grants the call's tenant nothing: a plan naming a host is blocked,
    // whatever the caller computed.
    let none = IntersectingProfiles::new(None);
    let remote = RemoteSandbox::new(serve_with(none, None).await, None);
    let call = Call::new(http(), vec![net("api.example.com")]);
    remote.guard(&call.request(json!({}))).unwrap();
    let e = remote.execute(call.request(json!({}))).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked);
}

#[tokio::test]
async fn bad_fields_are_named() {
    let mut raw = SandboxClient::new(serve(None, None).await);
    let status = raw
        .execute(raw_request(json!({"type": "ftp"}), json!([])))
        .await
        .unwrap_err();
    let e = SoulError::from_status(&status);
    assert_eq!(e.code(), ErrorCode::SchemaValidationFailed);
    assert_eq!(e.field("field"), Some("provider_json"));
    let mut bad = raw_request(json!({"type": "builtin"}), json!([]));
    bad.capabilities_json = "[{\"kind\":\"gpu\"}]".into();
    let e = SoulError::from_status(&raw.execute(bad).await.unwrap_err());
    assert_eq!(e.field("field"), Some("capabilities_json"));
}

#[tokio::test]
async fn the_internal_token_is_required() {
    let channel = serve(None, Some("s3cret")).await;
    let call = Call::new(builtin(), vec![]);
    for token in [None, Some("wrong".to_owned())] {
        let remote = RemoteSandbox::new(channel.clone(), token);
        let e = remote.execute(call.request(json!({}))).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::ProviderUnavailable);
    }
}
