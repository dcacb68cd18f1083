//! `http(s)://host:port/path` URLs, as the tools are given them: the demo's
//! `--storage`, the fenced storage server's lock service. A host is an IP
//! (IPv6 in brackets) or a name; the port may be left out (the scheme's);
//! a user, a query or a fragment is refused rather than ignored. Also the
//! [`Endpoint`] (host and port) the client connects to, which a URL gives.
//!
//! The client library's backend URLs (`fencelock://`, `redis://`, with
//! their parameters) are its own grammar, not this one.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// `http` or `https`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    /// 80 or 443.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        })
    }
}

/// A URL's host: an IP address or a name (resolved when connecting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Ip(IpAddr),
    Name(String),
}

impl fmt::Display for Host {
    /// An IPv6 address in brackets, as in a URL or a `host:port`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
            Host::Name(name) => f.write_str(name),
        }
    }
}

/// Where requests go: a host (an IP, or a name resolved when connecting)
/// and a port. Shown as `host:port`, which is also its `Host` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: Host,
    pub port: u16,
}

impl From<SocketAddr> for Endpoint {
    fn from(addr: SocketAddr) -> Self {
        Endpoint { host: Host::Ip(addr.ip()), port: addr.port() }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Why a string is not an `http(s)://host:port/path` URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    #[error("expected http:// or https://")]
    NoScheme,
    #[error("{0}:// is not http:// or https://")]
    Scheme(String),
    #[error("no host")]
    NoHost,
    #[error("an IPv6 host is written in brackets, e.g. [::1]:7071")]
    Brackets,
    #[error("bad port {port:?}: {source}")]
    Port { port: String, source: std::num::ParseIntError },
    #[error("a {0} is not supported")]
    Unsupported(&'static str),
}

/// A parsed `http(s)://host[:port][/path]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    pub scheme: Scheme,
    pub host: Host,
    /// As written; [`HttpUrl::port`] fills in the scheme's.
    pub port: Option<u16>,
    /// `""` when none is written, else from its `/` on.
    pub path: String,
}

impl HttpUrl {
    /// `http://…` or `https://…`; anything else, a bare `host:port`
    /// included, is an error.
    pub fn parse(raw: &str) -> Result<HttpUrl, UrlError> {
        let (scheme, rest) = raw.split_once("://").ok_or(UrlError::NoScheme)?;
        let scheme = match scheme {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            other => return Err(UrlError::Scheme(other.to_string())),
        };
        Self::parse_rest(scheme, rest)
    }

    /// As [`HttpUrl::parse`], but a bare `host:port[/path]` is `http://`.
    pub fn parse_or_http(raw: &str) -> Result<HttpUrl, UrlError> {
        match raw.contains("://") {
            true => Self::parse(raw),
            false => Self::parse_rest(Scheme::Http, raw),
        }
    }

    fn parse_rest(scheme: Scheme, rest: &str) -> Result<HttpUrl, UrlError> {
        if rest.contains('?') {
            return Err(UrlError::Unsupported("query"));
        }
        if rest.contains('#') {
            return Err(UrlError::Unsupported("fragment"));
        }
        let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
        if authority.contains('@') {
            return Err(UrlError::Unsupported("user"));
        }
        let (host, port) = split_authority(authority)?;
        Ok(HttpUrl { scheme, host, port, path: path.to_string() })
    }

    /// The port written, else the scheme's.
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(self.scheme.default_port())
    }

    /// Whether the URL names no path beyond `/`.
    pub fn is_base(&self) -> bool {
        self.path.trim_end_matches('/').is_empty()
    }

    /// Host and port (the scheme's if none is written), to connect to.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint { host: self.host.clone(), port: self.port() }
    }

    /// The address, if the host is an IP and the port is written.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        match (&self.host, self.port) {
            (Host::Ip(ip), Some(port)) => Some(SocketAddr::new(*ip, port)),
            _ => None,
        }
    }

    /// This URL with `path` in place of its own (`path` starts with `/`).
    pub fn with_path(&self, path: &str) -> HttpUrl {
        HttpUrl { path: path.to_string(), ..self.clone() }
    }
}

