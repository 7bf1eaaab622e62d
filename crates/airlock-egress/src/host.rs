//! Host names and numeric hosts, read strictly.
//!
//! Every place a host reaches the gate (a rule, a DNS question, a proxy request, a SOCKS
//! request, a `Host` header) goes through [`parse_host`], so a numeric form is always an
//! address, never a name: `2130706433`, `0x7f.1`, `0177.0.0.1` and `[::ffff:127.0.0.1]` are
//! 127.0.0.1 (in its v4-mapped form for the last), exactly as the C library and browsers read
//! them (inet_aton and the WHATWG URL host parser), so no spelling of an address can slip past
//! as a name (Deno's numeric-host bypass, denoland/deno PR #33203).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A host as the gate understands it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A numeric host, in any spelling.
    Address(IpAddr),
    /// A DNS name, normalised: lower case, ASCII (punycode), no trailing dot.
    Name(String),
}

/// Why a host text is not a host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HostError(pub String);

/// The longest DNS name in text form, without the trailing dot (RFC 1035 §2.3.4).
const MAX_NAME_LEN: usize = 253;
/// The longest DNS label (RFC 1035 §2.3.4).
const MAX_LABEL_LEN: usize = 63;

/// Reads a host: a bracketed or bare IPv6 address, an IPv4 address in any inet_aton spelling,
/// or a DNS name (normalised to lower-case punycode without a trailing dot).
pub fn parse_host(text: &str) -> Result<Host, HostError> {
    let text = text.trim();
    if let Some(inner) = text.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| HostError(format!("`{text}` opens `[` without closing it")))?;
        return parse_ipv6(inner).map(|ip| Host::Address(IpAddr::V6(ip)));
    }
    if text.contains(':') {
        return parse_ipv6(text).map(|ip| Host::Address(IpAddr::V6(ip)));
    }
    if let Some(ip) = parse_ipv4_any(text)? {
        return Ok(Host::Address(IpAddr::V4(ip)));
    }
    normalize_name(text).map(Host::Name)
}

fn parse_ipv6(text: &str) -> Result<Ipv6Addr, HostError> {
    if text.contains('%') {
        return Err(HostError(format!(
            "`{text}` carries a zone index (`%`); a zone names an interface of this machine, which the sandbox never reaches"
        )));
    }
    text.parse()
        .map_err(|_| HostError(format!("`{text}` is not an IPv6 address")))
}

/// Reads an IPv4 address in every spelling inet_aton and the WHATWG URL parser accept: one to
/// four dot-separated parts, each decimal, octal (leading `0`) or hex (`0x`), the last part
/// filling the remaining bytes. Returns `Ok(None)` when the text is a name; an error when its
/// last label is a number but the whole is no valid address (`1.2.3.4.5`, `0x1g`), because a
/// resolver would treat such text as an address, never as a name.
pub fn parse_ipv4_any(text: &str) -> Result<Option<Ipv4Addr>, HostError> {
    let trimmed = text.strip_suffix('.').unwrap_or(text);
    let parts: Vec<&str> = trimmed.split('.').collect();
    let last = parts.last().copied().unwrap_or_default();
    if !ends_in_number(last) {
        return Ok(None);
    }
    let numbers: Option<Vec<u64>> = parts.iter().map(|part| parse_number(part)).collect();
    let invalid = || {
        HostError(format!(
            "`{text}` ends in a number but is not an IPv4 address"
        ))
    };
    let numbers = numbers.ok_or_else(invalid)?;
    combine_ipv4_parts(&numbers).map(Some).ok_or_else(invalid)
}

/// The WHATWG URL parser's "ends in a number": a last label of decimal digits or `0x` hex
/// makes the whole host an IPv4 address or an error.
fn ends_in_number(last: &str) -> bool {
    let hex = last.strip_prefix("0x").or_else(|| last.strip_prefix("0X"));
    match hex {
        Some(digits) => digits.chars().all(|c| c.is_ascii_hexdigit()),
        None => !last.is_empty() && last.chars().all(|c| c.is_ascii_digit()),
    }
}

