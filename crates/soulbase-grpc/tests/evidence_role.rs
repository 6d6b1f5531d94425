#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The evidence role over real gRPC on loopback.

use std::sync::Arc;

use soulbase_errors::{ErrorCode, SoulError};
use soulbase_grpc::evidence_proto::{
    AppendRequest, GetCallRequest, ListCallsRequest, evidence_client::EvidenceClient,
};
use soulbase_grpc::{EvidenceRoleService, RemoteEvidence};
use soulbase_observe::{
    BudgetUsage, Denial, EndStatus, EvidenceBegin, EvidenceEnd, EvidenceEvent, EvidenceQuery,
    EvidenceRecord, EvidenceSink, EvidenceStore, MemoryStore, ReplayOutcome,
};
use soulbase_types::{ActorId, CallId, Envelope, Origin, TenantId, ToolId, UnixMillis};
use tonic::transport::{Channel, Endpoint};

async fn serve(token: Option<&str>) -> (Channel, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    let service = EvidenceRoleService::new(store.clone(), token.map(str::to_owned));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service.into_server())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    (channel, store)
}

fn tenant(t: &str) -> TenantId {
    TenantId::new(t).unwrap()
}

fn envelope(t: &str, at: i64, payload: EvidenceEvent) -> EvidenceRecord {
    let mut r = Envelope::new(
        tenant(t),
        ActorId::new("bob").unwrap(),
        Origin::Api,
        payload,
    );
    r.at = UnixMillis(at);
    r
}

fn begin(t: &str, call_id: &CallId, at: i64) -> EvidenceRecord {
    envelope(
        t,
        at,
        EvidenceEvent::Begin(EvidenceBegin {
            call_id: call_id.clone(),
            tool_id: ToolId::new("soulbase.test.echo").unwrap(),
            tool_version: "1.0.0".into(),
            manifest_digest: "m".into(),
            profile_hash: "p".into(),
            policy_hash: "pol".into(),
            config_hash: "c".into(),
            args_digest: "a".into(),
            idempotency_key: None,
            calling_skill: None,
            consent: None,
            conversation: None,
            surface: None,
        }),
    )
}

fn end(begin: &EvidenceRecord, call_id: &CallId, status: EndStatus) -> EvidenceRecord {
    envelope(
        begin.tenant.as_str(),
        begin.at.0 + 5,
        EvidenceEvent::End(EvidenceEnd {
            call_id: call_id.clone(),
            begin_id: begin.id.clone(),
            status,
            error_code: (status != EndStatus::Ok).then_some(ErrorCode::ToolExecutionFailed),
            output_digest: Some("o".into()),
            side_effects: Vec::new(),
            usage: BudgetUsage {
                calls: 1,
                ..Default::default()
            },
            duration_us: 1_000,
            client_requests: Vec::new(),
        }),
    )
}

fn field(status: &tonic::Status) -> Option<String> {
    let e = SoulError::from_status(status);
    assert_eq!(e.code(), ErrorCode::SchemaValidationFailed, "{e:?}");
    e.field("field").map(str::to_owned)
}

#[tokio::test]
async fn appends_are_idempotent_and_calls_are_per_tenant() {
    let (channel, store) = serve(Some("s3cret")).await;
    let remote = RemoteEvidence::new(channel, Some("s3cret".into()));
    let call = CallId::generate();
    let b = begin("acme", &call, 1_000);
    let e = end(&b, &call, EndStatus::Ok);
    let batch = vec![b.clone(), e.clone()];
    remote.write_batch(&batch).await.unwrap();
    remote.write_batch(&batch).await.unwrap();
    assert_eq!(store.len(), 2);

    let got = remote.call(Some(&tenant("acme")), &call).await.unwrap();
    assert_eq!(got.records, batch);
    let all = remote.call(None, &call).await.unwrap();
    assert_eq!(all.records.len(), 2);
    let other = remote.call(Some(&tenant("other")), &call).await.unwrap();
    assert!(other.is_empty());

    let replay = remote.replay(Some(&tenant("acme")), &call).await.unwrap();
    assert_eq!(replay.call_id, call);
    assert!(replay.anomalies.is_empty(), "{:?}", replay.anomalies);
    let ReplayOutcome::Executed(x) = replay.outcome else {
        panic!("not executed: {:?}", replay.outcome);
    };
    assert_eq!(x.status, Some(EndStatus::Ok));
    assert_eq!(x.begin_id, b.id);

    // An unknown call: the same refusal the local replay gives for no evidence.
    let e = remote.replay(None, &CallId::generate()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::SchemaValidationFailed);
    assert_eq!(e.field("field"), Some("call_id"));

    // Retention is not served remotely.
    let e = remote.purge_before(UnixMillis(0)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::EvidenceUnavailable);
}

