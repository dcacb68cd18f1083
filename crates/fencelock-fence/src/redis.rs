//! [`RedisFence`]: one Lua script ([`SCRIPT`]) that checks the token against
//! the key's marks by [the rule](crate::Marks::admit), performs the caller's
//! read or write and raises the marks, all in one atomic step on the Redis
//! server.
//!
//! The marks of resource key `K` are the string key `{prefix}K` (prefix
//! `fencelock:fence:` by default): `"W:S"` in decimal (the last write's
//! token, 0 if none, and the highest token admitted), or one decimal when
//! the two are equal, which is also how a mark stored before fenced reads
//! reads.
//!
//! # Durability: what Redis must be configured for
//!
//! The mark is only as durable as Redis makes it. With the default
//! configuration (RDB snapshots, no AOF) a crash forgets the marks raised
//! since the last snapshot, and a stale token is admitted after the restart;
//! an asynchronous replica promoted on fail-over can forget them too. For a
//! fence that survives a crash run Redis with `appendonly yes` and
//! `appendfsync always`, and do not fail over to a replica that may lag.
//!
//! In Redis Cluster the mark key and the data key must hash to the same slot:
//! give both a hash tag (e.g. resource key `{orders}`, data key `{orders}:v`).

use std::sync::LazyLock;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::{Script, Value};

use crate::fence::{check_input, check_key, Access, Fence, FenceError, Fenced, Marks, Stale};

/// The script's source, documented in the crate's README.
pub const SCRIPT: &str = include_str!("fence.lua");

static FENCE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SCRIPT));

/// The default prefix of mark keys.
pub const DEFAULT_PREFIX: &str = "fencelock:fence:";

/// A write that [`RedisFence::write`] performs together with the check.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisWrite {
    /// `SET key value`.
    Set { key: String, value: Vec<u8> },
    /// `DEL key`; the reply is the number of keys removed.
    Del { key: String },
    /// `APPEND key value`; the reply is the new length.
    Append { key: String, value: Vec<u8> },
    /// `HSET key field value [field value …]`; the reply is the number of
    /// fields added. Needs at least one field.
    HSet { key: String, fields: Vec<(String, Vec<u8>)> },
}

/// A [`Fence`] whose marks live in Redis, with fenced writes.
#[derive(Clone)]
pub struct RedisFence {
    conn: MultiplexedConnection,
    prefix: String,
}

/// How long a fence call waits for Redis's answer.
pub const RESPONSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl RedisFence {
    /// Use `conn` with the default mark prefix.
    pub fn new(conn: MultiplexedConnection) -> Self {
        Self { conn, prefix: DEFAULT_PREFIX.to_owned() }
    }

    /// Connect to `url` (`redis://127.0.0.1:6379/`). A call that Redis has
    /// not answered within [`RESPONSE_TIMEOUT`] fails (its outcome unknown);
    /// the driver's own default, 500 ms, failed fenced writes on a merely
    /// busy machine.
    pub async fn connect(url: &str) -> Result<Self, FenceError> {
        let client = redis::Client::open(url).map_err(FenceError::storage)?;
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(RESPONSE_TIMEOUT));
        let conn = client.get_multiplexed_async_connection_with_config(&config).await.map_err(FenceError::storage)?;
        Ok(Self::new(conn))
    }

    /// Use another prefix for mark keys.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The Redis key holding the mark of resource `key`.
    pub fn mark_key(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    /// Admit `token` on resource `key` and, if admitted, perform `write` in
    /// the same atomic step. Stale: nothing is written. If Redis refuses the
    /// write (e.g. `WRONGTYPE`), the call fails and the mark is unchanged.
    ///
    /// The reply is the write's integer reply (0 for `SET`).
    pub async fn write(&self, key: &str, token: u64, write: RedisWrite) -> Result<Fenced<i64>, FenceError> {
        check_input(key, token)?;
        let mut call = FENCE_SCRIPT.prepare_invoke();
        call.key(self.mark_key(key)).arg(token.to_string());
        match write {
            RedisWrite::Set { key, value } => call.key(key).arg("SET").arg(value),
            RedisWrite::Del { key } => call.key(key).arg("DEL"),
            RedisWrite::Append { key, value } => call.key(key).arg("APPEND").arg(value),
            RedisWrite::HSet { key, fields } => {
                call.key(key).arg("HSET");
                for (field, value) in fields {
                    call.arg(field).arg(value);
                }
                &mut call
            }
        };
        let mut conn = self.conn.clone();
        let reply: Value = call.invoke_async(&mut conn).await.map_err(FenceError::storage)?;
        parse_reply(reply, Access::Write, token)?.map_admitted(|v| match v {
            Value::Int(n) => Some(n),
            _ => None,
        })
    }

    /// A fenced read: admit `token` as a read on resource `key` and, if
    /// admitted, `GET data_key` in the same atomic step (`None`: no such
    /// key). Stale: nothing is read.
    pub async fn read(&self, key: &str, token: u64, data_key: &str) -> Result<Fenced<Option<Vec<u8>>>, FenceError> {
        check_input(key, token)?;
        let mut conn = self.conn.clone();
        let reply: Value = FENCE_SCRIPT
            .key(self.mark_key(key))
            .key(data_key)
            .arg(token.to_string())
            .arg("GET")
            .invoke_async(&mut conn)
            .await
            .map_err(FenceError::storage)?;
        parse_reply(reply, Access::Read, token)?.map_admitted(|v| match v {
            Value::Nil => Some(None),
            Value::BulkString(bytes) => Some(Some(bytes)),
            _ => None,
        })
    }
}

