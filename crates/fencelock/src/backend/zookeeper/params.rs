//! The URL of the ZooKeeper backend: the connect string, the chroot (the
//! URL's path), `prefix=`, and the `digest` login (`user:password@`).
//!
//! Where it sits: read once by [`super::ZkBackend::connect`].

use super::keys::check_path;
use crate::backend::BackendUrl;
use crate::error::Error;

/// Where locks live under the chroot unless the URL says `?prefix=`.
pub const DEFAULT_PREFIX: &str = "/fencelock";

/// The client's connect string (`h:p,[v6]:p`) and the base path
/// (`/{chroot}{prefix}`) of `url`.
pub(super) fn parse_url(url: &BackendUrl) -> Result<(String, String), Error> {
    if url.userinfo.is_some() && (url.user().is_none() || url.password().is_none()) {
        return Err(Error::InvalidArgument(format!("{url}: zk digest auth needs user:password@")));
    }
    let hosts: Vec<String> = url
        .hosts
        .iter()
        .map(|(h, p)| if h.contains(':') { format!("[{h}]:{p}") } else { format!("{h}:{p}") })
        .collect();
    let chroot = if url.path.is_empty() { String::new() } else { format!("/{}", url.path) };
    let prefix = url.param("prefix").unwrap_or(DEFAULT_PREFIX);
    if !prefix.starts_with('/') {
        return Err(Error::InvalidArgument(format!("{url}: prefix {prefix:?} must start with /")));
    }
    let base = format!("{chroot}{prefix}");
    check_path(&base).map_err(|why| Error::InvalidArgument(format!("{url}: path {base:?} {why}")))?;
    Ok((hosts.join(","), base))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_hosts_and_base_path() {
        let parse = |u: &str| parse_url(&BackendUrl::parse(u).unwrap());
        assert_eq!(parse("zk://a:1,b,[::1]:3").unwrap(), ("a:1,b:2181,[::1]:3".into(), "/fencelock".into()));
        assert_eq!(parse("zk://a/app/x?prefix=/locks").unwrap().1, "/app/x/locks");
        for bad in
            ["zk://a?prefix=locks", "zk://a?prefix=/", "zk://a/../x", "zk://u@a", "zk://:p@a", "zk://a?prefix=/a//b"]
        {
            assert!(matches!(parse(bad), Err(Error::InvalidArgument(_))), "{bad}");
        }
    }
}
