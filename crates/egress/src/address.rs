//! Destination names and addresses: canonical host parsing (every IPv4 spelling that
//! `inet_aton` accepts is an address, not a name) and the hard block, which refuses loopback,
//! link-local, private, shared, multicast and reserved ranges, including IPv4 addresses carried
//! inside IPv6 (mapped, compatible, translated, NAT64, 6to4).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A destination as the proxy understands it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name: lower-case ASCII, no trailing dot.
    Name(String),
    /// An address literal, whatever spelling the client used.
    Ip(IpAddr),
}

impl Host {
    /// The form rules and audit lines use: the name, or the address in standard notation
    /// (IPv6 without brackets).
    pub fn canonical(&self) -> String {
        match self {
            Host::Name(name) => name.clone(),
            Host::Ip(ip) => ip.to_string(),
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AddressError {
    #[error("the host is empty")]
    Empty,
    #[error("the host is longer than 253 characters")]
    TooLong,
    #[error("the host contains {0:?}, which no DNS name or address may contain")]
    BadCharacter(char),
    #[error("the host has an empty label")]
    EmptyLabel,
    #[error("a label of the host is longer than 63 characters")]
    LabelTooLong,
    #[error("the host ends in a number but is not a valid IPv4 address")]
    BadIpv4,
    #[error("the bracketed host is not a valid IPv6 address (zone ids are not accepted)")]
    BadIpv6,
}

/// Parses a host as a client wrote it (in a CONNECT target, a URL or a `Host` header, without
/// the port). Names are lower-cased and lose one trailing dot. Anything whose last label looks
/// numeric must be an IPv4 address in one of the `inet_aton` forms (`2852039166`, `0xa9fea9fe`,
/// `0251.0376.0251.0376`, `169.254.43518`, `127.1`), as the WHATWG URL standard requires;
/// otherwise it would be a name that the system resolver turns into that very address.
pub fn parse_host(raw: &str) -> Result<Host, AddressError> {
    if let Some(inner) = raw.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or(AddressError::BadIpv6)?;
        return inner
            .parse::<Ipv6Addr>()
            .map(|ip| Host::Ip(IpAddr::V6(ip)))
            .map_err(|_| AddressError::BadIpv6);
    }
    if raw.contains(':') {
        // Unbracketed IPv6 (a TLS server name never has one; a CONNECT target must bracket).
        return raw
            .parse::<Ipv6Addr>()
            .map(|ip| Host::Ip(IpAddr::V6(ip)))
            .map_err(|_| AddressError::BadIpv6);
    }
    let lower = raw.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    if name.is_empty() {
        return Err(AddressError::Empty);
    }
    if name.len() > 253 {
        return Err(AddressError::TooLong);
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '.' || *c == '_'))
    {
        return Err(AddressError::BadCharacter(bad));
    }
    let labels: Vec<&str> = name.split('.').collect();
    if labels.iter().any(|label| label.is_empty()) {
        return Err(AddressError::EmptyLabel);
    }
    if labels.iter().any(|label| label.len() > 63) {
        return Err(AddressError::LabelTooLong);
    }
    let last = labels.last().copied().unwrap_or_default();
    if looks_numeric(last) {
        return parse_ipv4_loose(&labels)
            .map(|ip| Host::Ip(IpAddr::V4(ip)))
            .ok_or(AddressError::BadIpv4);
    }
    Ok(Host::Name(name.to_owned()))
}

fn looks_numeric(label: &str) -> bool {
    match label.strip_prefix("0x") {
        Some(hex) => hex.chars().all(|c| c.is_ascii_hexdigit()),
        None => label.chars().all(|c| c.is_ascii_digit()),
    }
}

/// One `inet_aton` part: `0x` hex, leading-`0` octal, or decimal.
fn parse_part(part: &str) -> Option<u64> {
    if let Some(hex) = part.strip_prefix("0x") {
        if hex.is_empty() {
            return Some(0);
        }
        return u64::from_str_radix(hex, 16).ok();
    }
    if part.len() > 1 && part.starts_with('0') {
        return u64::from_str_radix(&part[1..], 8).ok();
    }
    part.parse::<u64>().ok()
}

/// `a`, `a.b` (8.24 bits), `a.b.c` (8.8.16) or `a.b.c.d`.
fn parse_ipv4_loose(labels: &[&str]) -> Option<Ipv4Addr> {
    if labels.is_empty() || labels.len() > 4 {
        return None;
    }
    let parts = labels
        .iter()
        .map(|label| parse_part(label))
        .collect::<Option<Vec<u64>>>()?;
    let (leading, last) = parts.split_at(parts.len() - 1);
    let mut value: u64 = 0;
    for (index, part) in leading.iter().enumerate() {
        if *part > 255 {
            return None;
        }
        value |= part << (24 - 8 * index);
    }
    let last_bits = 8 * (5 - parts.len()) as u32;
    let last = *last.first()?;
    if last >= 1u64 << last_bits {
        return None;
    }
    value |= last;
    u32::try_from(value).ok().map(Ipv4Addr::from)
}

/// Why an address may not be reached from a sandbox, or `None` when it may.
pub fn blocked_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(ip) => blocked_v4(ip),
        IpAddr::V6(ip) => blocked_v6(ip),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn blocked_v4(ip: Ipv4Addr) -> Option<&'static str> {
    const RANGES: &[([u8; 4], u32, &str)] = &[
        ([0, 0, 0, 0], 8, "unspecified"),
        ([10, 0, 0, 0], 8, "private"),
        ([100, 64, 0, 0], 10, "shared address space"),
        ([127, 0, 0, 0], 8, "loopback"),
        ([169, 254, 0, 0], 16, "link-local"),
        ([172, 16, 0, 0], 12, "private"),
        ([192, 0, 0, 0], 24, "reserved"),
        ([192, 0, 2, 0], 24, "documentation"),
        ([192, 88, 99, 0], 24, "reserved"),
        ([192, 168, 0, 0], 16, "private"),
        ([198, 18, 0, 0], 15, "reserved"),
        ([198, 51, 100, 0], 24, "documentation"),
        ([203, 0, 113, 0], 24, "documentation"),
        ([224, 0, 0, 0], 4, "multicast"),
        ([240, 0, 0, 0], 4, "reserved"),
    ];
    RANGES
        .iter()
        .find(|(net, prefix, _)| in_v4(ip, *net, *prefix))
        .map(|(_, _, why)| *why)
}

