//! The allow-list and the checks made before any connection: parsing `[network] allow` entries,
//! matching a URL against them, and judging the addresses a name resolved to. Pure functions over
//! parsed values, no I/O, so every rule is unit-tested without wasm or sockets.
//!
//! Entry syntax: `[http://|https://]HOST[:PORT|:*]`, where HOST is a name (`example.com`), a
//! wildcard over its subdomains (`*.example.org`, which does not match `example.org` itself), an
//! IPv4 literal or a bracketed IPv6 literal (`[::1]`; a bare IPv6 literal is accepted without a
//! port). Without a port an entry allows the scheme's default port (443, or 80 for plain http);
//! `:*` allows every port. Without `http://` an entry allows https only, and plain http only when
//! the connection goes to a loopback address; `http://` allows both.
//!
//! Addresses: a destination in a special range (loopback, private, link-local, CGNAT, multicast,
//! unspecified, broadcast, documentation, reserved; see [`super::address`]) is refused unless the
//! URL's host is named exactly by an entry (not through a wildcard) or the address itself is.
//! Several lists can be stacked (a child's grants narrowed by its parent's); a request must pass
//! every list.

use std::fmt;
use std::net::IpAddr;

use url::{Host, Url};

use super::address::{self, SpecialRange};
use super::error::{NetworkError, NetworkErrorKind};

/// Where refusals tell the operator to look.
pub(crate) const ALLOW_KEY: &str = "[network] allow in clawcage.toml";

/// Which schemes an entry allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SchemeRule {
    /// https, and plain http only to a loopback address.
    Https,
    /// http and https.
    HttpAndHttps,
}

/// Which hosts an entry allows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// Exactly this name (lower case, no trailing dot).
    Name(String),
    /// Any name below this one (`*.example.org`), not the name itself.
    Subdomains(String),
    /// Exactly this address (canonical form).
    Ip(IpAddr),
    /// Any host, never named exactly: an address in a special range is refused. Made only by
    /// [`AllowList::with_any_public_host`], never parsed from the configuration.
    AnyPublic,
}

/// Which ports an entry allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortRule {
    /// The scheme's default port: 443 for https, 80 for http.
    Default,
    /// This port.
    Port(u16),
    /// Every port.
    Any,
}

/// One parsed `[network] allow` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowEntry {
    scheme: SchemeRule,
    host: HostPattern,
    port: PortRule,
}

/// Why an allow-list entry could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "[network] allow entry {entry:?} is not valid: {reason}; write HOST, HOST:PORT, *.DOMAIN, an IP address or [IPv6]:PORT, optionally after http://"
)]
pub struct AllowEntryError {
    /// The entry as written.
    pub entry: String,
    /// What is wrong with it.
    pub reason: String,
}

