//! Hosts, addresses, ranges, methods and path globs of the network sections: validation and
//! the containment tests the prover needs. Every test here errs towards "not covered", so a
//! prover built on them may over-report a widening but never miss one.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The methods a rule may name.
pub const METHODS: &[&str] = &["GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"];
/// The `read-only` preset.
pub const READ_ONLY_METHODS: &[&str] = &["GET", "HEAD", "OPTIONS"];

/// What a host field names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKind {
    Name,
    /// `*.example.com`.
    Wildcard,
    Ip(IpAddr),
}

/// Checks a host pattern: a lower-case DNS name, `*.` and a name of at least two labels, or an
/// IP address in its standard form. Numeric forms that resolvers also accept (`2130706433`,
/// `0x7f.1`, `127.1`) are refused, since they hide what they reach.
pub fn check_host(host: &str) -> Result<HostKind, String> {
    if host.is_empty() {
        return Err("empty host".into());
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(HostKind::Ip(ip));
    }
    if host.contains(':') && !host.contains('/') && host.matches(':').count() == 1 {
        return Err("a host has no port; list ports in `ports`".into());
    }
    if host == "*" || host == "*." {
        return Err("`*` matches every host; name a domain or `*.example.com`".into());
    }
    let (kind, name) = match host.strip_prefix("*.") {
        Some(rest) => (HostKind::Wildcard, rest),
        None => (HostKind::Name, host),
    };
    if name.contains('*') {
        return Err("`*` may only be the whole first label, as in `*.example.com`".into());
    }
    if name.ends_with('.') {
        return Err("remove the trailing dot".into());
    }
    if name.len() > 253 {
        return Err("longer than 253 characters".into());
    }
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        if label.is_empty() || label.len() > 63 {
            return Err(format!("`{host}` has an empty or over-long label"));
        }
        if !label
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(format!(
                "`{host}`: a host name has only lower-case letters, digits, `-` and `.`"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("`{host}`: a label cannot start or end with `-`"));
        }
    }
    if labels.iter().all(|l| looks_numeric(l)) || labels.last().is_some_and(|l| looks_numeric(l)) {
        return Err(format!(
            "`{host}` looks like an IP address in a non-standard form; write a.b.c.d"
        ));
    }
    if kind == HostKind::Wildcard && labels.len() < 2 {
        return Err(format!(
            "`{host}` covers a whole top-level domain; a wildcard needs at least two labels below it"
        ));
    }
    Ok(kind)
}

fn looks_numeric(label: &str) -> bool {
    label.chars().all(|c| c.is_ascii_digit())
        || label
            .strip_prefix("0x")
            .is_some_and(|hex| hex.chars().all(|c| c.is_ascii_hexdigit()))
}

/// The blocked range `ip` falls in, if any: what the proxy refuses after DNS resolution.
/// IPv6 forms that embed an IPv4 address (mapped, compatible, NAT64, 6to4) are judged by it.
pub fn blocked_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => blocked_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_v4(v6) {
                return blocked_v4(v4);
            }
            let first = v6.segments()[0];
            if v6.is_loopback() {
                Some("loopback")
            } else if v6.is_unspecified() {
                Some("unspecified")
            } else if first & 0xffc0 == 0xfe80 || first & 0xffc0 == 0xfec0 {
                Some("link-local")
            } else if first & 0xfe00 == 0xfc00 {
                Some("private")
            } else if first & 0xff00 == 0xff00 {
                Some("multicast")
            } else {
                None
            }
        }
    }
}

fn blocked_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_link_local() {
        Some("link-local")
    } else if ip.is_private() || (a == 100 && b & 0xc0 == 64) {
        Some("private")
    } else if ip.is_multicast() {
        Some("multicast")
    } else if a == 0 {
        Some("unspecified")
    } else if ip.is_broadcast() || a >= 240 {
        Some("reserved")
    } else {
        None
    }
}

fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    if s[..6] == [0; 6] && !ip.is_loopback() && !ip.is_unspecified() {
        return Some(low); // IPv4-compatible (deprecated)
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(low); // NAT64
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        )); // 6to4
    }
    None
}

