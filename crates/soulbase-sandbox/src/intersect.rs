//! The true intersection of capability sets: Grant ∩ Manifest ∩ PolicyConfig.
//!
//! A set of capabilities is the union of what each one allows, so the intersection of
//! two sets is the union of the pairwise intersections of their members. Each pairwise
//! intersection is computed structurally: paths by components, hosts by labels,
//! schemes / ports / methods as sets (an empty list means "any"), temp space as the
//! smaller size. Nothing here does IO.

use std::collections::BTreeSet;
use std::path::Path;

use crate::Capability;
use crate::exec::host_matches;
use crate::path::{normalize, path_covers};

/// The intersection of two capability sets: everything both allow, nothing more.
/// The result is deduplicated and keeps the order of `a`.
pub fn intersect(a: &[Capability], b: &[Capability]) -> Vec<Capability> {
    let mut out: Vec<Capability> = Vec::new();
    for ca in a {
        for cb in b {
            if let Some(c) = intersect_one(ca, cb)
                && !out.contains(&c)
            {
                out.push(c);
            }
        }
    }
    out
}

/// The intersection of two single capabilities, or `None` when they share nothing.
pub fn intersect_one(a: &Capability, b: &Capability) -> Option<Capability> {
    match (a, b) {
        (
            Capability::Fs {
                paths: pa,
                access: aa,
            },
            Capability::Fs {
                paths: pb,
                access: ab,
            },
        ) => {
            let access: BTreeSet<_> = aa.intersection(ab).copied().collect();
            let mut paths: Vec<String> = Vec::new();
            for x in pa {
                for y in pb {
                    let narrower = if path_covers(Path::new(x), Path::new(y)) {
                        Some(y)
                    } else if path_covers(Path::new(y), Path::new(x)) {
                        Some(x)
                    } else {
                        None
                    };
                    if let Some(p) = narrower.and_then(|p| normalize(Path::new(p))) {
                        let p = p.to_string_lossy().into_owned();
                        if !paths.contains(&p) {
                            paths.push(p);
                        }
                    }
                }
            }
            (!access.is_empty() && !paths.is_empty()).then_some(Capability::Fs { paths, access })
        }
        (
            Capability::Net {
                hosts: ha,
                schemes: sa,
                ports: pa,
                methods: ma,
            },
            Capability::Net {
                hosts: hb,
                schemes: sb,
                ports: pb,
                methods: mb,
            },
        ) => {
            let mut hosts: Vec<String> = Vec::new();
            for x in ha {
                for y in hb {
                    if let Some(h) = intersect_host(x, y)
                        && !hosts.contains(&h)
                    {
                        hosts.push(h);
                    }
                }
            }
            if hosts.is_empty() {
                return None;
            }
            let schemes = intersect_any(sa, sb)?;
            let ports = intersect_any(pa, pb)?;
            let methods = intersect_any(ma, mb)?;
            Some(Capability::Net {
                hosts,
                schemes,
                ports,
                methods,
            })
        }
        (Capability::Proc { commands: ca }, Capability::Proc { commands: cb }) => {
            let commands: Vec<String> = ca.iter().filter(|c| cb.contains(c)).cloned().collect();
            (!commands.is_empty()).then_some(Capability::Proc { commands })
        }
        (Capability::Tmp { max_bytes: a }, Capability::Tmp { max_bytes: b }) => {
            Some(Capability::Tmp {
                max_bytes: (*a).min(*b),
            })
        }
        (Capability::Browser {}, Capability::Browser {}) => Some(Capability::Browser {}),
        (Capability::Client { requests: ra }, Capability::Client { requests: rb }) => {
            let requests: BTreeSet<_> = ra.intersection(rb).copied().collect();
            (!requests.is_empty()).then_some(Capability::Client { requests })
        }
        _ => None,
    }
}

/// Two host patterns' overlap: an exact host covered by the other side, or the same
/// wildcard on both sides. Different wildcards never overlap (a label wildcard
/// stands for exactly one label).
fn intersect_host(a: &str, b: &str) -> Option<String> {
    let (a_wild, b_wild) = (a.starts_with("*."), b.starts_with("*."));
    match (a_wild, b_wild) {
        (false, false) => a.eq_ignore_ascii_case(b).then(|| a.to_ascii_lowercase()),
        (true, false) => host_matches(a, b).then(|| b.to_ascii_lowercase()),
        (false, true) => host_matches(b, a).then(|| a.to_ascii_lowercase()),
        (true, true) => a.eq_ignore_ascii_case(b).then(|| a.to_ascii_lowercase()),
    }
}