impl AllowEntry {
    /// Parse one entry.
    pub fn parse(text: &str) -> Result<AllowEntry, AllowEntryError> {
        let fail = |reason: &str| AllowEntryError {
            entry: text.to_string(),
            reason: reason.to_string(),
        };
        let trimmed = text.trim();
        let lower = trimmed.to_ascii_lowercase();
        let (scheme, rest) = if let Some(rest) = lower.strip_prefix("http://") {
            (SchemeRule::HttpAndHttps, rest)
        } else if let Some(rest) = lower.strip_prefix("https://") {
            (SchemeRule::Https, rest)
        } else if lower.contains("://") {
            return Err(fail("only http:// and https:// can be named"));
        } else {
            (SchemeRule::Https, lower.as_str())
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.is_empty() {
            return Err(fail("it names no host"));
        }
        if rest.contains(['/', '@', '?', '#', ' ']) {
            return Err(fail(
                "it must be a host, not a URL with a path, user or query",
            ));
        }
        let (host_text, port_text) = split_host_port(rest).ok_or_else(|| fail("bad brackets"))?;
        let port = match port_text {
            None => PortRule::Default,
            Some("*") => PortRule::Any,
            Some(digits) => match digits.parse::<u16>() {
                Ok(port) if port > 0 => PortRule::Port(port),
                _ => return Err(fail("the port must be 1-65535 or *")),
            },
        };
        let host = if let Some(base) = host_text.strip_prefix("*.") {
            match Host::parse(base) {
                Ok(Host::Domain(domain)) if !domain.contains('*') => {
                    HostPattern::Subdomains(normalize_name(&domain))
                }
                Ok(_) => return Err(fail("a wildcard must stand before a domain name")),
                Err(error) => return Err(fail(&format!("the domain is not valid ({error})"))),
            }
        } else if host_text.contains('*') {
            return Err(fail(
                "`*` is allowed only as the first label, as in *.example.org",
            ));
        } else {
            let bracketed;
            let parse_text = if host_text.contains(':') && !host_text.starts_with('[') {
                bracketed = format!("[{host_text}]");
                bracketed.as_str()
            } else {
                host_text
            };
            match Host::parse(parse_text) {
                Ok(Host::Domain(domain)) => HostPattern::Name(normalize_name(&domain)),
                Ok(Host::Ipv4(ip)) => HostPattern::Ip(IpAddr::V4(ip)),
                Ok(Host::Ipv6(ip)) => HostPattern::Ip(address::canonical(IpAddr::V6(ip))),
                Err(error) => return Err(fail(&format!("the host is not valid ({error})"))),
            }
        };
        Ok(AllowEntry { scheme, host, port })
    }

    /// Whether the entry allows `host` on `port` for `scheme` (ignoring the plain-http rule,
    /// which [`check_addresses`] applies once the addresses are known).
    fn matches(&self, host: &TargetHost, port: u16, scheme: &str) -> bool {
        let host_matches = match (&self.host, host) {
            (HostPattern::Name(name), TargetHost::Name(target)) => name == target,
            (HostPattern::Subdomains(base), TargetHost::Name(target)) => target
                .strip_suffix(base.as_str())
                .is_some_and(|prefix| prefix.len() > 1 && prefix.ends_with('.')),
            (HostPattern::Ip(ip), TargetHost::Ip(target)) => ip == target,
            (HostPattern::AnyPublic, _) => true,
            _ => false,
        };
        host_matches && self.port_matches(port, scheme)
    }

    fn port_matches(&self, port: u16, scheme: &str) -> bool {
        match self.port {
            PortRule::Any => true,
            PortRule::Port(allowed) => allowed == port,
            PortRule::Default => port == default_port(scheme),
        }
    }

    /// Whether the entry names `host` exactly (not through a wildcard).
    fn names_exactly(&self) -> bool {
        !matches!(
            self.host,
            HostPattern::Subdomains(_) | HostPattern::AnyPublic
        )
    }

    /// Whether the entry names exactly the address `ip` on `port`.
    fn names_address(&self, ip: IpAddr, port: u16, scheme: &str) -> bool {
        matches!(self.host, HostPattern::Ip(allowed) if allowed == ip)
            && self.port_matches(port, scheme)
    }
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.scheme == SchemeRule::HttpAndHttps {
            f.write_str("http://")?;
        }
        match &self.host {
            HostPattern::Name(name) => f.write_str(name)?,
            HostPattern::Subdomains(base) => write!(f, "*.{base}")?,
            HostPattern::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]")?,
            HostPattern::Ip(ip) => write!(f, "{ip}")?,
            HostPattern::AnyPublic => f.write_str("any public host")?,
        }
        match self.port {
            PortRule::Default => Ok(()),
            PortRule::Port(port) => write!(f, ":{port}"),
            PortRule::Any => f.write_str(":*"),
        }
    }
}

