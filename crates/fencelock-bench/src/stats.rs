//! Percentiles and medians of what was measured.

use crate::model::{Latency, RunResult, Scale};

/// Percentiles of `ms` (sorted in place).
pub fn latency(ms: &mut [f64]) -> Latency {
    if ms.is_empty() {
        return Latency::default();
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| ms[((ms.len() as f64 * p).ceil() as usize).clamp(1, ms.len()) - 1];
    Latency { p50: at(0.50), p99: at(0.99), p999: at(0.999), max: ms[ms.len() - 1], samples: ms.len() as u64 }
}

/// The run with the median throughput (the lower middle one for an even count).
pub fn median_run(runs: &[RunResult]) -> RunResult {
    let mut sorted: Vec<&RunResult> = runs.iter().collect();
    sorted.sort_by(|a, b| a.cycles_per_sec.total_cmp(&b.cycles_per_sec));
    sorted.get((sorted.len().max(1) - 1) / 2).map(|r| (*r).clone()).unwrap_or_default()
}

/// The W3 run with the median create time (the slower middle one for an
/// even count, as [`median_run`] takes the lower throughput), carrying every
/// run's create time in run order.
pub fn median_scale(runs: Vec<Scale>) -> Option<Scale> {
    let times: Vec<f64> = runs.iter().map(|s| s.create_seconds).collect();
    let mut sorted = runs;
    sorted.sort_by(|a, b| a.create_seconds.total_cmp(&b.create_seconds));
    let middle = sorted.len() / 2;
    let mut median = sorted.into_iter().nth(middle)?;
    median.create_seconds_runs = times;
    Some(median)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nearest-rank percentiles: p50 of 1..=100 is 50, p99 is 99, p99.9 is 100.
    #[test]
    fn nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let l = latency(&mut v);
        assert_eq!((l.p50, l.p99, l.p999, l.max, l.samples), (50.0, 99.0, 100.0, 100.0, 100));
        assert_eq!(latency(&mut []).samples, 0);
    }

    /// W3's median run is the middle one by create time, with its own
    /// figures and every run's time; of two, the slower.
    #[test]
    fn the_median_scale_run_is_the_middle_create_time() {
        let run = |secs: f64, bytes: f64| {
            let mut s = crate::report::tests::scale(1_000, secs);
            s.bytes_per_lease = bytes;
            s
        };
        let m = median_scale(vec![run(9.0, 1.0), run(12.0, 2.0), run(10.0, 3.0)]).expect("a run");
        assert_eq!((m.create_seconds, m.bytes_per_lease), (10.0, 3.0));
        assert_eq!(m.create_seconds_runs, [9.0, 12.0, 10.0]);
        assert_eq!(median_scale(vec![run(9.0, 1.0), run(12.0, 2.0)]).expect("a run").create_seconds, 12.0);
        assert!(median_scale(Vec::new()).is_none());
    }

    /// The median of three runs is the middle one by throughput, with its own figures.
    #[test]
    fn median_is_middle_run() {
        let run = |c: f64, e: u64| RunResult { cycles_per_sec: c, errors: e, ..RunResult::default() };
        let m = median_run(&[run(3.0, 3), run(1.0, 1), run(2.0, 2)]);
        assert_eq!((m.cycles_per_sec, m.errors), (2.0, 2));
        assert_eq!(median_run(&[run(1.0, 1), run(2.0, 2)]).errors, 1);
    }
}
