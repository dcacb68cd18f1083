//! The recipe: one run of the acquire script, a try, an acquire or a
//! campaign, and the release, new-value and withdraw scripts (see the
//! [module docs](super) for the protocol, and `*.lua` beside this file).
//!
//! Where it sits: under [`super::RedisBackend`]; waiting in line is in
//! [`super::wait`], the guard of a grant in [`super::held`].

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::{Script, Value};

use super::keys::{lease_of, millis, mismatch, token_of, Ticket};
use super::{RedisBackend, Retry, Shared, OP_TIMEOUT};
use crate::backend::election::encode_holder;
use crate::backend::{Guard, LockBackend, Outcome};
use crate::error::Error;
use crate::types::LockOptions;

const QUEUE_LUA: &str = include_str!("queue.lua");
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| with_queue(include_str!("acquire.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| with_queue(include_str!("release.lua")));
static WITHDRAW: LazyLock<Script> = LazyLock::new(|| with_queue(include_str!("withdraw.lua")));
pub(super) static LEADER: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("leader.lua")));
static SET_VALUE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("set_value.lua")));
/// `renew.lua`: `PEXPIRE` if the value matches; shared with Redlock.
pub(in crate::backend) static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("renew.lua")));

pub(super) fn with_queue(script: &str) -> Script {
    Script::new(&format!("{QUEUE_LUA}\n{script}"))
}

impl RedisBackend {
    /// One run of the acquire script for `req`; `wait` enqueues its ticket if
    /// the lock is not granted; `queued_before` refuses to enqueue it again.
    pub(super) async fn attempt(&self, req: &Req<'_>, wait: bool, queued_before: bool) -> Result<Attempt, Error> {
        let keys = &self.shared.keys;
        let (lock, queue, counter, holder) =
            (keys.lock(req.name), keys.queue(req.name), keys.counter(), keys.holder(req.name));
        let (holders, tokens, permits) = (keys.holders(req.name), keys.tokens(req.name), keys.permits(req.name));
        let flag = |yes: bool| if yes { "1" } else { "0" };
        let (prefix, ticket, ttl_ms) = (&keys.prefix, &req.ticket.text, millis(req.opts.ttl));
        let (wait, queued_before, channel) = (flag(wait), flag(queued_before), keys.channel(req.name));
        let deadline = crate::clock::now() + OP_TIMEOUT;
        let reply: Value = self
            .shared
            .conn
            .run(deadline, Retry::Once, |mut c| {
                let (lock, queue, counter, holder, channel) = (&lock, &queue, &counter, &holder, &channel);
                let (holders, tokens, permits) = (&holders, &tokens, &permits);
                async move {
                    let mut call = ACQUIRE.prepare_invoke();
                    call.key(lock).key(queue).key(counter).key(holder).key(holders).key(tokens).key(permits);
                    call.arg(prefix).arg(ticket).arg(ttl_ms).arg(wait).arg(&req.data).arg(channel).arg(queued_before);
                    call.arg(req.opts.permits);
                    call.invoke_async(&mut c).await
                }
            })
            .await?;
        parse_attempt(&reply)
    }

    /// Tries once: granted, or `Busy` with what the script saw.
    async fn try_once(&self, req: &Req<'_>) -> Result<Outcome<Guard>, Error> {
        let sent = crate::clock::now();
        Ok(match self.attempt(req, false, false).await? {
            Attempt::Granted { token } => Outcome::Acquired(self.grant(req, token, sent)),
            Attempt::Refused { holder, waiters, .. } => {
                let holder_lease = holder.as_deref().and_then(lease_of);
                let holder_token = holder.as_deref().and_then(token_of);
                Outcome::Busy { holder_lease, holder_token, reopens_in: None, waiters }
            }
            Attempt::Dropped => return Err(req.lost()),
            Attempt::Mismatch { kept } => return Err(mismatch(kept, req.opts.permits)),
        })
    }

