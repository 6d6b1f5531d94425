//! Which IP addresses a tool request may reach without an explicit grant.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is restricted: loopback, private, link-local, cloud metadata and the
/// other special-purpose ranges a tool must not reach unless the profile names the
/// address literally. `None` for an ordinary public address.
pub fn restricted_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_reason(v4),
        IpAddr::V6(v6) => v6_reason(v6),
    }
}

fn v4_reason(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() || o[0] == 0 {
        Some("unspecified")
    } else if ip.is_private() {
        Some("private")
    } else if ip.is_link_local() {
        // 169.254.0.0/16, which holds the cloud metadata endpoint 169.254.169.254.
        Some("link-local or cloud metadata")
    } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
        // 100.64.0.0/10 carrier-grade NAT; also Alibaba's metadata 100.100.100.200.
        Some("shared address space or cloud metadata")
    } else if o[0] == 192 && o[1] == 0 && o[2] == 0 {
        Some("IETF protocol assignment")
    } else if o[0] == 198 && (o[1] & 0xfe) == 18 {
        Some("benchmarking")
    } else if ip.is_multicast() || ip.is_broadcast() || o[0] >= 240 {
        Some("multicast or reserved")
    } else if ip.is_documentation() {
        Some("documentation")
    } else {
        None
    }
}

fn v6_reason(ip: Ipv6Addr) -> Option<&'static str> {
    let seg = ip.segments();
    if ip.is_loopback() {
        return Some("loopback");
    }
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    // Addresses that embed an IPv4 address are judged by it.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return v4_reason(v4);
    }
    if seg[0] == 0x64 && seg[1] == 0xff9b {
        // NAT64 64:ff9b::/96.
        let v4 = Ipv4Addr::new(
            (seg[6] >> 8) as u8,
            seg[6] as u8,
            (seg[7] >> 8) as u8,
            seg[7] as u8,
        );
        return v4_reason(v4);
    }
    if seg[0] == 0x2002 {
        // 6to4 2002::/16 embeds the IPv4 address in the next 32 bits.
        let v4 = Ipv4Addr::new(
            (seg[1] >> 8) as u8,
            seg[1] as u8,
            (seg[2] >> 8) as u8,
            seg[2] as u8,
        );
        return v4_reason(v4);
    }
    if seg[0..6] == [0, 0, 0, 0, 0, 0] {
        // Deprecated IPv4-compatible ::a.b.c.d.
        return Some("IPv4-compatible");
    }
    if (seg[0] & 0xfe00) == 0xfc00 {
        // fc00::/7 unique local, which holds AWS's metadata fd00:ec2::254.
        return Some("unique local or cloud metadata");
    }
    if (seg[0] & 0xffc0) == 0xfe80 || (seg[0] & 0xffc0) == 0xfec0 {
        return Some("link-local");
    }
    if ip.is_multicast() {
        return Some("multicast");
    }
    if seg[0] == 0x2001 && seg[1] == 0x0db8 {
        return Some("documentation");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> Option<&'static str> {
        restricted_reason(s.parse().unwrap())
    }

    #[test]
    fn special_ranges_are_restricted() {
        for bad in [
            "127.0.0.1",
            "127.8.9.10",
            "0.0.0.0",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.100.100.200",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "fd00:ec2::254",
            "fe80::1",
            "ff02::1",
        ] {
            assert!(r(bad).is_some(), "{bad}");
        }
        for ok in [
            "93.184.216.34",
            "1.1.1.1",
            "172.32.0.1",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
        ] {
            assert_eq!(r(ok), None, "{ok}");
        }
    }
}
