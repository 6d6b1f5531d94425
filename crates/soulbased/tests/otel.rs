//! OpenTelemetry export: with `observe.otlp_endpoint` set, an invocation over HTTP
//! or MCP reaches a (tiny, in-process) OTLP gRPC collector as one
//! `execute_tool {tool}` span with the GenAI attributes, parented by the caller's
//! `traceparent`, with one child span per pipeline stage the call passed through.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::{Server, http};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::sync::mpsc;

struct Collector(mpsc::UnboundedSender<Span>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for rs in request.into_inner().resource_spans {
            for ss in rs.scope_spans {
                for span in ss.spans {
                    let _ = self.0.send(span);
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
        .map(|v| match v {
            AnyValue::StringValue(s) => s.clone(),
            other => format!("{other:?}"),
        })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invocations_are_exported_as_execute_tool_spans() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Collector(tx)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let config = format!(
        "server:\n  dev_insecure: true\nobserve:\n  otlp_endpoint: http://{addr}\n\
         policy:\n  rules:\n    - {{ effect: allow, tenant: acme, tools: [\"*\"] }}\n"
    );
    // Export batches every 50 ms instead of the default 5 s.
    let server = Server::start_env(&config, |_| {}, &[("OTEL_BSP_SCHEDULE_DELAY", "50")]);
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (status, body) = http(
        &server.http,
        "POST",
        "/api/tools/soulbase.builtin.echo/invoke",
        &[
            ("x-soulbase-tenant", "acme"),
            ("x-soulbase-actor", "bob"),
            ("traceparent", traceparent),
        ],
        r#"{"a": 1}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let result: serde_json::Value = serde_json::from_str(&body).unwrap();
    let call_id = result["call_id"].as_str().unwrap();
    // A call refused by policy is a span too, with its error type.
    let (status, _) = http(
        &server.http,
        "POST",
        "/api/tools/soulbase.builtin.echo/invoke",
        &[("x-soulbase-tenant", "other"), ("x-soulbase-actor", "eve")],
        r#"{"a": 1}"#,
    )
    .await;
    assert_eq!(status, 403);
    // And over MCP.
    let mut headers = std::collections::HashMap::new();
    headers.insert(
        http::HeaderName::from_static("x-soulbase-tenant"),
        http::HeaderValue::from_static("acme"),
    );
    headers.insert(
        http::HeaderName::from_static("x-soulbase-actor"),
        http::HeaderValue::from_static("agent"),
    );
    let transport = rmcp::transport::StreamableHttpClientTransport::from_config(
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            format!("http://{}/mcp", server.http),
        )
        .custom_headers(headers),
    );
    let mcp = rmcp::ServiceExt::serve((), transport).await.unwrap();
    let out = mcp
        .call_tool(
            rmcp::model::CallToolRequestParams::new("soulbase.builtin.echo")
                .with_arguments(serde_json::json!({"m": 2}).as_object().cloned().unwrap()),
        )
        .await
        .unwrap();
    assert_ne!(out.is_error, Some(true), "{out:?}");

    // A span is exported when it ends, so a call's stage spans arrive before its
    // `execute_tool` span.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut spans = Vec::new();
    let mut stages = Vec::new();
    while spans.len() < 3 {
        let left = deadline.saturating_duration_since(Instant::now());
        let span = tokio::time::timeout(left, rx.recv())
            .await
            .expect("the collector did not receive all three spans in time")
            .unwrap();
        if span.name.starts_with("execute_tool") {
            spans.push(span);
        } else {
            stages.push(span);
        }
    }
    let ok = spans
        .iter()
        .find(|s| attr(s, "gen_ai.tool.call.id").as_deref() == Some(call_id))
        .expect("no span for the successful call");
    assert_eq!(ok.name, "execute_tool soulbase.builtin.echo");
    assert_eq!(
        attr(ok, "gen_ai.operation.name").as_deref(),
        Some("execute_tool")
    );
    assert_eq!(
        attr(ok, "gen_ai.tool.name").as_deref(),
        Some("soulbase.builtin.echo")
    );
    assert_eq!(attr(ok, "error.type"), None);
    assert_eq!(hex(&ok.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(hex(&ok.parent_span_id), "00f067aa0ba902b7");
    let others: Vec<_> = spans
        .iter()
        .filter(|s| attr(s, "gen_ai.tool.call.id").as_deref() != Some(call_id))
        .collect();
    assert_eq!(others.len(), 2);
    let codes: Vec<_> = others
        .iter()
        .filter_map(|s| attr(s, "error.type"))
        .collect();
    // The denied HTTP call carries its code; the MCP call succeeded.
    assert_eq!(codes, ["POLICY.DENY_TOOL"]);
    for s in &others {
        assert_eq!(s.name, "execute_tool soulbase.builtin.echo");
        assert!(attr(s, "gen_ai.tool.call.id").is_some_and(|id| id.starts_with("call_")));
    }

    // Every stage span is a child of an `execute_tool` span, in its trace.
    for stage in &stages {
        assert!(
            spans
                .iter()
                .any(|s| s.span_id == stage.parent_span_id && s.trace_id == stage.trace_id),
            "stage span {:?} is not a child of an execute_tool span",
            stage.name
        );
    }
    // The successful call: one span per stage it passed through, in order.
    let ok_stages = children(&stages, ok);
    assert_eq!(
        names(&ok_stages),
        [
            "resolve",
            "schema",
            "authorize",
            "quota",
            "profile",
            "guard",
            "concurrency",
            "evidence.begin",
            "execute",
            "output",
            "evidence.end",
            "quota.settle",
        ]
    );
    for stage in &ok_stages {
        assert_eq!(hex(&stage.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(stage.parent_span_id, ok.span_id);
        assert_eq!(attr(stage, "error.type"), None, "{}", stage.name);
    }
    // The denied call stops at `authorize`, which carries the error type.
    let denied = others
        .iter()
        .find(|s| attr(s, "error.type").is_some())
        .unwrap();
    let denied_stages = children(&stages, denied);
    assert_eq!(
        names(&denied_stages),
        ["resolve", "schema", "authorize", "evidence.denial"]
    );
    for stage in &denied_stages {
        assert_eq!(stage.trace_id, denied.trace_id);
        let error = attr(stage, "error.type");
        if stage.name == "authorize" {
            assert_eq!(error.as_deref(), Some("POLICY.DENY_TOOL"));
            // STATUS_CODE_ERROR
            assert_eq!(stage.status.as_ref().map(|s| s.code), Some(2));
        } else {
            assert_eq!(error, None, "{}", stage.name);
        }
    }
}

/// The stage spans whose parent is `parent`, in the order they started.
fn children<'a>(stages: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    let mut out: Vec<_> = stages
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id)
        .collect();
    // Stable: stages that started in the same nanosecond keep their export order
    // (the order they ended, which for sequential stages is the order they ran).
    out.sort_by_key(|s| s.start_time_unix_nano);
    out
}

fn names<'a>(spans: &[&'a Span]) -> Vec<&'a str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}