/// Split `host[:port]`, `[v6][:port]` or a bare IPv6 literal. `None` for unbalanced brackets.
fn split_host_port(text: &str) -> Option<(&str, Option<&str>)> {
    if let Some(inner_end) = text.strip_prefix('[').and_then(|rest| rest.find(']')) {
        let close = inner_end + 1;
        let host = &text[..=close];
        let after = &text[close + 1..];
        return match after.strip_prefix(':') {
            Some(port) => Some((host, Some(port))),
            None if after.is_empty() => Some((host, None)),
            None => None,
        };
    }
    if text.contains(['[', ']']) {
        return None;
    }
    match text.matches(':').count() {
        0 => Some((text, None)),
        1 => text.split_once(':').map(|(host, port)| (host, Some(port))),
        // A bare IPv6 literal: no port can be given without brackets.
        _ => Some((text, None)),
    }
}

/// Parse `HOST[:PORT]` naming one host exactly (a name or an IP literal; no wildcard, no scheme),
/// as secrets are keyed.
pub(super) fn parse_exact_host(text: &str) -> Result<(TargetHost, Option<u16>), String> {
    let lower = text.trim().to_ascii_lowercase();
    if lower.is_empty() || lower.contains(['/', '@', '?', '#', ' ', '*']) {
        return Err("it must be one host name or address, optionally with :PORT".to_string());
    }
    let (host_text, port_text) =
        split_host_port(&lower).ok_or_else(|| "it has unbalanced brackets".to_string())?;
    let port = match port_text {
        None => None,
        Some(digits) => match digits.parse::<u16>() {
            Ok(port) if port > 0 => Some(port),
            _ => return Err("the port must be 1-65535".to_string()),
        },
    };
    let bracketed;
    let parse_text = if host_text.contains(':') && !host_text.starts_with('[') {
        bracketed = format!("[{host_text}]");
        bracketed.as_str()
    } else {
        host_text
    };
    let host = match Host::parse(parse_text) {
        Ok(Host::Domain(domain)) => TargetHost::Name(normalize_name(&domain)),
        Ok(Host::Ipv4(ip)) => TargetHost::Ip(IpAddr::V4(ip)),
        Ok(Host::Ipv6(ip)) => TargetHost::Ip(address::canonical(IpAddr::V6(ip))),
        Err(error) => return Err(format!("the host is not valid ({error})")),
    };
    Ok((host, port))
}

fn normalize_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

fn default_port(scheme: &str) -> u16 {
    if scheme == "http" { 80 } else { 443 }
}

/// The operator's allow-list: the hosts (and ports) outbound requests may go to. Empty means
/// nothing is allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<AllowEntry>,
}

impl AllowList {
    /// An empty list: every request is refused.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Parse every entry; the first bad one is the error.
    pub fn parse<I>(entries: I) -> Result<AllowList, AllowEntryError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let entries = entries
            .into_iter()
            .map(|entry| AllowEntry::parse(entry.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(AllowList { entries })
    }

    /// This list and every public host over https on port 443: the hosts a registry may redirect
    /// a download to (a content delivery network). A host that resolves to a loopback, private or
    /// otherwise special address is still refused unless another entry names it exactly, and
    /// plain http still goes only to loopback. Never made from the configuration.
    pub fn with_any_public_host(mut self) -> Self {
        self.entries.push(AllowEntry {
            scheme: SchemeRule::Https,
            host: HostPattern::AnyPublic,
            port: PortRule::Default,
        });
        self
    }

    /// Whether nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries.
    pub fn entries(&self) -> &[AllowEntry] {
        &self.entries
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, entry) in self.entries.iter().enumerate() {
            if index > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{entry}")?;
        }
        Ok(())
    }
}

/// The host part of a URL, normalised for matching.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetHost {
    /// A DNS name, lower case without a trailing dot.
    Name(String),
    /// An IP literal in canonical form (IPv4-mapped IPv6 as IPv4).
    Ip(IpAddr),
}

impl fmt::Display for TargetHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetHost::Name(name) => f.write_str(name),
            TargetHost::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            TargetHost::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// A URL that passed the allow-list, with what the address check needs to know.
