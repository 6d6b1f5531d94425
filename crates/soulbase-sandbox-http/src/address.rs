//! Which IP addresses a tool request may reach without an explicit grant.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is restricted: loopback, private, link-local, cloud metadata and the
/// other special-purpose ranges of the IANA IPv4 and IPv6 special-purpose registries
/// that are not globally reachable, plus every IPv6 transition range that embeds an
/// IPv4 address (mapped, translated, NAT64, 6to4, Teredo). A tool reaches them only
/// when the profile names the address literally. `None` for an ordinary public address.
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
        // 192.0.0.0/24, which holds DS-Lite 192.0.0.0/29 and NAT64 discovery.
        Some("IETF protocol assignment")
    } else if o[0] == 192 && o[1] == 88 && o[2] == 99 {
        // 192.88.99.0/24, the deprecated 6to4 relay anycast.
        Some("6to4 relay anycast")
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
    if seg[0..4] == [0, 0, 0, 0] && seg[4] == 0xffff && seg[5] == 0 {
        // IPv4-translated ::ffff:0:a.b.c.d (RFC 2765).
        return Some("IPv4-translated");
    }
    if seg[0] == 0x64 && seg[1] == 0xff9b && seg[2] == 1 {
        // 64:ff9b:1::/48, local-use IPv4/IPv6 translation.
        return Some("local-use translation");
    }
    if seg[0] == 0x100 && seg[1] == 0 && seg[2] == 0 && (seg[3] == 0 || seg[3] == 1) {
        // 100::/64 discard-only, 100:0:0:1::/64 dummy prefix.
        return Some("discard-only or dummy prefix");
    }
    if seg[0] == 0x2001 && seg[1] < 0x0200 {
        // 2001::/23 IETF protocol assignments: Teredo 2001::/32 (which embeds an
        // obfuscated IPv4 address), benchmarking, AMT, ORCHID and the rest.
        return Some("IETF protocol assignment or Teredo");
    }
    if (seg[0] == 0x3fff && seg[1] < 0x1000) || (seg[0] == 0x2001 && seg[1] == 0x0db8) {
        // 3fff::/20 and 2001:db8::/32.
        return Some("documentation");
    }
    if seg[0] == 0x5f00 {
        // 5f00::/16, SRv6 segment identifiers.
        return Some("segment routing");
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
            // Teredo and the rest of 2001::/23.
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001::1",
            "2001:2::1",
            "2001:20::1",
            "2001:1ff::1",
            "192.88.99.1",
            "192.0.0.170",
            "64:ff9b:1::a00:1",
            "::ffff:0:7f00:1",
            "100::1",
            "100:0:0:1::1",
            "3fff::1",
            "5f00::1",
            "2001:db8::1",
        ] {
            assert!(r(bad).is_some(), "{bad}");
        }
        for ok in [
            "93.184.216.34",
            "1.1.1.1",
            "172.32.0.1",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
            "2001:200::1",
            "2001:4860:4860::8888",
            "2a00:1450::1",
        ] {
            assert_eq!(r(ok), None, "{ok}");
        }
    }
}
