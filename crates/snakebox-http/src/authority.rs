//! Host names, parsed once: the `Host` of a request, `Origin`, `--public-url`,
//! `--allowed-host` and `--allowed-origin` all become an [`Authority`] (host and port) before
//! anything compares them or builds a URL from them.
//!
//! An authority is `host [":" port]` and nothing else: the host a DNS name, an IPv4 address
//! in dotted decimal, or an IPv6 address in brackets; the port 1 to 65535 in decimal digits.
//! No userinfo (`user@`), no path, query or fragment, no whitespace, no second colon. The
//! parsed value is what the edge checks against the allowlist and what every URL the server
//! hands out (download links, the UI's client configurations) is written from, in its
//! canonical form ([`Authority`]'s `Display`: the name lowercased, IPv6 compressed): a
//! header's text never reaches a link, so `Host: localhost:8000@evil.example` cannot turn a
//! link into one to `evil.example`.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// The longest DNS name (RFC 1035: 255 octets on the wire, 253 characters written).
const MAX_NAME: usize = 253;
/// The longest label of a DNS name.
const MAX_LABEL: usize = 63;

/// Why a text is not an authority.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthorityError {
    /// Nothing was given.
    #[error("the authority is empty")]
    Empty,
    /// Longer than any host and port.
    #[error("the authority is {0} characters long, more than a host name and a port can be")]
    TooLong(usize),
    /// A space, a control character or a byte that is not ASCII.
    #[error("the authority holds a space, a control character or a character that is not ASCII")]
    Character,
    /// `user@host`.
    #[error("the authority has a user part (`@`)")]
    Userinfo,
    /// `host/path`, `host?query`, `host#fragment`, `host\…`.
    #[error("the authority is followed by a path, query or fragment (`{0}`)")]
    Trailing(char),
    /// `[::1` or `[::1]x`.
    #[error("the IPv6 address is not closed by `]`, or something other than a port follows it")]
    Bracket,
    /// Not an IPv6 address between the brackets (a zone id `%…` included).
    #[error("`[{0}]` is not an IPv6 address")]
    Ipv6(String),
    /// Two colons outside brackets (`host::80`, `::1`, `a:1:2`).
    #[error("the authority has more than one `:` (an IPv6 address must be in brackets)")]
    Colons,
    /// A `:` with nothing after it.
    #[error("the port after `:` is empty")]
    EmptyPort,
    /// Not 1 to 65535 in at most five decimal digits.
    #[error("the port `{0}` is not a number from 1 to 65535")]
    Port(String),
    /// Not a DNS name (empty or long labels, a character other than letters, digits, `-`
    /// and `_`, a label starting or ending with `-`).
    #[error("`{0}` is not a DNS name")]
    Name(String),
    /// A name whose last label is a number: an IPv4 address in another notation (`127.1`,
    /// `0x7f.1`), which clients read differently.
    #[error(
        "`{0}` ends in a number: it is neither a DNS name nor an IPv4 address in dotted decimal"
    )]
    NumericName(String),
}

impl AuthorityError {
    /// What a valid authority looks like.
    #[must_use]
    pub fn hint(&self) -> &'static str {
        "write `host[:port]`: a DNS name, an IPv4 address or an IPv6 address in brackets, and optionally a port from 1 to 65535, with nothing before or after"
    }
}

/// The host of an authority.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    /// A DNS name, lowercase.
    Name(String),
    /// An IPv4 address.
    V4(Ipv4Addr),
    /// An IPv6 address (written in brackets).
    V6(Ipv6Addr),
}

impl Host {
    /// Whether it names this machine's loopback interface (`localhost`, `*.localhost`,
    /// `127.0.0.0/8`, `::1`).
    #[must_use]
    pub fn is_loopback(&self) -> bool {
        match self {
            Host::Name(name) => name == "localhost" || name.ends_with(".localhost"),
            Host::V4(ip) => ip.is_loopback(),
            Host::V6(ip) => ip.is_loopback(),
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::V4(ip) => write!(f, "{ip}"),
            Host::V6(ip) => write!(f, "[{ip}]"),
        }
    }
}

