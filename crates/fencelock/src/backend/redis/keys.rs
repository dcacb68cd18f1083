//! The key layout (the table in the [module docs](super)), the tickets that
//! name one acquire, and the values stored under the keys.
//!
//! Where it sits: under [`super::RedisBackend`]; every script call takes its
//! key names from [`Keys`]. [`Ticket`] and [`millis`] are shared with Redlock.
//! [`mismatch`] is the refusal of a request whose permits differ from the N
//! kept under `{p}:permits:{name}`, given by the first try and by the wait.

use std::time::Duration;

use crate::error::Error;
use crate::types::LockOptions;

/// The names of the keys (see the table in the [module docs](super)).
pub(super) struct Keys {
    /// The prefix with its `:`.
    pub(super) prefix: String,
}

impl Keys {
    pub(super) fn lock(&self, name: &str) -> String {
        format!("{}lock:{name}", self.prefix)
    }

    pub(super) fn queue(&self, name: &str) -> String {
        format!("{}queue:{name}", self.prefix)
    }

    pub(super) fn counter(&self) -> String {
        format!("{}token", self.prefix)
    }

    pub(super) fn wake(&self, ticket: &str) -> String {
        format!("{}wake:{ticket}", self.prefix)
    }

    pub(super) fn holder(&self, name: &str) -> String {
        format!("{}holder:{name}", self.prefix)
    }

    pub(super) fn channel(&self, name: &str) -> String {
        format!("{}leader:{name}", self.prefix)
    }

    pub(super) fn holders(&self, name: &str) -> String {
        format!("{}holders:{name}", self.prefix)
    }

    pub(super) fn tokens(&self, name: &str) -> String {
        format!("{}tokens:{name}", self.prefix)
    }

    pub(super) fn permits(&self, name: &str) -> String {
        format!("{}permits:{name}", self.prefix)
    }
}

/// One acquire's identity: 128 random bits, as 32 hex digits in Redis; `id`
/// (the high half) is the guard's lease id.
pub(in crate::backend) struct Ticket {
    pub(in crate::backend) id: u64,
    pub(in crate::backend) text: String,
}

impl Ticket {
    pub(in crate::backend) fn new() -> Ticket {
        let bits = crate::unique::u128();
        Ticket { id: (bits >> 64) as u64, text: format!("{bits:032x}") }
    }

    /// A ticket of the kind `opts` asks for: exclusive, or (see `queue.lua`)
    /// a reader's (`r` after the 32 digits) or a semaphore's (`s{weight}`).
    pub(super) fn for_request(opts: &LockOptions) -> Ticket {
        let mut ticket = Ticket::new();
        if opts.permits > 0 {
            ticket.text.push_str(&format!("s{}", opts.weight));
        } else if opts.mode == crate::LockMode::Shared {
            ticket.text.push('r');
        }
        ticket
    }

    /// Is this a reader's or a semaphore's ticket?
    pub(super) fn is_shared(&self) -> bool {
        self.text.len() > 32
    }
}

/// The token of a lock value `"{token}:{ticket}"`.
pub(super) fn token_of(value: &str) -> Option<u64> {
    value.split_once(':')?.0.parse().ok()
}

/// The lease id of a lock value `"{token}:{ticket}"`: the high half of the
/// ticket, as the holder's [`Guard::lease_id`](crate::backend::Guard::lease_id).
pub(super) fn lease_of(value: &str) -> Option<u64> {
    let ticket = value.split_once(':')?.1;
    u64::from_str_radix(ticket.get(..16)?, 16).ok()
}

/// A duration in whole milliseconds, at least 1 (for `PX`).
pub(in crate::backend) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The refusal of a request for `asked` permits (0: not a semaphore) of a
/// lock that keeps `kept`.
pub(super) fn mismatch(kept: u32, asked: u32) -> Error {
    Error::InvalidArgument(format!(
        "permits mismatch: the lock has {kept} permits, the acquire asked for {asked} (0 = not a semaphore)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_values_carry_their_token() {
        assert_eq!(token_of("12:00ff"), Some(12));
        assert_eq!(token_of("x:00ff"), None);
        assert_eq!(token_of("12"), None);
        assert_eq!(lease_of("12:00000000000000ff0000000000000001"), Some(255));
        assert_eq!(lease_of("12:ff"), None);
    }

    #[test]
    fn tickets_are_random_and_hex() {
        let (a, b) = (Ticket::new(), Ticket::new());
        assert_ne!(a.text, b.text);
        assert_eq!(a.text.len(), 32);
        assert!(a.text.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(format!("{:016x}", a.id), a.text[..16]);
    }

    /// A ticket says its kind after its 32 digits (`queue.lua`'s `kind_of`).
    #[test]
    fn tickets_say_their_kind() {
        let reader = Ticket::for_request(&LockOptions::default().shared());
        assert!(reader.text.ends_with('r') && reader.text.len() == 33 && reader.is_shared());
        let permits = Ticket::for_request(&LockOptions::default().permits(5).weight(3));
        assert!(permits.text.ends_with("s3") && permits.is_shared());
        let writer = Ticket::for_request(&LockOptions::default());
        assert!(writer.text.len() == 32 && !writer.is_shared());
    }
}