/// `{1, token, reply}` → admitted with `reply`; `{0, mark}` → stale.
fn parse_reply(reply: Value, access: Access, token: u64) -> Result<Fenced<Value>, FenceError> {
    let bad = |reply: &Value| FenceError::storage(format!("unexpected fence script reply: {reply:?}"));
    let Value::Array(mut items) = reply else {
        return Err(bad(&reply));
    };
    match items.as_slice() {
        [Value::Int(1), _, _] => Ok(Fenced::Admitted(items.pop().expect("three items"))),
        [Value::Int(0), highest] => {
            let highest = decimal(highest).ok_or_else(|| bad(&Value::Array(items.clone())))?;
            Ok(Fenced::Stale(Stale { access, highest, got: token }))
        }
        _ => Err(bad(&Value::Array(items))),
    }
}

trait MapAdmitted {
    /// Convert an admitted script reply, or fail if it has the wrong shape.
    fn map_admitted<T>(self, f: impl FnOnce(Value) -> Option<T>) -> Result<Fenced<T>, FenceError>;
}

impl MapAdmitted for Fenced<Value> {
    fn map_admitted<T>(self, f: impl FnOnce(Value) -> Option<T>) -> Result<Fenced<T>, FenceError> {
        match self {
            Fenced::Admitted(value) => {
                let shown = format!("{value:?}");
                f(value)
                    .map(Fenced::Admitted)
                    .ok_or_else(|| FenceError::storage(format!("unexpected fence script reply: {shown}")))
            }
            Fenced::Stale(stale) => Ok(Fenced::Stale(stale)),
        }
    }
}

/// The marks as stored: `"W:S"` or one decimal for `W = S`.
fn parse_marks(stored: &str) -> Option<Marks> {
    match stored.split_once(':') {
        Some((w, s)) => Some(Marks { write: w.parse().ok()?, seen: s.parse().ok()? }),
        None => stored.parse().ok().map(Marks::single),
    }
}

fn decimal(value: &Value) -> Option<u64> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

#[async_trait]
impl Fence for RedisFence {
    async fn admit_as(&self, key: &str, token: u64, access: Access) -> Result<Fenced, FenceError> {
        check_input(key, token)?;
        let op = match access {
            Access::Read => "READ",
            Access::Write => "NONE",
        };
        let mut conn = self.conn.clone();
        let reply: Value = FENCE_SCRIPT
            .key(self.mark_key(key))
            .arg(token.to_string())
            .arg(op)
            .invoke_async(&mut conn)
            .await
            .map_err(FenceError::storage)?;
        Ok(parse_reply(reply, access, token)?.map(|_| ()))
    }

    async fn marks(&self, key: &str) -> Result<Option<Marks>, FenceError> {
        check_key(key)?;
        let mut conn = self.conn.clone();
        let value: Option<String> =
            redis::cmd("GET").arg(self.mark_key(key)).query_async(&mut conn).await.map_err(FenceError::storage)?;
        match value {
            None => Ok(None),
            Some(stored) => parse_marks(&stored)
                .map(Some)
                .ok_or_else(|| FenceError::Corrupt(format!("marks of {key:?} are not tokens: {stored:?}"))),
        }
    }
}
