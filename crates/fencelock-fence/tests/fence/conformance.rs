//! The one conformance suite every `Fence` implementation must pass. Each
//! case takes the fence (or, for the race, one handle per task: separate
//! connections where the store has them) and a key prefix of its own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use fencelock_fence::{Access, Fence, FenceError, Fenced, Marks, Stale, MAX_KEY_LEN, MAX_TOKEN};

/// A write refused by a write or a read with a higher token.
fn stale(highest: u64, got: u64) -> Fenced {
    Fenced::Stale(Stale { access: Access::Write, highest, got })
}

/// A read refused by a write with a higher token.
fn stale_read(highest: u64, got: u64) -> Fenced {
    Fenced::Stale(Stale { access: Access::Read, highest, got })
}

/// Accept above, accept equal, reject below; the mark moves only up.
pub async fn exact_cases(fence: &dyn Fence, p: &str) {
    let k = format!("{p}:exact");
    assert_eq!(fence.highest(&k).await.unwrap(), None);
    assert_eq!(fence.admit(&k, 5).await.unwrap(), Fenced::Admitted(()));
    assert_eq!(fence.highest(&k).await.unwrap(), Some(5));
    assert_eq!(fence.admit(&k, 5).await.unwrap(), Fenced::Admitted(()), "equal token must be admitted");
    assert_eq!(fence.admit(&k, 4).await.unwrap(), stale(5, 4));
    assert_eq!(fence.admit(&k, 1).await.unwrap(), stale(5, 1));
    assert_eq!(fence.highest(&k).await.unwrap(), Some(5), "a stale admit changed the mark");
    assert_eq!(fence.admit(&k, 6).await.unwrap(), Fenced::Admitted(()));
    assert_eq!(fence.admit(&k, 5).await.unwrap(), stale(6, 5));
    assert_eq!(fence.admit(&k, 1000).await.unwrap(), Fenced::Admitted(()));
    assert_eq!(fence.highest(&k).await.unwrap(), Some(1000));
}

/// Tokens are compared exactly up to `MAX_TOKEN` (doubles are not exact
/// above 2^53: a store that compares floats fails here).
pub async fn large_tokens_are_exact(fence: &dyn Fence, p: &str) {
    let k = format!("{p}:large");
    let two53 = 1u64 << 53;
    assert!(fence.admit(&k, two53 + 1).await.unwrap().is_admitted());
    assert_eq!(fence.admit(&k, two53).await.unwrap(), stale(two53 + 1, two53));
    assert!(fence.admit(&k, MAX_TOKEN).await.unwrap().is_admitted());
    assert_eq!(fence.admit(&k, MAX_TOKEN - 1).await.unwrap(), stale(MAX_TOKEN, MAX_TOKEN - 1));
    assert_eq!(fence.highest(&k).await.unwrap(), Some(MAX_TOKEN));
}

/// Keys do not affect one another; any valid key works.
pub async fn keys_are_independent(fence: &dyn Fence, p: &str) {
    let (a, b) = (format!("{p}:a"), format!("{p}:b"));
    assert!(fence.admit(&a, 50).await.unwrap().is_admitted());
    assert_eq!(fence.highest(&b).await.unwrap(), None);
    assert!(fence.admit(&b, 3).await.unwrap().is_admitted());
    assert_eq!((fence.highest(&a).await.unwrap(), fence.highest(&b).await.unwrap()), (Some(50), Some(3)));
    let unicode = format!("{p}:ключ/🔒 with spaces");
    assert!(fence.admit(&unicode, 7).await.unwrap().is_admitted());
    assert_eq!(fence.highest(&unicode).await.unwrap(), Some(7));
    let long = format!("{p}:{}", "k".repeat(MAX_KEY_LEN - p.len() - 1));
    assert_eq!(long.len(), MAX_KEY_LEN);
    assert!(fence.admit(&long, 9).await.unwrap().is_admitted());
    assert_eq!(fence.highest(&long).await.unwrap(), Some(9));
}

/// Invalid input is an error and changes nothing.
pub async fn invalid_input_is_refused(fence: &dyn Fence, p: &str) {
    let k = format!("{p}:invalid");
    assert!(matches!(fence.admit(&k, 0).await, Err(FenceError::InvalidToken(0))));
    assert!(matches!(fence.admit(&k, MAX_TOKEN + 1).await, Err(FenceError::InvalidToken(t)) if t == MAX_TOKEN + 1));
    assert!(matches!(fence.admit(&k, u64::MAX).await, Err(FenceError::InvalidToken(u64::MAX))));
    assert!(matches!(fence.admit("", 1).await, Err(FenceError::InvalidKey { .. })));
    assert!(matches!(fence.admit("a\0b", 1).await, Err(FenceError::InvalidKey { .. })));
    let too_long = "k".repeat(MAX_KEY_LEN + 1);
    assert!(matches!(fence.admit(&too_long, 1).await, Err(FenceError::InvalidKey { .. })));
    assert!(matches!(fence.highest("").await, Err(FenceError::InvalidKey { .. })));
    assert_eq!(fence.highest(&k).await.unwrap(), None);
}

