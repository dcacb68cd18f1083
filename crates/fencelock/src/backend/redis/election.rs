//! Leader election on one Redis server: a campaign is the lock recipe (its
//! grant stores the candidate's identity and value in the holder key), the
//! leader is the lock's holder, and its term the grant's token.
//!
//! Where it sits: under [`super::RedisBackend`]'s `leader` and `observe`; the
//! campaign is `RedisBackend::acquire_as` for `Purpose::Campaign`, and the
//! rule that terms never go back is [`crate::backend::election`]'s.
//!
//! Observing: the observer subscribes to the lock's channel first, then reads
//! the leader (`leader.lua`), so that no grant or release after the read is
//! missed while the subscription lasts: the scripts publish every grant
//! (`g{token}:{data}`) and release (`r{token}`) in the same atomic step that
//! makes it. An expiry publishes nothing, so the observer reads the leader
//! again when the leader's lock would expire, and at least every [`REREAD`]
//! (which also covers messages lost while the subscription's connection was
//! down: it is made again before that read).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::PubSubStream;
use redis::Value;
use tokio::time::Instant;
use tokio_stream::StreamExt;

use super::{token_of, Retry, Shared, CONNECT_TIMEOUT, LEADER, OP_TIMEOUT};
use crate::backend::election::decode_holder;
use crate::backend::{check_name, leader_stream, Leader, LeaderEvent, LeaderSink, LeaderStream};
use crate::backoff::Backoff;
use crate::error::Error;

/// The longest an observer goes without reading the leader.
const REREAD: Duration = Duration::from_secs(1);

/// A leader as read, with the time its lock has left.
type Read = Option<(Leader, Duration)>;

impl super::RedisBackend {
    /// The leader of the election `name`, with the time its lock has left.
    pub(super) async fn leader_of(&self, name: &str) -> Result<Read, Error> {
        check_name(name)?;
        read_leader(&self.shared, name).await
    }

    /// The changes of the election `name` from now on, the current leader
    /// first. The subscription and the first read happen here, so that their
    /// failure is this call's.
    pub(super) async fn observe_election(&self, name: &str) -> Result<LeaderStream, Error> {
        check_name(name)?;
        let messages = subscribe(&self.shared, name).await?;
        let first = read_leader(&self.shared, name).await?;
        let follower = Follower { shared: self.shared.clone(), name: name.to_string(), messages: Some(messages) };
        Ok(leader_stream(move |sink| follower.run(first, sink)))
    }
}

/// One observer: the lock's channel, and reads of the leader.
struct Follower {
    shared: Arc<Shared>,
    name: String,
    /// `None` while the subscription is down.
    messages: Option<PubSubStream>,
}

impl Follower {
    /// Shows `first`, then every message and every read after it, until the
    /// reader is gone or something fencelock did not write shows up.
    async fn run(mut self, first: Read, mut sink: LeaderSink) {
        let mut next_read = reread_after(&first);
        if !sink.show(first.map(|(leader, _)| leader)).await {
            return;
        }
        let backoff = Backoff::default();
        let mut attempt = 0;
        loop {
            match self.listen_until(next_read, &mut sink).await {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => return sink.fail(e).await,
            }
            if self.messages.is_none() {
                self.messages = subscribe(&self.shared, &self.name).await.ok();
            }
            match read_leader(&self.shared, &self.name).await {
                Ok(read) => {
                    attempt = 0;
                    next_read = reread_after(&read);
                    if !sink.show(read.map(|(leader, _)| leader)).await {
                        return;
                    }
                }
                Err(e @ (Error::Protocol(_) | Error::Security { .. })) => return sink.fail(e).await,
                Err(e) => {
                    tracing::debug!(lock = %self.name, error = %e, "fencelock: redis: election read failed; retrying");
                    next_read = crate::clock::now() + backoff.delay(attempt, fastrand::f64());
                    attempt = attempt.saturating_add(1);
                }
            }
        }
    }

    /// Hands on the channel's messages until `until`, or until the
    /// subscription ends. `Ok(false)` once the reader is gone.
    async fn listen_until(&mut self, until: Instant, sink: &mut LeaderSink) -> Result<bool, Error> {
        loop {
            let Some(messages) = self.messages.as_mut() else {
                tokio::time::sleep_until(until).await;
                return Ok(true);
            };
            let message = tokio::select! {
                message = messages.next() => message,
                () = tokio::time::sleep_until(until) => return Ok(true),
            };
            let Some(message) = message else {
                // The connection ended: read now, and subscribe again.
                self.messages = None;
                return Ok(true);
            };
            let shown = match parse_message(&self.name, message.get_payload_bytes())? {
                // A grant also ends a term that expired unannounced.
                LeaderEvent::Leader(leader) => sink.show(Some(leader)).await,
                vacant => sink.send(vacant).await,
            };
            if !shown {
                return Ok(false);
            }
        }
    }
}

/// When to read again after `read`: just after the leader's lock would
/// expire, and within [`REREAD`].
fn reread_after(read: &Read) -> Instant {
    let wait = match read {
        Some((_, left)) => (*left + Duration::from_millis(1)).min(REREAD),
        None => REREAD,
    };
    crate::clock::now() + wait
}

