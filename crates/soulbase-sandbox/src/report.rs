//! What a running tool tells its caller before it answers — progress and log
//! messages — and what it may ask the caller's client: the user's input
//! (elicitation) or a completion from the client's model (sampling).
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
//!
//! Requests to the client ([`Reporter::ask`]) are governed: the pipeline wraps
//! the surface's [`ClientSink`] with [`govern_client_requests`], which lets through only the
//! kinds the call's profile grants (a `client` capability), bounds how many one
//! call makes, and records each — digests, never content — for the call's End.

use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::{ClientRequestKind, ClientRequestRecord, canonical_json, digest_bytes};

use crate::profile::Profile;

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
    /// The tool will take a while: the caller need not hold a connection open
    /// for it. A surface that can let the client poll closes the call's response
    /// stream now and delivers what follows when the client reconnects (MCP over
    /// streamable HTTP: SSE polling, SEP-1699); others ignore it.
    Poll,
}

/// Where a call's reports go; implemented by the surface that started the call.
/// Must not block: it is called from the tool's own task.
pub trait ReportSink: Send + Sync + 'static {
    /// Takes one report.
    fn report(&self, report: Report);
}

/// A call's channel to its caller: cheap to clone; [`Reporter::none`] drops
/// every report and answers no request.
#[derive(Clone, Default)]
pub struct Reporter {
    sink: Option<Arc<dyn ReportSink>>,
    client: Option<Arc<dyn ClientSink>>,
}

impl Reporter {
    /// A reporter that drops every report (a surface with no way to deliver them).
    pub fn none() -> Self {
        Self::default()
    }

    /// A reporter delivering to `sink`.
    pub fn new(sink: Arc<dyn ReportSink>) -> Self {
        Self {
            sink: Some(sink),
            client: None,
        }
    }

    /// This reporter, with requests going to `client` (a surface whose client
    /// can answer some: MCP with `elicitation` or `sampling` declared).
    pub fn with_client(mut self, client: Arc<dyn ClientSink>) -> Self {
        self.client = Some(client);
        self
    }

    /// Whether anyone receives the reports (a tool may skip building them).
    pub fn is_listening(&self) -> bool {
        self.sink.is_some()
    }

    /// Whether a client may be asked anything (before the pipeline governs it:
    /// whether the surface's client can answer).
    pub fn has_client(&self) -> bool {
        self.client.is_some()
    }

    /// Asks the caller's client: the user (elicitation) or its model (sampling).
    /// Waits for the answer; the call's timeout still bounds the whole run.
    ///
    /// Refused with `SANDBOX.CAPABILITY_BLOCKED` when the call's profile does not
    /// grant the kind or the caller's client cannot answer it (no MCP client
    /// declaring it: every other surface).
    pub async fn ask(&self, request: ClientRequest) -> Result<ClientResponse, SoulError> {
        match &self.client {
            Some(client) => client.request(request).await,
            None => Err(no_client(request.kind())),
        }
    }

    /// Reports progress: `done` of `total` (a `total` of zero or less, or a value
    /// that is not finite, counts as nothing done).
    pub fn progress(&self, done: f64, total: f64, message: Option<&str>) {
        if let Some(sink) = &self.sink {
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

    /// Lets the caller poll for the rest of a long call instead of holding its
    /// connection open ([`Report::Poll`]).
    pub fn let_client_poll(&self) {
        if let Some(sink) = &self.sink {
            sink.report(Report::Poll);
        }
    }

    /// Reports a log message at `level`.
    pub fn log(&self, level: LogLevel, message: impl Into<String>) {
        if let Some(sink) = &self.sink {
            sink.report(Report::Log {
                level,
                message: message.into(),
            });
        }
    }
}

impl fmt::Debug for Reporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reporter")
            .field("listening", &self.sink.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

/// Two reporters are equal when they deliver to the same sinks (or both to none).
impl PartialEq for Reporter {
    fn eq(&self, other: &Self) -> bool {
        fn same<T: ?Sized>(a: &Option<Arc<T>>, b: &Option<Arc<T>>) -> bool {
            match (a, b) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
        }
        same(&self.sink, &other.sink) && same(&self.client, &other.client)
    }
}

impl Eq for Reporter {}

/// The most requests one call may make to its client: a tool looping on its
/// client is a bug, and each request may wait on a person.
pub const MAX_CLIENT_REQUESTS: usize = 16;

/// One message of a sampling request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SamplingMessage {
    /// `user` or `assistant`.
    pub role: SamplingRole,
    /// The message's text.
    pub text: String,
}

/// Who says a [`SamplingMessage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SamplingRole {
    /// The user.
    User,
    /// The model.
    Assistant,
}

/// What a running tool asks its caller's client.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ClientRequest {
    /// Ask the user for input.
    Elicitation {
        /// What to show the user.
        message: String,
        /// The answer's shape: a flat object schema of primitive properties (the
        /// restricted JSON Schema MCP elicitation allows).
        schema: Value,
    },
    /// Ask the client's model for a completion.
    Sampling {
        /// The conversation to complete.
        messages: Vec<SamplingMessage>,
        /// A system prompt, if any.
        #[serde(skip_serializing_if = "Option::is_none")]
        system_prompt: Option<String>,
        /// The most tokens to generate.
        max_tokens: u32,
    },
}