#[derive(Debug, Clone)]
pub struct Target {
    /// The parsed URL; the same value is handed to the HTTP client, so no second parser can
    /// read the host differently.
    pub url: Url,
    /// The host, normalised.
    pub host: TargetHost,
    /// The port, explicit or the scheme's default.
    pub port: u16,
    /// Every list names the host exactly (so special addresses are allowed for it).
    named_exactly: bool,
    /// Every list allows plain http to the host.
    plain_http_allowed: bool,
}

impl Target {
    /// Whether the URL is plain `http://`.
    pub fn is_plain_http(&self) -> bool {
        self.url.scheme() == "http"
    }

    /// The name to resolve, if the host is not an IP literal.
    pub fn name(&self) -> Option<&str> {
        match &self.host {
            TargetHost::Name(name) => Some(name),
            TargetHost::Ip(_) => None,
        }
    }

    /// The `url` crate's own spelling of the host (the key the HTTP client looks up).
    pub fn url_host(&self) -> &str {
        self.url.host_str().unwrap_or_default()
    }

    /// The entry to suggest for this host: `host`, `host:port` when the port is not the
    /// scheme's default, with `http://` in front when `plain` is set.
    fn suggestion(&self, host: &str, plain: bool) -> String {
        let scheme = if plain { "http://" } else { "" };
        if self.port == default_port(self.url.scheme()) {
            format!("{scheme}{host}")
        } else {
            format!("{scheme}{host}:{}", self.port)
        }
    }
}

/// The allow-list entry that names exactly the host of `url` (with its port when it is not the
/// scheme's default, and `http://` for plain http to a host that is not loopback): what an
/// operator's approval of one request to it allows.
pub fn exact_entry(url: &Url) -> Option<String> {
    let host = match url.host()? {
        Host::Domain(domain) => TargetHost::Name(normalize_name(domain)),
        Host::Ipv4(ip) => TargetHost::Ip(IpAddr::V4(ip)),
        Host::Ipv6(ip) => TargetHost::Ip(address::canonical(IpAddr::V6(ip))),
    };
    let port = url
        .port_or_known_default()
        .unwrap_or_else(|| default_port(url.scheme()));
    let target = Target {
        url: url.clone(),
        host,
        port,
        named_exactly: true,
        plain_http_allowed: false,
    };
    let plain = target.is_plain_http() && !is_loopback_host(&target.host);
    Some(target.suggestion(&target.host.to_string(), plain))
}

/// Parse a URL a component sent: absolute, `http` or `https`, with a host.
pub fn parse_url(text: &str) -> Result<Url, NetworkError> {
    let url = Url::parse(text.trim()).map_err(|error| {
        NetworkError::invalid(format!(
            "{text:?} is not a valid URL ({error}); give an absolute http:// or https:// URL"
        ))
    })?;
    check_scheme(&url)?;
    Ok(url)
}

/// Refuse schemes other than http and https, and URLs without a host.
pub fn check_scheme(url: &Url) -> Result<(), NetworkError> {
    match url.scheme() {
        "http" | "https" => {}
        other => {
            return Err(NetworkError::invalid(format!(
                "{other}:// URLs cannot be fetched; only http:// and https:// are supported"
            )));
        }
    }
    if url.host().is_none() {
        return Err(NetworkError::invalid(format!("{url} names no host")));
    }
    Ok(())
}

/// The host of `url` as the policy judges it; `None` when it names none.
fn target_host(url: &Url) -> Option<TargetHost> {
    Some(match url.host()? {
        Host::Domain(domain) => TargetHost::Name(normalize_name(domain)),
        Host::Ipv4(ip) => TargetHost::Ip(IpAddr::V4(ip)),
        Host::Ipv6(ip) => TargetHost::Ip(address::canonical(IpAddr::V6(ip))),
    })
}