    /// An acquire (`Purpose::Lock`) or a campaign: queued, or tried once.
    pub(super) async fn acquire_as(
        &self,
        name: &str,
        opts: &LockOptions,
        purpose: Purpose,
    ) -> Result<Outcome<Guard>, Error> {
        self.capabilities().admit(self.kind(), name, opts)?;
        if purpose == Purpose::Campaign && (opts.permits > 0 || opts.mode == crate::LockMode::Shared) {
            return Err(Error::InvalidArgument("a campaign is exclusive: no shared mode, no permits".into()));
        }
        let req = Req { name, ticket: Ticket::for_request(opts), opts, data: encode_holder(opts), purpose };
        // Dropped (with the future, or on an error) it withdraws the ticket.
        let mut withdraw =
            Withdraw { shared: Some(self.shared.clone()), name: name.to_string(), ticket: req.ticket.text.clone() };
        let outcome = if opts.wait.is_zero() { self.try_once(&req).await? } else { self.wait_in_line(&req).await? };
        match outcome {
            Outcome::TimedOut => withdraw.now().await,
            _ => withdraw.disarm(),
        }
        Ok(outcome)
    }
}

impl Shared {
    /// Release: compare-and-delete lock `name` if it holds `owner`, then wake
    /// the next waiter. `Ok(true)` iff this call deleted it. Not retried: a
    /// lost answer leaves the outcome unknown (an error).
    pub(super) async fn release(&self, name: &str, owner: &str) -> Result<bool, Error> {
        let keys = &self.keys;
        let (lock, queue, holder, channel) = (keys.lock(name), keys.queue(name), keys.holder(name), keys.channel(name));
        let (lock, queue, holder, channel, prefix) = (&lock, &queue, &holder, &channel, &keys.prefix);
        let deadline = crate::clock::now() + OP_TIMEOUT;
        let n: i64 = self
            .conn
            .run(deadline, Retry::Never, |mut c| async move {
                let mut call = RELEASE.prepare_invoke();
                call.key(lock).key(queue).key(holder).arg(prefix).arg(owner).arg(channel);
                call.invoke_async(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }

    /// Compare-and-set of the holder key of lock `name` if the lock holds
    /// `owner`: see `set_value.lua`. `Ok(true)` iff it did. Idempotent.
    pub(super) async fn set_value(&self, name: &str, owner: &str, data: Vec<u8>) -> Result<bool, Error> {
        let keys = &self.keys;
        let (lock, holder, channel) = (keys.lock(name), keys.holder(name), keys.channel(name));
        let (lock, holder, channel, data) = (&lock, &holder, &channel, &data);
        let deadline = crate::clock::now() + OP_TIMEOUT;
        let n: i64 = self
            .conn
            .run(deadline, Retry::Once, |mut c| async move {
                let mut call = SET_VALUE.prepare_invoke();
                call.key(lock).key(holder).arg(owner).arg(data).arg(channel);
                call.invoke_async(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }

    /// A waiter gives up: see `withdraw.lua`. Idempotent.
    pub(super) async fn withdraw(&self, name: &str, ticket: &str) -> Result<(), Error> {
        let keys = &self.keys;
        let (lock, queue, holder, channel) = (keys.lock(name), keys.queue(name), keys.holder(name), keys.channel(name));
        let (holders, tokens) = (keys.holders(name), keys.tokens(name));
        let prefix = &keys.prefix;
        let deadline = crate::clock::now() + OP_TIMEOUT;
        let _: i64 = self
            .conn
            .run(deadline, Retry::Once, |mut c| {
                let (lock, queue, holder, channel, holders, tokens) =
                    (&lock, &queue, &holder, &channel, &holders, &tokens);
                async move {
                    let mut call = WITHDRAW.prepare_invoke();
                    call.key(lock).key(queue).key(holder).key(holders).key(tokens);
                    call.arg(prefix).arg(ticket).arg(channel);
                    call.invoke_async(&mut c).await
                }
            })
            .await?;
        Ok(())
    }
}

/// What a request is for, which decides what losing its place means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Purpose {
    /// A lock: a ticket dropped from the queue is queued again, at the back.
    Lock,
    /// A campaign: a candidate whose ticket was dropped is told so
    /// ([`Error::LeaseNotFound`]), as every backend's campaign does.
    Campaign,
}

/// One acquire or campaign: what each run of the acquire script sends.
pub(super) struct Req<'a> {
    pub(super) name: &'a str,
    pub(super) ticket: Ticket,
    pub(super) opts: &'a LockOptions,
    /// The identity and value, encoded for the holder key.
    pub(super) data: Vec<u8>,
    pub(super) purpose: Purpose,
}

impl Req<'_> {
    /// The error of a campaign whose ticket was dropped from the queue.
    pub(super) fn lost(&self) -> Error {
        let why = format!("the ticket of a waiting campaign for {:?} was dropped from the queue (its waiter key expired, or the server lost it)", self.name);
        match self.purpose {
            Purpose::Lock => Error::backend("redis", why),
            Purpose::Campaign => Error::LeaseNotFound(format!("redis: {why}")),
        }
    }
}

/// What one run of the acquire script found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Attempt {
    Granted {
        token: u64,
    },
    /// `holder`: the lock's value, if held; `pttl`: its time to live.
    Refused {
        holder: Option<String>,
        pttl: Option<Duration>,
        waiters: u32,
        first: bool,
    },
    /// The ticket, queued before, is queued no more (a campaign's).
    Dropped,
    /// The lock keeps another semaphore size `kept` (0: not a semaphore).
    Mismatch {
        kept: u32,
    },
}

/// Parses the acquire script's reply (see `acquire.lua`).
pub(super) fn parse_attempt(reply: &Value) -> Result<Attempt, Error> {
    let bad = || Error::backend("redis", format!("unexpected reply of the acquire script: {reply:?}"));
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    match items.as_slice() {
        [Value::Int(1), token] => Ok(Attempt::Granted { token: decimal(token).ok_or_else(bad)? }),
        [Value::Int(2)] => Ok(Attempt::Dropped),
        [Value::Int(3), Value::Int(kept)] => Ok(Attempt::Mismatch { kept: u32::try_from(*kept).map_err(|_| bad())? }),
        [Value::Int(0), Value::BulkString(holder), Value::Int(pttl), Value::Int(waiters), Value::Int(first)] => {
            Ok(Attempt::Refused {
                holder: (!holder.is_empty()).then(|| String::from_utf8_lossy(holder).into_owned()),
                pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
                waiters: u32::try_from(*waiters).unwrap_or(u32::MAX),
                first: *first == 1,
            })
        }
        _ => Err(bad()),
    }
}

/// A token in a reply: an integer or a decimal string.
fn decimal(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// Drop guard of an acquire: unless disarmed, withdraws the ticket in the
/// background (the future was dropped, or failed).
struct Withdraw {
    shared: Option<Arc<Shared>>,
    name: String,
    ticket: String,
}

impl Withdraw {
    /// The acquire ended cleanly: nothing to withdraw.
    fn disarm(&mut self) {
        self.shared = None;
    }

    /// Withdraws now (a wait ran out); errors are ignored: the waiter key then
    /// expires after the TTL, and the ticket is skipped after that.
    async fn now(&mut self) {
        if let Some(shared) = self.shared.take() {
            if let Err(e) = shared.withdraw(&self.name, &self.ticket).await {
                tracing::debug!(lock = self.name, error = %e, "fencelock: redis withdraw failed");
            }
        }
    }
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (name, ticket) = (std::mem::take(&mut self.name), std::mem::take(&mut self.ticket));
            runtime.spawn(async move {
                let _ = shared.withdraw(&name, &ticket).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn acquire_replies_parse() {
        let granted = Value::Array(vec![Value::Int(1), bulk("42")]);
        assert_eq!(parse_attempt(&granted), Ok(Attempt::Granted { token: 42 }));
        let value = "7:00000000000000ff0000000000000001";
        let held = Value::Array(vec![Value::Int(0), bulk(value), Value::Int(900), Value::Int(2), Value::Int(1)]);
        let want = Attempt::Refused {
            holder: Some(value.to_string()),
            pttl: Some(Duration::from_millis(900)),
            waiters: 2,
            first: true,
        };
        assert_eq!(parse_attempt(&held), Ok(want));
        let free = Value::Array(vec![Value::Int(0), bulk(""), Value::Int(-2), Value::Int(1), Value::Int(0)]);
        let want = Attempt::Refused { holder: None, pttl: None, waiters: 1, first: false };
        assert_eq!(parse_attempt(&free), Ok(want));
        assert_eq!(parse_attempt(&Value::Array(vec![Value::Int(2)])), Ok(Attempt::Dropped));
        assert_eq!(parse_attempt(&Value::Array(vec![Value::Int(3), Value::Int(4)])), Ok(Attempt::Mismatch { kept: 4 }));
        for bad in [Value::Nil, Value::Array(vec![Value::Int(1), bulk("x")]), Value::Array(vec![Value::Int(3)])] {
            assert!(matches!(parse_attempt(&bad), Err(Error::Backend { .. })), "{bad:?}");
        }
    }
}