/// `host [":" port]`, parsed strictly (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Authority {
    /// The host.
    pub host: Host,
    /// The port, when one was written.
    pub port: Option<u16>,
}

impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.host),
            None => write!(f, "{}", self.host),
        }
    }
}

impl From<std::net::SocketAddr> for Authority {
    fn from(addr: std::net::SocketAddr) -> Authority {
        let host = match addr.ip() {
            std::net::IpAddr::V4(ip) => Host::V4(ip),
            std::net::IpAddr::V6(ip) => Host::V6(ip),
        };
        Authority {
            host,
            port: Some(addr.port()),
        }
    }
}

impl std::str::FromStr for Authority {
    type Err = AuthorityError;

    fn from_str(text: &str) -> Result<Authority, AuthorityError> {
        Authority::parse(text)
    }
}

/// The port of `text` (what follows the `:`).
fn port(text: &str) -> Result<u16, AuthorityError> {
    if text.is_empty() {
        return Err(AuthorityError::EmptyPort);
    }
    let invalid = || AuthorityError::Port(text.to_owned());
    if text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(invalid()),
        Ok(port) => Ok(port),
    }
}

/// Whether a label is a number as URL parsers read IPv4 parts: decimal, or `0x` and hex.
fn numeric(label: &str) -> bool {
    let hex = label
        .strip_prefix("0x")
        .or_else(|| label.strip_prefix("0X"));
    match hex {
        Some(digits) => digits.bytes().all(|b| b.is_ascii_hexdigit()),
        None => !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// A non-bracketed host: IPv4 in dotted decimal, else a DNS name.
fn host(text: &str) -> Result<Host, AuthorityError> {
    if let Ok(ip) = text.parse::<Ipv4Addr>() {
        return Ok(Host::V4(ip));
    }
    let name = text.to_ascii_lowercase();
    let invalid = || AuthorityError::Name(text.to_owned());
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(invalid());
    }
    for label in name.split('.') {
        let ok = (1..=MAX_LABEL).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(invalid());
        }
    }
    if name.rsplit('.').next().is_some_and(numeric) {
        return Err(AuthorityError::NumericName(text.to_owned()));
    }
    Ok(Host::Name(name))
}

impl Authority {
    /// Parse `host [":" port]` strictly.
    ///
    /// # Errors
    /// Anything but a host and an optional port: see [`AuthorityError`].
    pub fn parse(text: &str) -> Result<Authority, AuthorityError> {
        if text.is_empty() {
            return Err(AuthorityError::Empty);
        }
        if text.len() > MAX_NAME + ":65535".len() {
            return Err(AuthorityError::TooLong(text.len()));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(AuthorityError::Character);
        }
        if text.contains('@') {
            return Err(AuthorityError::Userinfo);
        }
        if let Some(at) = text.find(['/', '?', '#', '\\']) {
            let found = text[at..].chars().next().unwrap_or('/');
            return Err(AuthorityError::Trailing(found));
        }
        if let Some(rest) = text.strip_prefix('[') {
            let (inside, after) = rest.split_once(']').ok_or(AuthorityError::Bracket)?;
            let ip = inside
                .parse::<Ipv6Addr>()
                .map_err(|_| AuthorityError::Ipv6(inside.to_owned()))?;
            let port = match after {
                "" => None,
                _ => Some(port(
                    after.strip_prefix(':').ok_or(AuthorityError::Bracket)?,
                )?),
            };
            return Ok(Authority {
                host: Host::V6(ip),
                port,
            });
        }
        if text.contains(['[', ']']) {
            return Err(AuthorityError::Bracket);
        }
        let (name, port_text) = match text.split_once(':') {
            Some((_, after)) if after.contains(':') => return Err(AuthorityError::Colons),
            Some((name, after)) => (name, Some(after)),
            None => (text, None),
        };
        Ok(Authority {
            host: host(name)?,
            port: port_text.map(port).transpose()?,
        })
    }

