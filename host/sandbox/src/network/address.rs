//! Which IP addresses are not the public internet: loopback, private networks, link-local (where
//! cloud metadata services answer), carrier-grade NAT, multicast, unspecified, broadcast,
//! documentation and reserved ranges, and their IPv6 equivalents. IPv6 addresses that embed an
//! IPv4 address (IPv4-mapped, IPv4-compatible, NAT64, 6to4, Teredo) are judged by the address
//! they embed, so `[::ffff:127.0.0.1]` is loopback. Pure functions, no I/O.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is not on the public internet, as words for a refusal message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecialRange {
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`, `fc00::/7`.
    Private,
    /// `169.254.0.0/16`, `fe80::/10`: link-local, where cloud metadata services live.
    LinkLocal,
    /// `100.64.0.0/10`: carrier-grade NAT.
    CarrierGradeNat,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `0.0.0.0/8`, `::`.
    Unspecified,
    /// `255.255.255.255`.
    Broadcast,
    /// `192.0.2.0/24`, `198.51.100.0/24`, `203.0.113.0/24`, `2001:db8::/32`.
    Documentation,
    /// Ranges reserved for protocols, benchmarks or future use (`192.0.0.0/24`, `198.18.0.0/15`,
    /// `240.0.0.0/4`, `100::/64`, `fec0::/10`, local-use NAT64 and the like).
    Reserved,
}

impl SpecialRange {
    /// A phrase for messages, e.g. "a loopback address (this machine)".
    pub fn describe(self) -> &'static str {
        match self {
            SpecialRange::Loopback => "a loopback address (this machine)",
            SpecialRange::Private => "a private-network address",
            SpecialRange::LinkLocal => {
                "a link-local address (cloud metadata services such as 169.254.169.254 live there)"
            }
            SpecialRange::CarrierGradeNat => "a carrier-grade NAT address",
            SpecialRange::Multicast => "a multicast address",
            SpecialRange::Unspecified => "an unspecified address (0.0.0.0 or ::)",
            SpecialRange::Broadcast => "the broadcast address",
            SpecialRange::Documentation => "a documentation-only address",
            SpecialRange::Reserved => "a reserved address",
        }
    }
}

/// The canonical form of an address for comparisons: an IPv4-mapped IPv6 address
/// (`::ffff:a.b.c.d`) becomes the IPv4 address it maps.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// The special range `ip` lies in, or `None` for an ordinary public address.
pub fn special_range(ip: IpAddr) -> Option<SpecialRange> {
    match ip {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    }
}

/// Whether `ip` is a loopback address, including IPv4 loopback embedded in IPv6.
pub fn is_loopback(ip: IpAddr) -> bool {
    special_range(ip) == Some(SpecialRange::Loopback)
}

fn in_v4(ip: Ipv4Addr, network: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(network)) & mask
}

fn special_v4(ip: Ipv4Addr) -> Option<SpecialRange> {
    use SpecialRange::*;
    const TABLE: &[([u8; 4], u32, SpecialRange)] = &[
        ([0, 0, 0, 0], 8, Unspecified),
        ([10, 0, 0, 0], 8, Private),
        ([100, 64, 0, 0], 10, CarrierGradeNat),
        ([127, 0, 0, 0], 8, Loopback),
        ([169, 254, 0, 0], 16, LinkLocal),
        ([172, 16, 0, 0], 12, Private),
        ([192, 0, 0, 0], 24, Reserved),
        ([192, 0, 2, 0], 24, Documentation),
        ([192, 88, 99, 0], 24, Reserved),
        ([192, 168, 0, 0], 16, Private),
        ([198, 18, 0, 0], 15, Reserved),
        ([198, 51, 100, 0], 24, Documentation),
        ([203, 0, 113, 0], 24, Documentation),
        ([224, 0, 0, 0], 4, Multicast),
        ([255, 255, 255, 255], 32, Broadcast),
        ([240, 0, 0, 0], 4, Reserved),
    ];
    TABLE
        .iter()
        .find(|(network, prefix, _)| in_v4(ip, *network, *prefix))
        .map(|(_, _, range)| *range)
}

fn in_v6(ip: Ipv6Addr, network: [u16; 8], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    };
    u128::from(ip) & mask == u128::from(Ipv6Addr::from(network)) & mask
}

fn special_v6(ip: Ipv6Addr) -> Option<SpecialRange> {
    use SpecialRange::*;
    let bits = u128::from(ip);
    if ip.is_unspecified() {
        return Some(Unspecified);
    }
    if ip.is_loopback() {
        return Some(Loopback);
    }
    // IPv4-mapped (::ffff:0:0/96) and the deprecated IPv4-compatible (::/96) forms reach the
    // embedded IPv4 address on a dual-stack host.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return special_v4(v4);
    }
    if bits >> 32 == 0 {
        return special_v4(Ipv4Addr::from(bits as u32));
    }
    // NAT64 well-known prefix 64:ff9b::/96 translates to the embedded IPv4 address.
    if in_v6(ip, [0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96) {
        return special_v4(Ipv4Addr::from(bits as u32));
    }
    // 6to4 (2002::/16) and Teredo (2001::/32) are tunnels that no public site is served from;
    // they are refused, as the embedded address where it is special, else as reserved.
    // 6to4 embeds an IPv4 address in bits 16..48.
    if in_v6(ip, [0x2002, 0, 0, 0, 0, 0, 0, 0], 16) {
        let embedded = Ipv4Addr::from((bits >> 80) as u32);
        return special_v4(embedded).or(Some(Reserved));
    }
    // Teredo embeds the client's IPv4 address, inverted, in the last 32 bits.
    if in_v6(ip, [0x2001, 0, 0, 0, 0, 0, 0, 0], 32) {
        let embedded = Ipv4Addr::from(!(bits as u32));
        return special_v4(embedded).or(Some(Reserved));
    }
    const TABLE: &[([u16; 8], u32, SpecialRange)] = &[
        ([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, Reserved),
        ([0x100, 0, 0, 0, 0, 0, 0, 0], 64, Reserved),
        ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, Documentation),
        ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, Documentation),
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, Private),
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, LinkLocal),
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, Reserved),
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, Multicast),
    ];
    TABLE
        .iter()
        .find(|(network, prefix, _)| in_v6(ip, *network, *prefix))
        .map(|(_, _, range)| *range)
}

#[cfg(test)]
mod tests {
    use super::*;
    use SpecialRange::*;

    fn range(text: &str) -> Option<SpecialRange> {
        special_range(text.parse().unwrap())
    }

    #[test]
    fn ipv4_ranges() {
        for (ip, expected) in [
            ("127.0.0.1", Some(Loopback)),
            ("127.255.255.254", Some(Loopback)),
            ("10.1.2.3", Some(Private)),
            ("172.16.0.1", Some(Private)),
            ("172.31.255.255", Some(Private)),
            ("172.32.0.1", None),
            ("192.168.1.1", Some(Private)),
            ("169.254.169.254", Some(LinkLocal)),
            ("100.64.0.1", Some(CarrierGradeNat)),
            ("100.127.255.255", Some(CarrierGradeNat)),
            ("100.128.0.1", None),
            ("224.0.0.251", Some(Multicast)),
            ("239.255.255.250", Some(Multicast)),
            ("0.0.0.0", Some(Unspecified)),
            ("0.1.2.3", Some(Unspecified)),
            ("255.255.255.255", Some(Broadcast)),
            ("192.0.2.10", Some(Documentation)),
            ("198.51.100.7", Some(Documentation)),
            ("203.0.113.9", Some(Documentation)),
            ("198.18.0.1", Some(Reserved)),
            ("240.0.0.1", Some(Reserved)),
            ("192.0.0.170", Some(Reserved)),
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("93.184.215.14", None),
        ] {
            assert_eq!(range(ip), expected, "{ip}");
        }
    }

    #[test]
    fn ipv6_ranges() {
        for (ip, expected) in [
            ("::1", Some(Loopback)),
            ("::", Some(Unspecified)),
            ("::ffff:127.0.0.1", Some(Loopback)),
            ("::ffff:169.254.169.254", Some(LinkLocal)),
            ("::ffff:10.0.0.1", Some(Private)),
            ("::ffff:8.8.8.8", None),
            ("::127.0.0.1", Some(Loopback)),
            ("::10.0.0.1", Some(Private)),
            ("64:ff9b::7f00:1", Some(Loopback)),
            ("64:ff9b::a9fe:a9fe", Some(LinkLocal)),
            ("64:ff9b::808:808", None),
            ("64:ff9b:1::1", Some(Reserved)),
            ("2002:7f00:1::", Some(Loopback)),
            ("2002:0808:0808::1", Some(Reserved)),
            ("2001:0:4136:e378:8000:63bf:80ff:fffe", Some(Loopback)),
            ("fc00::1", Some(Private)),
            ("fd12:3456::1", Some(Private)),
            ("fe80::1", Some(LinkLocal)),
            ("febf::1", Some(LinkLocal)),
            ("fec0::1", Some(Reserved)),
            ("ff02::1", Some(Multicast)),
            ("2001:db8::1", Some(Documentation)),
            ("100::1", Some(Reserved)),
            ("2606:4700:4700::1111", None),
            ("2a00:1450:4001:80b::200e", None),
        ] {
            assert_eq!(range(ip), expected, "{ip}");
        }
    }

    #[test]
    fn mapped_addresses_compare_as_ipv4() {
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(canonical(mapped), "127.0.0.1".parse::<IpAddr>().unwrap());
        let plain: IpAddr = "::1".parse().unwrap();
        assert_eq!(canonical(plain), plain);
        assert!(is_loopback(mapped));
    }
}
