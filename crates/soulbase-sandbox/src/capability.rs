//! Capabilities: the least-privilege grants a tool declares.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};
pub use soulbase_observe::ClientRequestKind;

use crate::FieldProblem;
use crate::syntax::{has_parent_component, is_valid_host_pattern};

/// HTTP methods a `net` capability may name.
const HTTP_METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// One kind of access to the file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsAccess {
    /// Read file contents.
    Read,
    /// Create, modify or delete files.
    Write,
    /// List directory entries and read metadata.
    List,
}

/// The capability domains of the sandbox: what a [`Capability`] is about.
///
/// Used to index tools ("which tools touch the network?") and to check that a
/// manifest's capabilities cover its declared side effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CapabilityDomain {
    /// File system access.
    Fs,
    /// Network access.
    Net,
    /// Starting processes.
    Proc,
    /// Scratch space that is discarded after the call.
    Tmp,
    /// A headless browser (reserved).
    Browser,
    /// Requests to the caller's client while the tool runs (elicitation, sampling).
    Client,
}

impl CapabilityDomain {
    /// Every domain, in order.
    pub const ALL: [CapabilityDomain; 6] = [
        CapabilityDomain::Fs,
        CapabilityDomain::Net,
        CapabilityDomain::Proc,
        CapabilityDomain::Tmp,
        CapabilityDomain::Browser,
        CapabilityDomain::Client,
    ];

    /// The lowercase name used in manifests (`fs`, `net`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            CapabilityDomain::Fs => "fs",
            CapabilityDomain::Net => "net",
            CapabilityDomain::Proc => "proc",
            CapabilityDomain::Tmp => "tmp",
            CapabilityDomain::Browser => "browser",
            CapabilityDomain::Client => "client",
        }
    }
}

impl fmt::Display for CapabilityDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn default_fs_access() -> BTreeSet<FsAccess> {
    BTreeSet::from([FsAccess::Read])
}

/// One least-privilege grant a tool declares in its manifest.
///
/// Serialized internally tagged by `kind`, e.g.
/// `{"kind":"fs","paths":["data/"],"access":["read","list"]}` or
/// `{"kind":"net","hosts":["api.example.com"],"schemes":["https"]}`.
/// Unknown fields are refused, so a typo never silently widens or narrows a grant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Capability {
    /// File system access below the given paths.
    Fs {
        /// Path prefixes (absolute, or relative to the tenant's sandbox root); no `..`.
        paths: Vec<String>,
        /// The allowed kinds of access; defaults to `[read]`.
        #[serde(default = "default_fs_access")]
        access: BTreeSet<FsAccess>,
    },
    /// Network access to the given hosts.
    Net {
        /// Host names, `*.example.com` label wildcards or IP literals. Required, non-empty.
        hosts: Vec<String>,
        /// Allowed URL schemes (e.g. `https`); empty means any.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        schemes: Vec<String>,
        /// Allowed ports; empty means any.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        ports: Vec<u16>,
        /// Allowed HTTP methods (upper case); empty means any.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        methods: Vec<String>,
    },
    /// Starting the given commands.
    Proc {
        /// Program names or paths that may be executed. Required, non-empty.
        commands: Vec<String>,
    },
    /// Scratch space, discarded after the call.
    Tmp {
        /// The most bytes the scratch space may hold.
        max_bytes: u64,
    },
    /// A headless browser. Reserved: no executor exists yet.
    Browser {},
    /// Requests the running tool may make to its caller's client: asking the user
    /// (`elicitation`) or the client's model (`sampling`). Each request passes the
    /// call's profile and is recorded, by digest, in the call's End; only builtin
    /// tools can make them today.
    Client {
        /// The kinds of request allowed. Required, non-empty.
        requests: BTreeSet<ClientRequestKind>,
    },
}

impl Capability {
    /// The domain this capability belongs to.
    pub fn domain(&self) -> CapabilityDomain {
        match self {
            Capability::Fs { .. } => CapabilityDomain::Fs,
            Capability::Net { .. } => CapabilityDomain::Net,
            Capability::Proc { .. } => CapabilityDomain::Proc,
            Capability::Tmp { .. } => CapabilityDomain::Tmp,
            Capability::Browser {} => CapabilityDomain::Browser,
            Capability::Client { .. } => CapabilityDomain::Client,
        }
    }

