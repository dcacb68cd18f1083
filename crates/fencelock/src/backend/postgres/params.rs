//! The URL of the PostgreSQL backend: `mode=` (lease or advisory), `table=`
//! (the lease mode's table, a checked [`Table`]), the TLS parameters (read by
//! `tls`), and everything else passed to tokio-postgres as it is.
//!
//! Where it sits: read once by [`super::PgBackend::connect`].

use tokio_postgres::Config;

use super::conn::describe;
use super::tls::{self, PgConfig};
use super::CONNECT_TIMEOUT;
use crate::backend::BackendUrl;
use crate::error::Error;

/// The table of the lease-table mode when the URL names none.
pub const DEFAULT_TABLE: &str = "fencelock_locks";

/// Longest `table` name: the derived names (`<table>_waiters_id_seq`, the
/// longest) must fit PostgreSQL's 63-byte identifiers.
const MAX_TABLE_LEN: usize = 40;

/// What the URL says: the connection config for tokio-postgres, and the table
/// of the lease-table mode (`None`: advisory mode).
pub(super) struct Settings {
    pub(super) config: PgConfig,
    pub(super) table: Option<Table>,
}

impl Settings {
    pub(super) fn from_url(url: &BackendUrl) -> Result<Settings, Error> {
        let advisory = match url.param("mode") {
            None | Some("lease") => false,
            Some("advisory") => true,
            Some(other) => {
                return Err(Error::InvalidArgument(format!(
                    "postgres: mode={other:?} is not a mode (lease or advisory)"
                )))
            }
        };
        let table = match (advisory, url.param("table")) {
            (true, Some(_)) => {
                return Err(Error::InvalidArgument("postgres: table= applies to the lease mode only".into()))
            }
            (true, None) => None,
            (false, table) => Some(Table::new(table.unwrap_or(DEFAULT_TABLE))?),
        };
        let stripped = strip_params(&url.raw, &["mode", "table", tls::PARAMS[0], tls::PARAMS[1]]);
        let config: Config = stripped.parse().map_err(|e| {
            // The driver's message may quote the URL: say it without the password.
            let shown = describe(&e).replace(&url.raw, &url.redacted());
            Error::InvalidArgument(format!("postgres: bad connection url {url}: {shown}"))
        })?;
        let mut config = PgConfig::new(config, url)?;
        let inner = config.inner_mut();
        if inner.get_connect_timeout().is_none() {
            inner.connect_timeout(CONNECT_TIMEOUT);
        }
        if inner.get_application_name().is_none() {
            inner.application_name("fencelock");
        }
        Ok(Settings { config, table })
    }
}

/// The table name of the lease-table mode: a plain lower-case SQL identifier
/// (it is spliced into the DDL and the statements, quoted), at most 40 bytes.
fn check_table(table: &str) -> Result<&str, Error> {
    let mut chars = table.chars();
    let starts_well = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !starts_well || !rest_ok || table.len() > MAX_TABLE_LEN {
        return Err(Error::InvalidArgument(format!(
            "postgres: table={table:?} must be a lower-case identifier ([a-z_][a-z0-9_]*) \
             of at most {MAX_TABLE_LEN} bytes"
        )));
    }
    Ok(table)
}

/// The table of the lease-table mode: a name checked by [`check_table`] (a
/// plain lower-case identifier, `[a-z_][a-z0-9_]*`, at most 40 bytes), the
/// only value ever spliced into SQL. It is spliced in double quotes (and, for
/// the DDL's advisory lock key, in single quotes), which such a name cannot
/// end, and it names no keyword that matters inside quotes; every other value
/// is a bound parameter (`$1`, …). [`Table::new`] is the only way to make one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Table(String);

impl Table {
    /// `name` if it is a valid table name, else [`Error::InvalidArgument`].
    pub(super) fn new(name: &str) -> Result<Table, Error> {
        Ok(Table(check_table(name)?.to_string()))
    }

    pub(super) fn as_str(&self) -> &str {
        &self.0
    }

    /// A statement of a `.sql` file with every `{table}` replaced by this
    /// name (the files use no other placeholder).
    pub(super) fn render(&self, template: &str) -> String {
        template.replace("{table}", &self.0)
    }
}

/// `raw` without the query parameters named in `keys` (tokio-postgres refuses
/// parameters it does not know).
fn strip_params(raw: &str, keys: &[&str]) -> String {
    let Some((base, query)) = raw.split_once('?') else {
        return raw.to_string();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| !pair.is_empty() && !keys.contains(&pair.split_once('=').map_or(*pair, |(k, _)| k)))
        .collect();
    if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Duration;

    #[test]
    fn own_parameters_are_stripped_and_others_kept() {
        let strip = |raw| strip_params(raw, &["mode", "table"]);
        assert_eq!(strip("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(strip("postgres://u@h/db?mode=advisory"), "postgres://u@h/db");
        assert_eq!(strip("postgres://u@h/db?table=t&connect_timeout=2&mode"), "postgres://u@h/db?connect_timeout=2");
        assert_eq!(strip("postgres://u@h/db?application_name=x&table=t"), "postgres://u@h/db?application_name=x");
    }

    #[test]
    fn settings_pick_the_mode_and_check_the_table() {
        let settings = |raw: &str| Settings::from_url(&BackendUrl::parse(raw).unwrap());
        let lease = settings("postgres://u@h:1/db").unwrap();
        assert_eq!(lease.table.as_ref().map(Table::as_str), Some(DEFAULT_TABLE));
        assert_eq!(lease.config.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert_eq!(lease.config.get_application_name(), Some("fencelock"));
        let named = settings("postgres://u@h:1/db?table=jobs_locks&connect_timeout=2&application_name=me").unwrap();
        assert_eq!(named.table.as_ref().map(Table::as_str), Some("jobs_locks"));
        assert_eq!(named.config.get_connect_timeout(), Some(&Duration::from_secs(2)));
        assert_eq!(named.config.get_application_name(), Some("me"));
        assert!(settings("postgres://u@h:1/db?mode=advisory").unwrap().table.is_none());
        for bad in [
            "postgres://u@h/db?mode=session",
            "postgres://u@h/db?mode=advisory&table=t",
            "postgres://u@h/db?table=Locks",
            "postgres://u@h/db?table=a;drop",
            "postgres://u@h/db?table=",
            "postgres://u@h/db?table=1a",
            "postgres://u@h/db?connect_timeout=soon",
        ] {
            assert!(matches!(settings(bad), Err(Error::InvalidArgument(_))), "{bad}");
        }
        assert!(check_table(&"t".repeat(MAX_TABLE_LEN)).is_ok());
        assert!(check_table(&"t".repeat(MAX_TABLE_LEN + 1)).is_err());
    }
}
