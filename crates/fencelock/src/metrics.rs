//! Client metrics, through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! Where it sits: the acquire path, the guard and the lease watchdog call these
//! helpers; the application installs whatever recorder it likes (Prometheus, …).
//! Without a recorder they cost next to nothing. All names start with
//! `fencelock_client_`:
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `fencelock_client_acquires_total` | counter | `outcome` = acquired, busy, timed_out, error | acquire calls by outcome |
//! | `fencelock_client_lock_wait_seconds` | histogram | `outcome` | time from the acquire call to its outcome |
//! | `fencelock_client_lock_hold_seconds` | histogram | | time from the grant to the guard's release or drop (after a loss too) |
//! | `fencelock_client_lease_renewals_total` | counter | | keep-alives the server confirmed |
//! | `fencelock_client_lease_renewal_failures_total` | counter | | keep-alive rounds that failed (retried until the lease deadline) |
//! | `fencelock_client_leases_lost_total` | counter | `reason` | leases lost while in use |
//! | `fencelock_client_rpc_retries_total` | counter | `op` | RPC attempts retried after a transient failure |
//!
//! # Examples
//!
//! Install a recorder of the `metrics` crate (a Prometheus exporter, say) at
//! start-up; the constants here name what the client records, for dashboards
//! and alerts.
//!
//! ```
//! use fencelock::metrics;
//!
//! // Alert when a holder loses a lock it still used.
//! let alert = format!("increase({}[5m]) > 0", metrics::LEASES_LOST);
//! assert_eq!(alert, "increase(fencelock_client_leases_lost_total[5m]) > 0");
//! ```

use std::time::Duration;

/// Counter of acquire calls, labelled `outcome`.
pub const ACQUIRES: &str = "fencelock_client_acquires_total";
/// Histogram of the time from an acquire call to its outcome, labelled `outcome`.
pub const WAIT_SECONDS: &str = "fencelock_client_lock_wait_seconds";
/// Histogram of the time from a grant to its guard's release or drop.
pub const HOLD_SECONDS: &str = "fencelock_client_lock_hold_seconds";
/// Counter of keep-alives the server confirmed.
pub const RENEWALS: &str = "fencelock_client_lease_renewals_total";
/// Counter of keep-alive rounds that failed.
pub const RENEWAL_FAILURES: &str = "fencelock_client_lease_renewal_failures_total";
/// Counter of leases lost while in use, labelled `reason`.
pub const LEASES_LOST: &str = "fencelock_client_leases_lost_total";
/// Counter of RPC attempts retried, labelled `op`.
pub const RPC_RETRIES: &str = "fencelock_client_rpc_retries_total";

/// One acquire ended with `outcome` after `waited`.
pub(crate) fn acquire(outcome: &'static str, waited: Duration) {
    metrics::counter!(ACQUIRES, "outcome" => outcome).increment(1);
    metrics::histogram!(WAIT_SECONDS, "outcome" => outcome).record(waited.as_secs_f64());
}

/// A lock was held for `held`.
pub(crate) fn hold(held: Duration) {
    metrics::histogram!(HOLD_SECONDS).record(held.as_secs_f64());
}

pub(crate) fn renewal() {
    metrics::counter!(RENEWALS).increment(1);
}

pub(crate) fn renewal_failure() {
    metrics::counter!(RENEWAL_FAILURES).increment(1);
}

pub(crate) fn lease_lost(reason: &'static str) {
    metrics::counter!(LEASES_LOST, "reason" => reason).increment(1);
}

pub(crate) fn rpc_retry(op: &'static str) {
    metrics::counter!(RPC_RETRIES, "op" => op).increment(1);
}