    /// Whether `self`, a pattern from the allowlist, admits `other`: the same host, and the
    /// same port unless the pattern names none (then any port).
    #[must_use]
    pub fn admits(&self, other: &Authority) -> bool {
        self.host == other.host && (self.port.is_none() || self.port == other.port)
    }
}

/// `http` or `https`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scheme {
    /// `http`, port 80 by default.
    Http,
    /// `https`, port 443 by default.
    Https,
}

impl Scheme {
    fn parse(text: &str) -> Option<Scheme> {
        if text.eq_ignore_ascii_case("http") {
            Some(Scheme::Http)
        } else if text.eq_ignore_ascii_case("https") {
            Some(Scheme::Https)
        } else {
            None
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// Why a text is not an origin or a base URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Not `http://` or `https://`.
    #[error("it does not start with `http://` or `https://`")]
    Scheme,
    /// The authority is not valid.
    #[error(transparent)]
    Authority(#[from] AuthorityError),
    /// An origin with a path.
    #[error("an origin is a scheme and a host only, without a path")]
    OriginPath,
    /// A base URL's path with a query, fragment or a character a URL path cannot hold.
    #[error(
        "the path `{0}` holds a query, a fragment or a character that is not allowed in a URL path"
    )]
    Path(String),
}

/// A browser's `Origin` (`scheme://host[:port]`), or one the operator allows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Origin {
    /// `http` or `https`.
    pub scheme: Scheme,
    /// Host and port.
    pub authority: Authority,
}

impl Origin {
    /// Parse `scheme://host[:port]`; `trailing_slash` admits one `/` after it (as operators
    /// write origins; browsers never send one).
    ///
    /// # Errors
    /// Another scheme, an invalid authority, a path.
    pub fn parse(text: &str, trailing_slash: bool) -> Result<Origin, UrlError> {
        let (scheme, rest) = text.split_once("://").ok_or(UrlError::Scheme)?;
        let scheme = Scheme::parse(scheme).ok_or(UrlError::Scheme)?;
        let rest = if trailing_slash {
            rest.strip_suffix('/').unwrap_or(rest)
        } else {
            rest
        };
        let authority = Authority::parse(rest).map_err(|err| match err {
            AuthorityError::Trailing(_) => UrlError::OriginPath,
            other => UrlError::Authority(other),
        })?;
        Ok(Origin { scheme, authority })
    }

    /// The port, the scheme's default when none is written.
    fn port(&self) -> u16 {
        self.authority
            .port
            .unwrap_or_else(|| self.scheme.default_port())
    }

    /// Whether two origins are the same (a missing port is the scheme's default).
    #[must_use]
    pub fn same(&self, other: &Origin) -> bool {
        self.scheme == other.scheme
            && self.authority.host == other.authority.host
            && self.port() == other.port()
    }

    /// Whether this is the origin of pages served under `authority` (the request's own
    /// `Host`), over either scheme (a proxy in front may speak https).
    #[must_use]
    pub fn is_of(&self, authority: &Authority) -> bool {
        self.authority.host == authority.host
            && match authority.port {
                Some(port) => self.port() == port,
                // A `Host` without a port (behind a proxy): the scheme's own port.
                None => self
                    .authority
                    .port
                    .is_none_or(|port| port == self.scheme.default_port()),
            }
    }
}

/// The URL clients reach the server at: `--public-url`, or `http://` and the request's
/// parsed `Host`. Written without a trailing `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    /// `http` or `https`.
    pub scheme: Scheme,
    /// Host and port.
    pub authority: Authority,
    /// A path prefix (`/snakebox`), or empty.
    pub path: String,
}

