//! Every invariant with 16 clients (the CI seeds run 4 to 8): more clients
//! per lock make longer queues, more multi-acquires crossing each other and
//! more retries whose attempt and cancel meet at the server in one batch.
//! Seeds 6, 21 and 48 at 16 clients are where INV-MULTI once counted a grant
//! the server had cancelled, before any client saw it, as a second grant of
//! the request (see `check::multi`); each runs with 1 and with 4 writes in
//! flight.
//!
//! Reproduce: `cargo run -p fencelock-sim -- --seed 48 --clients 16 --max-inflight 1 --trace`.

use fencelock_sim::{check, SimConfig};

#[test]
fn every_invariant_holds_with_sixteen_clients() {
    let mut failures = Vec::new();
    for seed in [6, 21, 48] {
        for inflight in [1, 4] {
            let mut config = SimConfig::new(seed).with_max_inflight(inflight);
            config.clients = 16;
            let report = fencelock_sim::run(&config);
            for c in check::ALL {
                let v = check::run(c, &report);
                println!("seed {seed}, {inflight} in flight: {}", v.summary());
                if !v.holds() {
                    failures.push(format!("seed {seed}, {inflight} in flight: {}", v.summary()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
