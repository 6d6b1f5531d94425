//! Provider bindings: how a tool is executed.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::FieldProblem;
use crate::capability::truncate;
use crate::syntax::{has_parent_component, is_valid_host};

/// The path an HTTP provider is called on when its binding names none.
pub const DEFAULT_HTTP_PATH: &str = "/execute";

/// The longest timeout an HTTP provider may ask for (seed 001: max 120 s).
pub const MAX_HTTP_TIMEOUT_MS: u64 = 120_000;

/// Headers a binding may not set: the HTTP client owns them.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
];

/// The kinds of provider, without their arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// Rust code compiled into the host.
    Builtin,
    /// A JSON-over-HTTP service.
    Http,
    /// A WebAssembly module.
    Wasm,
    /// A local process.
    Process,
}

impl ProviderKind {
    /// The lowercase name used in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Builtin => "builtin",
            ProviderKind::Http => "http",
            ProviderKind::Wasm => "wasm",
            ProviderKind::Process => "process",
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a tool executes. Serialized internally tagged by `type`, e.g.
/// `{"type":"http","endpoint":"https://svc.internal:8443","timeout_ms":5000}`.
///
/// The binding says *where* the code is; what it may touch is still governed by the
/// tool's capabilities and the sandbox profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum ProviderBinding {
    /// Rust code compiled into the host, for trusted low-latency tools.
    Builtin {
        /// The registered handler name; defaults to the tool id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        handler: Option<String>,
    },
    /// A service that receives the arguments as a JSON `POST`.
    Http {
        /// `http(s)://host[:port]`, nothing else (the path goes in `path`).
        endpoint: String,
        /// The request path; defaults to [`DEFAULT_HTTP_PATH`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
        /// Extra request headers; values may reference `${ENV}` variables.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        headers: BTreeMap<String, String>,
        /// Per-request timeout; at most [`MAX_HTTP_TIMEOUT_MS`]. Defaults to the
        /// manifest's `limits.timeout_ms`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// A WebAssembly module, pinned by digest.
    Wasm {
        /// Where the module is (a path relative to the skill directory).
        module: String,
        /// The module's SHA-256, 64 hex characters; the executor refuses a mismatch.
        sha256: String,
    },
    /// A local program.
    Process {
        /// The program to run.
        command: String,
        /// Fixed arguments placed before anything the tool call supplies.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        args: Vec<String>,
    },
}

impl Default for ProviderBinding {
    fn default() -> Self {
        ProviderBinding::Builtin { handler: None }
    }
}

impl ProviderBinding {
    /// The kind of provider.
    pub fn kind(&self) -> ProviderKind {
        match self {
            ProviderBinding::Builtin { .. } => ProviderKind::Builtin,
            ProviderBinding::Http { .. } => ProviderKind::Http,
            ProviderBinding::Wasm { .. } => ProviderKind::Wasm,
            ProviderBinding::Process { .. } => ProviderKind::Process,
        }
    }

    /// For a builtin binding, the handler name, falling back to `tool_id`.
    pub fn builtin_handler<'a>(&'a self, tool_id: &'a str) -> Option<&'a str> {
        match self {
            ProviderBinding::Builtin { handler } => Some(handler.as_deref().unwrap_or(tool_id)),
            _ => None,
        }
    }

    /// For an HTTP binding, the request path, falling back to [`DEFAULT_HTTP_PATH`].
    pub fn http_path(&self) -> Option<&str> {
        match self {
            ProviderBinding::Http { path, .. } => {
                Some(path.as_deref().unwrap_or(DEFAULT_HTTP_PATH))
            }
            _ => None,
        }
    }

