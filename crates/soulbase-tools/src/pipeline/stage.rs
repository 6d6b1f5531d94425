//! The `tracing` spans of the pipeline stages (listed in the [module docs](super)).

use std::future::Future;

use soulbase_errors::SoulError;
use tracing::{Instrument, Span};

/// The `tracing` target of the pipeline's stage spans. They are `DEBUG` spans, so a
/// log filter at `info` does not materialise them; an exporter (soulbased's
/// OpenTelemetry layer) enables this target explicitly.
pub const STAGE_TARGET: &str = "soulbase::pipeline";

/// A stage span: a static name and two empty fields, `error.type` and
/// `otel.status_code`, filled only when the stage refuses or fails the call. When
/// the target is disabled this is one cached callsite check and no allocation.
macro_rules! stage_span {
    ($name:literal) => {
        ::tracing::debug_span!(
            target: $crate::pipeline::STAGE_TARGET,
            $name,
            error.type = ::tracing::field::Empty,
            otel.status_code = ::tracing::field::Empty,
        )
    };
}
pub(crate) use stage_span;

/// Records `err`'s stable code on `span` as `error.type` (and marks it an error).
pub(crate) fn record_error(span: &Span, err: &SoulError) {
    if !span.is_disabled() {
        span.record("error.type", err.code().as_str());
        span.record("otel.status_code", "ERROR");
    }
}

/// Runs the synchronous stage `f` inside `span`, recording its error, if any.
pub(crate) fn sync<T>(
    span: Span,
    f: impl FnOnce() -> Result<T, SoulError>,
) -> Result<T, SoulError> {
    let r = span.in_scope(f);
    if let Err(e) = &r {
        record_error(&span, e);
    }
    r
}

/// Runs the asynchronous stage `fut` inside `span`, recording its error, if any.
pub(crate) async fn run<T>(
    span: Span,
    fut: impl Future<Output = Result<T, SoulError>>,
) -> Result<T, SoulError> {
    let r = fut.instrument(span.clone()).await;
    if let Err(e) = &r {
        record_error(&span, e);
    }
    r
}