/// Whether `url` names the loopback interface as the policy judges it (where plain http may
/// carry a secret).
pub fn is_loopback_url(url: &Url) -> bool {
    target_host(url).is_some_and(|host| is_loopback_host(&host))
}

/// Check a parsed URL against every list. The host must be allowed (with its port) by each.
pub fn check_target(lists: &[AllowList], url: Url) -> Result<Target, NetworkError> {
    check_scheme(&url)?;
    let Some(host) = target_host(&url) else {
        return Err(NetworkError::invalid(format!("{url} names no host")));
    };
    let port = url
        .port_or_known_default()
        .unwrap_or_else(|| default_port(url.scheme()));
    let scheme = url.scheme().to_string();
    let mut named_exactly = true;
    let mut plain_http_allowed = true;
    let mut target = Target {
        url,
        host,
        port,
        named_exactly: false,
        plain_http_allowed: false,
    };
    if lists.is_empty() {
        return Err(not_allowed(&target, "no host is allowed"));
    }
    for list in lists {
        let matching: Vec<&AllowEntry> = list
            .entries
            .iter()
            .filter(|entry| entry.matches(&target.host, port, &scheme))
            .collect();
        if matching.is_empty() {
            let why = if list.is_empty() {
                "no host is allowed".to_string()
            } else {
                format!("it is not on the network allow-list ({list})")
            };
            return Err(not_allowed(&target, &why));
        }
        named_exactly &= matching.iter().any(|entry| entry.names_exactly());
        plain_http_allowed &= matching
            .iter()
            .any(|entry| entry.scheme == SchemeRule::HttpAndHttps);
    }
    target.named_exactly = named_exactly;
    target.plain_http_allowed = plain_http_allowed;
    Ok(target)
}

fn not_allowed(target: &Target, why: &str) -> NetworkError {
    let host = target.host.to_string();
    let what = match target.host {
        TargetHost::Ip(ip) => match address::special_range(ip) {
            Some(range) => format!("{host} ({})", range.describe()),
            None => host.clone(),
        },
        TargetHost::Name(_) => host.clone(),
    };
    let shown_port = if target.port == default_port(target.url.scheme()) {
        String::new()
    } else {
        format!(" port {}", target.port)
    };
    NetworkError::new(
        NetworkErrorKind::HostNotAllowed,
        format!(
            "requests to {what}{shown_port} are refused: {why}. To allow it, add \"{}\" to {ALLOW_KEY}",
            target.suggestion(
                &host,
                target.is_plain_http() && !is_loopback_host(&target.host)
            )
        ),
    )
}

fn is_loopback_host(host: &TargetHost) -> bool {
    match host {
        TargetHost::Ip(ip) => address::is_loopback(*ip),
        TargetHost::Name(name) => name == "localhost" || name.ends_with(".localhost"),
    }
}

/// Judge the addresses the host resolved to (or the literal it named). Every address must pass:
/// one in a special range passes only when the host or that address is named exactly in every
/// list; plain http passes only when a list entry allows it or every address is loopback.
pub fn check_addresses(
    lists: &[AllowList],
    target: &Target,
    addresses: &[IpAddr],
) -> Result<(), NetworkError> {
    let scheme = target.url.scheme();
    for &resolved in addresses {
        let ip = address::canonical(resolved);
        let Some(range) = address::special_range(ip) else {
            continue;
        };
        let address_named = lists.iter().all(|list| {
            list.entries
                .iter()
                .any(|entry| entry.names_address(ip, target.port, scheme))
        });
        if target.named_exactly || address_named {
            continue;
        }
        return Err(address_refused(target, ip, range));
    }
    if target.is_plain_http() && !target.plain_http_allowed {
        let all_loopback = !addresses.is_empty()
            && addresses
                .iter()
                .all(|ip| address::is_loopback(address::canonical(*ip)));
        if !all_loopback {
            return Err(NetworkError::new(
                NetworkErrorKind::PlainHttpRefused,
                format!(
                    "plain http:// to {} is refused: it is allowed over https only. Use https://, or add \"{}\" to {ALLOW_KEY} to allow unencrypted HTTP to it",
                    target.host,
                    target.suggestion(&target.host.to_string(), true)
                ),
            ));
        }
    }
    Ok(())
}

