//! Multi mode's cycle (`--multi K`, atomic multi-locks of issue 18): all K
//! locks at once or one of them, then a read-modify-write of each held
//! lock's object with that lock's token, a hold, and the release.
//!
//! Where it sits: a part of the worker process (`super`), beside its
//! exclusive, shared, semaphore and election cycles, with their reads,
//! writes, fault points and last checks. Histories: the acquire and the
//! release name the locks in the order asked (`locks`); a multi grant
//! records one token per lock in that order (`tokens`), a single grant its
//! `token`; each read and write names its object (`key`).

use std::time::Duration;

use fencelock::backend::{Backend, Guard, MultiGuard};
use fencelock::{Error, LockOptions, Outcome};

use super::{fail, released, Guarded, Worker, NO_TOKEN};
use crate::history::{Event, Kind, Op};
use crate::scenario::multi_name;

/// The share of cycles that take all the locks at once.
const MULTI_SHARE: f64 = 0.5;

impl Worker {
    /// One multi-mode cycle: the locks (all K, in a shuffled order, with
    /// probability [`MULTI_SHARE`]; else one drawn at random), then each
    /// held lock's object read and written in that order, a hold, release.
    /// A multi-holder goes on to the next object after a failed read or
    /// write: its last check before each write decides for that write.
    pub(super) async fn multi_cycle(&mut self, seq: u64) -> anyhow::Result<()> {
        let mut order: Vec<u32> = (0..self.a.multi).collect();
        self.rng.shuffle(&mut order);
        if self.rng.f64() >= MULTI_SHARE {
            order.truncate(1);
        }
        let objs: Vec<Guarded> = order.iter().map(|&i| self.guarded(i)).collect();
        let Some(guards) = self.acquire_locks(seq, &objs).await? else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            return Ok(());
        };
        for (obj, guard) in objs.iter().zip(&guards) {
            let token = guard.token().unwrap_or(NO_TOKEN);
            if let Some(value) = self.read(seq, token, obj).await? {
                self.write(seq, token, guard, value, obj).await?;
            }
        }
        self.hold().await;
        self.release_locks(seq, &objs, guards).await
    }

    /// Lock `i` and its object.
    fn guarded(&self, i: u32) -> Guarded {
        Guarded { lock: multi_name(&self.a.lock, i), key: multi_name(&self.a.key, i) }
    }

    /// Takes the locks of `objs`: one with a plain acquire, several with
    /// `acquire_all` (the mutant multi-one-by-one: one after another). One
    /// guard per lock, in the order asked.
    async fn acquire_locks(&mut self, seq: u64, objs: &[Guarded]) -> anyhow::Result<Option<Vec<Guard>>> {
        let locks: Vec<String> = objs.iter().map(|o| o.lock.clone()).collect();
        self.log(Event { locks: Some(locks.clone()), ..self.ev(Kind::Invoke, Op::Acquire, seq) })?;
        let opts = self.options(false);
        let names: Vec<&str> = locks.iter().map(String::as_str).collect();
        let res = match (names.as_slice(), self.a.multi_one_by_one) {
            ([one], _) => self.backend.acquire(one, &opts).await.map(|a| a.map(|g| vec![g])),
            (_, false) => self.backend.acquire_all(&names, &opts).await.map(|a| a.map(MultiGuard::into_guards)),
            (_, true) => one_by_one(&self.backend, &names, &opts).await,
        };
        let mut e = Event { locks: Some(locks), ..self.ev(Kind::Ok, Op::Acquire, seq) };
        let guards = match res {
            Ok(Outcome::Acquired(gs)) => {
                record_grant(&mut e, &gs);
                Some(gs)
            }
            Ok(Outcome::Busy { .. }) => fail(&mut e, "busy"),
            Ok(Outcome::TimedOut) => fail(&mut e, "timed out"),
            Err(err) => self.failed(&mut e, err),
        };
        self.log(e)?;
        Ok(guards)
    }

    /// Releases every lock of the cycle (all were still held: `released`).
    async fn release_locks(&mut self, seq: u64, objs: &[Guarded], guards: Vec<Guard>) -> anyhow::Result<()> {
        let locks: Vec<String> = objs.iter().map(|o| o.lock.clone()).collect();
        let (token, tokens) = tokens_of(&guards);
        let tag = |e: Event| Event { locks: Some(locks.clone()), token, tokens: tokens.clone(), ..e };
        self.log(tag(self.ev(Kind::Invoke, Op::Release, seq)))?;
        let mut all = Ok(true);
        for g in guards {
            all = match (all, g.release().await) {
                (Err(e), _) | (Ok(_), Err(e)) => Err(e),
                (Ok(a), Ok(b)) => Ok(a && b),
            };
        }
        let mut e = tag(self.ev(Kind::Ok, Op::Release, seq));
        released(&mut e, all);
        self.log(e)
    }
}

/// A grant's tokens and lease on its event.
fn record_grant(e: &mut Event, guards: &[Guard]) {
    e.lease = guards.first().map(Guard::lease_id);
    if let Some(first) = guards.first() {
        e.detail = super::lease_left(first);
    }
    (e.token, e.tokens) = tokens_of(guards);
}

/// One lock's token as `token`, a multi grant's as `tokens` (one per
/// guard, in the order asked).
fn tokens_of(guards: &[Guard]) -> (Option<u64>, Option<Vec<u64>>) {
    match guards {
        [one] => (one.token(), None),
        all => (None, Some(all.iter().filter_map(Guard::token).collect())),
    }
}

/// The mutant multi-one-by-one: the locks taken one after another with
/// plain acquires, each waiting its turn, as a non-atomic multi-lock does;
/// if one is not granted, those taken are released and its outcome is the
/// whole one's.
async fn one_by_one(backend: &Backend, names: &[&str], opts: &LockOptions) -> Result<Outcome<Vec<Guard>>, Error> {
    let mut held = Vec::with_capacity(names.len());
    for name in names {
        match backend.acquire(name, opts).await {
            Ok(Outcome::Acquired(g)) => held.push(g),
            other => {
                for g in held {
                    let _ = g.release().await;
                }
                return other.map(|a| a.map(|g| vec![g]));
            }
        }
    }
    Ok(Outcome::Acquired(held))
}