/// The read-modify-write of the `Fence` docs: holder 6's fenced read stops
/// holder 5's late write, and after holder 6 wrote, holder 5's read too.
pub async fn fenced_read_stops_an_older_write(fence: &dyn Fence, p: &str) {
    let k = format!("{p}:rmw");
    assert!(fence.admit_read(&k, 5).await.unwrap().is_admitted(), "holder 5 reads");
    assert!(fence.admit_read(&k, 6).await.unwrap().is_admitted(), "holder 6 reads");
    assert_eq!(fence.admit(&k, 5).await.unwrap(), stale(6, 5), "holder 5's write must be stale");
    assert!(fence.admit(&k, 6).await.unwrap().is_admitted(), "holder 6 writes");
    assert_eq!(fence.admit_read(&k, 5).await.unwrap(), stale_read(6, 5), "holder 5's read after 6 wrote");
    assert_eq!(fence.highest(&k).await.unwrap(), Some(6));
}

/// The read rule (`Marks::admit`): readers of a read-write lock are admitted
/// in any token order; a stale reader after a newer writer wrote is refused;
/// an old writer after a newer reader read is refused; a downgraded writer
/// reads its own write with its token. The marks are exact at each step.
pub async fn reads_and_writes_exact_cases(fence: &dyn Fence, p: &str) {
    let k = format!("{p}:rw");
    let marks = |write, seen| Some(Marks { write, seen });
    assert!(fence.admit_read(&k, 4).await.unwrap().is_admitted(), "reader 4 on a fresh key");
    assert_eq!(fence.marks(&k).await.unwrap(), marks(0, 4));
    assert!(fence.admit_read(&k, 3).await.unwrap().is_admitted(), "reader 3 after reader 4");
    assert_eq!(fence.marks(&k).await.unwrap(), marks(0, 4), "an older read lowers nothing");
    assert_eq!(fence.admit(&k, 3).await.unwrap(), stale(4, 3), "writer 3 after reader 4 read");
    assert!(fence.admit(&k, 5).await.unwrap().is_admitted(), "writer 5");
    assert_eq!(fence.marks(&k).await.unwrap(), marks(5, 5));
    assert_eq!(fence.admit_read(&k, 4).await.unwrap(), stale_read(5, 4), "reader 4 after writer 5 wrote");
    assert!(fence.admit_read(&k, 5).await.unwrap().is_admitted(), "writer 5 downgraded reads its own write");
    assert!(fence.admit_read(&k, 7).await.unwrap().is_admitted(), "reader 7");
    assert!(fence.admit_read(&k, 6).await.unwrap().is_admitted(), "reader 6 after reader 7");
    assert_eq!(fence.marks(&k).await.unwrap(), marks(5, 7));
    assert_eq!(fence.admit(&k, 6).await.unwrap(), stale(7, 6), "writer 6 after reader 7 read");
    assert_eq!(fence.marks(&k).await.unwrap(), marks(5, 7), "a stale admit changed the marks");
    assert!(fence.admit(&k, 7).await.unwrap().is_admitted(), "writer 7 (equal to the highest)");
    assert_eq!(fence.marks(&k).await.unwrap(), marks(7, 7));
    assert_eq!(fence.highest(&k).await.unwrap(), Some(7));
}

/// Random reads and writes on a few keys, one at a time: every outcome and
/// every key's marks are what `Marks::admit` (the rule, in Rust) says. This
/// is what keeps the Redis script and the PostgreSQL statements, the rule's
/// translations, equal to it.
pub async fn agrees_with_the_rule(fence: &dyn Fence, p: &str, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut model: HashMap<String, Marks> = HashMap::new();
    for n in 0..300u64 {
        let key = format!("{p}:rule{}", rng.usize(..3));
        let access = if rng.bool() { Access::Read } else { Access::Write };
        let token = rng.u64(1..=(3 + n / 4)); // close together: equal and stale are common
        let expected = Marks::admit(model.get(&key).copied(), access, token);
        let outcome = fence.admit_as(&key, token, access).await.unwrap();
        match expected {
            Ok(after) => {
                assert_eq!(outcome, Fenced::Admitted(()), "seed {seed} op {n}: {access:?} {token} on {key}");
                model.insert(key.clone(), after);
            }
            Err(refused) => assert_eq!(outcome, Fenced::Stale(refused), "seed {seed} op {n} on {key}"),
        }
        assert_eq!(fence.marks(&key).await.unwrap(), model.get(&key).copied(), "seed {seed} op {n}: marks of {key}");
    }
}

