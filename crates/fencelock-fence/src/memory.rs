//! [`MemoryFence`]: marks in a `Mutex<HashMap>`. Not durable: a restart
//! forgets every mark, and then a stale token is admitted. For tests, and for
//! a resource that itself lives only in the memory of the same process.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::fence::{check_input, check_key, judge, Access, Fence, FenceError, Fenced, Marks};

/// An in-memory [`Fence`]. Cheap; all keys share one short critical section.
#[derive(Debug, Default)]
pub struct MemoryFence {
    marks: Mutex<HashMap<String, Marks>>,
}

impl MemoryFence {
    /// An empty fence: no key has a mark.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl Fence for MemoryFence {
    async fn admit_as(&self, key: &str, token: u64, access: Access) -> Result<Fenced, FenceError> {
        check_input(key, token)?;
        let mut marks = self.marks.lock().unwrap_or_else(|p| p.into_inner());
        let (outcome, raised) = judge(marks.get(key).copied(), access, token);
        if let Some(raised) = raised {
            marks.insert(key.to_owned(), raised);
        }
        Ok(outcome)
    }

    async fn marks(&self, key: &str) -> Result<Option<Marks>, FenceError> {
        check_key(key)?;
        Ok(self.marks.lock().unwrap_or_else(|p| p.into_inner()).get(key).copied())
    }
}
