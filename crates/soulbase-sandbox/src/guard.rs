//! The guard: every operation an executor plans is checked against the call's profile
//! before it happens, and refused with `SANDBOX.CAPABILITY_BLOCKED` when it lies
//! outside.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use soulbase_errors::{ErrorCode, SoulError};

use crate::exec::host_matches;
use crate::path::resolve;
use crate::{Capability, FsAccess, Profile};

/// One operation a call plans to perform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation<'a> {
    /// File-system access to a path (absolute, or relative to the sandbox root).
    Fs {
        /// The path as the tool names it; symlinks are resolved before the check.
        path: &'a Path,
        /// The kind of access.
        access: FsAccess,
    },
    /// A network request.
    Net {
        /// URL scheme, lower case (`https`).
        scheme: &'a str,
        /// Host name or IP literal (IPv6 without brackets).
        host: &'a str,
        /// Port.
        port: u16,
        /// HTTP method, upper case; `None` for a non-HTTP connection.
        method: Option<&'a str>,
    },
    /// Starting a program.
    Exec {
        /// The program as named in the provider binding.
        command: &'a str,
    },
    /// Using scratch space.
    Tmp {
        /// Bytes wanted.
        bytes: u64,
    },
}

/// An `fs` grant resolved for enforcement: an absolute, symlink-free path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsGrant {
    /// The resolved path (what Landlock rules and WASI preopens are built from).
    pub path: PathBuf,
    /// Whether reading file contents is granted.
    pub read: bool,
    /// Whether creating, modifying or deleting is granted.
    pub write: bool,
    /// Whether listing directories is granted.
    pub list: bool,
}

fn blocked(note: String) -> SoulError {
    SoulError::of(ErrorCode::SandboxCapabilityBlocked).with_note(note)
}

impl Profile {
    /// Checks one planned operation; `root` resolves relative paths (the tenant's
    /// sandbox root). Paths are resolved (symlinks followed) and compared by
    /// components against the resolved grants; hosts by labels.
    pub fn check(&self, op: &Operation<'_>, root: Option<&Path>) -> Result<(), SoulError> {
        match op {
            Operation::Fs { path, access } => {
                let target = resolve(path, root)?;
                let ok = self
                    .fs_grants(root)
                    .iter()
                    .any(|g| g.allows(*access) && target.starts_with(&g.path));
                if ok {
                    Ok(())
                } else {
                    Err(blocked(format!(
                        "{access:?} access to {} is not granted",
                        target.display()
                    ))
                    .with_field("path", target.display().to_string()))
                }
            }
            Operation::Net {
                scheme,
                host,
                port,
                method,
            } => {
                let ok = self.capabilities().iter().any(|c| match c {
                    Capability::Net {
                        hosts,
                        schemes,
                        ports,
                        methods,
                    } => {
                        hosts.iter().any(|p| host_pattern_matches(p, host))
                            && (schemes.is_empty() || schemes.iter().any(|s| s == scheme))
                            && (ports.is_empty() || ports.contains(port))
                            && match method {
                                Some(m) => methods.is_empty() || methods.iter().any(|x| x == m),
                                None => true,
                            }
                    }
                    _ => false,
                });
                if ok {
                    Ok(())
                } else {
                    Err(blocked(format!(
                        "{} {scheme}://{host}:{port} is not granted",
                        method.unwrap_or("connect")
                    ))
                    .with_field("host", host.to_string()))
                }
            }
            Operation::Exec { command } => {
                if self.grants_command(command) {
                    Ok(())
                } else {
                    Err(blocked(format!("running {command} is not granted")))
                }
            }
            Operation::Tmp { bytes } => match self.tmp_bytes() {
                Some(max) if *bytes <= max => Ok(()),
                Some(max) => Err(blocked(format!(
                    "{bytes} bytes of scratch space exceed the granted {max}"
                ))),
                None => Err(blocked("scratch space is not granted".into())),
            },
        }
    }

    /// The `fs` grants resolved for enforcement: relative paths joined to `root`
    /// (dropped without one), symlinks resolved, paths that do not exist dropped
    /// (nothing can be granted below a path that is not there), and access merged
    /// per path.
    pub fn fs_grants(&self, root: Option<&Path>) -> Vec<FsGrant> {
        let mut out: Vec<FsGrant> = Vec::new();
        for c in self.capabilities() {
            if let Capability::Fs { paths, access } = c {
                for p in paths {
                    let p = Path::new(p);
                    let joined = match (p.is_absolute(), root) {
                        (true, _) => p.to_path_buf(),
                        (false, Some(r)) => r.join(p),
                        (false, None) => continue,
                    };
                    let Ok(path) = joined.canonicalize() else {
                        continue;
                    };
                    let (read, write, list) = (
                        access.contains(&FsAccess::Read),
                        access.contains(&FsAccess::Write),
                        access.contains(&FsAccess::List),
                    );
                    match out.iter_mut().find(|g| g.path == path) {
                        Some(g) => {
                            g.read |= read;
                            g.write |= write;
                            g.list |= list;
                        }
                        None => out.push(FsGrant {
                            path,
                            read,
                            write,
                            list,
                        }),
                    }
                }
            }
        }
        out
    }

