//! Objects as files, one per key, replaced atomically and durably.
//!
//! A put writes `.tmp.<key>.<n>`, fsyncs it, renames it over `<key>` and
//! fsyncs the directory: after a crash the object is the old bytes or the new
//! ones, never a mix. Keys never start with `.`, so temporary files cannot
//! collide with objects; leftovers of a crash are removed on open.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The longest object key, in bytes.
pub const MAX_OBJECT_KEY_LEN: usize = 200;

/// Why an object key is refused, or `None` if it is valid: 1..=200 bytes of
/// `A-Z a-z 0-9 . _ -`, not starting with `.`.
pub fn invalid_object_key(key: &str) -> Option<&'static str> {
    if key.is_empty() || key.len() > MAX_OBJECT_KEY_LEN {
        Some("object keys are 1 to 200 bytes long")
    } else if !key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        Some("object keys may hold only A-Z a-z 0-9 . _ -")
    } else if key.starts_with('.') {
        Some("object keys may not start with '.'")
    } else {
        None
    }
}

/// The object directory. Calls block: run them off the async threads.
pub(crate) struct ObjectStore {
    dir: PathBuf,
    tmp_seq: AtomicU64,
}

impl ObjectStore {
    /// Open `dir` (created if missing), removing temporary files a crash
    /// left behind.
    pub(crate) fn open(dir: PathBuf) -> io::Result<Self> {
        fs::create_dir_all(&dir)?;
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with(".tmp.") {
                fs::remove_file(entry.path())?;
            }
        }
        Ok(Self { dir, tmp_seq: AtomicU64::new(0) })
    }

    fn path(&self, key: &str) -> PathBuf {
        debug_assert!(invalid_object_key(key).is_none());
        self.dir.join(key)
    }

    /// Replace the object durably; `true` if it did not exist before.
    pub(crate) fn put(&self, key: &str, bytes: &[u8]) -> io::Result<bool> {
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self.dir.join(format!(".tmp.{key}.{n}"));
        let path = self.path(key);
        let existed = path.exists();
        let result =
            write_synced(&tmp, bytes).and_then(|()| fs::rename(&tmp, &path)).and_then(|()| sync_dir(&self.dir));
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result.map(|()| !existed)
    }

    /// Whether the object exists.
    pub(crate) fn exists(&self, key: &str) -> bool {
        self.path(key).exists()
    }

    /// The object's bytes, or `None` if there is no such object.
    pub(crate) fn get(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        match fs::read(self.path(key)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Remove the object durably; `true` if it existed.
    pub(crate) fn delete(&self, key: &str) -> io::Result<bool> {
        match fs::remove_file(self.path(key)) {
            Ok(()) => sync_dir(&self.dir).map(|()| true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_rules() {
        assert_eq!(invalid_object_key("report-2024_v1.csv"), None);
        assert!(invalid_object_key("").is_some());
        assert!(invalid_object_key(".hidden").is_some());
        assert!(invalid_object_key("..").is_some());
        assert!(invalid_object_key("a/b").is_some());
        assert!(invalid_object_key("a b").is_some());
        assert!(invalid_object_key(&"k".repeat(201)).is_some());
    }

    #[test]
    fn put_get_delete_and_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".tmp.k.0"), b"half").unwrap();
        let store = ObjectStore::open(dir.path().into()).unwrap();
        assert!(!dir.path().join(".tmp.k.0").exists());
        assert_eq!(store.get("k").unwrap(), None);
        assert!(store.put("k", b"one").unwrap());
        assert!(!store.put("k", b"two").unwrap());
        assert_eq!(store.get("k").unwrap().as_deref(), Some(&b"two"[..]));
        assert!(store.delete("k").unwrap());
        assert!(!store.delete("k").unwrap());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