    /// Syntactic checks, reporting every problem as (relative field path, problem).
    ///
    /// HTTP: `endpoint` is `http(s)://host[:port]` with an optional trailing `/` and no
    /// user info, path, query or fragment; `path` starts with `/` and has no `..`,
    /// query, fragment or whitespace; header names are HTTP tokens (not hop-by-hop or
    /// client-owned ones), values have no control characters; `timeout_ms` is
    /// 1..=[`MAX_HTTP_TIMEOUT_MS`]. WASM: `module` is a non-empty path without `..`
    /// and `sha256` is 64 hex characters. Process: `command` is non-empty; no NUL in
    /// `command` or `args`. Builtin: a given `handler` is a non-empty identifier.
    pub fn validate(&self) -> Vec<FieldProblem> {
        let mut out = Vec::new();
        match self {
            ProviderBinding::Builtin { handler } => {
                if let Some(h) = handler
                    && (h.is_empty()
                        || !h.chars().all(|c| {
                            c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')
                        }))
                {
                    out.push((
                        "handler".into(),
                        "must be a non-empty name of letters, digits and _ - . :".into(),
                    ));
                }
            }
            ProviderBinding::Http {
                endpoint,
                path,
                headers,
                timeout_ms,
            } => {
                if let Err(problem) = check_endpoint(endpoint) {
                    out.push(("endpoint".into(), problem));
                }
                if let Some(p) = path
                    && let Err(problem) = check_http_path(p)
                {
                    out.push(("path".into(), problem));
                }
                for (name, value) in headers {
                    let field = format!("headers.{name}");
                    if name.is_empty() || !name.chars().all(is_tchar) {
                        out.push((field, "is not a valid HTTP header name".into()));
                    } else if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
                        out.push((
                            field,
                            "is set by the HTTP client and may not be overridden".into(),
                        ));
                    } else if value.chars().any(|c| c.is_control() && c != '\t') {
                        out.push((field, "value must not contain control characters".into()));
                    }
                }
                if let Some(t) = timeout_ms
                    && (*t == 0 || *t > MAX_HTTP_TIMEOUT_MS)
                {
                    out.push((
                        "timeout_ms".into(),
                        format!("must be between 1 and {MAX_HTTP_TIMEOUT_MS}"),
                    ));
                }
            }
            ProviderBinding::Wasm { module, sha256 } => {
                if module.trim().is_empty() {
                    out.push(("module".into(), "must not be empty".into()));
                } else if module.contains('\0') || has_parent_component(module) {
                    out.push((
                        "module".into(),
                        "must not contain NUL or a `..` component".into(),
                    ));
                }
                if sha256.len() != 64 || !sha256.chars().all(|c| c.is_ascii_hexdigit()) {
                    out.push(("sha256".into(), "must be 64 hexadecimal characters".into()));
                }
            }
            ProviderBinding::Process { command, args } => {
                if command.trim().is_empty() {
                    out.push(("command".into(), "must not be empty".into()));
                } else if command.contains('\0') {
                    out.push(("command".into(), "must not contain NUL".into()));
                }
                for (i, a) in args.iter().enumerate() {
                    if a.contains('\0') {
                        out.push((format!("args[{i}]"), "must not contain NUL".into()));
                    }
                }
            }
        }
        out
    }
}

