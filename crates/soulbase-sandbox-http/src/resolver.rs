//! The DNS resolver every request goes through: it resolves the name itself and
//! refuses it when any address is restricted and not explicitly allowed, so a name
//! pointing at 127.0.0.1 (or rebinding to it) never gets a connection.

use std::error::Error;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::address::restricted_reason;

/// A refused address: found in the source chain of a reqwest error and mapped to
/// `SANDBOX.CAPABILITY_BLOCKED`.
#[derive(Debug, Clone)]
pub struct AddressRefused {
    /// The host that was looked up (or the IP literal).
    pub host: String,
    /// The address that is not allowed.
    pub ip: IpAddr,
    /// Why (loopback, private, …).
    pub reason: &'static str,
}

impl fmt::Display for AddressRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} resolves to {} ({}), which the profile does not allow",
            self.host, self.ip, self.reason
        )
    }
}

impl Error for AddressRefused {}

/// Checks one address: public, or named literally by the profile.
pub fn check_address(host: &str, ip: IpAddr, allowed: &[IpAddr]) -> Result<(), AddressRefused> {
    match restricted_reason(ip) {
        Some(reason) if !allowed.contains(&ip) => Err(AddressRefused {
            host: host.to_owned(),
            ip,
            reason,
        }),
        _ => Ok(()),
    }
}

/// Resolves with the system resolver, then checks every address.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    allowed: Arc<[IpAddr]>,
}

impl GuardedResolver {
    /// A resolver admitting restricted addresses only when listed in `allowed`.
    pub fn new(allowed: &[IpAddr]) -> Self {
        Self {
            allowed: allowed.into(),
        }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allowed = self.allowed.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            for a in &addrs {
                check_address(&host, a.ip(), &allowed)?;
            }
            let it: Addrs = Box::new(addrs.into_iter());
            Ok(it)
        })
    }
}
