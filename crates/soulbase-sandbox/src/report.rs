//! What a running tool tells its caller before it answers: progress and log
//! messages.
//!
//! A surface that can deliver them (MCP: `notifications/progress` for a call
//! carrying a `progressToken`, `notifications/message` for a session that set a
//! log level) gives the call a [`Reporter`] over its own [`ReportSink`]; the
//! pipeline hands it to the executor in [`ExecRequest::reporter`](crate::ExecRequest)
//! and a builtin handler reports through
//! [`BuiltinHandler::call_reporting`](crate::BuiltinHandler::call_reporting). Every
//! other call gets [`Reporter::none`], on which reporting does nothing. Reports are
//! advisory: they are not evidence, they never change the call's outcome, and a
//! sink must not block (the MCP surface queues them and sends them in order
//! before the call's answer).

use std::fmt;
use std::sync::Arc;

/// The severity of a tool's log message (the MCP levels a tool may use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Detail for debugging.
    Debug,
    /// Normal progress.
    Info,
    /// Normal but significant.
    Notice,
    /// Something unexpected the tool worked around.
    Warning,
    /// Something failed.
    Error,
}

/// One report of a running tool.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// How far the tool is: the fraction `done / total`, in `0.0..=1.0`.
    Progress {
        /// The fraction done, clamped to `0.0..=1.0`.
        fraction: f64,
        /// A short human-readable note, if any.
        message: Option<String>,
    },
    /// A log message.
    Log {
        /// Its severity.
        level: LogLevel,
        /// The message.
        message: String,
    },
}

/// Where a call's reports go; implemented by the surface that started the call.
/// Must not block: it is called from the tool's own task.
pub trait ReportSink: Send + Sync + 'static {
    /// Takes one report.
    fn report(&self, report: Report);
}

/// A call's report channel: cheap to clone; [`Reporter::none`] drops everything.
#[derive(Clone, Default)]
pub struct Reporter(Option<Arc<dyn ReportSink>>);

impl Reporter {
    /// A reporter that drops every report (a surface with no way to deliver them).
    pub fn none() -> Self {
        Self(None)
    }

    /// A reporter delivering to `sink`.
    pub fn new(sink: Arc<dyn ReportSink>) -> Self {
        Self(Some(sink))
    }

    /// Whether anyone receives the reports (a tool may skip building them).
    pub fn is_listening(&self) -> bool {
        self.0.is_some()
    }

    /// Reports progress: `done` of `total` (a `total` of zero or less, or a value
    /// that is not finite, counts as nothing done).
    pub fn progress(&self, done: f64, total: f64, message: Option<&str>) {
        if let Some(sink) = &self.0 {
            let fraction = if total > 0.0 && done.is_finite() && total.is_finite() {
                (done / total).clamp(0.0, 1.0)
            } else {
                0.0
            };
            sink.report(Report::Progress {
                fraction,
                message: message.map(str::to_owned),
            });
        }
    }

    /// Reports a log message at `level`.
    pub fn log(&self, level: LogLevel, message: impl Into<String>) {
        if let Some(sink) = &self.0 {
            sink.report(Report::Log {
                level,
                message: message.into(),
            });
        }
    }
}

impl fmt::Debug for Reporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Reporter")
            .field(&if self.0.is_some() {
                "listening"
            } else {
                "none"
            })
            .finish()
    }
}

/// Two reporters are equal when they deliver to the same sink (or both to none).
impl PartialEq for Reporter {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for Reporter {}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Mutex;

    use super::*;

    #[derive(Default)]
    struct Collect(Mutex<Vec<Report>>);

    impl ReportSink for Collect {
        fn report(&self, report: Report) {
            self.0.lock().unwrap().push(report);
        }
    }

    #[test]
    fn reports_reach_the_sink_as_fractions_and_none_drops_them() {
        let sink = Arc::new(Collect::default());
        let r = Reporter::new(sink.clone());
        assert!(r.is_listening());
        r.progress(50.0, 100.0, Some("half"));
        r.progress(7.0, 0.0, None);
        r.progress(300.0, 100.0, None);
        r.log(LogLevel::Info, "hello");
        let got = sink.0.lock().unwrap().clone();
        assert_eq!(
            got,
            vec![
                Report::Progress {
                    fraction: 0.5,
                    message: Some("half".into())
                },
                Report::Progress {
                    fraction: 0.0,
                    message: None
                },
                Report::Progress {
                    fraction: 1.0,
                    message: None
                },
                Report::Log {
                    level: LogLevel::Info,
                    message: "hello".into()
                },
            ]
        );
        let none = Reporter::none();
        assert!(!none.is_listening());
        none.log(LogLevel::Error, "dropped");
        assert_eq!(none, Reporter::default());
        assert_ne!(none, r);
        assert_eq!(r.clone(), r);
    }
}