fn in_v6(ip: Ipv6Addr, net: Ipv6Addr, prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    };
    u128::from(ip) & mask == u128::from(net) & mask
}

fn embedded_v4(bits: u128) -> Ipv4Addr {
    Ipv4Addr::from((bits & 0xffff_ffff) as u32)
}

fn blocked_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let bits = u128::from(ip);
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    // Forms that carry an IPv4 address: judge the IPv4 address, and refuse the form itself
    // when it can only be a trick (compatible and translated addresses are obsolete).
    let v6 = |s: &str| s.parse::<Ipv6Addr>().unwrap_or(Ipv6Addr::UNSPECIFIED);
    if in_v6(ip, v6("::ffff:0:0"), 96) {
        return blocked_v4(embedded_v4(bits));
    }
    if in_v6(ip, v6("::"), 96) {
        return Some("IPv4-compatible");
    }
    if in_v6(ip, v6("::ffff:0:0:0"), 96) {
        return Some("IPv4-translated");
    }
    if in_v6(ip, v6("64:ff9b::"), 96) {
        return blocked_v4(embedded_v4(bits));
    }
    if in_v6(ip, v6("2002::"), 16) {
        return blocked_v4(Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32));
    }
    const RANGES: &[(&str, u32, &str)] = &[
        ("64:ff9b:1::", 48, "local NAT64"),
        ("100::", 64, "discard-only"),
        ("2001::", 32, "Teredo"),
        ("2001:db8::", 32, "documentation"),
        ("fc00::", 7, "private (unique local)"),
        ("fe80::", 10, "link-local"),
        ("fec0::", 10, "site-local"),
        ("ff00::", 8, "multicast"),
    ];
    RANGES
        .iter()
        .find(|(net, prefix, _)| in_v6(ip, v6(net), *prefix))
        .map(|(_, _, why)| *why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(raw: &str) -> IpAddr {
        match parse_host(raw) {
            Ok(Host::Ip(ip)) => ip,
            other => panic!("{raw}: {other:?}"),
        }
    }

    #[test]
    fn test_every_inet_aton_spelling_is_an_address() {
        let metadata: IpAddr = "169.254.169.254".parse().unwrap();
        for raw in [
            "169.254.169.254",
            "2852039166",
            "0xa9fea9fe",
            "0XA9FEA9FE",
            "0251.0376.0251.0376",
            "0xa9.0xfe.0xa9.0xfe",
            "169.254.43518",
            "169.16689662",
            "169.254.169.254.",
            "[::ffff:169.254.169.254]",
        ] {
            let parsed = ip(raw);
            let v4 = match parsed {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap(),
                other => other,
            };
            assert_eq!(v4, metadata, "{raw}");
        }
        assert_eq!(ip("127.1"), "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(ip("0x7f.1"), "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(ip("0"), "0.0.0.0".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn test_names_ending_in_a_bad_number_are_refused() {
        assert_eq!(parse_host("foo.123"), Err(AddressError::BadIpv4));
        assert_eq!(parse_host("1.2.3.4.5"), Err(AddressError::BadIpv4));
        assert_eq!(parse_host("256.1.1.1"), Err(AddressError::BadIpv4));
        assert_eq!(parse_host("08.1.1.1"), Err(AddressError::BadIpv4));
        assert_eq!(parse_host("[fe80::1%25eth0]"), Err(AddressError::BadIpv6));
        assert_eq!(parse_host("a b"), Err(AddressError::BadCharacter(' ')));
        assert_eq!(parse_host("a..b"), Err(AddressError::EmptyLabel));
        assert_eq!(parse_host(""), Err(AddressError::Empty));
    }

    #[test]
    fn test_names_are_lower_cased_without_trailing_dot() {
        assert_eq!(
            parse_host("API.Example.COM."),
            Ok(Host::Name("api.example.com".into()))
        );
        assert_eq!(
            parse_host("1a.example"),
            Ok(Host::Name("1a.example".into()))
        );
    }

    #[test]
    fn test_the_hard_block_covers_every_internal_range() {
        for raw in [
            "127.0.0.1",
            "0.0.0.0",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.100.100.200",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:a9fe:a9fe",
            "::169.254.169.254",
            "::ffff:0:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::7f00:1",
            "2002:a9fe:a9fe::1",
            "2002:7f00:1::",
            "fd00:ec2::254",
            "fe80::1",
            "ff02::1",
            "2001::1",
        ] {
            let parsed: IpAddr = raw.parse().unwrap();
            assert!(blocked_reason(parsed).is_some(), "{raw} must be blocked");
        }
        for raw in [
            "93.184.216.34",
            "2606:4700::1111",
            "::ffff:93.184.216.34",
            "64:ff9b::5db8:d822",
        ] {
            let parsed: IpAddr = raw.parse().unwrap();
            assert_eq!(blocked_reason(parsed), None, "{raw} must be allowed");
        }
    }
}