fn is_tchar(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let rest = endpoint
        .strip_prefix("https://")
        .or_else(|| endpoint.strip_prefix("http://"))
        .ok_or_else(|| {
            format!(
                "{:?} must start with http:// or https://",
                truncate(endpoint)
            )
        })?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#']) {
        return Err("must be http(s)://host[:port] only; put the path in `path`".into());
    }
    if authority.contains('@') {
        return Err("must not contain user info; use `headers` for credentials".into());
    }
    // Split off a port, minding bracketed IPv6 literals.
    let (host, port) = if authority.starts_with('[') {
        match authority.find(']') {
            Some(end) => {
                let (h, after) = authority.split_at(end + 1);
                match after.strip_prefix(':') {
                    Some(p) => (h, Some(p)),
                    None if after.is_empty() => (h, None),
                    None => return Err("has garbage after the IPv6 literal".into()),
                }
            }
            None => return Err("has an unterminated IPv6 literal".into()),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if !is_valid_host(host) || (!host.starts_with('[') && host.contains(':')) {
        return Err(format!("{:?} is not a valid host", truncate(host)));
    }
    if let Some(p) = port {
        match p.parse::<u16>() {
            Ok(n) if n > 0 => {}
            _ => return Err(format!("{:?} is not a valid port", truncate(p))),
        }
    }
    Ok(())
}

fn check_http_path(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err("must start with `/`".into());
    }
    if p.contains(['?', '#']) || p.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain a query, fragment, whitespace or control characters".into());
    }
    if has_parent_component(p) {
        return Err("must not contain a `..` component".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> ProviderBinding {
        serde_json::from_str(json).unwrap()
    }

    fn problem_paths(b: &ProviderBinding) -> Vec<String> {
        b.validate().into_iter().map(|p| p.0).collect()
    }

    #[test]
    fn defaults_and_helpers() {
        let b = ProviderBinding::default();
        assert_eq!(b.kind(), ProviderKind::Builtin);
        assert_eq!(b.builtin_handler("fs.files.read"), Some("fs.files.read"));
        assert_eq!(
            serde_json::to_value(&b).unwrap(),
            serde_json::json!({"type":"builtin"})
        );
        let h = parse(r#"{"type":"http","endpoint":"https://svc.internal:8443"}"#);
        assert_eq!(h.http_path(), Some(DEFAULT_HTTP_PATH));
        assert!(h.validate().is_empty());
        assert_eq!(h.builtin_handler("x"), None);
        let named = parse(r#"{"type":"builtin","handler":"echo"}"#);
        assert_eq!(named.builtin_handler("a.b.c"), Some("echo"));
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(
            serde_json::from_str::<ProviderBinding>(
                r#"{"type":"http","endpoint":"http://a","timeout":1}"#
            )
            .is_err()
        );
        assert!(serde_json::from_str::<ProviderBinding>(r#"{"type":"ftp"}"#).is_err());
    }

    #[test]
    fn http_endpoint_rules() {
        for ok in [
            "http://localhost",
            "https://api.example.com/",
            "http://10.0.0.1:8080",
            "http://[::1]:9000",
        ] {
            let b = ProviderBinding::Http {
                endpoint: ok.into(),
                path: None,
                headers: BTreeMap::new(),
                timeout_ms: None,
            };
            assert!(b.validate().is_empty(), "{ok}: {:?}", b.validate());
        }
        for bad in [
            "ftp://a.com",
            "api.example.com",
            "https://a.com/api",
            "https://a.com?x=1",
            "https://user:pw@a.com",
            "https://a.com:0",
            "https://a.com:99999",
            "https://bad host",
            "http://[::1",
            "http://::1",
        ] {
            let b = ProviderBinding::Http {
                endpoint: bad.into(),
                path: None,
                headers: BTreeMap::new(),
                timeout_ms: None,
            };
            assert_eq!(problem_paths(&b), ["endpoint"], "{bad}");
        }
    }

    #[test]
    fn http_other_fields() {
        let b = parse(
            r#"{"type":"http","endpoint":"https://a.com","path":"run","timeout_ms":200000,
                "headers":{"Authorization":"Bearer ${TOKEN}","Host":"x","bad name":"v","X-Ok":"a\nb"}}"#,
        );
        assert_eq!(
            problem_paths(&b),
            [
                "path",
                "headers.Host",
                "headers.X-Ok",
                "headers.bad name",
                "timeout_ms"
            ]
        );
        let b =
            parse(r#"{"type":"http","endpoint":"https://a.com","path":"/a/../b","timeout_ms":0}"#);
        assert_eq!(problem_paths(&b), ["path", "timeout_ms"]);
    }

    #[test]
    fn wasm_process_builtin_rules() {
        let good = "ab".repeat(32);
        assert!(
            parse(&format!(
                r#"{{"type":"wasm","module":"m.wasm","sha256":"{good}"}}"#
            ))
            .validate()
            .is_empty()
        );
        let b = parse(r#"{"type":"wasm","module":"../m.wasm","sha256":"xyz"}"#);
        assert_eq!(problem_paths(&b), ["module", "sha256"]);
        let b = parse(r#"{"type":"process","command":" ","args":["ok","a\u0000b"]}"#);
        assert_eq!(problem_paths(&b), ["command", "args[1]"]);
        let b = parse(r#"{"type":"builtin","handler":"has space"}"#);
        assert_eq!(problem_paths(&b), ["handler"]);
    }
}
