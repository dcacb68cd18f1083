//! Determinism: the same seed run twice gives the identical trace, and two
//! different seeds give different traces. Without this no failing seed could be
//! reproduced.
//!
//! Reproduce one seed: `FENCELOCK_SIM_SEED=N cargo nextest run -p fencelock-sim inv_determinism::`.

use fencelock_sim::{harness, SimConfig};

fn trace(seed: u64) -> Vec<String> {
    fencelock_sim::run(&SimConfig::new(seed)).trace()
}

fn first_difference(a: &[String], b: &[String]) -> String {
    let i = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    format!("line {i}: {:?} vs {:?}", a.get(i), b.get(i))
}

#[test]
fn same_seed_same_trace_different_seed_different_trace() {
    let seeds = harness::seeds();
    let mut traces = Vec::new();
    for &seed in &seeds {
        let (a, b) = (trace(seed), trace(seed));
        assert!(
            a == b,
            "seed {seed} gave two different traces, first difference at {}\n{}",
            first_difference(&a, &b),
            harness::reproduce("inv_determinism", seed)
        );
        traces.push((seed, a));
    }
    if traces.len() == 1 {
        traces.push((seeds[0] + 1, trace(seeds[0] + 1)));
    }
    for w in traces.windows(2) {
        let ((s1, t1), (s2, t2)) = (&w[0], &w[1]);
        assert_ne!(t1, t2, "seeds {s1} and {s2} gave the same trace");
    }
    println!("{} seeds, each run twice: identical traces", seeds.len());
}
