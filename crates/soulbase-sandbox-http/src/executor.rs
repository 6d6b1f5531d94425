//! The executor: guard, expand headers, send, check the response.

use std::collections::{BTreeMap, HashMap};
use std::error::Error as _;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION};
use reqwest::{Client, Url, redirect};
use serde_json::Value;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::SideEffectRecord;
use soulbase_sandbox::{
    ExecOutput, ExecRequest, Executor, MAX_HTTP_TIMEOUT_MS, Operation, Profile, ProviderBinding,
};

use crate::resolver::{AddressRefused, GuardedResolver, check_address};

/// The timeout when neither the binding nor the call names one (seed 001).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How the HTTP executor behaves beyond what each call's profile says.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Environment variables header values may reference as `${VAR}`. Anything else is
    /// refused, so a manifest cannot exfiltrate the host's secrets.
    pub env_allow: Vec<String>,
    /// Redirects followed per call (each re-checked); 0 never follows.
    pub max_redirects: usize,
    /// The response cap when the call has no `max_bytes_out`.
    pub max_response_bytes: u64,
    /// Fixed values for `${VAR}` instead of the process environment (tests, or a
    /// secrets manager feeding the executor).
    pub env_values: Option<HashMap<String, String>>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            env_allow: Vec::new(),
            max_redirects: 0,
            max_response_bytes: 4 << 20,
            env_values: None,
        }
    }
}

impl HttpOptions {
    /// Options from the `sandbox` config section (`http_env_allow`,
    /// `http_max_redirects`); variables are read from the process environment.
    pub fn from_config(config: &soulbase_config::SandboxConfig) -> Self {
        Self {
            env_allow: config.http_env_allow.clone(),
            max_redirects: usize::try_from(config.http_max_redirects).unwrap_or(0),
            ..Self::default()
        }
    }
}

/// The HTTP executor; plug it into `LocalSandbox` for [`soulbase_sandbox::ProviderKind::Http`].
/// Cheap to share: clients (one per set of explicitly allowed IPs, usually one) and
/// their connection pools are reused across calls.
pub struct HttpExecutor {
    options: HttpOptions,
    clients: Mutex<HashMap<Vec<IpAddr>, Client>>,
}

impl HttpExecutor {
    /// An executor with `options`.
    pub fn new(options: HttpOptions) -> Self {
        Self {
            options,
            clients: Mutex::new(HashMap::new()),
        }
    }

    fn client(&self, allowed: &[IpAddr]) -> Result<Client, SoulError> {
        let mut key = allowed.to_vec();
        key.sort();
        if let Ok(c) = self.clients.lock()
            && let Some(client) = c.get(&key)
        {
            return Ok(client.clone());
        }
        // reqwest's default, set here so it stays: a request is several small
        // writes, and with Nagle each can wait ~40 ms for the server's delayed ACK.
        let client = Client::builder()
            .tcp_nodelay(true)
            .no_proxy()
            .redirect(redirect::Policy::none())
            .dns_resolver(GuardedResolver::new(&key))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| {
                SoulError::of(ErrorCode::ProviderUnavailable)
                    .with_note("cannot build the HTTP client")
                    .with_source(e)
            })?;
        if let Ok(mut c) = self.clients.lock() {
            c.insert(key, client.clone());
        }
        Ok(client)
    }

    /// Expands `${VAR}` in a header value from the allow-listed environment.
    fn expand(&self, header: &str, value: &str) -> Result<String, SoulError> {
        let parts = soulbase_sandbox::parse_env_template(value).map_err(|why| {
            SoulError::of(ErrorCode::ToolExecutionFailed)
                .with_note(format!("header {header}: value {why}"))
        })?;
        let mut out = String::with_capacity(value.len());
        for part in parts {
            let var = match part {
                soulbase_sandbox::TemplatePart::Text(t) => {
                    out.push_str(t);
                    continue;
                }
                soulbase_sandbox::TemplatePart::Var(var) => var,
            };
            if !self.options.env_allow.iter().any(|v| v == var) {
                return Err(SoulError::of(ErrorCode::SandboxCapabilityBlocked)
                    .with_note(format!(
                        "header {header} references ${{{var}}}, which is not on the allow-list"
                    ))
                    .with_field("header", header.to_owned()));
            }
            let val = match &self.options.env_values {
                Some(map) => map.get(var).cloned(),
                None => std::env::var(var).ok(),
            };
            let Some(val) = val else {
                return Err(SoulError::of(ErrorCode::ProviderUnavailable)
                    .with_note(format!("header {header}: ${{{var}}} is not set")));
            };
            out.push_str(&val);
        }
        Ok(out)
    }

    fn headers(&self, binding: &BTreeMap<String, String>) -> Result<HeaderMap, SoulError> {
        let mut map = HeaderMap::new();
        for (name, value) in binding.iter() {
            let expanded = self.expand(name, value)?;
            let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad_header(name))?;
            let v = HeaderValue::from_str(&expanded).map_err(|_| bad_header(name))?;
            map.insert(n, v);
        }
        Ok(map)
    }
}