/// An address range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    /// Parses `10.0.0.0/8` or a single address. Host bits must be zero.
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("`{text}` is not an address range such as 10.20.0.0/16"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("`{text}`: the prefix length must be 0 to {max}"))?,
        };
        let cidr = Cidr { addr, prefix };
        if cidr.network() != bits(addr) {
            return Err(format!("`{text}` has host bits set below /{prefix}"));
        }
        Ok(cidr)
    }

    fn mask(&self) -> u128 {
        let width = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.prefix == 0 {
            0
        } else {
            (u128::MAX << (width - u32::from(self.prefix))) & width_mask(width)
        }
    }

    fn network(&self) -> u128 {
        bits(self.addr) & self.mask()
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.addr.is_ipv4() && bits(ip) & self.mask() == self.network()
    }

    /// Whether every address of `other` is in this range.
    pub fn covers(&self, other: &Cidr) -> bool {
        other.prefix >= self.prefix && self.contains(other.addr)
    }

    /// The blocked range the whole of this range lies in (`private`, `link-local`), or why it
    /// may not be listed.
    pub fn exception_class(&self) -> Result<&'static str, String> {
        let first = self.addr;
        let last = from_bits(
            self.network() | !self.mask() & width_mask(self.width()),
            first,
        );
        match (blocked_range(first), blocked_range(last)) {
            (Some(a), Some(b)) if a == b && (a == "private" || a == "link-local") => Ok(a),
            (Some("loopback" | "unspecified" | "multicast" | "reserved"), _) => Err(format!(
                "{self} is {}; it can never be allowed",
                blocked_range(first).unwrap_or("blocked")
            )),
            (None, None) => Err(format!(
                "{self} is not a private or link-local range; public addresses need no exception"
            )),
            _ => Err(format!(
                "{self} spans several kinds of range; list private or link-local ranges only"
            )),
        }
    }

    fn width(&self) -> u32 {
        if self.addr.is_ipv4() { 32 } else { 128 }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn width_mask(width: u32) -> u128 {
    if width == 128 {
        u128::MAX
    } else {
        (1u128 << width) - 1
    }
}

fn bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn from_bits(value: u128, like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(value as u32)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

/// Whether host pattern `outer` matches every name `inner` (a name or pattern) matches.
pub fn host_covers(outer: &str, inner: &str) -> bool {
    if outer == inner {
        return true;
    }
    match outer.strip_prefix("*.") {
        Some(suffix) => {
            let inner = inner.strip_prefix("*.").unwrap_or(inner);
            inner.len() > suffix.len() && inner.ends_with(&format!(".{suffix}"))
        }
        None => false,
    }
}

/// One concrete name a host pattern matches.
pub fn host_example(pattern: &str) -> String {
    match pattern.strip_prefix("*.") {
        Some(suffix) => format!("x.{suffix}"),
        None => pattern.to_owned(),
    }
}

/// Checks an HTTP path glob: absolute, printable, `**` only as a whole segment.
pub fn check_http_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("path `{path}` must start with `/`"));
    }
    if path
        .chars()
        .any(|c| c.is_control() || c.is_whitespace() || c == '?' || c == '#')
    {
        return Err(format!(
            "path `{path}` has a space, control character, `?` or `#`"
        ));
    }
    if path
        .split('/')
        .any(|segment| segment.contains("**") && segment != "**")
    {
        return Err(format!(
            "path `{path}`: `**` must be a whole segment (`/a/**`)"
        ));
    }
    Ok(())
}

/// Checks a git ref glob of `git_push_refs`: a full ref name (`refs/heads/main`) as
/// `git check-ref-format` allows it, where `*` matches within a segment and `**` whole
/// segments.
pub fn check_git_ref_glob(glob: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("git ref `{glob}` {why}"));
    if !glob.starts_with("refs/") {
        return bad("must be a full ref name starting with `refs/` (refs/heads/NAME)");
    }
    if glob.chars().any(|c| {
        c.is_control() || c.is_whitespace() || matches!(c, '~' | '^' | ':' | '?' | '[' | '\\')
    }) {
        return bad("has a space, control character or one of ~ ^ : ? [ \\");
    }
    if glob.contains("..") || glob.contains("@{") || glob.ends_with(".lock") {
        return bad("has `..`, `@{` or ends in `.lock`");
    }
    for segment in glob.split('/') {
        if segment.is_empty() || segment.starts_with('.') {
            return bad("has an empty segment or one starting with `.`");
        }
        if segment.contains("**") && segment != "**" {
            return bad("uses `**` inside a segment (it must be a whole segment)");
        }
    }
    Ok(())
}

/// Whether path glob `outer` matches every path `inner` matches. Syntactic: equal, `/**`, or a
/// `prefix/**` that `inner` starts within.
pub fn glob_covers(outer: &str, inner: &str) -> bool {
    if outer == inner || outer == "/**" {
        return true;
    }
    match outer.strip_suffix("/**") {
        Some(prefix) if !prefix.contains('*') => inner.starts_with(&format!("{prefix}/")),
        _ => false,
    }
}

