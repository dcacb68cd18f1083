//! The file seam of the segment log: every read, write, sync, resize and
//! preallocation of a segment, and every create, delete and directory sync,
//! goes through [`LogFiles`] and [`LogFile`].
//!
//! Where it sits: under [`super::segments`], which owns the files. The default
//! is [`RealFiles`] (std's files, `posix_fallocate` for preallocation); a
//! fault-injection harness plugs another one through
//! [`crate::seams::Seams::log_files`], e.g. one that records what was written
//! since the last `sync_data` and drops it at a simulated power loss.

use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// One open segment file.
pub trait LogFile: Send + Debug {
    /// Reads into `buf` from `offset`; how many bytes were read (0 at the end).
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `buf` at `offset` (not durable before [`LogFile::sync_data`]).
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes the data written so far (and the file's size) durable: `fdatasync`.
    fn sync_data(&mut self) -> io::Result<()>;
    /// Cuts (or extends with zeros) the file to `len` bytes.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// Makes sure bytes `0..len` are allocated; never shrinks the file. Bytes
    /// past the old end read as zeros.
    fn allocate(&mut self, len: u64) -> io::Result<()>;
    /// The file's size in bytes.
    fn size(&mut self) -> io::Result<u64>;
}

/// Opens, lists and removes segment files, and syncs their directory. Only
/// `open` must be given: the others default to the real file system, so a
/// seam overrides just what it changes.
pub trait LogFiles: Send + Sync + Debug {
    /// Opens `path` for reading and writing, creating it (empty) if `create`.
    fn open(&self, path: &Path, create: bool) -> io::Result<Box<dyn LogFile>>;
    /// The files in `dir` (not recursive), in no particular order.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        std::fs::read_dir(dir)?.map(|e| e.map(|e| e.path())).collect()
    }
    /// Removes the file `path`.
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    /// Makes the directory's entries (files created or removed) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// std's files: the default [`LogFiles`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFiles;

impl LogFiles for RealFiles {
    fn open(&self, path: &Path, create: bool) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new().read(true).write(true).create(create).truncate(false).open(path)?;
        Ok(Box::new(RealFile(file)))
    }
}

/// One file of [`RealFiles`].
#[derive(Debug)]
struct RealFile(File);

impl LogFile for RealFile {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }

    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn allocate(&mut self, len: u64) -> io::Result<()> {
        if self.0.metadata()?.len() >= len {
            return Ok(());
        }
        let Ok(len_off) = libc::off_t::try_from(len) else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("cannot allocate {len} bytes")));
        };
        // SAFETY: posix_fallocate reads no memory of ours; the descriptor is
        // open for the whole call (borrowed from `self.0`).
        match unsafe { libc::posix_fallocate(self.0.as_raw_fd(), 0, len_off) } {
            0 => Ok(()),
            // A file system without fallocate: a sparse file of that size.
            libc::EOPNOTSUPP | libc::EINVAL => self.0.set_len(len),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }

    fn size(&mut self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
}
