//! A call's progress and log messages as MCP notifications.
//!
//! `tools/call` gives the governed call a [`Reporter`] whose reports are queued
//! ([`Queue`], never blocking the tool) and sent in order on the request's peer by
//! a [`Notifier`] while the call runs, and the rest before its answer:
//!
//! - progress, for a call carrying `_meta.progressToken`: `0/1` "started" when the
//!   call begins, each fraction the tool reports that is larger than the last one
//!   sent (progress only ever increases, as the specification requires), and `1/1`
//!   "finished" unless the tool already reached it;
//! - log messages, `notifications/message` with logger `soulbase.tool` and data
//!   `{tool, message}`, when the request's or the session's log level admits
//!   their severity;
//! - a request to poll ([`Report::Poll`]), for a call over streamable HTTP: its
//!   response stream is closed and the client reconnects for the rest
//!   ([`crate::polling`]).

// MCP logging is deprecated by SEP-2577 (rmcp 3.9) but still what clients speak.
#![allow(deprecated)]

use rmcp::model::RequestId;
use rmcp::model::{
    LoggingLevel, LoggingMessageNotification, LoggingMessageNotificationParam,
    ProgressNotification, ProgressNotificationParam, ProgressToken, ServerNotification,
};
use rmcp::{Peer, RoleServer};
use soulbase_tools::pipeline::{LogLevel, Report, ReportSink, Reporter};
use tokio::sync::mpsc;

/// The logger name of a tool's own log messages.
pub const TOOL_LOGGER: &str = "soulbase.tool";

/// Queues a call's reports for its [`Notifier`].
struct Queue(mpsc::UnboundedSender<Report>);

impl ReportSink for Queue {
    fn report(&self, report: Report) {
        // The request is gone: nobody to tell.
        let _ = self.0.send(report);
    }
}

/// A reporter for one call and the queue its reports arrive on; `None` when the
/// request wants neither progress nor log messages.
pub(crate) fn channel(wanted: bool) -> (Reporter, Option<Reports>) {
    if !wanted {
        return (Reporter::none(), None);
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let keep = tx.clone();
    (
        Reporter::new(std::sync::Arc::new(Queue(tx))),
        Some(Reports { rx, _keep: keep }),
    )
}

/// The receiving end of a call's reports. It holds a sender of its own, so that
/// receiving waits for the next report rather than ending when the call drops its
/// reporter.
pub(crate) struct Reports {
    rx: mpsc::UnboundedReceiver<Report>,
    _keep: mpsc::UnboundedSender<Report>,
}

impl Reports {
    /// The next report (pending until there is one).
    pub(crate) async fn next(&mut self) -> Option<Report> {
        self.rx.recv().await
    }

    /// A report already queued, if any.
    pub(crate) fn queued(&mut self) -> Option<Report> {
        self.rx.try_recv().ok()
    }
}

/// The MCP level of a tool's log message.
#[allow(deprecated)]
fn level(l: LogLevel) -> LoggingLevel {
    match l {
        LogLevel::Debug => LoggingLevel::Debug,
        LogLevel::Info => LoggingLevel::Info,
        LogLevel::Notice => LoggingLevel::Notice,
        LogLevel::Warning => LoggingLevel::Warning,
        LogLevel::Error => LoggingLevel::Error,
    }
}

/// Sends one call's notifications on its request's peer.
pub(crate) struct Notifier {
    peer: Peer<RoleServer>,
    token: Option<ProgressToken>,
    #[allow(deprecated)]
    log_level: Option<LoggingLevel>,
    tool: String,
    /// The last progress fraction sent.
    last: Option<f64>,
    /// The call's response stream, when it can be closed for polling.
    stream: Option<CallStream>,
    /// The call's stream, once closed for polling.
    polled: Option<crate::polling::Polled>,
}

/// Where a call's response stream is: its session's streams, the session and
/// the request.
pub(crate) struct CallStream {
    pub(crate) sessions: std::sync::Arc<crate::polling::PollingSessions>,
    pub(crate) session: String,
    pub(crate) request: RequestId,
}

impl Notifier {
    /// A notifier for a call of `tool`: progress when `token` is given, log
    /// messages at `log_level` or above when it is.
    #[allow(deprecated)]
    pub(crate) fn new(
        peer: Peer<RoleServer>,
        token: Option<ProgressToken>,
        log_level: Option<LoggingLevel>,
        tool: String,
    ) -> Self {
        Self {
            peer,
            token,
            log_level,
            tool,
            last: None,
            stream: None,
            polled: None,
        }
    }

    /// This notifier, able to close the call's response stream when the tool
    /// lets the client poll.
    pub(crate) fn with_stream(mut self, stream: Option<CallStream>) -> Self {
        self.stream = stream;
        self
    }

    /// Whether the request wants any report (or can act on a poll).
    pub(crate) fn wants_reports(&self) -> bool {
        self.token.is_some() || self.log_level.is_some() || self.stream.is_some()
    }

    /// Progress `0/1`, "started".
    pub(crate) async fn started(&mut self) {
        self.progress(0.0, Some("started")).await;
    }

    /// Progress `1/1`, "finished", unless the tool reported it already; for a
    /// call whose stream was closed for polling, then waits for the client to
    /// reconnect (its answer would be lost otherwise: [`crate::polling`]).
    pub(crate) async fn finished(&mut self) {
        self.progress(1.0, Some("finished")).await;
        if let Some(polled) = self.polled.take()
            && !polled.resumed().await
        {
            tracing::info!(tool = %self.tool, "a polled call's client did not reconnect for its answer");
        }
    }

    /// Sends what the tool reported.
    pub(crate) async fn send(&mut self, report: Report) {
        match report {
            Report::Poll => {
                // Once: the stream is gone after the first.
                if let Some(s) = self.stream.take() {
                    self.polled = s.sessions.close_stream(&s.session, &s.request).await;
                }
            }
            Report::Progress { fraction, message } => {
                self.progress(fraction, message.as_deref()).await;
            }
            Report::Log { level: l, message } => {
                let l = level(l);
                if self
                    .log_level
                    .is_none_or(|w| crate::severity(l) < crate::severity(w))
                {
                    return;
                }
                let data = serde_json::json!({ "tool": self.tool, "message": message });
                let mut param = LoggingMessageNotificationParam::new(l, data);
                param.logger = Some(TOOL_LOGGER.into());
                let _ = self
                    .peer
                    .send_notification(ServerNotification::LoggingMessageNotification(
                        LoggingMessageNotification::new(param),
                    ))
                    .await;
            }
        }
    }

    /// Sends progress `fraction` of 1 when it is larger than the last sent (the
    /// first is always sent); a client that is gone is ignored.
    async fn progress(&mut self, fraction: f64, message: Option<&str>) {
        let Some(token) = &self.token else { return };
        if self.last.is_some_and(|last| fraction <= last) {
            return;
        }
        self.last = Some(fraction);
        let mut param = ProgressNotificationParam::new(token.clone(), fraction).with_total(1.0);
        if let Some(m) = message {
            param = param.with_message(m);
        }
        let _ = self
            .peer
            .send_notification(ServerNotification::ProgressNotification(
                ProgressNotification::new(param),
            ))
            .await;
    }
}