    /// Whether this is an `fs` capability granting `access`.
    pub fn grants_fs(&self, access: FsAccess) -> bool {
        matches!(self, Capability::Fs { access: a, .. } if a.contains(&access))
    }

    /// Whether this is a `client` capability allowing requests of `kind`.
    pub fn grants_client(&self, kind: ClientRequestKind) -> bool {
        matches!(self, Capability::Client { requests } if requests.contains(&kind))
    }

    /// Syntactic checks, reporting every problem as (relative field path, problem).
    ///
    /// Checks shapes only (non-empty lists, no `..` in paths, well-formed hosts,
    /// schemes, ports and methods). Whether the grant is *allowed* is decided later
    /// by policy, and whether it *covers* the tool's side effect by the manifest
    /// validator.
    pub fn validate(&self) -> Vec<FieldProblem> {
        let mut out = Vec::new();
        match self {
            Capability::Fs { paths, access } => {
                if paths.is_empty() {
                    out.push(("paths".into(), "must list at least one path".into()));
                }
                for (i, p) in paths.iter().enumerate() {
                    if let Some(problem) = path_problem(p) {
                        out.push((format!("paths[{i}]"), problem));
                    }
                }
                if access.is_empty() {
                    out.push((
                        "access".into(),
                        "must grant at least one of read, write, list".into(),
                    ));
                }
            }
            Capability::Net {
                hosts,
                schemes,
                ports,
                methods,
            } => {
                if hosts.is_empty() {
                    out.push(("hosts".into(), "must list at least one host".into()));
                }
                for (i, h) in hosts.iter().enumerate() {
                    if !is_valid_host_pattern(h) {
                        out.push((
                            format!("hosts[{i}]"),
                            format!(
                                "{:?} is not a host name, a `*.example.com` wildcard or an IP literal",
                                truncate(h)
                            ),
                        ));
                    }
                }
                for (i, s) in schemes.iter().enumerate() {
                    if !is_scheme(s) {
                        out.push((
                            format!("schemes[{i}]"),
                            format!("{:?} is not a lowercase URL scheme", truncate(s)),
                        ));
                    }
                }
                for (i, p) in ports.iter().enumerate() {
                    if *p == 0 {
                        out.push((format!("ports[{i}]"), "port 0 is not a port".into()));
                    }
                }
                for (i, m) in methods.iter().enumerate() {
                    if !HTTP_METHODS.contains(&m.as_str()) {
                        out.push((
                            format!("methods[{i}]"),
                            format!(
                                "{:?} is not one of {}",
                                truncate(m),
                                HTTP_METHODS.join(", ")
                            ),
                        ));
                    }
                }
            }
            Capability::Proc { commands } => {
                if commands.is_empty() {
                    out.push(("commands".into(), "must list at least one command".into()));
                }
                for (i, c) in commands.iter().enumerate() {
                    if c.trim().is_empty() {
                        out.push((format!("commands[{i}]"), "must not be empty".into()));
                    } else if c.contains('\0') || c.trim() != c {
                        out.push((
                            format!("commands[{i}]"),
                            "must not contain NUL or leading/trailing whitespace".into(),
                        ));
                    }
                }
            }
            Capability::Tmp { max_bytes } => {
                if *max_bytes == 0 {
                    out.push(("max_bytes".into(), "must be greater than 0".into()));
                }
            }
            Capability::Browser {} => {}
            Capability::Client { requests } => {
                if requests.is_empty() {
                    out.push((
                        "requests".into(),
                        "must allow at least one of elicitation, sampling".into(),
                    ));
                }
            }
        }
        out
    }
}

fn path_problem(p: &str) -> Option<String> {
    if p.trim().is_empty() {
        Some("must not be empty".into())
    } else if p.contains('\0') {
        Some("must not contain NUL".into())
    } else if has_parent_component(p) {
        Some(format!(
            "{:?} must not contain a `..` component",
            truncate(p)
        ))
    } else {
        None
    }
}

fn is_scheme(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '+' | '-' | '.'))
}