/// Intersects two "empty means any" lists: `None` when both restrict and share nothing.
fn intersect_any<T: Clone + PartialEq>(a: &[T], b: &[T]) -> Option<Vec<T>> {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => Some(b.to_vec()),
        (_, true) => Some(a.to_vec()),
        _ => {
            let both: Vec<T> = a.iter().filter(|x| b.contains(x)).cloned().collect();
            (!both.is_empty()).then_some(both)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FsAccess;

    fn fs(paths: &[&str], access: &[FsAccess]) -> Capability {
        Capability::Fs {
            paths: paths.iter().map(|s| s.to_string()).collect(),
            access: access.iter().copied().collect(),
        }
    }

    fn net(hosts: &[&str], ports: &[u16]) -> Capability {
        Capability::Net {
            hosts: hosts.iter().map(|s| s.to_string()).collect(),
            schemes: vec![],
            ports: ports.to_vec(),
            methods: vec![],
        }
    }

    #[test]
    fn fs_takes_the_narrower_path_and_common_access() {
        let a = fs(&["/data"], &[FsAccess::Read, FsAccess::Write]);
        let b = fs(&["/data/reports", "/database"], &[FsAccess::Read]);
        assert_eq!(
            intersect(std::slice::from_ref(&a), &[b]),
            vec![fs(&["/data/reports"], &[FsAccess::Read])]
        );
        let disjoint = fs(&["/database"], &[FsAccess::Read]);
        assert!(intersect(std::slice::from_ref(&a), &[disjoint]).is_empty());
        let no_common_access = fs(&["/data"], &[FsAccess::List]);
        assert!(intersect(&[a], &[no_common_access]).is_empty());
    }

    #[test]
    fn net_hosts_by_labels_and_lists_as_sets() {
        let grant = net(&["*.example.com"], &[]);
        let manifest = net(
            &["api.example.com", "evilexample.com", "example.com"],
            &[443],
        );
        assert_eq!(
            intersect(std::slice::from_ref(&manifest), &[grant]),
            vec![net(&["api.example.com"], &[443])]
        );
        let ports = net(&["api.example.com"], &[80]);
        assert!(intersect(&[manifest], &[ports]).is_empty());
        assert!(intersect(&[net(&["*.a.com"], &[])], &[net(&["*.b.a.com"], &[])]).is_empty());
    }

    #[test]
    fn proc_tmp_browser_and_mixed_domains() {
        let a = vec![
            Capability::Proc {
                commands: vec!["/usr/bin/jq".into(), "/bin/sh".into()],
            },
            Capability::Tmp { max_bytes: 100 },
            Capability::Browser {},
        ];
        let b = vec![
            Capability::Proc {
                commands: vec!["/usr/bin/jq".into()],
            },
            Capability::Tmp { max_bytes: 10 },
        ];
        assert_eq!(
            intersect(&a, &b),
            vec![
                Capability::Proc {
                    commands: vec!["/usr/bin/jq".into()]
                },
                Capability::Tmp { max_bytes: 10 }
            ]
        );
        assert!(intersect(&a, &[]).is_empty());
    }

    #[test]
    fn intersection_is_commutative_in_content() {
        let a = vec![
            fs(&["/data", "/srv"], &[FsAccess::Read]),
            net(&["*.x.io"], &[]),
        ];
        let b = vec![fs(&["/srv/a"], &[FsAccess::Read]), net(&["y.x.io"], &[443])];
        let ab = intersect(&a, &b);
        let ba = intersect(&b, &a);
        assert_eq!(ab.len(), ba.len());
        for c in &ab {
            assert!(ba.contains(c));
        }
    }

    #[test]
    fn client_requests_intersect_as_sets() {
        use crate::ClientRequestKind::{Elicitation, Sampling};
        let client = |kinds: &[crate::ClientRequestKind]| Capability::Client {
            requests: kinds.iter().copied().collect(),
        };
        assert_eq!(
            intersect_one(&client(&[Elicitation, Sampling]), &client(&[Sampling])),
            Some(client(&[Sampling]))
        );
        assert_eq!(
            intersect_one(&client(&[Elicitation]), &client(&[Sampling])),
            None
        );
        assert_eq!(
            intersect_one(&client(&[Sampling]), &Capability::Browser {}),
            None
        );
    }
}