#[tokio::test]
async fn listing_paginates_and_filters() {
    let (channel, _store) = serve(None).await;
    let remote = RemoteEvidence::new(channel, None);
    let mut calls = Vec::new();
    let mut records = Vec::new();
    for i in 0..3 {
        let call = CallId::generate();
        let b = begin("acme", &call, 1_000 + i * 100);
        let status = if i == 1 {
            EndStatus::Timeout
        } else {
            EndStatus::Ok
        };
        records.push(end(&b, &call, status));
        records.push(b);
        calls.push(call);
    }
    records.push(begin("other", &CallId::generate(), 1_050));
    remote.write_batch(&records).await.unwrap();

    let mut q = EvidenceQuery::tenant(tenant("acme"), 2);
    let first = remote.list(&q).await.unwrap();
    assert_eq!(
        first.calls.iter().map(|c| &c.call_id).collect::<Vec<_>>(),
        vec![&calls[2], &calls[1]]
    );
    q.after = Some(first.next.clone().expect("a second page"));
    let second = remote.list(&q).await.unwrap();
    assert_eq!(second.calls.len(), 1);
    assert_eq!(second.calls[0].call_id, calls[0]);
    assert_eq!(second.next, None);

    let mut q = EvidenceQuery::tenant(tenant("acme"), 10);
    q.status = Some(EndStatus::Timeout);
    let timeouts = remote.list(&q).await.unwrap();
    assert_eq!(timeouts.calls.len(), 1);
    assert_eq!(timeouts.calls[0].call_id, calls[1]);
    q.status = None;
    q.from = Some(UnixMillis(1_100));
    q.to = Some(UnixMillis(1_200));
    let ranged = remote.list(&q).await.unwrap();
    assert_eq!(ranged.calls.len(), 1);
    assert_eq!(ranged.calls[0].call_id, calls[1]);
    // By actor and by error code, carried over the wire.
    let mut q = EvidenceQuery::tenant(tenant("acme"), 10);
    q.code = Some(ErrorCode::ToolExecutionFailed);
    let failed = remote.list(&q).await.unwrap();
    assert_eq!(
        failed.calls.iter().map(|c| &c.call_id).collect::<Vec<_>>(),
        vec![&calls[1]]
    );
    q.actor = Some(ActorId::new("nobody").unwrap());
    assert!(remote.list(&q).await.unwrap().calls.is_empty());
}