impl fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme, self.host)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        f.write_str(&self.path)
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`.
fn split_authority(authority: &str) -> Result<(Host, Option<u16>), UrlError> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(bracketed) => {
            let (v6, after) = bracketed.split_once(']').ok_or(UrlError::Brackets)?;
            let ip = v6.parse::<std::net::Ipv6Addr>().map_err(|_| UrlError::Brackets)?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or(UrlError::Brackets)?),
            };
            (Host::Ip(IpAddr::V6(ip)), port)
        }
        None if authority.matches(':').count() > 1 => return Err(UrlError::Brackets),
        None => {
            let (host, port) = authority.split_once(':').map_or((authority, None), |(h, p)| (h, Some(p)));
            if host.is_empty() {
                return Err(UrlError::NoHost);
            }
            (host.parse().map_or_else(|_| Host::Name(host.to_string()), Host::Ip), port)
        }
    };
    let port = port.map(|p| p.parse::<u16>().map_err(|source| UrlError::Port { port: p.to_string(), source }));
    Ok((host, port.transpose()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(raw: &str) -> HttpUrl {
        HttpUrl::parse(raw).unwrap_or_else(|e| panic!("{raw}: {e}"))
    }

    /// Rule: scheme, host (IP, bracketed IPv6 or name), optional port, path.
    #[test]
    fn urls_parse() {
        let u = url("http://127.0.0.1:7071/");
        assert_eq!(u.socket_addr(), Some("127.0.0.1:7071".parse().unwrap()));
        assert!(u.is_base());
        let u = url("https://[::1]:7072");
        assert_eq!((u.scheme, u.socket_addr()), (Scheme::Https, Some("[::1]:7072".parse().unwrap())));
        let u = url("https://lock.example/");
        assert_eq!((u.host.clone(), u.port(), u.socket_addr()), (Host::Name("lock.example".into()), 443, None));
        assert_eq!(url("http://h:1/metrics").path, "/metrics");
        assert!(!url("http://h:1/x").is_base());
        assert_eq!(HttpUrl::parse_or_http("127.0.0.1:7072").unwrap(), url("http://127.0.0.1:7072"));
    }

    /// Rule: a URL prints as written (but for a trailing path it was given),
    /// and its endpoint is `host:port` with the scheme's port filled in.
    #[test]
    fn urls_print_back() {
        assert_eq!(url("http://[::1]:7071").with_path("/metrics").to_string(), "http://[::1]:7071/metrics");
        assert_eq!(url("https://h").endpoint().to_string(), "h:443");
        assert_eq!(url("http://10.0.0.1:80/").to_string(), "http://10.0.0.1:80/");
    }

    /// Rule: what is not an http(s) URL says why; nothing is silently dropped.
    #[test]
    fn bad_urls_say_why() {
        let err = |raw: &str| HttpUrl::parse(raw).unwrap_err();
        assert_eq!(err("127.0.0.1:7071"), UrlError::NoScheme);
        assert_eq!(err("ftp://h:1"), UrlError::Scheme("ftp".into()));
        assert_eq!(err("http://:1"), UrlError::NoHost);
        assert_eq!(err("http://::1:7071"), UrlError::Brackets);
        assert_eq!(err("http://[::1"), UrlError::Brackets);
        assert!(matches!(err("http://h:x"), UrlError::Port { .. }));
        assert!(matches!(err("http://h:70000"), UrlError::Port { .. }));
        assert_eq!(err("http://u:p@h:1"), UrlError::Unsupported("user"));
        assert_eq!(err("http://h:1?ca=x"), UrlError::Unsupported("query"));
        assert_eq!(err("http://h:1#x"), UrlError::Unsupported("fragment"));
        assert!(std::error::Error::source(&err("http://h:x")).is_some(), "a bad port keeps the parse error");
    }
}