fn parse_number(part: &str) -> Option<u64> {
    let (digits, radix) =
        if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (hex, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    if digits.is_empty() {
        // `0x` alone is zero to the WHATWG parser; an empty part is no number.
        return (radix == 16).then_some(0);
    }
    if digits.len() > 20 || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

fn combine_ipv4_parts(numbers: &[u64]) -> Option<Ipv4Addr> {
    let (last, leading) = numbers.split_last()?;
    if numbers.len() > 4 || leading.iter().any(|&n| n > 255) {
        return None;
    }
    let last_bits = 8 * (5 - numbers.len() as u32);
    if last_bits < 64 && *last >= 1u64 << last_bits {
        return None;
    }
    let mut value: u64 = *last;
    for (index, &n) in leading.iter().enumerate() {
        value |= n << (24 - 8 * index as u32);
    }
    Some(Ipv4Addr::from(u32::try_from(value).ok()?))
}

/// Normalises a DNS name: lower case, IDNA (UTS 46) to punycode, no trailing dot, labels of
/// letters, digits, `-` and `_`, no numeric last label (that would be an address).
pub fn normalize_name(text: &str) -> Result<String, HostError> {
    let text = text.strip_suffix('.').unwrap_or(text);
    if text.is_empty() {
        return Err(HostError("the name is empty".into()));
    }
    let ascii = idna::domain_to_ascii(text)
        .map_err(|_| HostError(format!("`{text}` is not a valid internationalised name")))?;
    check_ascii_name(&ascii)?;
    Ok(ascii)
}

fn check_ascii_name(name: &str) -> Result<(), HostError> {
    if name.len() > MAX_NAME_LEN {
        return Err(HostError(format!(
            "`{name}` is longer than {MAX_NAME_LEN} characters"
        )));
    }
    for label in name.split('.') {
        let valid_chars = label
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
        if label.is_empty() || label.len() > MAX_LABEL_LEN || !valid_chars {
            return Err(HostError(format!(
                "`{name}` has an invalid label `{label}` (labels are 1-{MAX_LABEL_LEN} letters, digits, `-` or `_`)"
            )));
        }
    }
    Ok(())
}

/// Splits `host[:port]` where host may be a bracketed IPv6 address. The port is returned as
/// text; `None` when absent.
pub fn split_host_port(text: &str) -> Result<(&str, Option<&str>), HostError> {
    if text.starts_with('[') {
        let close = text
            .find(']')
            .ok_or_else(|| HostError(format!("`{text}` opens `[` without closing it")))?;
        let (host, rest) = text.split_at(close + 1);
        return match rest {
            "" => Ok((host, None)),
            _ => rest
                .strip_prefix(':')
                .map(|port| (host, Some(port)))
                .ok_or_else(|| {
                    HostError(format!("`{text}` has text after `]` that is not `:PORT`"))
                }),
        };
    }
    match text.rsplit_once(':') {
        Some((host, _)) if host.contains(':') => Ok((text, None)),
        Some((host, port)) => Ok((host, Some(port))),
        None => Ok((text, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> IpAddr {
        match parse_host(text) {
            Ok(Host::Address(ip)) => ip,
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn every_inet_aton_spelling_of_loopback_is_an_address() {
        for text in [
            "127.0.0.1",
            "2130706433",
            "0x7f000001",
            "0x7f.1",
            "0177.0.0.1",
            "127.1",
            "127.0.1",
            "0x7F.0.0.1",
            "127.0.0.1.",
            "017700000001",
        ] {
            assert_eq!(addr(text), IpAddr::V4(Ipv4Addr::LOCALHOST), "{text}");
        }
    }

    #[test]
    fn ipv6_forms_are_addresses() {
        assert_eq!(
            addr("[::ffff:127.0.0.1]"),
            "::ffff:127.0.0.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(addr("::1"), "::1".parse::<IpAddr>().unwrap());
        assert!(parse_host("[fe80::1%eth0]").is_err());
        assert!(parse_host("[::1").is_err());
    }

    #[test]
    fn numeric_last_label_that_is_no_address_is_an_error_not_a_name() {
        for text in [
            "1.2.3.4.5",
            "256.1.1.1",
            "0x100000000",
            "example.0x7f",
            "1.2.3.08",
        ] {
            assert!(parse_host(text).is_err(), "{text}");
        }
    }

    #[test]
    fn names_are_normalised() {
        assert_eq!(
            parse_host("API.OpenAI.com.").unwrap(),
            Host::Name("api.openai.com".into())
        );
        assert_eq!(
            parse_host("bücher.example").unwrap(),
            Host::Name("xn--bcher-kva.example".into())
        );
        assert_eq!(
            parse_host("0x7f.example").unwrap(),
            Host::Name("0x7f.example".into())
        );
        for bad in ["", "a..b", "exa mple.com", "a/b", &"a".repeat(64)] {
            assert!(parse_host(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn host_port_split() {
        assert_eq!(
            split_host_port("a.com:443").unwrap(),
            ("a.com", Some("443"))
        );
        assert_eq!(split_host_port("[::1]:80").unwrap(), ("[::1]", Some("80")));
        assert_eq!(split_host_port("[::1]").unwrap(), ("[::1]", None));
        assert_eq!(split_host_port("::1").unwrap(), ("::1", None));
        assert!(split_host_port("[::1]x").is_err());
    }
}