/// One admit as seen from outside: when it started and ended on a logical
/// clock shared by all tasks, and what it answered.
#[derive(Debug, Clone)]
struct Op {
    key: usize,
    access: Access,
    token: u64,
    start: u64,
    end: u64,
    outcome: Fenced,
}

const TASKS: usize = 16;
const OPS_PER_TASK: usize = 40;
const KEYS: usize = 3;

/// 16 tasks admit random tokens on 3 keys at once, all writes, or (`reads`)
/// half of them reads. Checks, per key, against the rule (`Marks::admit`):
/// an admitted write's token is ≥ every token admitted by an admit that
/// ended before it started, an admitted read's ≥ every such write's; a stale
/// answer names a mark above its token that some admit really set (a write's,
/// for a read), and that is ≥ what the rule held it against before it
/// started; the final marks are the largest admitted write's token and the
/// largest admitted token.
pub async fn racing_tokens(fences: &[Arc<dyn Fence>], p: &str, seed: u64, reads: bool) {
    assert_eq!(fences.len(), TASKS);
    let clock = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (i, fence) in fences.iter().enumerate() {
        let (fence, clock, p) = (fence.clone(), clock.clone(), p.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed.wrapping_add(i as u64));
            let mut ops = Vec::new();
            for n in 0..OPS_PER_TASK {
                let key = rng.usize(..KEYS);
                let access = if reads && rng.bool() { Access::Read } else { Access::Write };
                let token = rng.u64(1..=(5 + 2 * n as u64)); // marks climb; stale and equal are common
                let start = clock.fetch_add(1, SeqCst);
                let outcome = fence.admit_as(&format!("{p}:race{key}"), token, access).await.unwrap();
                let end = clock.fetch_add(1, SeqCst);
                ops.push(Op { key, access, token, start, end, outcome });
            }
            ops
        }));
    }
    let mut ops = Vec::new();
    for task in tasks {
        ops.extend(task.await.unwrap());
    }
    let (mut admitted, mut rejected) = (0, 0);
    for key in 0..KEYS {
        let of_key: Vec<&Op> = ops.iter().filter(|o| o.key == key).collect();
        let (a, r) = check_history(&of_key, seed);
        admitted += a;
        rejected += r;
        let final_marks = fences[0].marks(&format!("{p}:race{key}")).await.unwrap();
        assert_eq!(final_marks, expected_marks(&of_key), "seed {seed}: final marks, key {key}");
    }
    assert_eq!(admitted + rejected, TASKS * OPS_PER_TASK);
    assert!(admitted > 0 && rejected > 0, "seed {seed}: {admitted} admitted, {rejected} rejected");
}

/// The marks the admitted ops leave: the largest write, the largest of all.
fn expected_marks(ops: &[&Op]) -> Option<Marks> {
    let admitted = ops.iter().filter(|o| o.outcome.is_admitted());
    let seen = admitted.clone().map(|o| o.token).max()?;
    let write = admitted.filter(|o| o.access == Access::Write).map(|o| o.token).max().unwrap_or(0);
    Some(Marks { write, seen })
}

fn check_history(ops: &[&Op], seed: u64) -> (usize, usize) {
    let admitted: Vec<&&Op> = ops.iter().filter(|o| o.outcome.is_admitted()).collect();
    // The least the rule's mark for `access` was when an op began at `start`.
    let mark_before = |access: Access, start: u64| {
        let judged = admitted.iter().filter(|a| a.end < start);
        let judged = judged.filter(|a| access == Access::Write || a.access == Access::Write);
        judged.map(|a| a.token).max()
    };
    let set_by = |access: Access, mark: u64| {
        admitted.iter().any(|a| a.token == mark && (access == Access::Write || a.access == Access::Write))
    };
    for op in ops {
        let before = mark_before(op.access, op.start);
        match op.outcome {
            Fenced::Admitted(()) => assert!(
                before.is_none_or(|b| b <= op.token),
                "seed {seed}: stale {:?} token {} won after {before:?}",
                op.access,
                op.token
            ),
            Fenced::Stale(Stale { access, highest, got }) => {
                assert_eq!((access, got), (op.access, op.token), "seed {seed}");
                assert!(got < highest, "seed {seed}: rejected {got} with mark {highest}");
                assert!(set_by(access, highest), "seed {seed}: {access:?} mark {highest} was never admitted");
                assert!(before.is_none_or(|b| b <= highest), "seed {seed}: mark {highest} below admitted {before:?}");
            }
        }
    }
    (admitted.len(), ops.len() - admitted.len())
}