impl ClientRequest {
    /// Its kind.
    pub fn kind(&self) -> ClientRequestKind {
        match self {
            ClientRequest::Elicitation { .. } => ClientRequestKind::Elicitation,
            ClientRequest::Sampling { .. } => ClientRequestKind::Sampling,
        }
    }
}

/// The user's answer to an elicitation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ElicitationAction {
    /// Answered.
    Accept,
    /// Explicitly refused.
    Decline,
    /// Dismissed without choosing.
    Cancel,
}

impl ElicitationAction {
    /// `accept`, `decline` or `cancel`.
    pub fn as_str(self) -> &'static str {
        match self {
            ElicitationAction::Accept => "accept",
            ElicitationAction::Decline => "decline",
            ElicitationAction::Cancel => "cancel",
        }
    }
}

/// What the client answered.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ClientResponse {
    /// The user's answer.
    Elicitation {
        /// Accepted, declined or cancelled.
        action: ElicitationAction,
        /// The values entered, when accepted.
        #[serde(skip_serializing_if = "Option::is_none")]
        content: Option<Value>,
    },
    /// The client model's completion.
    Sampling {
        /// Its text (the text parts of its answer, joined).
        text: String,
        /// The model the client says answered.
        model: String,
        /// Why it stopped, as the client says.
        #[serde(skip_serializing_if = "Option::is_none")]
        stop_reason: Option<String>,
    },
}

/// Where a call's client requests go; implemented by the surface that started the
/// call (MCP: `elicitation/create`, `sampling/createMessage` on the request's
/// session).
#[async_trait]
pub trait ClientSink: Send + Sync + 'static {
    /// Whether the caller's client can answer requests of `kind`.
    fn offers(&self, kind: ClientRequestKind) -> bool;

    /// Sends `request` and waits for the answer. A client that cannot answer it,
    /// fails, or answers with something else is an error.
    async fn request(&self, request: ClientRequest) -> Result<ClientResponse, SoulError>;
}

fn no_client(kind: ClientRequestKind) -> SoulError {
    SoulError::new(
        ErrorCode::SandboxCapabilityBlocked,
        format!(
            "the caller's client cannot answer {} requests (only an MCP client declaring the capability can)",
            kind.as_str()
        ),
    )
    .with_field("capability", format!("client.{}", kind.as_str()))
}

/// The requests one call made, recorded by [`govern_client_requests`] for its End.
#[derive(Debug, Clone, Default)]
pub struct ClientRequests(Arc<Mutex<Vec<ClientRequestRecord>>>);