    /// Whether `command` is listed by a `proc` capability (exact match).
    pub fn grants_command(&self, command: &str) -> bool {
        self.capabilities().iter().any(|c| match c {
            Capability::Proc { commands } => commands.iter().any(|x| x == command),
            _ => false,
        })
    }

    /// Whether any `net` capability is granted.
    pub fn grants_net(&self) -> bool {
        self.capabilities()
            .iter()
            .any(|c| matches!(c, Capability::Net { .. }))
    }

    /// The granted scratch space in bytes (the largest `tmp` grant), if any.
    pub fn tmp_bytes(&self) -> Option<u64> {
        self.capabilities()
            .iter()
            .filter_map(|c| match c {
                Capability::Tmp { max_bytes } => Some(*max_bytes),
                _ => None,
            })
            .max()
    }

    /// IP addresses the profile names literally in its `net` hosts: the only way a
    /// loopback, private, link-local or metadata address is ever allowed.
    pub fn explicit_ips(&self) -> Vec<IpAddr> {
        let mut out = Vec::new();
        for c in self.capabilities() {
            if let Capability::Net { hosts, .. } = c {
                for h in hosts {
                    let h = h.trim_start_matches('[').trim_end_matches(']');
                    if let Ok(ip) = h.parse::<IpAddr>()
                        && !out.contains(&ip)
                    {
                        out.push(ip);
                    }
                }
            }
        }
        out
    }
}

impl FsGrant {
    /// Whether this grant allows `access`.
    pub fn allows(&self, access: FsAccess) -> bool {
        match access {
            FsAccess::Read => self.read,
            FsAccess::Write => self.write,
            FsAccess::List => self.list,
        }
    }
}

/// Host matching that also understands IP literals (bracketed or not, compared as
/// addresses so `::1` and `0:0::1` are the same).
fn host_pattern_matches(pattern: &str, host: &str) -> bool {
    let strip = |s: &str| s.trim_start_matches('[').trim_end_matches(']').to_owned();
    match (
        strip(pattern).parse::<IpAddr>(),
        strip(host).parse::<IpAddr>(),
    ) {
        (Ok(a), Ok(b)) => a == b,
        (Ok(_), Err(_)) | (Err(_), Ok(_)) => false,
        _ => host_matches(pattern, host),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net_profile() -> Profile {
        Profile::new(vec![Capability::Net {
            hosts: vec!["example.com".into(), "*.api.io".into(), "::1".into()],
            schemes: vec!["https".into()],
            ports: vec![443],
            methods: vec!["POST".into()],
        }])
    }

    fn net<'a>(host: &'a str, scheme: &'a str, port: u16, method: &'a str) -> Operation<'a> {
        Operation::Net {
            scheme,
            host,
            port,
            method: Some(method),
        }
    }

    #[test]
    fn net_checks_every_dimension() {
        let p = net_profile();
        assert!(
            p.check(&net("example.com", "https", 443, "POST"), None)
                .is_ok()
        );
        assert!(
            p.check(&net("x.api.io", "https", 443, "POST"), None)
                .is_ok()
        );
        assert!(p.check(&net("[::1]", "https", 443, "POST"), None).is_ok());
        for bad in [
            net("evilexample.com", "https", 443, "POST"),
            net("example.com", "http", 443, "POST"),
            net("example.com", "https", 8443, "POST"),
            net("example.com", "https", 443, "GET"),
            net("api.io", "https", 443, "POST"),
        ] {
            let e = p.check(&bad, None).unwrap_err();
            assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked, "{bad:?}");
        }
        assert_eq!(p.explicit_ips(), vec!["::1".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn exec_and_tmp() {
        let p = Profile::new(vec![
            Capability::Proc {
                commands: vec!["/bin/true".into()],
            },
            Capability::Tmp { max_bytes: 10 },
        ]);
        assert!(
            p.check(
                &Operation::Exec {
                    command: "/bin/true"
                },
                None
            )
            .is_ok()
        );
        assert!(
            p.check(
                &Operation::Exec {
                    command: "/bin/truex"
                },
                None
            )
            .is_err()
        );
        assert!(p.check(&Operation::Tmp { bytes: 10 }, None).is_ok());
        assert!(p.check(&Operation::Tmp { bytes: 11 }, None).is_err());
        assert!(
            Profile::new(vec![])
                .check(&Operation::Tmp { bytes: 1 }, None)
                .is_err()
        );
    }
}
