//! `fencelock demo` end to end: with fencing the paused holder's stale write is
//! rejected and nothing acknowledged is lost (exit 0); without fencing the same
//! scenario loses B's acknowledged write, which proves the fault really happened.

mod support;

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
    // Fenced run: A (token 1) is rejected after B (token 2) wrote; B's write stays.
    assert!(fenced.contains("B acquired \"demo-ledger\": token 2"), "{fenced}");
    assert!(fenced.contains("with token 1: REJECTED 409"), "{fenced}");
    assert!(fenced.contains("final object \"ledger\": [\"B booked seat 7\"]"), "{fenced}");
    assert!(fenced.contains("PUT ledger token 1 -> stale (highest seen 2)"), "{fenced}");
    // Unfenced run: the same race loses B's acknowledged write.
    assert!(unfenced.contains("final object \"ledger\": [\"A booked seat 7\"]"), "{unfenced}");
    assert!(unfenced.contains("LOST: acknowledged write \"B booked seat 7\""), "{unfenced}");
    assert!(text.contains("fencing on: nothing lost; A's stale write was rejected"), "{text}");
}