/// A subscription to the election channel of `name`, on a connection of its own.
async fn subscribe(shared: &Shared, name: &str) -> Result<PubSubStream, Error> {
    let channel = shared.keys.channel(name);
    let connect = async {
        let mut pubsub = shared.conn.client.get_async_pubsub().await?;
        pubsub.subscribe(&channel).await?;
        Ok(pubsub.into_on_message())
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(messages)) => Ok(messages),
        Ok(Err(e)) => Err(shared.conn.error(&e)),
        Err(_) => {
            Err(Error::backend("redis", format!("{}: no subscription within {CONNECT_TIMEOUT:?}", shared.conn.addr)))
        }
    }
}

/// The leader of `name` and the time its lock has left (`leader.lua`).
async fn read_leader(shared: &Shared, name: &str) -> Result<Read, Error> {
    let (lock, holder) = (shared.keys.lock(name), shared.keys.holder(name));
    let deadline = crate::clock::now() + OP_TIMEOUT;
    let reply: Value = shared
        .conn
        .run(deadline, Retry::Once, |mut c| {
            let (lock, holder) = (&lock, &holder);
            async move {
                let mut call = LEADER.prepare_invoke();
                call.key(lock).key(holder);
                call.invoke_async(&mut c).await
            }
        })
        .await?;
    parse_leader(name, &reply)
}

/// Parses `leader.lua`'s reply. A holder key of another grant than the
/// lock's (or none) means the holder stored no identity and no value.
fn parse_leader(name: &str, reply: &Value) -> Result<Read, Error> {
    let bad = || Error::Protocol(format!("redis: unexpected reply of the leader script: {reply:?}"));
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    match items.as_slice() {
        [] => Ok(None),
        [Value::BulkString(lock), Value::BulkString(holder), Value::Int(left)] => {
            let token = std::str::from_utf8(lock).ok().and_then(token_of).ok_or_else(bad)?;
            let data = match split_token(holder) {
                Some((of, data)) if of == token => data,
                _ => &[],
            };
            let left = Duration::from_millis(u64::try_from(*left).unwrap_or(0));
            Ok(Some((decode_holder(name, token, data)?, left)))
        }
        _ => Err(bad()),
    }
}

/// What a message on the election channel of `name` says: `g{token}:{data}`
/// a grant, `r{token}` a release.
fn parse_message(name: &str, payload: &[u8]) -> Result<LeaderEvent, Error> {
    let bad = || Error::Protocol(format!("redis: a message on the election channel of {name:?} not from fencelock"));
    match payload.split_first() {
        Some((b'g', rest)) => {
            let (token, data) = split_token(rest).ok_or_else(bad)?;
            Ok(LeaderEvent::Leader(decode_holder(name, token, data)?))
        }
        Some((b'r', rest)) => {
            let term = std::str::from_utf8(rest).ok().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
            Ok(LeaderEvent::Vacant { term })
        }
        _ => Err(bad()),
    }
}

/// `"{token}:{rest}"` as its token and the rest.
fn split_token(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let colon = bytes.iter().position(|&b| b == b':')?;
    let token = std::str::from_utf8(&bytes[..colon]).ok()?.parse().ok()?;
    Some((token, &bytes[colon + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The channel's two messages read back as the scripts write them, and
    /// anything else is refused.
    #[test]
    fn messages_are_grants_and_releases() {
        let got = parse_message("e", b"g42:\x00\x02abv").unwrap();
        let want = Leader { name: "e".into(), term: 42, value: b"v".to_vec(), identity: Some("ab".into()) };
        assert_eq!(got, LeaderEvent::Leader(want));
        assert_eq!(parse_message("e", b"g7:").unwrap(), LeaderEvent::Leader(decode_holder("e", 7, b"").unwrap()));
        assert_eq!(parse_message("e", b"r42").unwrap(), LeaderEvent::Vacant { term: 42 });
        for foreign in [&b""[..], b"x1", b"g", b"gx:", b"r", b"r4x"] {
            assert!(matches!(parse_message("e", foreign), Err(Error::Protocol(_))), "{foreign:?}");
        }
    }

    /// A holder key left by another grant is not shown as the holder's.
    #[test]
    fn the_holder_key_counts_only_for_its_own_grant() {
        let bulk = |b: &[u8]| Value::BulkString(b.to_vec());
        let reply = |holder: &[u8]| Value::Array(vec![bulk(b"9:abc"), bulk(holder), Value::Int(500)]);
        let (leader, left) = parse_leader("e", &reply(b"9:\x00\x00v")).unwrap().unwrap();
        assert_eq!((leader.term, leader.value.as_slice(), left), (9, &b"v"[..], Duration::from_millis(500)));
        let (leader, _) = parse_leader("e", &reply(b"8:\x00\x00old")).unwrap().unwrap();
        assert_eq!((leader.term, leader.value.as_slice()), (9, &b""[..]));
        assert_eq!(parse_leader("e", &Value::Array(vec![])).unwrap(), None);
    }
}
