//! The file seam of the segment log: every read, write, sync, resize and
//! preallocation of a segment, and every create, delete and directory sync,
//! goes through [`LogFiles`] and [`LogFile`], two traits that are seams of the
//! node ([`crate::seams`], where they are defined: what a caller may plug in).
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
use std::path::Path;

pub use crate::seams::{LogFile, LogFiles};

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