impl ClientRequests {
    /// The records, in the order the requests were made (emptied).
    pub fn take(&self) -> Vec<ClientRequestRecord> {
        std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    fn push(&self, record: ClientRequestRecord) -> usize {
        let mut records = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        records.push(record);
        records.len()
    }

    fn count(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }
}

/// `reporter` as the call running under `profile` may use it: its client
/// requests pass the profile (a `client` capability granting the kind), at most
/// [`MAX_CLIENT_REQUESTS`] per call, and each is recorded in the returned
/// [`ClientRequests`] — refused ones too. A call whose profile grants no client
/// request and whose surface has no client keeps `reporter` as it is (nothing to
/// record, nothing allocated).
pub fn govern_client_requests(
    reporter: &Reporter,
    profile: &Profile,
) -> (Reporter, Option<ClientRequests>) {
    let grants = profile
        .capabilities()
        .iter()
        .any(|c| c.domain() == crate::CapabilityDomain::Client);
    if !grants && reporter.client.is_none() {
        return (reporter.clone(), None);
    }
    let log = ClientRequests::default();
    let granted = ClientRequestKind::ALL
        .into_iter()
        .filter(|k| profile.capabilities().iter().any(|c| c.grants_client(*k)))
        .collect();
    let governed = Governed {
        inner: reporter.client.clone(),
        granted,
        log: log.clone(),
    };
    let reporter = Reporter {
        sink: reporter.sink.clone(),
        client: Some(Arc::new(governed)),
    };
    (reporter, Some(log))
}

/// A call's client requests as its profile allows them, each recorded.
struct Governed {
    inner: Option<Arc<dyn ClientSink>>,
    granted: Vec<ClientRequestKind>,
    log: ClientRequests,
}

impl Governed {
    fn refuse(
        &self,
        kind: ClientRequestKind,
        digest: String,
        e: SoulError,
        outcome: &str,
    ) -> SoulError {
        self.log.push(ClientRequestRecord {
            kind,
            request_digest: digest,
            outcome: outcome.into(),
            response_digest: None,
            response_bytes: 0,
            model: None,
            error_code: Some(e.code()),
        });
        e
    }
}

#[async_trait]
impl ClientSink for Governed {
    fn offers(&self, kind: ClientRequestKind) -> bool {
        self.granted.contains(&kind) && self.inner.as_ref().is_some_and(|c| c.offers(kind))
    }

    async fn request(&self, request: ClientRequest) -> Result<ClientResponse, SoulError> {
        let kind = request.kind();
        let digest = digest_bytes(&canonical_json(
            &serde_json::to_value(&request).unwrap_or(Value::Null),
        ));
        if !self.granted.contains(&kind) {
            let e = SoulError::new(
                ErrorCode::SandboxCapabilityBlocked,
                format!(
                    "the call's profile grants no {} requests (declare a client capability allowing them)",
                    kind.as_str()
                ),
            )
            .with_field("capability", format!("client.{}", kind.as_str()));
            return Err(self.refuse(kind, digest, e, "refused"));
        }
        if self.log.count() >= MAX_CLIENT_REQUESTS {
            let e = SoulError::new(
                ErrorCode::QuotaBudgetExceeded,
                format!("a call may make at most {MAX_CLIENT_REQUESTS} client requests"),
            )
            .with_field("max_client_requests", MAX_CLIENT_REQUESTS.to_string());
            return Err(self.refuse(kind, digest, e, "refused"));
        }
        let Some(inner) = self.inner.as_ref().filter(|c| c.offers(kind)) else {
            return Err(self.refuse(kind, digest, no_client(kind), "refused"));
        };
        match inner.request(request).await {
            Ok(response) => {
                let bytes = canonical_json(&serde_json::to_value(&response).unwrap_or(Value::Null));
                let (outcome, model) = match &response {
                    ClientResponse::Elicitation { action, .. } => (action.as_str(), None),
                    ClientResponse::Sampling { model, .. } => ("answered", Some(model.clone())),
                };
                self.log.push(ClientRequestRecord {
                    kind,
                    request_digest: digest,
                    outcome: outcome.into(),
                    response_digest: Some(digest_bytes(&bytes)),
                    response_bytes: bytes.len() as u64,
                    model,
                    error_code: None,
                });
                Ok(response)
            }
            Err(e) => Err(self.refuse(kind, digest, e, "failed")),
        }
    }
}

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

    /// A client that answers every request it offers, counting them.
    struct Answering {
        offers: Vec<ClientRequestKind>,
        asked: Mutex<usize>,
    }

    #[async_trait]
    impl ClientSink for Answering {
        fn offers(&self, kind: ClientRequestKind) -> bool {
            self.offers.contains(&kind)
        }