#[tokio::test]
async fn denials_are_listed_through_the_role() {
    let (channel, _store) = serve(None).await;
    let remote = RemoteEvidence::new(channel, None);
    let denied = |t: &str, at: i64, code: ErrorCode| {
        envelope(
            t,
            at,
            EvidenceEvent::Denied(Denial {
                call_id: CallId::generate(),
                tool: "demo.a.x".into(),
                code,
            }),
        )
    };
    let a = denied("acme", 1_000, ErrorCode::PolicyDenyTool);
    let b = denied("acme", 2_000, ErrorCode::ConsentRequired);
    let other = denied("other", 1_500, ErrorCode::PolicyDenyTool);
    remote
        .write_batch(&[a.clone(), b.clone(), other])
        .await
        .unwrap();
    let mut q = EvidenceQuery::tenant(tenant("acme"), 1);
    let first = remote.list_denials(&q).await.unwrap();
    assert_eq!(first.denials.len(), 1);
    assert_eq!(&first.denials[0].call_id, b.payload.call_id());
    assert_eq!(first.denials[0].code, ErrorCode::ConsentRequired);
    q.after = first.next;
    let second = remote.list_denials(&q).await.unwrap();
    assert_eq!(
        second
            .denials
            .iter()
            .map(|d| &d.call_id)
            .collect::<Vec<_>>(),
        vec![a.payload.call_id()]
    );
    assert!(second.next.is_none());
    let mut q = EvidenceQuery::tenant(tenant("acme"), 10);
    q.code = Some(ErrorCode::PolicyDenyTool);
    let page = remote.list_denials(&q).await.unwrap();
    assert_eq!(page.denials.len(), 1);
    assert_eq!(&page.denials[0].call_id, a.payload.call_id());
    q.code = None;
    q.status = Some(EndStatus::Ok);
    let err = remote.list_denials(&q).await.unwrap_err();
    assert_eq!(err.field("field"), Some("status"));
}

#[tokio::test]
async fn bad_requests_name_their_fields() {
    let (channel, _store) = serve(None).await;
    let mut raw = EvidenceClient::new(channel);
    let status = raw
        .list_calls(ListCallsRequest {
            tenant: "acme".into(),
            status: "finished".into(),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(field(&status).as_deref(), Some("status"));
    let status = raw
        .list_calls(ListCallsRequest {
            tenant: "acme".into(),
            limit: 10,
            after: "garbage".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(field(&status).as_deref(), Some("after"));
    let status = raw
        .append(AppendRequest {
            records_json: vec!["{\"id\": 1}".into()],
        })
        .await
        .unwrap_err();
    assert_eq!(field(&status).as_deref(), Some("records_json[0]"));
    let status = raw
        .append(AppendRequest {
            records_json: vec![String::new(); 10_001],
        })
        .await
        .unwrap_err();
    assert_eq!(field(&status).as_deref(), Some("records_json"));
    let status = raw.get_call(GetCallRequest::default()).await.unwrap_err();
    assert_eq!(field(&status).as_deref(), Some("call_id"));
    let accepted = raw
        .append(AppendRequest {
            records_json: vec![
                serde_json::to_string(&begin("acme", &CallId::generate(), 1)).unwrap(),
            ],
        })
        .await
        .unwrap();
    assert_eq!(accepted.get_ref().accepted, 1);
}

#[tokio::test]
async fn the_internal_token_is_required() {
    let (channel, store) = serve(Some("s3cret")).await;
    let call = CallId::generate();
    for token in [None, Some("wrong".to_owned())] {
        let remote = RemoteEvidence::new(channel.clone(), token);
        let e = remote
            .write_batch(&[begin("acme", &call, 1)])
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::EvidenceUnavailable);
        assert!(e.audit().causes.join(" ").contains("internal token"), "{e}");
        let e = remote.call(None, &call).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::EvidenceUnavailable);
    }
    assert!(store.is_empty());
}

#[tokio::test]
async fn the_remote_store_is_an_evidence_sink() {
    let (channel, store) = serve(None).await;
    let sink: Arc<dyn EvidenceSink> = Arc::new(RemoteEvidence::new(channel, None));
    let call = CallId::generate();
    let denial = envelope(
        "acme",
        42,
        EvidenceEvent::Denied(Denial {
            call_id: call.clone(),
            tool: "soulbase.test.echo".into(),
            code: ErrorCode::PolicyDenyTool,
        }),
    );
    sink.record(denial.clone()).await.unwrap();
    assert_eq!(store.records(), vec![denial]);
    let got = store.call(Some(&tenant("acme")), &call).await.unwrap();
    assert_eq!(got.denials().count(), 1);
}

#[tokio::test]
async fn an_unreachable_role_is_evidence_unavailable() {
    // Bind and drop a listener to get a port nobody serves.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let remote = RemoteEvidence::new(channel, None);
    let e = remote
        .record(begin("acme", &CallId::generate(), 1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::EvidenceUnavailable);
}