fn address_refused(target: &Target, ip: IpAddr, range: SpecialRange) -> NetworkError {
    let shown_ip = match ip {
        IpAddr::V6(v6) => format!("[{v6}]"),
        v4 => v4.to_string(),
    };
    let how = match &target.host {
        TargetHost::Name(name) => format!(
            "{name} resolves to {shown_ip}, {}; such addresses are refused unless the exact name or address is allowed. To allow it, add \"{}\" or \"{}\" to {ALLOW_KEY}",
            range.describe(),
            target.suggestion(name, false),
            target.suggestion(&shown_ip, false)
        ),
        TargetHost::Ip(_) => format!(
            "{shown_ip} is {}; such addresses are refused unless named exactly. To allow it, add \"{}\" to {ALLOW_KEY}",
            range.describe(),
            target.suggestion(&shown_ip, false)
        ),
    };
    NetworkError::new(NetworkErrorKind::AddressRefused, how)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(entries).unwrap()
    }

    fn target(lists: &[AllowList], url: &str) -> Result<Target, NetworkError> {
        check_target(lists, parse_url(url)?)
    }

    fn ips(text: &[&str]) -> Vec<IpAddr> {
        text.iter().map(|ip| ip.parse().unwrap()).collect()
    }

    #[test]
    fn entries_parse_and_print_canonically() {
        for (written, canonical) in [
            ("example.com", "example.com"),
            ("Example.COM.", "example.com"),
            ("example.com:8443", "example.com:8443"),
            ("*.example.org", "*.example.org"),
            ("127.0.0.1:8080", "127.0.0.1:8080"),
            ("http://localhost:3000", "http://localhost:3000"),
            ("https://api.example.com/", "api.example.com"),
            ("[::1]:8080", "[::1]:8080"),
            ("::1", "[::1]"),
            ("[::ffff:127.0.0.1]", "127.0.0.1"),
            ("2130706433", "127.0.0.1"),
            ("0x7f000001:80", "127.0.0.1:80"),
            ("example.com:*", "example.com:*"),
            ("bücher.example", "xn--bcher-kva.example"),
        ] {
            let entry = AllowEntry::parse(written).unwrap();
            assert_eq!(entry.to_string(), canonical, "{written}");
        }
    }

    #[test]
    fn bad_entries_are_refused_with_the_reason() {
        for bad in [
            "",
            "ftp://example.com",
            "example.com/path",
            "user@example.com",
            "example.com:0",
            "example.com:99999",
            "example.com:http",
            "*",
            "*.",
            "a.*.example.com",
            "*.127.0.0.1",
            "[::1",
            "exa mple.com",
        ] {
            let error = AllowEntry::parse(bad).unwrap_err();
            assert!(
                error.to_string().contains("[network] allow entry"),
                "{error}"
            );
        }
    }

    #[test]
    fn hosts_ports_and_wildcards_match() {
        let lists = [list(&[
            "example.com",
            "*.example.org",
            "127.0.0.1:8080",
            "api.test:*",
        ])];
        assert!(target(&lists, "https://example.com/page").is_ok());
        assert!(target(&lists, "https://EXAMPLE.com./page").is_ok());
        assert!(target(&lists, "https://a.example.org/").is_ok());
        assert!(target(&lists, "https://a.b.example.org/").is_ok());
        assert!(target(&lists, "http://127.0.0.1:8080/").is_ok());
        assert!(target(&lists, "https://api.test:9999/").is_ok());
        for refused in [
            "https://example.org/",
            "https://badexample.org/",
            "https://example.com.evil.net/",
            "https://example.com:8443/",
            "http://127.0.0.1:8081/",
            "https://sub.example.com/",
            "https://evil.net/",
            "https://example.com@evil.net/",
        ] {
            let error = target(&lists, refused).unwrap_err();
            assert_eq!(error.kind(), NetworkErrorKind::HostNotAllowed, "{refused}");
            assert!(error.message().contains(ALLOW_KEY), "{error}");
        }
    }

    #[test]
    fn a_refusal_names_the_entry_that_would_allow_it() {
        let lists = [list(&["example.com"])];
        let error = target(&lists, "https://other.net/x").unwrap_err();
        assert!(
            error
                .message()
                .contains("add \"other.net\" to [network] allow in clawcage.toml"),
            "{error}"
        );
        let error = target(&lists, "https://other.net:8443/x").unwrap_err();
        assert!(
            error.message().contains("add \"other.net:8443\""),
            "{error}"
        );
        let error = target(&[AllowList::empty()], "https://other.net/").unwrap_err();
        assert!(error.message().contains("no host is allowed"), "{error}");
        let error = target(&[], "https://other.net/").unwrap_err();
        assert!(error.message().contains("no host is allowed"), "{error}");
    }

    #[test]
    fn numeric_hosts_are_read_as_the_address_they_are() {
        let lists = [list(&["example.com"])];
        for url in [
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0177.0.0.1/",
            "http://127.1/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:7f00:1]/",
        ] {
            let parsed = parse_url(url).unwrap();
            let error = check_target(&lists, parsed).unwrap_err();
            assert!(
                error.message().contains("127.0.0.1 (a loopback address"),
                "{url}: {error}"
            );
        }
        let allowed = [list(&["127.0.0.1:80"])];
        for url in [
            "http://2130706433/",
            "http://0x7f000001/",
            "http://[::ffff:127.0.0.1]/",
        ] {
            let target = target(&allowed, url).unwrap();
            assert_eq!(target.host, TargetHost::Ip("127.0.0.1".parse().unwrap()));
            check_addresses(&allowed, &target, &ips(&["127.0.0.1"])).unwrap();
        }
    }

    #[test]
    fn invalid_urls_and_schemes() {
        for (url, needle) in [
            ("not a url", "not a valid URL"),
            ("file:///etc/passwd", "file:// URLs cannot be fetched"),
            ("ftp://example.com/x", "ftp:// URLs cannot be fetched"),
            ("gopher://example.com/", "gopher://"),
            ("http://", "not a valid URL"),
            ("//example.com", "not a valid URL"),
        ] {
            let error = parse_url(url).unwrap_err();
            assert_eq!(error.kind(), NetworkErrorKind::InvalidRequest, "{url}");
            assert!(error.message().contains(needle), "{url}: {error}");
        }
    }

    #[test]
    fn special_addresses_need_an_exact_name_or_address() {
        let wildcard = [list(&["*.test:*"])];
        let t = target(&wildcard, "http://allowed.test:8080/").unwrap();
        for refused in [
            "127.0.0.1",
            "10.0.0.5",
            "169.254.169.254",
            "::1",
            "fd00::1",
            "::ffff:192.168.0.1",
        ] {
            let error = check_addresses(&wildcard, &t, &ips(&[refused])).unwrap_err();
            assert_eq!(error.kind(), NetworkErrorKind::AddressRefused, "{refused}");
            assert!(
                error.message().contains("allowed.test resolves to"),
                "{error}"
            );
            assert!(error.message().contains("\"allowed.test:8080\""), "{error}");
        }
        // One bad address among good ones refuses the request.
        let error = check_addresses(&wildcard, &t, &ips(&["93.184.215.14", "127.0.0.1"]));
        assert!(error.is_err());

        let by_name = [list(&["allowed.test:8080"])];
        let t = target(&by_name, "http://allowed.test:8080/").unwrap();
        check_addresses(&by_name, &t, &ips(&["127.0.0.1"])).unwrap();

        let by_address = [list(&["*.test:*", "127.0.0.1:8080"])];
        let t = target(&by_address, "http://allowed.test:8080/").unwrap();
        check_addresses(&by_address, &t, &ips(&["127.0.0.1"])).unwrap();
        check_addresses(&by_address, &t, &ips(&["::ffff:127.0.0.1"])).unwrap();
        // The address entry is for port 8080 only.
        let t = target(&by_address, "http://allowed.test:9090/").unwrap();
        assert!(check_addresses(&by_address, &t, &ips(&["127.0.0.1"])).is_err());
        // The metadata address is not covered by allowing loopback.
        let t = target(&by_address, "http://allowed.test:8080/").unwrap();
        let error = check_addresses(&by_address, &t, &ips(&["169.254.169.254"])).unwrap_err();
        assert!(error.message().contains("link-local"), "{error}");
    }

    #[test]
    fn any_public_host_means_public_addresses_over_https_only() {
        let lists = [list(&["registry.test:5000"]).with_any_public_host()];
        // Any public name or address over https on port 443.
        let t = target(&lists, "https://cdn.example.net/blob").unwrap();
        check_addresses(&lists, &t, &ips(&["93.184.215.14"])).unwrap();
        assert!(target(&lists, "https://cdn.example.net:8443/blob").is_err());
        // Never a loopback, private or link-local address, whatever the name.
        for refused in ["127.0.0.1", "10.0.0.5", "169.254.169.254", "fd00::1"] {
            let error = check_addresses(&lists, &t, &ips(&[refused])).unwrap_err();
            assert_eq!(error.kind(), NetworkErrorKind::AddressRefused, "{refused}");
        }
        // Plain http only to loopback, which it does not reach either.
        let t = target(&lists, "http://cdn.example.net/blob").unwrap();
        let error = check_addresses(&lists, &t, &ips(&["93.184.215.14"])).unwrap_err();
        assert_eq!(error.kind(), NetworkErrorKind::PlainHttpRefused);
        // The host named exactly keeps its own rules.
        let t = target(&lists, "https://registry.test:5000/v2/").unwrap();
        check_addresses(&lists, &t, &ips(&["10.0.0.5"])).unwrap();
    }

    #[test]
    fn plain_http_needs_an_http_entry_or_loopback() {
        let lists = [list(&[
            "example.com",
            "http://plain.example",
            "*.test:*",
            "localhost:*",
        ])];
        let t = target(&lists, "http://example.com/").unwrap();
        let error = check_addresses(&lists, &t, &ips(&["93.184.215.14"])).unwrap_err();
        assert_eq!(error.kind(), NetworkErrorKind::PlainHttpRefused);
        assert!(
            error.message().contains("\"http://example.com\""),
            "{error}"
        );
        let t = target(&lists, "https://example.com/").unwrap();
        check_addresses(&lists, &t, &ips(&["93.184.215.14"])).unwrap();
        let t = target(&lists, "http://plain.example/").unwrap();
        check_addresses(&lists, &t, &ips(&["93.184.215.14"])).unwrap();
        let t = target(&lists, "http://localhost:3000/").unwrap();
        check_addresses(&lists, &t, &ips(&["127.0.0.1", "::1"])).unwrap();
    }

    #[test]
    fn stacked_lists_must_all_allow() {
        let parent = list(&["*.example.org", "example.com"]);
        let child = list(&["a.example.org", "other.net"]);
        let lists = [parent, child];
        assert!(target(&lists, "https://a.example.org/").is_ok());
        assert!(target(&lists, "https://b.example.org/").is_err());
        assert!(target(&lists, "https://other.net/").is_err());
        assert!(target(&lists, "https://example.com/").is_err());
        // Exactness is required of every list: the parent allows a.example.org only by wildcard.
        let t = target(&lists, "https://a.example.org/").unwrap();
        assert!(check_addresses(&lists, &t, &ips(&["10.0.0.1"])).is_err());
    }
}
