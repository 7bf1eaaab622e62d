//! Address classes: which addresses are globally routable, and which are not.
//!
//! The gate refuses every address that is not public unicast unless an explicit `allow` range
//! covers it (see [`crate::rules::RuleSet::exempts`]). The list follows smokescreen's
//! classifier and the IANA special-purpose registries, including every IPv6 form that embeds
//! an IPv4 address (so `::ffff:127.0.0.1` or `64:ff9b::a9fe:a9fe` cannot smuggle a private
//! IPv4 target through an IPv6 literal).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

/// The class of an address. Everything but [`AddressClass::Public`] is refused unless
/// explicitly allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AddressClass {
    /// Globally routable unicast.
    Public,
    /// 0.0.0.0/8 and `::`: "this network", never a destination.
    Unspecified,
    /// 127.0.0.0/8 and `::1`.
    Loopback,
    /// RFC 1918: 10/8, 172.16/12, 192.168/16.
    Private,
    /// 100.64.0.0/10, carrier-grade NAT.
    SharedCgnat,
    /// 169.254.0.0/16 (cloud metadata at 169.254.169.254 included) and fe80::/10.
    LinkLocal,
    /// 192.0.0.0/24 and 2001::/23 (IETF protocol assignments, Teredo excluded).
    ProtocolAssignment,
    /// 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32, 3fff::/20.
    Documentation,
    /// 198.18.0.0/15 and 2001:2::/48.
    Benchmarking,
    /// 240.0.0.0/4 (255.255.255.255 included) and IPv6 outside 2000::/3 not listed above.
    Reserved,
    /// 224.0.0.0/4 and ff00::/8.
    Multicast,
    /// 192.88.99.0/24, the deprecated 6to4 relay anycast.
    Relay6to4,
    /// fc00::/7, unique local IPv6.
    UniqueLocal,
    /// fec0::/10, deprecated site-local IPv6.
    SiteLocal,
    /// ::ffff:0:0/96, an IPv4 address in IPv6 clothing.
    V4Mapped,
    /// ::/96 (except `::` and `::1`), the deprecated IPv4-compatible form.
    V4Compatible,
    /// 64:ff9b::/96 and 64:ff9b:1::/48, NAT64.
    Nat64,
    /// 2002::/16, 6to4.
    SixToFour,
    /// 2001::/32, Teredo.
    Teredo,
    /// 100::/64, the discard prefix.
    Discard,
    /// An address of the machine running the gate.
    OwnAddress,
}

impl AddressClass {
    /// True for globally routable unicast.
    pub fn is_public(self) -> bool {
        self == AddressClass::Public
    }
}

/// The range and class of every special-purpose IPv4 block.
const V4_CLASSES: &[(Ipv4Addr, u8, AddressClass)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8, AddressClass::Unspecified),
    (Ipv4Addr::new(10, 0, 0, 0), 8, AddressClass::Private),
    (Ipv4Addr::new(100, 64, 0, 0), 10, AddressClass::SharedCgnat),
    (Ipv4Addr::new(127, 0, 0, 0), 8, AddressClass::Loopback),
    (Ipv4Addr::new(169, 254, 0, 0), 16, AddressClass::LinkLocal),
    (Ipv4Addr::new(172, 16, 0, 0), 12, AddressClass::Private),
    (
        Ipv4Addr::new(192, 0, 0, 0),
        24,
        AddressClass::ProtocolAssignment,
    ),
    (Ipv4Addr::new(192, 0, 2, 0), 24, AddressClass::Documentation),
    (Ipv4Addr::new(192, 88, 99, 0), 24, AddressClass::Relay6to4),
    (Ipv4Addr::new(192, 168, 0, 0), 16, AddressClass::Private),
    (Ipv4Addr::new(198, 18, 0, 0), 15, AddressClass::Benchmarking),
    (
        Ipv4Addr::new(198, 51, 100, 0),
        24,
        AddressClass::Documentation,
    ),
    (
        Ipv4Addr::new(203, 0, 113, 0),
        24,
        AddressClass::Documentation,
    ),
    (Ipv4Addr::new(224, 0, 0, 0), 4, AddressClass::Multicast),
    (Ipv4Addr::new(240, 0, 0, 0), 4, AddressClass::Reserved),
];