/// Whether `b` may appear in a URL path as written (RFC 3986 `pchar` and `/`; `%` only as
/// part of an escape, checked separately).
fn path_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/%".contains(&b)
}

impl BaseUrl {
    /// Parse `--public-url`: `http(s)://host[:port][/path]`, without query or fragment.
    ///
    /// # Errors
    /// Another scheme, an invalid authority, a query, fragment or odd character in the path.
    pub fn parse(text: &str) -> Result<BaseUrl, UrlError> {
        let (scheme, rest) = text.split_once("://").ok_or(UrlError::Scheme)?;
        let scheme = Scheme::parse(scheme).ok_or(UrlError::Scheme)?;
        let (authority, path) = match rest.find('/') {
            Some(at) => rest.split_at(at),
            None => (rest, ""),
        };
        let authority = Authority::parse(authority)?;
        let path = path.trim_end_matches('/');
        let escapes_ok = path.split('%').skip(1).all(|after| {
            after.len() >= 2 && after.as_bytes()[..2].iter().all(u8::is_ascii_hexdigit)
        });
        if !path.bytes().all(path_byte) || !escapes_ok {
            return Err(UrlError::Path(path.to_owned()));
        }
        Ok(BaseUrl {
            scheme,
            authority,
            path: path.to_owned(),
        })
    }

    /// `http://` and an authority (a request's `Host`, or the bound address).
    #[must_use]
    pub fn http(authority: Authority) -> BaseUrl {
        BaseUrl {
            scheme: Scheme::Http,
            authority,
            path: String::new(),
        }
    }

    /// The origin of pages under this URL.
    #[must_use]
    pub fn origin(&self) -> Origin {
        Origin {
            scheme: self.scheme,
            authority: self.authority.clone(),
        }
    }

    /// Whether it is https (cookies get `Secure`).
    #[must_use]
    pub fn is_https(&self) -> bool {
        self.scheme == Scheme::Https
    }
}