fn bad_header(name: &str) -> SoulError {
    SoulError::of(ErrorCode::ToolExecutionFailed)
        .with_note(format!("header {name} is not a valid HTTP header"))
}

fn blocked(note: String) -> SoulError {
    SoulError::of(ErrorCode::SandboxCapabilityBlocked).with_note(note)
}

fn failed(note: String) -> SoulError {
    SoulError::of(ErrorCode::ToolExecutionFailed).with_note(note)
}

/// Checks one URL against the profile and, for an IP literal, the address rules.
fn check_url(url: &Url, profile: &Profile, allowed: &[IpAddr]) -> Result<(), SoulError> {
    let scheme = url.scheme();
    if scheme != "http" && scheme != "https" {
        return Err(blocked(format!("scheme {scheme} is not allowed")));
    }
    let Some(host) = url.host_str() else {
        return Err(blocked("URL has no host".into()));
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = url.port_or_known_default().unwrap_or(0);
    profile.check(
        &Operation::Net {
            scheme,
            host: &host,
            port,
            method: Some("POST"),
        },
        None,
    )?;
    if let Ok(ip) = host.parse::<IpAddr>() {
        check_address(&host, ip, allowed)
            .map_err(|e| blocked(e.to_string()).with_field("host", host.clone()))?;
    }
    Ok(())
}

/// Maps a transport error: a refused address wins over everything else.
fn map_send_error(e: reqwest::Error) -> SoulError {
    let mut src: Option<&(dyn std::error::Error + 'static)> = e.source();
    while let Some(s) = src {
        if let Some(r) = s.downcast_ref::<AddressRefused>() {
            return blocked(r.to_string()).with_field("host", r.host.clone());
        }
        src = s.source();
    }
    if e.is_timeout() {
        return SoulError::of(ErrorCode::ProviderTimeout).with_source(e);
    }
    SoulError::of(ErrorCode::ProviderUnavailable)
        .with_note("the tool service could not be reached")
        .with_source(e)
}

fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(ct) = content_type.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The effective timeout: binding, else the call's, else 30 s; at most 120 s.
fn effective_timeout(binding: Option<u64>, call: Duration) -> Duration {
    let t = match binding {
        Some(ms) => Duration::from_millis(ms),
        None if call.is_zero() => DEFAULT_TIMEOUT,
        None => call,
    };
    t.min(Duration::from_millis(MAX_HTTP_TIMEOUT_MS))
}

#[async_trait]
impl Executor for HttpExecutor {
    fn guard(&self, req: &ExecRequest<'_>) -> Result<(), SoulError> {
        let ProviderBinding::Http {
            endpoint, headers, ..
        } = req.provider
        else {
            return Err(SoulError::of(ErrorCode::ProviderUnavailable)
                .with_note("the HTTP executor only runs http bindings"));
        };
        let url = Url::parse(endpoint).map_err(|e| blocked(format!("endpoint: {e}")))?;
        check_url(&url, req.profile, &req.profile.explicit_ips())?;
        // Refuse non-allow-listed variables before anything runs.
        for (name, value) in headers {
            let mut rest = value.as_str();
            while let Some(start) = rest.find("${") {
                let after = &rest[start + 2..];
                let var = after.split('}').next().unwrap_or_default();
                if !self.options.env_allow.iter().any(|v| v == var) {
                    return Err(blocked(format!(
                        "header {name} references ${{{var}}}, which is not on the allow-list"
                    )));
                }
                rest = after;
            }
        }
        Ok(())
    }

    async fn execute(&self, req: ExecRequest<'_>) -> Result<ExecOutput, SoulError> {
        let ProviderBinding::Http {
            endpoint,
            headers,
            timeout_ms,
            ..
        } = req.provider
        else {
            return Err(SoulError::of(ErrorCode::ProviderUnavailable)
                .with_note("the HTTP executor only runs http bindings"));
        };
        let path = req
            .provider
            .http_path()
            .unwrap_or(soulbase_sandbox::DEFAULT_HTTP_PATH);
        let base = endpoint.trim_end_matches('/');
        let mut url =
            Url::parse(&format!("{base}{path}")).map_err(|e| blocked(format!("endpoint: {e}")))?;
        let allowed = req.profile.explicit_ips();
        let header_map = self.headers(headers)?;
        let body = serde_json::to_vec(&req.args).map_err(SoulError::internal)?;
        let client = self.client(&allowed)?;
        let cap = req.max_bytes_out.unwrap_or(self.options.max_response_bytes);
        let timeout = effective_timeout(*timeout_ms, req.timeout);
        let profile = req.profile;

        let run = async {
            let mut hops = 0usize;
            loop {
                check_url(&url, profile, &allowed)?;
                let mut resp = client
                    .post(url.clone())
                    .headers(header_map.clone())
                    .header(CONTENT_TYPE, "application/json")
                    .body(body.clone())
                    .send()
                    .await
                    .map_err(map_send_error)?;
                let status = resp.status();
                if status.is_redirection() {
                    let location = resp.headers().get(LOCATION).and_then(|v| v.to_str().ok());
                    if hops >= self.options.max_redirects {
                        return Err(failed(format!(
                            "the service answered {status}; redirects are not followed"
                        )));
                    }
                    let Some(next) = location.and_then(|l| url.join(l).ok()) else {
                        return Err(failed(format!("{status} without a usable Location")));
                    };
                    hops += 1;
                    url = next;
                    continue;
                }
                if !status.is_success() {
                    let code = match status.as_u16() {
                        429 | 502 | 503 | 504 => ErrorCode::ProviderUnavailable,
                        _ => ErrorCode::ToolExecutionFailed,
                    };
                    return Err(SoulError::of(code)
                        .with_note(format!("the service answered {status}"))
                        .with_field("status", status.as_u16().to_string()));
                }
                if !is_json(resp.headers().get(CONTENT_TYPE)) {
                    return Err(failed(format!(
                        "the response is {:?}, not JSON",
                        resp.headers()
                            .get(CONTENT_TYPE)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("untyped")
                    )));
                }
                if resp.content_length().is_some_and(|n| n > cap) {
                    return Err(too_large(cap));
                }
                let mut buf: Vec<u8> = Vec::new();
                while let Some(chunk) = resp.chunk().await.map_err(map_send_error)? {
                    if (buf.len() + chunk.len()) as u64 > cap {
                        return Err(too_large(cap));
                    }
                    buf.extend_from_slice(&chunk);
                }
                let output: Value = serde_json::from_slice(&buf)
                    .map_err(|e| failed(format!("the response is not valid JSON: {e}")))?;
                let target = url.host_str().unwrap_or_default().to_owned();
                return Ok(ExecOutput {
                    output,
                    side_effects: vec![SideEffectRecord {
                        kind: "net.request".into(),
                        target,
                    }],
                    cpu_ms: None,
                });
            }
        };
        match tokio::time::timeout(timeout, run).await {
            Ok(r) => r,
            Err(_) => Err(SoulError::of(ErrorCode::ProviderTimeout).with_note(format!(
                "no complete response within {} ms",
                timeout.as_millis()
            ))),
        }
    }
}

fn too_large(cap: u64) -> SoulError {
    failed(format!("the response exceeds {cap} bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_default_and_clamp() {
        assert_eq!(effective_timeout(None, Duration::ZERO), DEFAULT_TIMEOUT);
        assert_eq!(
            effective_timeout(None, Duration::from_secs(5)),
            Duration::from_secs(5)
        );
        assert_eq!(
            effective_timeout(Some(200), Duration::from_secs(5)),
            Duration::from_millis(200)
        );
        assert_eq!(
            effective_timeout(None, Duration::from_secs(500)),
            Duration::from_secs(120)
        );
    }

    #[test]
    fn json_content_types() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert!(is_json(Some(&v("application/json"))));
        assert!(is_json(Some(&v("Application/JSON; charset=utf-8"))));
        assert!(is_json(Some(&v("application/problem+json"))));
        assert!(!is_json(Some(&v("text/html"))));
        assert!(!is_json(Some(&v("text/json+html"))));
        assert!(!is_json(None));
    }

    #[test]
    fn env_expansion_is_allow_listed() {
        let ex = HttpExecutor::new(HttpOptions {
            env_allow: vec!["TOKEN".into(), "UNSET".into()],
            env_values: Some(HashMap::from([("TOKEN".into(), "s3cret".into())])),
            ..HttpOptions::default()
        });
        assert_eq!(
            ex.expand("a", "Bearer ${TOKEN}!").unwrap(),
            "Bearer s3cret!"
        );
        assert_eq!(ex.expand("a", "plain").unwrap(), "plain");
        assert_eq!(
            ex.expand("a", "${HOME}").unwrap_err().code(),
            ErrorCode::SandboxCapabilityBlocked
        );
        assert_eq!(
            ex.expand("a", "${UNSET}").unwrap_err().code(),
            ErrorCode::ProviderUnavailable
        );
        assert!(ex.expand("a", "${TOKEN").is_err());
    }
}
