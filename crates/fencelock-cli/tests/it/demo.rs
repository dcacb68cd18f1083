//! `fencelock demo` end to end: with fencing the paused holder's stale write is
//! rejected and nothing acknowledged is lost (exit 0); without fencing the same
//! scenario loses B's acknowledged write, which proves the fault really happened.

use crate::support;

use std::process::Command;

#[test]
fn demo_fences_off_the_paused_holder() {
    let out = Command::new(support::bin()).arg("demo").output().expect("run fencelock demo");
    // Whitespace-normalized, line by line, so column widths do not matter.
    let text: String = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ") + "\n")
        .collect();
    assert!(out.status.success(), "demo failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let (fenced, unfenced) = text.split_once("fencing OFF").expect("both runs printed");
    // Fenced run: A (the first token) is rejected after B (a larger one) wrote;
    // B's write stays. (Tokens start at the group's token floor, not at 1.)
    let (a, b) = (token_of(fenced, "A"), token_of(fenced, "B"));
    assert!(b > a, "B's token {b} is above A's {a}: {fenced}");
    assert!(fenced.contains(&format!("with token {a}: REJECTED 409")), "{fenced}");
    assert!(fenced.contains("final object \"ledger\": [\"B booked seat 7\"]"), "{fenced}");
    assert!(fenced.contains(&format!("PUT ledger token {a} -> stale (highest seen {b})")), "{fenced}");
    // Unfenced run: the same race loses B's acknowledged write.
    assert!(unfenced.contains("final object \"ledger\": [\"A booked seat 7\"]"), "{unfenced}");
    assert!(unfenced.contains("LOST: acknowledged write \"B booked seat 7\""), "{unfenced}");
    assert!(text.contains("fencing on: nothing lost; A's stale write was rejected"), "{text}");
}

/// The token in the line `WHO acquired "demo-ledger": token N, …`.
fn token_of(text: &str, who: &str) -> u64 {
    let prefix = format!("{who} acquired \"demo-ledger\": token ");
    let rest = text
        .lines()
        .find_map(|l| l.split_once(&prefix).map(|(_, r)| r))
        .unwrap_or_else(|| panic!("{who} acquired: {text}"));
    rest.split(',').next().unwrap().trim().parse().unwrap_or_else(|e| panic!("{rest:?}: {e}"))
}