impl fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}{}",
            self.scheme.as_str(),
            self.authority,
            self.path
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str, port: Option<u16>) -> Authority {
        Authority {
            host: Host::Name(text.into()),
            port,
        }
    }

    macro_rules! accepted {
        ($($case:ident: $input:expr => $expected:expr, $written:expr;)*) => {$(
            #[test]
            fn $case() {
                let parsed = Authority::parse($input);
                assert_eq!(parsed, Ok($expected), "{:?}", $input);
                assert_eq!(parsed.unwrap().to_string(), $written, "{:?}", $input);
            }
        )*};
    }

    accepted! {
        a_name: "localhost" => name("localhost", None), "localhost";
        a_name_and_port: "localhost:8000" => name("localhost", Some(8000)), "localhost:8000";
        a_name_is_lowercased: "SnakeBox.Example.COM:443" => name("snakebox.example.com", Some(443)), "snakebox.example.com:443";
        a_name_with_dashes_and_underscores: "my_host-1.internal" => name("my_host-1.internal", None), "my_host-1.internal";
        a_name_with_a_numeric_label_before_the_last: "10.example" => name("10.example", None), "10.example";
        an_ipv4: "127.0.0.1" => Authority { host: Host::V4(Ipv4Addr::LOCALHOST), port: None }, "127.0.0.1";
        an_ipv4_and_port: "127.0.0.1:65535" => Authority { host: Host::V4(Ipv4Addr::LOCALHOST), port: Some(65535) }, "127.0.0.1:65535";
        an_ipv6: "[::1]" => Authority { host: Host::V6(Ipv6Addr::LOCALHOST), port: None }, "[::1]";
        an_ipv6_and_port: "[0:0:0:0:0:0:0:1]:8000" => Authority { host: Host::V6(Ipv6Addr::LOCALHOST), port: Some(8000) }, "[::1]:8000";
        a_port_with_leading_zeros: "localhost:08000" => name("localhost", Some(8000)), "localhost:8000";
        port_one: "a:1" => name("a", Some(1)), "a:1";
    }

    macro_rules! refused {
        ($($case:ident: $input:expr => $pattern:pat,)*) => {$(
            #[test]
            fn $case() {
                let parsed = Authority::parse($input);
                assert!(matches!(parsed, Err($pattern)), "{:?} -> {:?}", $input, parsed);
            }
        )*};
    }

    refused! {
        empty: "" => AuthorityError::Empty,
        userinfo: "localhost:8000@evil.example" => AuthorityError::Userinfo,
        userinfo_before_a_name: "evil.example@localhost" => AuthorityError::Userinfo,
        userinfo_after_ipv6: "[::1]@evil.example" => AuthorityError::Userinfo,
        a_path: "localhost:8000/x" => AuthorityError::Trailing('/'),
        a_path_after_ipv6: "[::1]:8000/x" => AuthorityError::Trailing('/'),
        a_query: "localhost?x" => AuthorityError::Trailing('?'),
        a_fragment: "localhost:8000#" => AuthorityError::Trailing('#'),
        a_backslash: "localhost\\evil.example" => AuthorityError::Trailing('\\'),
        a_space: "localhost:8000 x" => AuthorityError::Character,
        a_leading_space: " localhost" => AuthorityError::Character,
        a_tab: "localhost\t" => AuthorityError::Character,
        a_newline: "localhost\r\nx: y" => AuthorityError::Character,
        not_ascii: "lócalhost" => AuthorityError::Character,
        double_colon: "localhost::8000" => AuthorityError::Colons,
        two_ports: "localhost:8000:9000" => AuthorityError::Colons,
        a_bare_ipv6: "::1" => AuthorityError::Colons,
        empty_port: "localhost:" => AuthorityError::EmptyPort,
        empty_port_after_ipv6: "[::1]:" => AuthorityError::EmptyPort,
        port_too_large: "localhost:65536" => AuthorityError::Port(_),
        port_far_too_large: "127.0.0.1:99999" => AuthorityError::Port(_),
        port_zero: "localhost:0" => AuthorityError::Port(_),
        port_too_many_digits: "localhost:000080" => AuthorityError::Port(_),
        port_with_a_sign: "localhost:+80" => AuthorityError::Port(_),
        port_not_digits: "localhost:80a" => AuthorityError::Port(_),
        only_a_port: ":8000" => AuthorityError::Name(_),
        unclosed_bracket: "[::1" => AuthorityError::Bracket,
        junk_after_bracket: "[::1]x" => AuthorityError::Bracket,
        bracket_in_a_name: "local[host]" => AuthorityError::Bracket,
        ipv4_in_brackets: "[127.0.0.1]" => AuthorityError::Ipv6(_),
        ipv6_zone: "[fe80::1%25eth0]" => AuthorityError::Ipv6(_),
        empty_label: "a..b" => AuthorityError::Name(_),
        trailing_dot: "localhost." => AuthorityError::Name(_),
        leading_dash: "-a.example" => AuthorityError::Name(_),
        trailing_dash: "a-.example" => AuthorityError::Name(_),
        a_star: "*.example" => AuthorityError::Name(_),
        a_quote: "a\"b" => AuthorityError::Name(_),
        long_label: &format!("{}.example", "a".repeat(64)) => AuthorityError::Name(_),
        long_name: &format!("{}a", "a.".repeat(127)) => AuthorityError::Name(_),
        too_long: &"a".repeat(300) => AuthorityError::TooLong(300),
        short_ipv4: "127.1" => AuthorityError::NumericName(_),
        hex_ipv4: "0x7f.0.0.1" => AuthorityError::NumericName(_),
        hex_last_label: "a.0x10" => AuthorityError::NumericName(_),
        ipv4_out_of_range: "1.2.3.256" => AuthorityError::NumericName(_),
        ipv4_leading_zero: "127.0.0.01" => AuthorityError::NumericName(_),
        a_number: "8000" => AuthorityError::NumericName(_),
    }

    #[test]
    fn patterns_admit_their_host_at_their_port_or_any() {
        let any = Authority::parse("snakebox.internal").unwrap();
        let one = Authority::parse("snakebox.internal:8000").unwrap();
        for (pattern, request, admitted) in [
            (&any, "snakebox.internal", true),
            (&any, "SNAKEBOX.internal:9", true),
            (&one, "snakebox.internal:8000", true),
            (&one, "snakebox.internal:8001", false),
            (&one, "snakebox.internal", false),
            (&any, "other.internal", false),
        ] {
            let request = Authority::parse(request).unwrap();
            assert_eq!(pattern.admits(&request), admitted, "{pattern} {request}");
        }
    }

    #[test]
    fn loopback_hosts_are_known() {
        for (text, loopback) in [
            ("localhost", true),
            ("ui.localhost:8000", true),
            ("127.0.0.2", true),
            ("[::1]:8000", true),
            ("localhost.example", false),
            ("10.0.0.1", false),
            ("[::2]", false),
        ] {
            let parsed = Authority::parse(text).unwrap();
            assert_eq!(parsed.host.is_loopback(), loopback, "{text}");
        }
    }

    #[test]
    fn origins_are_a_scheme_and_an_authority() {
        let origin = Origin::parse("HTTPS://App.Example.com", false).unwrap();
        assert_eq!(origin.scheme, Scheme::Https);
        assert_eq!(origin.authority, name("app.example.com", None));
        assert!(origin.same(&Origin::parse("https://app.example.com:443", false).unwrap()));
        assert!(!origin.same(&Origin::parse("http://app.example.com", false).unwrap()));
        assert_eq!(
            Origin::parse("https://a.example/", false),
            Err(UrlError::OriginPath)
        );
        assert!(Origin::parse("https://a.example/", true).is_ok());
        for bad in [
            "null",
            "ftp://a.example",
            "https://a.example/x",
            "https://u@a.example",
            "https://a.example:99999",
            "a.example",
        ] {
            assert!(Origin::parse(bad, true).is_err(), "{bad}");
        }
        let own = Authority::parse("localhost:8000").unwrap();
        assert!(
            Origin::parse("http://localhost:8000", false)
                .unwrap()
                .is_of(&own)
        );
        assert!(
            Origin::parse("https://localhost:8000", false)
                .unwrap()
                .is_of(&own)
        );
        assert!(
            !Origin::parse("http://localhost:8001", false)
                .unwrap()
                .is_of(&own)
        );
        assert!(
            !Origin::parse("http://localhost", false)
                .unwrap()
                .is_of(&own)
        );
        let bare = Authority::parse("snakebox.example.com").unwrap();
        assert!(
            Origin::parse("https://snakebox.example.com", false)
                .unwrap()
                .is_of(&bare)
        );
    }

    #[test]
    fn base_urls_keep_a_clean_path_and_nothing_else() {
        let base = BaseUrl::parse("https://SB.example.com:8443/snake%20box/").unwrap();
        assert_eq!(base.to_string(), "https://sb.example.com:8443/snake%20box");
        assert!(base.is_https());
        assert_eq!(
            BaseUrl::parse("http://localhost:8000").unwrap().to_string(),
            "http://localhost:8000"
        );
        for bad in [
            "snakebox.example.com",
            "ftp://snakebox.example.com",
            "https://u:p@snakebox.example.com",
            "https://snakebox.example.com?x=1",
            "https://snakebox.example.com/a?x=1",
            "https://snakebox.example.com/a#x",
            "https://snakebox.example.com/a b",
            "https://snakebox.example.com/a\"b",
            "https://snakebox.example.com/%zz",
            "https://snakebox.example.com:0",
            "https://",
        ] {
            assert!(BaseUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
