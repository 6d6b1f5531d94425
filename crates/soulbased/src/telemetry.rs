//! OpenTelemetry traces over OTLP/gRPC, only when `observe.otlp_endpoint` is set.
//!
//! Every invocation made through the HTTP API, gRPC or MCP runs inside one span named
//! `execute_tool {tool}` with the GenAI semantic-convention attributes
//! `gen_ai.operation.name = execute_tool`, `gen_ai.tool.name`,
//! `gen_ai.tool.call.id`, and `error.type` (the stable error code) when the call did
//! not succeed. The caller's W3C trace context (`traceparent`), when present, is the
//! span's parent. The spans use the `tracing` target [`TARGET`], which only the
//! OpenTelemetry layer enables: without an endpoint they cost one disabled-callsite
//! check per call.
//!
//! Inside it, each pipeline stage the call passes through (`resolve`, `schema`,
//! `authorize`, `quota`, `profile`, `guard`, `concurrency`, `evidence.begin`,
//! `execute`, `output`, `evidence.end`, `quota.settle`, …; the full list is in
//! [`soulbase_tools::pipeline`]) is a child span; the stage that refuses or fails
//! the call carries `error.type`. Those are `DEBUG` spans of the target
//! [`STAGE_TARGET`], which the OpenTelemetry layer enables too (a log filter at
//! `info` does not).

use std::future::Future;

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_tools::pipeline::{CallResult, STAGE_TARGET, ToolCall};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of the spans exported to OpenTelemetry.
pub const TARGET: &str = "soulbase::otel";

/// The span of one invocation (see the module docs).
pub fn execute_tool_span(call: &ToolCall) -> tracing::Span {
    let span = tracing::info_span!(
        target: TARGET,
        "execute_tool",
        otel.name = %format_args!("execute_tool {}", call.tool),
        otel.kind = "internal",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.tool,
        gen_ai.tool.call.id = %call.call_id,
        error.type = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    if let Some(t) = &call.trace
        && !span.is_disabled()
    {
        let remote = SpanContext::new(
            TraceId::from_bytes(t.trace_id()),
            SpanId::from_bytes(t.span_id()),
            if t.sampled() {
                TraceFlags::SAMPLED
            } else {
                TraceFlags::default()
            },
            true,
            TraceState::default(),
        );
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    }
    span
}

/// Runs `run` (an invocation) inside `span` (its [`execute_tool_span`], taken
/// before the call moved into `run`) and records the outcome on it.
pub async fn traced<F>(span: tracing::Span, run: F) -> CallResult
where
    F: Future<Output = CallResult>,
{
    if span.is_disabled() {
        return run.await;
    }
    let result = run.instrument(span.clone()).await;
    if let Some(code) = result.error_code {
        span.record("error.type", code.as_str());
        span.record("otel.status_code", "ERROR");
    }
    result
}

/// The OTLP/gRPC tracer provider for `endpoint` (batching exporter on the Tokio
/// runtime; must be called inside one).
pub fn otlp_provider(endpoint: &str) -> Result<SdkTracerProvider, SoulError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| {
            SoulError::new(
                ErrorCode::ConfigInvalid,
                "observe.otlp_endpoint is not usable",
            )
            .with_field("field", "observe.otlp_endpoint")
            .with_note(e.to_string())
        })?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("soulbased")
                .build(),
        )
        .build())
}

/// The `tracing` layer exporting [`TARGET`] spans (and the [`STAGE_TARGET`] spans
/// of the pipeline stages) through `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("soulbased"))
        .with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target(TARGET, tracing::Level::INFO)
                .with_target(STAGE_TARGET, tracing::Level::DEBUG),
        )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use opentelemetry::Value;
    use opentelemetry_sdk::trace::InMemorySpanExporter;
    use soulbase_tools::pipeline::CallStatus;
    use soulbase_types::{ActorId, Subject, TenantId, ToolId, TraceContext};
    use tracing_subscriber::layer::SubscriberExt;

    fn call() -> ToolCall {
        ToolCall::new(
            Subject::new(TenantId::new("acme").unwrap(), ActorId::new("bob").unwrap()),
            ToolId::new("soulbase.builtin.echo").unwrap(),
            serde_json::json!({}),
        )
    }

    fn result(call: &ToolCall, code: Option<ErrorCode>) -> CallResult {
        CallResult {
            call_id: call.call_id.clone(),
            status: if code.is_some() {
                CallStatus::Error
            } else {
                CallStatus::Ok
            },
            error_code: code,
            error: None,
            output: None,
            evidence_ref: None,
            replayed: false,
            warnings: Vec::new(),
            usage: None,
        }
    }

    fn attr(span: &opentelemetry_sdk::trace::SpanData, key: &str) -> Option<String> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| match &kv.value {
                Value::String(s) => s.as_str().to_owned(),
                v => v.to_string(),
            })
    }

    #[tokio::test]
    async fn each_invocation_is_one_execute_tool_span_with_genai_attributes() {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry().with(layer(&provider));
        let _guard = tracing::subscriber::set_default(subscriber);

        let ok = call();
        let r = traced(execute_tool_span(&ok), async { result(&ok, None) }).await;
        assert_eq!(r.status, CallStatus::Ok);
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let failed = call().with_trace(TraceContext::parse_traceparent(traceparent).unwrap());
        traced(execute_tool_span(&failed), async {
            result(&failed, Some(ErrorCode::ProviderTimeout))
        })
        .await;
        provider.force_flush().unwrap();

        let spans = exporter.get_finished_spans().unwrap();
        assert_eq!(spans.len(), 2, "{spans:?}");
        let (a, b) = (&spans[0], &spans[1]);
        for (span, c) in [(a, &ok), (b, &failed)] {
            assert_eq!(span.name, "execute_tool soulbase.builtin.echo");
            assert_eq!(
                attr(span, "gen_ai.operation.name").as_deref(),
                Some("execute_tool")
            );
            assert_eq!(
                attr(span, "gen_ai.tool.name").as_deref(),
                Some("soulbase.builtin.echo")
            );
            assert_eq!(
                attr(span, "gen_ai.tool.call.id").as_deref(),
                Some(c.call_id.as_str())
            );
        }
        assert_eq!(attr(a, "error.type"), None);
        assert_eq!(attr(b, "error.type").as_deref(), Some("PROVIDER.TIMEOUT"));
        assert!(matches!(
            b.status,
            opentelemetry::trace::Status::Error { .. }
        ));
        // The caller's traceparent is the parent.
        assert_eq!(
            b.span_context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(b.parent_span_id.to_string(), "00f067aa0ba902b7");
        assert_ne!(a.span_context.trace_id(), b.span_context.trace_id());
    }

    #[tokio::test]
    async fn the_result_passes_through_unchanged() {
        let c = call();
        let r = traced(execute_tool_span(&c), async {
            result(&c, Some(ErrorCode::PolicyDenyTool))
        })
        .await;
        assert_eq!(r.call_id, c.call_id);
        assert_eq!(r.error_code, Some(ErrorCode::PolicyDenyTool));
    }
}