        async fn request(&self, request: ClientRequest) -> Result<ClientResponse, SoulError> {
            *self.asked.lock().unwrap() += 1;
            Ok(match request {
                ClientRequest::Elicitation { .. } => ClientResponse::Elicitation {
                    action: ElicitationAction::Accept,
                    content: Some(serde_json::json!({"name": "Ada"})),
                },
                ClientRequest::Sampling { .. } => ClientResponse::Sampling {
                    text: "hello".into(),
                    model: "m1".into(),
                    stop_reason: None,
                },
            })
        }
    }

    fn elicit() -> ClientRequest {
        ClientRequest::Elicitation {
            message: "Who are you?".into(),
            schema: serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}}}),
        }
    }

    fn sample() -> ClientRequest {
        ClientRequest::Sampling {
            messages: vec![SamplingMessage {
                role: SamplingRole::User,
                text: "hi".into(),
            }],
            system_prompt: None,
            max_tokens: 10,
        }
    }

    #[tokio::test]
    async fn client_requests_pass_only_what_the_profile_grants_and_are_recorded() {
        let client = Arc::new(Answering {
            offers: vec![ClientRequestKind::Elicitation, ClientRequestKind::Sampling],
            asked: Mutex::new(0),
        });
        let reporter = Reporter::none().with_client(client.clone());
        let profile = Profile::new(vec![crate::Capability::Client {
            requests: [ClientRequestKind::Elicitation].into(),
        }]);
        let (governed, log) = govern_client_requests(&reporter, &profile);
        let log = log.unwrap();
        let answer = governed.ask(elicit()).await.unwrap();
        assert!(matches!(
            answer,
            ClientResponse::Elicitation {
                action: ElicitationAction::Accept,
                ..
            }
        ));
        let refused = governed.ask(sample()).await.unwrap_err();
        assert_eq!(refused.code(), ErrorCode::SandboxCapabilityBlocked);
        // The refused request never reached the client.
        assert_eq!(*client.asked.lock().unwrap(), 1);
        let records = log.take();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].kind, ClientRequestKind::Elicitation);
        assert_eq!(records[0].outcome, "accept");
        assert_eq!(
            records[0].request_digest,
            digest_bytes(&canonical_json(&serde_json::to_value(elicit()).unwrap()))
        );
        assert!(records[0].response_digest.is_some() && records[0].response_bytes > 0);
        assert_eq!(records[1].outcome, "refused");
        assert_eq!(
            records[1].error_code,
            Some(ErrorCode::SandboxCapabilityBlocked)
        );
        assert!(records[1].response_digest.is_none());
    }

    #[tokio::test]
    async fn a_client_that_cannot_answer_and_too_many_requests_are_refused() {
        let profile = Profile::new(vec![crate::Capability::Client {
            requests: [ClientRequestKind::Elicitation, ClientRequestKind::Sampling].into(),
        }]);
        // Granted, but the surface has no client (HTTP, gRPC): refused, recorded.
        let (governed, log) = govern_client_requests(&Reporter::none(), &profile);
        let e = governed.ask(sample()).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked);
        assert_eq!(log.unwrap().take()[0].outcome, "refused");
        // A client offering only elicitation is not asked for sampling.
        let client = Arc::new(Answering {
            offers: vec![ClientRequestKind::Elicitation],
            asked: Mutex::new(0),
        });
        let (governed, log) =
            govern_client_requests(&Reporter::none().with_client(client.clone()), &profile);
        assert!(governed.ask(sample()).await.is_err());
        assert_eq!(*client.asked.lock().unwrap(), 0);
        for _ in 1..MAX_CLIENT_REQUESTS {
            governed.ask(elicit()).await.unwrap();
        }
        let e = governed.ask(elicit()).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::QuotaBudgetExceeded);
        assert_eq!(*client.asked.lock().unwrap(), MAX_CLIENT_REQUESTS - 1);
        assert_eq!(log.unwrap().take().len(), MAX_CLIENT_REQUESTS + 1);
    }

    #[test]
    fn nothing_is_wrapped_without_a_grant_or_a_client() {
        let reporter = Reporter::none();
        let (same, log) = govern_client_requests(&reporter, &Profile::new(Vec::new()));
        assert!(log.is_none());
        assert_eq!(same, reporter);
    }
}