/// Keeps problem messages short when an input is huge.
pub(crate) fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Capability {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn serde_shape_is_tagged_by_kind() {
        let c = parse(r#"{"kind":"fs","paths":["/data"],"access":["list","read"]}"#);
        assert_eq!(c.domain(), CapabilityDomain::Fs);
        assert!(c.grants_fs(FsAccess::Read));
        assert!(!c.grants_fs(FsAccess::Write));
        let back = serde_json::to_value(&c).unwrap();
        assert_eq!(
            back,
            serde_json::json!({"kind":"fs","paths":["/data"],"access":["read","list"]})
        );
        assert_eq!(parse(r#"{"kind":"browser"}"#), Capability::Browser {});
        let client = parse(r#"{"kind":"client","requests":["sampling"]}"#);
        assert_eq!(client.domain(), CapabilityDomain::Client);
        assert!(client.grants_client(ClientRequestKind::Sampling));
        assert!(!client.grants_client(ClientRequestKind::Elicitation));
        assert!(
            serde_json::from_str::<Capability>(r#"{"kind":"client","requests":["mind_reading"]}"#)
                .is_err()
        );
        let none = parse(r#"{"kind":"client","requests":[]}"#);
        assert_eq!(
            none.validate(),
            vec![(
                "requests".to_string(),
                "must allow at least one of elicitation, sampling".to_string()
            )]
        );
        assert_eq!(
            parse(r#"{"kind":"tmp","max_bytes":10}"#).domain(),
            CapabilityDomain::Tmp
        );
        let net = parse(r#"{"kind":"net","hosts":["a.example.com"]}"#);
        assert_eq!(
            serde_json::to_value(&net).unwrap(),
            serde_json::json!({"kind":"net","hosts":["a.example.com"]})
        );
    }

    #[test]
    fn fs_access_defaults_to_read() {
        let c = parse(r#"{"kind":"fs","paths":["data"]}"#);
        assert!(c.grants_fs(FsAccess::Read));
        assert!(!c.grants_fs(FsAccess::List));
    }

    #[test]
    fn unknown_fields_and_kinds_are_refused() {
        assert!(
            serde_json::from_str::<Capability>(r#"{"kind":"fs","paths":[],"acess":[]}"#).is_err()
        );
        assert!(serde_json::from_str::<Capability>(r#"{"kind":"gpu"}"#).is_err());
        assert!(
            serde_json::from_str::<Capability>(r#"{"kind":"net","hosts":[],"ports":[70000]}"#)
                .is_err()
        );
    }

    #[test]
    fn yaml_works_too() {
        let c: Capability =
            serde_saphyr::from_str("kind: net\nhosts: [api.example.com]\nports: [443]\n").unwrap();
        assert_eq!(c.domain(), CapabilityDomain::Net);
        assert!(c.validate().is_empty());
    }

    #[test]
    fn validate_reports_every_problem_with_its_path() {
        let fs = parse(r#"{"kind":"fs","paths":["ok/dir","../etc","", "/a/../b"],"access":[]}"#);
        let paths: Vec<String> = fs.validate().into_iter().map(|p| p.0).collect();
        assert_eq!(paths, ["paths[1]", "paths[2]", "paths[3]", "access"]);
        assert_eq!(
            parse(r#"{"kind":"fs","paths":[]}"#).validate()[0].0,
            "paths"
        );

        let net = parse(
            r#"{"kind":"net","hosts":["ok.example.com","*.example.com","*","bad host","10.1.2.3","*.com"],
                "schemes":["https","HTTP"],"ports":[443,0],"methods":["GET","get"]}"#,
        );
        let paths: Vec<String> = net.validate().into_iter().map(|p| p.0).collect();
        assert_eq!(
            paths,
            [
                "hosts[2]",
                "hosts[3]",
                "hosts[5]",
                "schemes[1]",
                "ports[1]",
                "methods[1]"
            ]
        );
        assert_eq!(
            parse(r#"{"kind":"net","hosts":[]}"#).validate()[0].0,
            "hosts"
        );

        let proc_ = parse(r#"{"kind":"proc","commands":["git"," ","ls "]}"#);
        let paths: Vec<String> = proc_.validate().into_iter().map(|p| p.0).collect();
        assert_eq!(paths, ["commands[1]", "commands[2]"]);
        assert_eq!(
            parse(r#"{"kind":"proc","commands":[]}"#).validate()[0].0,
            "commands"
        );

        assert_eq!(
            parse(r#"{"kind":"tmp","max_bytes":0}"#).validate()[0].0,
            "max_bytes"
        );
        assert!(parse(r#"{"kind":"browser"}"#).validate().is_empty());
    }
}
