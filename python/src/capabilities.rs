//! A backend's [`fencelock::Capabilities`] as the dict `client.capabilities()`
//! answers: the Rust field names, `fencing` as its words ("none", "per
//! lock", "global"), `min_ttl` in seconds.

use std::collections::BTreeMap;

use pyo3::prelude::*;

/// The dict's values: a flag, words, or seconds.
#[derive(IntoPyObject)]
pub enum Cap {
    Flag(bool),
    Words(String),
    Seconds(f64),
}

/// Every declared capability of `c`.
pub fn describe(c: &fencelock::Capabilities) -> BTreeMap<&'static str, Cap> {
    let flags = [
        ("durable_tokens", c.durable_tokens),
        ("fifo", c.fifo),
        ("push_wakeup", c.push_wakeup),
        ("server_ttl", c.server_ttl),
        ("survives_failover", c.survives_failover),
        ("lock_delay", c.lock_delay),
        ("holder_identity", c.holder_identity),
        ("election", c.election),
        ("shared", c.shared),
        ("semaphores", c.semaphores),
        ("hold_at_least", c.hold_at_least),
        ("once_per", c.once_per),
        ("multi_lock", c.multi_lock),
    ];
    let mut out: BTreeMap<&'static str, Cap> = flags.into_iter().map(|(k, v)| (k, Cap::Flag(v))).collect();
    out.insert("fencing", Cap::Words(c.fencing.to_string()));
    out.insert("min_ttl", Cap::Seconds(c.min_ttl.as_secs_f64()));
    out
}
