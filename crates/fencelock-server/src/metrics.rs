//! Server metrics, rendered in the Prometheus text format by the admin endpoint.
//!
//! Counters and histograms are fed by the driver from engine effects (one place,
//! after the entry is applied); gauges are read from the engine when scraped.

use std::{
    fmt::Write,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
};

use fencelock_core::{Effect, ReleaseCause, Stats, WaitEnd};

/// Bucket upper bounds in seconds for the wait and hold histograms.
const BUCKETS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0];

/// A fixed-bucket histogram of seconds, observed in milliseconds.
#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_ms: AtomicU64,
}

impl Histogram {
    pub fn observe_ms(&self, ms: u64) {
        let secs = ms as f64 / 1000.0;
        for (b, le) in self.buckets.iter().zip(BUCKETS) {
            if secs <= le {
                b.fetch_add(1, Relaxed);
            }
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_ms.fetch_add(ms, Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (b, le) in self.buckets.iter().zip(BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {}", b.load(Relaxed));
        }
        let count = self.count.load(Relaxed);
        let sum = self.sum_ms.load(Relaxed) as f64 / 1000.0;
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// All server-side metrics.
#[derive(Default)]
pub struct Metrics {
    /// Per lock: where the contention is (see [`crate::lock_metrics`]).
    pub locks: crate::lock_metrics::LockMetrics,
    /// The data dir, measured at each scrape (see [`crate::group_metrics`]).
    pub data_dir: Option<std::path::PathBuf>,
    pub grants: AtomicU64,
    pub grants_after_wait: AtomicU64,
    pub releases: AtomicU64,
    pub releases_by_expiry: AtomicU64,
    pub releases_by_revoke: AtomicU64,
    pub releases_by_cancel: AtomicU64,
    pub expirations: AtomicU64,
    pub wait_timeouts: AtomicU64,
    pub waits_dropped: AtomicU64,
    /// Queued acquires told their once-per slot was done meanwhile.
    pub waits_slot_done: AtomicU64,
    pub batches: AtomicU64,
    pub batched_commands: AtomicU64,
    /// Raft messages from peers refused as malformed or unsafe (never applied).
    pub peer_messages_refused: AtomicU64,
    pub wait_time: Histogram,
    pub hold_time: Histogram,
    /// Accepted connections, fed by [`crate::access::conn_limits`].
    pub conns: ConnMetrics,
}

/// Connection counts of both listeners (see [`crate::access::conn_limits`]).
#[derive(Default)]
pub struct ConnMetrics {
    pub open: AtomicU64,
    pub refused_total: AtomicU64,
    pub refused_per_source: AtomicU64,
    pub refused_rate: AtomicU64,
    pub handshake_timeouts: AtomicU64,
    pub idle_closed: AtomicU64,
    pub tls_failures: AtomicU64,
}

impl ConnMetrics {
    pub fn opened(&self) {
        self.open.fetch_add(1, Relaxed);
    }

    pub fn closed(&self) {
        self.open.fetch_sub(1, Relaxed);
    }

    fn render(&self, o: &mut String) {
        let counters: [(&str, &str, &AtomicU64); 6] = [
            (
                "fencelock_connections_refused_total",
                "Connections closed at once: the total connection limit was reached.",
                &self.refused_total,
            ),
            (
                "fencelock_connections_refused_per_source_total",
                "Connections closed at once: their source address was at its connection limit.",
                &self.refused_per_source,
            ),
            (
                "fencelock_connections_refused_rate_total",
                "Connections closed at once: their source address opened new ones faster than its limit per second.",
                &self.refused_rate,
            ),
            (
                "fencelock_connections_handshake_timeouts_total",
                "Connections closed for sending nothing within the handshake timeout.",
                &self.handshake_timeouts,
            ),
            (
                "fencelock_connections_idle_closed_total",
                "Connections closed after the idle timeout.",
                &self.idle_closed,
            ),
            (
                "fencelock_connections_tls_failures_total",
                "Connections closed because their TLS handshake failed (a plaintext client, a certificate the node does not trust).",
                &self.tls_failures,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Relaxed));
        }
        let name = "fencelock_connections_open";
        let _ = writeln!(
            o,
            "# HELP {name} Accepted connections open, both ports.\n# TYPE {name} gauge\n{name} {}",
            self.open.load(Relaxed)
        );
    }
}

impl Metrics {
    /// Count one applied effect.
    pub fn effect(&self, e: &Effect) {
        match e {
            Effect::Granted { queued, waited_ms, .. } => {
                self.grants.fetch_add(1, Relaxed);
                if *queued {
                    self.grants_after_wait.fetch_add(1, Relaxed);
                }
                self.wait_time.observe_ms(*waited_ms);
            }
            Effect::Released { held_ms, cause, .. } => {
                self.hold_time.observe_ms(*held_ms);
                let c = match cause {
                    ReleaseCause::Expired => &self.releases_by_expiry,
                    ReleaseCause::Revoked => &self.releases_by_revoke,
                    ReleaseCause::Released => &self.releases,
                    ReleaseCause::Cancelled => &self.releases_by_cancel,
                };
                c.fetch_add(1, Relaxed);
            }
            Effect::ValueChanged { .. } | Effect::Downgraded { .. } => {}
            Effect::LeaseExpired { .. } => {
                self.expirations.fetch_add(1, Relaxed);
            }
            Effect::WaitEnded { why, .. } => {
                let c = match why {
                    WaitEnd::TimedOut => &self.wait_timeouts,
                    WaitEnd::LeaseEnded | WaitEnd::Cancelled => &self.waits_dropped,
                    WaitEnd::SlotDone(_) => &self.waits_slot_done,
                };
                c.fetch_add(1, Relaxed);
            }
        }
    }

    /// Count one log entry of `n` commands.
    pub fn batch(&self, n: usize) {
        self.batches.fetch_add(1, Relaxed);
        self.batched_commands.fetch_add(n as u64, Relaxed);
    }

    /// Render everything, with the engine gauges in `stats`.
    pub fn render(&self, stats: &Stats, is_leader: bool) -> String {
        let mut o = String::with_capacity(4096);
        let counters: [(&str, &str, &AtomicU64); 13] = [
            ("fencelock_grants_total", "Locks granted.", &self.grants),
            ("fencelock_grants_after_wait_total", "Locks granted to a queued waiter.", &self.grants_after_wait),
            ("fencelock_releases_total", "Locks released by their holder.", &self.releases),
            ("fencelock_releases_expired_total", "Locks released because the holder's lease expired.", &self.releases_by_expiry),
            ("fencelock_releases_revoked_total", "Locks released because the holder's lease was revoked.", &self.releases_by_revoke),
            (
                "fencelock_releases_cancelled_total",
                "Grants released undelivered: the caller went away before the answer reached it.",
                &self.releases_by_cancel,
            ),
            ("fencelock_lease_expirations_total", "Leases that expired.", &self.expirations),
            ("fencelock_wait_timeouts_total", "Queued acquires that timed out.", &self.wait_timeouts),
            ("fencelock_waits_dropped_total", "Queued acquires dropped (lease ended or cancelled).", &self.waits_dropped),
            (
                "fencelock_waits_slot_done_total",
                "Queued acquires answered that their once-per slot was done meanwhile (never granted).",
                &self.waits_slot_done,
            ),
            ("fencelock_log_entries_total", "Log entries written by this node's driver.", &self.batches),
            ("fencelock_log_commands_total", "Commands written in those entries.", &self.batched_commands),
            (
                "fencelock_peer_messages_refused_total",
                "Raft messages from peers refused as malformed or unsafe (a snapshot that does not decode, or would lower the token counter).",
                &self.peer_messages_refused,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Relaxed));
        }
        let gauges: [(&str, &str, u64); 6] = [
            ("fencelock_active_leases", "Live leases.", stats.leases),
            ("fencelock_held_locks", "Locks currently held.", stats.held_locks),
            ("fencelock_queue_depth", "Acquires waiting in queues, all locks.", stats.waiters),
            ("fencelock_tokens_issued", "Fencing tokens issued (grants made).", stats.tokens_issued),
            (
                "fencelock_token_counter",
                "Every token issued is at most this; the next is greater.",
                stats.token_counter,
            ),
            ("fencelock_is_leader", "1 if this node leads the group and serves requests.", is_leader as u64),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        self.wait_time.render(&mut o, "fencelock_wait_seconds", "Time from acquire to grant.");
        self.hold_time.render(&mut o, "fencelock_hold_seconds", "Time from grant to release or expiry.");
        self.conns.render(&mut o);
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe_ms(3);
        h.observe_ms(700);
        let mut s = String::new();
        h.render(&mut s, "x", "help");
        assert!(s.contains("x_bucket{le=\"0.001\"} 0\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"0.005\"} 1\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"1\"} 2\n"), "{s}");
        assert!(s.contains("x_bucket{le=\"+Inf\"} 2\nx_sum 0.703\nx_count 2\n"), "{s}");
    }
}
