//! The server's HTTP API from the CLI (`audit list`, `chat`): a client, the
//! caller's credentials on a request, and answers read as JSON — a refusal as
//! its stable code and message.

use std::time::Duration;

use serde_json::Value;
use soulbase_grpc::Credentials;

use crate::target::{Failure, Global};

/// A client with a connect timeout and an overall `timeout` per request.
pub(crate) fn client(timeout: Duration) -> Result<reqwest::Client, Failure> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(timeout)
        .build()
        .map_err(|e| Failure::Failed(format!("UNKNOWN.INTERNAL: no HTTP client: {e}")))
}

/// `url`'s `path` (the server's HTTP address, e.g. `http://127.0.0.1:8080`).
pub(crate) fn endpoint(url: &str, path: &str) -> Result<reqwest::Url, Failure> {
    reqwest::Url::parse(&format!("{}{path}", url.trim_end_matches('/')))
        .map_err(|e| Failure::Usage(format!("--server {url}: not a URL ({e})")))
}

/// `request` carrying the caller's credentials: `--api-key`, `--token`, or on a
/// development server the `--tenant` / `--actor` headers.
pub(crate) fn authed(
    request: reqwest::RequestBuilder,
    global: &Global,
) -> Result<reqwest::RequestBuilder, Failure> {
    Ok(match global.credentials() {
        Credentials::ApiKey(k) => request.header("x-api-key", k),
        Credentials::Bearer(t) => request.bearer_auth(t),
        Credentials::DevHeaders if global.actor.is_some() => {
            let s = global.subject()?;
            request
                .header("x-soulbase-tenant", s.tenant.as_str())
                .header("x-soulbase-actor", s.actor.as_str())
        }
        Credentials::DevHeaders | Credentials::None => request,
    })
}

/// A refusal's error envelope as a failure: `CODE: message`.
pub(crate) fn refusal(body: &Value) -> Failure {
    let e = &body["error"];
    Failure::Failed(format!(
        "{}: {}",
        e["code"].as_str().unwrap_or("UNKNOWN.INTERNAL"),
        e["message"]
            .as_str()
            .unwrap_or("the server refused the request")
    ))
}

/// Sends `request` to `url` and reads the answer as JSON; a non-2xx answer is
/// its refusal.
pub(crate) async fn json_answer(
    request: reqwest::RequestBuilder,
    url: &str,
) -> Result<Value, Failure> {
    let response = request
        .send()
        .await
        .map_err(|e| Failure::Failed(format!("PROVIDER.UNAVAILABLE: cannot reach {url}: {e}")))?;
    let status = response.status();
    let bytes = response.bytes().await.map_err(|e| {
        Failure::Failed(format!(
            "PROVIDER.UNAVAILABLE: {url} answered {status} but the body did not arrive: {e}"
        ))
    })?;
    let body: Value = serde_json::from_slice(&bytes).map_err(|e| {
        Failure::Failed(format!(
            "UNKNOWN.INTERNAL: {url} answered {status} without a JSON body: {e}"
        ))
    })?;
    if status.is_success() {
        Ok(body)
    } else {
        Err(refusal(&body))
    }
}
