//! [`MemoryFence`]: marks in a `Mutex<HashMap>`. Not durable: a restart
//! forgets every mark, and then a stale token is admitted. For tests, and for
//! a resource that itself lives only in the memory of the same process.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::fence::{check_input, check_key, judge, Fence, FenceError, Fenced};

/// An in-memory [`Fence`]. Cheap; all keys share one short critical section.
#[derive(Debug, Default)]
pub struct MemoryFence {
    marks: Mutex<HashMap<String, u64>>,
}

impl MemoryFence {
    /// An empty fence: no key has a mark.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl Fence for MemoryFence {
    async fn admit(&self, key: &str, token: u64) -> Result<Fenced, FenceError> {
        check_input(key, token)?;
        let mut marks = self.marks.lock().unwrap_or_else(|p| p.into_inner());
        let outcome = judge(marks.get(key).copied(), token);
        if outcome.is_admitted() {
            marks.insert(key.to_owned(), token);
        }
        Ok(outcome)
    }

    async fn highest(&self, key: &str) -> Result<Option<u64>, FenceError> {
        check_key(key)?;
        Ok(self.marks.lock().unwrap_or_else(|p| p.into_inner()).get(key).copied())
    }
}