/// Whether a concrete `path` matches `glob` (`*` within one segment, `**` across any number).
pub fn glob_matches(glob: &str, path: &str) -> bool {
    fn segments(glob: &[&str], path: &[&str]) -> bool {
        match glob.split_first() {
            None => path.is_empty(),
            Some((&"**", rest)) => (0..=path.len()).any(|skip| segments(rest, &path[skip..])),
            Some((first, rest)) => path.split_first().is_some_and(|(segment, tail)| {
                segment_matches(first, segment) && segments(rest, tail)
            }),
        }
    }
    fn segment_matches(glob: &str, text: &str) -> bool {
        match glob.split_once('*') {
            None => glob == text,
            Some((prefix, rest)) => {
                let Some(after) = text.strip_prefix(prefix) else {
                    return false;
                };
                (0..=after.len())
                    .filter(|i| after.is_char_boundary(*i))
                    .any(|i| segment_matches(rest, &after[i..]))
            }
        }
    }
    let glob: Vec<&str> = glob.trim_start_matches('/').split('/').collect();
    let path: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    segments(&glob, &path)
}

/// One concrete request path a glob matches.
pub fn glob_example(glob: &str) -> String {
    glob.replace("**", "x").replace('*', "x")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn test_hosts_refuse_wildcards_tlds_ports_and_numeric_disguises() {
        assert_eq!(check_host("api.github.com"), Ok(HostKind::Name));
        assert_eq!(check_host("*.example.com"), Ok(HostKind::Wildcard));
        assert_eq!(check_host("10.0.0.1"), Ok(HostKind::Ip(ip("10.0.0.1"))));
        assert_eq!(check_host("[::1]"), Ok(HostKind::Ip(ip("::1"))));
        for bad in [
            "*",
            "*.com",
            "a.*.com",
            "foo*.com",
            "API.example.com",
            "example.com.",
            "example.com:443",
            "2130706433",
            "0x7f.1",
            "127.1",
            "1.2.3.4.5",
            "-a.com",
            "",
        ] {
            assert!(check_host(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn test_blocked_ranges_include_alternate_ipv6_forms() {
        for (addr, class) in [
            ("127.0.0.1", "loopback"),
            ("169.254.169.254", "link-local"),
            ("10.1.2.3", "private"),
            ("100.64.0.1", "private"),
            ("224.0.0.1", "multicast"),
            ("0.0.0.0", "unspecified"),
            ("::1", "loopback"),
            ("fe80::1", "link-local"),
            ("fd00::1", "private"),
            ("ff02::1", "multicast"),
            ("::ffff:169.254.169.254", "link-local"),
            ("::ffff:7f00:1", "loopback"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("2002:a9fe:a9fe::", "link-local"),
        ] {
            assert_eq!(blocked_range(ip(addr)), Some(class), "{addr}");
        }
        assert_eq!(blocked_range(ip("140.82.112.3")), None);
        assert_eq!(blocked_range(ip("2606:4700::1111")), None);
    }

    #[test]
    fn test_cidr_containment_and_exception_classes() {
        let net = Cidr::parse("10.20.0.0/16").unwrap();
        assert!(net.contains(ip("10.20.3.4")));
        assert!(!net.contains(ip("10.21.0.1")));
        assert!(net.covers(&Cidr::parse("10.20.8.0/24").unwrap()));
        assert!(!net.covers(&Cidr::parse("10.0.0.0/8").unwrap()));
        assert_eq!(net.exception_class(), Ok("private"));
        assert_eq!(
            Cidr::parse("169.254.169.254/32").unwrap().exception_class(),
            Ok("link-local")
        );
        assert!(
            Cidr::parse("127.0.0.0/8")
                .unwrap()
                .exception_class()
                .is_err()
        );
        assert!(
            Cidr::parse("8.8.8.0/24")
                .unwrap()
                .exception_class()
                .is_err()
        );
        assert!(Cidr::parse("0.0.0.0/0").unwrap().exception_class().is_err());
        assert!(Cidr::parse("10.20.0.1/16").is_err());
        assert!(Cidr::parse("10.20.0.0/33").is_err());
    }

    #[test]
    fn test_host_and_glob_coverage() {
        assert!(host_covers("*.example.com", "a.example.com"));
        assert!(host_covers("*.example.com", "*.a.example.com"));
        assert!(!host_covers("*.example.com", "example.com"));
        assert!(!host_covers("a.example.com", "*.example.com"));
        assert!(glob_covers("/**", "/a/b"));
        assert!(glob_covers("/repos/**", "/repos/a/*"));
        assert!(!glob_covers("/repos/*", "/repos/a/b"));
        assert!(!glob_covers("/a/*", "/a/**"));
        assert!(check_http_path("/a/**").is_ok());
        assert!(check_http_path("/a**").is_err());
        assert!(check_http_path("a").is_err());
    }
}