/// The range and class of every special-purpose IPv6 block, most specific first.
const V6_CLASSES: &[(Ipv6Addr, u8, AddressClass)] = &[
    (
        Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 0),
        128,
        AddressClass::Unspecified,
    ),
    (
        Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 1),
        128,
        AddressClass::Loopback,
    ),
    (
        Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0),
        96,
        AddressClass::V4Mapped,
    ),
    (
        Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 0),
        96,
        AddressClass::V4Compatible,
    ),
    (
        Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0),
        96,
        AddressClass::Nat64,
    ),
    (
        Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0),
        48,
        AddressClass::Nat64,
    ),
    (
        Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0),
        64,
        AddressClass::Discard,
    ),
    (
        Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0),
        32,
        AddressClass::Teredo,
    ),
    (
        Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 0),
        48,
        AddressClass::Benchmarking,
    ),
    (
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0),
        32,
        AddressClass::Documentation,
    ),
    (
        Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0),
        23,
        AddressClass::ProtocolAssignment,
    ),
    (
        Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0),
        16,
        AddressClass::SixToFour,
    ),
    (
        Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0),
        20,
        AddressClass::Documentation,
    ),
    (
        Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0),
        7,
        AddressClass::UniqueLocal,
    ),
    (
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0),
        10,
        AddressClass::LinkLocal,
    ),
    (
        Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0),
        10,
        AddressClass::SiteLocal,
    ),
    (
        Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0),
        8,
        AddressClass::Multicast,
    ),
];

/// The class of an address, and the special-purpose range that gives it that class (`None`
/// for public addresses; the /3 block for reserved IPv6 outside 2000::/3).
pub fn classify(ip: IpAddr) -> (AddressClass, Option<IpNet>) {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> (AddressClass, Option<IpNet>) {
    for &(base, len, class) in V4_CLASSES {
        let net = Ipv4Net::new(base, len).expect("valid table prefix");
        if net.contains(&ip) {
            return (class, Some(IpNet::V4(net)));
        }
    }
    (AddressClass::Public, None)
}

fn classify_v6(ip: Ipv6Addr) -> (AddressClass, Option<IpNet>) {
    for &(base, len, class) in V6_CLASSES {
        let net = Ipv6Net::new(base, len).expect("valid table prefix");
        if net.contains(&ip) {
            return (class, Some(IpNet::V6(net)));
        }
    }
    let block = Ipv6Net::new(ip, 3).expect("valid prefix").trunc();
    if block.addr() == Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0) {
        (AddressClass::Public, None)
    } else {
        (AddressClass::Reserved, Some(IpNet::V6(block)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(text: &str) -> AddressClass {
        classify(text.parse().unwrap()).0
    }

    #[test]
    fn every_non_public_form_of_the_issue_is_refused() {
        let cases = [
            ("127.0.0.1", AddressClass::Loopback),
            ("10.1.2.3", AddressClass::Private),
            ("172.31.255.255", AddressClass::Private),
            ("192.168.1.1", AddressClass::Private),
            ("169.254.169.254", AddressClass::LinkLocal),
            ("100.64.0.1", AddressClass::SharedCgnat),
            ("0.0.0.0", AddressClass::Unspecified),
            ("0.1.2.3", AddressClass::Unspecified),
            ("240.0.0.1", AddressClass::Reserved),
            ("255.255.255.255", AddressClass::Reserved),
            ("224.0.0.251", AddressClass::Multicast),
            ("198.18.0.1", AddressClass::Benchmarking),
            ("198.19.255.255", AddressClass::Benchmarking),
            ("192.0.2.1", AddressClass::Documentation),
            ("198.51.100.1", AddressClass::Documentation),
            ("203.0.113.1", AddressClass::Documentation),
            ("192.0.0.8", AddressClass::ProtocolAssignment),
            ("::1", AddressClass::Loopback),
            ("::", AddressClass::Unspecified),
            ("fd00::1", AddressClass::UniqueLocal),
            ("fe80::1", AddressClass::LinkLocal),
            ("ff02::1", AddressClass::Multicast),
            ("::ffff:127.0.0.1", AddressClass::V4Mapped),
            ("::ffff:8.8.8.8", AddressClass::V4Mapped),
            ("::127.0.0.1", AddressClass::V4Compatible),
            ("64:ff9b::a9fe:a9fe", AddressClass::Nat64),
            ("64:ff9b:1::1", AddressClass::Nat64),
            ("2002:7f00:1::", AddressClass::SixToFour),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", AddressClass::Teredo),
            ("2001:db8::1", AddressClass::Documentation),
            ("3fff::1", AddressClass::Documentation),
            ("2001:2::1", AddressClass::Benchmarking),
            ("100::1", AddressClass::Discard),
            ("fec0::1", AddressClass::SiteLocal),
            ("4000::1", AddressClass::Reserved),
        ];
        for (text, expected) in cases {
            assert_eq!(class(text), expected, "{text}");
            assert!(!class(text).is_public(), "{text}");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for text in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "2a00:1450::1",
        ] {
            assert_eq!(class(text), AddressClass::Public, "{text}");
        }
    }
}
