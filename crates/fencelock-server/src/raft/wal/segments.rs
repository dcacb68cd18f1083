//! The segment files of the log on disk: finding and checking them at start-up,
//! appending batches, cutting the log back (`truncate`) and dropping purged
//! segments.
//!
//! Where it sits: owned by the log's writer (`thread.rs`), whose lock is
//! held by every caller once the log is open (the log thread, or an append
//! written at once); [`Segments::open`] runs before, at start-up. All file IO goes through the [`LogFiles`] seam.
//!
//! Invariants kept on disk:
//! - a segment's records are consecutive indexes starting at the index in its
//!   name and header; the next segment starts right after (unless everything
//!   before it is purged);
//! - after the records, a segment holds zeros: a cut (`truncate`, a torn tail
//!   at start-up) shrinks the file to the cut and preallocates it again, so
//!   no stale record past a cut can be read as valid;
//! - every segment but the last is durable in full: before a new segment is
//!   written to, the one before is synced.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::Entry;

use super::files::{LogFile, LogFiles};
use super::format::{self, BadHeader, Parsed, RecordId, HEADER_LEN};
use super::WalError;
use crate::raft::{codec, TypeConfig};

/// One entry to append, encoded.
#[derive(Debug)]
pub struct Rec {
    pub index: u64,
    pub term: u64,
    pub payload: Vec<u8>,
}

impl Rec {
    /// `entry` encoded with the current codec (`codec::CODEC_CURRENT`); its
    /// input keeps its bytes (see `codec::encode_and_keep`).
    pub fn encode(entry: &mut Entry<TypeConfig>) -> Result<Rec, WalError> {
        let payload = codec::encode_and_keep(entry).map_err(|e| WalError::Encode(e.to_string()))?;
        Ok(Rec { index: entry.log_id.index, term: entry.log_id.leader_id.term, payload })
    }
}

/// One record read back from a segment ([`Segments::read`]): its entry as
/// written, still encoded (decoding is the reader's work, not the log
/// thread's, which has appends to write).
#[derive(Debug)]
pub struct Stored {
    pub index: u64,
    pub term: u64,
    pub codec: u8,
    pub payload: Vec<u8>,
}

impl Stored {
    /// The entry it holds, checked to carry the record's log index and term.
    pub fn decode(&self) -> Result<Entry<TypeConfig>, WalError> {
        decode_record(self.index, self.term, self.codec, &self.payload).map_err(WalError::Decode)
    }
}

/// The entry a record of `index` and `term` holds in `payload` (of `codec`),
/// which must carry that log id: the one check of a record's entry, at
/// start-up and when a record is read back.
fn decode_record(index: u64, term: u64, codec: u8, payload: &[u8]) -> Result<Entry<TypeConfig>, String> {
    let entry =
        codec::decode_entry(&|| format!("segment log entry {index}"), codec, payload).map_err(|e| e.to_string())?;
    if entry.log_id.index != index || entry.log_id.leader_id.term != term {
        return Err(format!("entry {index} holds log id {}", entry.log_id));
    }
    Ok(entry)
}

/// One segment file.
#[derive(Debug)]
struct Segment {
    /// Index of its first record (its name).
    first: u64,
    path: PathBuf,
    file: Box<dyn LogFile>,
    /// Offset of each record; record `k` holds index `first + k`.
    starts: Vec<u64>,
    /// Offset after the last record: where the next one goes.
    end: u64,
}

impl Segment {
    fn next_index(&self) -> u64 {
        self.first + self.starts.len() as u64
    }
}

/// Counters of the IO done, for tests and the benchmark.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IoCounts {
    /// `write_at` calls for appended records.
    pub writes: u64,
    /// `sync_data` calls for appended batches.
    pub syncs: u64,
}

/// The segments of one log directory.
#[derive(Debug)]
pub struct Segments {
    dir: PathBuf,
    files: Arc<dyn LogFiles>,
    /// Preallocated size of a segment; a segment is full when the next record
    /// would pass it (a lone record larger than that still goes in).
    capacity: u64,
    segs: Vec<Segment>,
    pub counts: IoCounts,
}

/// The name of the segment whose first record is `first`.
pub fn segment_name(first: u64) -> String {
    format!("{first:020}.seg")
}

fn parse_name(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let digits = name.strip_suffix(".seg")?;
    match digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()) {
        true => digits.parse().ok(),
        false => None,
    }
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> WalError + 'a {
    move |source| WalError::Io { what, path: path.to_path_buf(), source }
}

/// The entries a start-up scan read, with the payload length of each one's
/// record (what memory counts against its budget of decoded bytes).
pub struct Loaded {
    pub entries: Vec<Entry<TypeConfig>>,
    pub sizes: Vec<usize>,
}

impl Segments {
    /// Opens the log in `dir` (creating the directory if needed) and returns
    /// its entries after `last_purged`. See the module docs of [`super`] for
    /// what is a torn tail (cut, logged) and what is corruption (an error
    /// naming the file and offset). A torn tail whose cut would end the log
    /// before `committed` is corruption too, refused before anything is cut:
    /// only synced entries get committed, so what it holds was acknowledged
    /// (a changed byte in the last batch reads as a torn write).
    pub fn open(
        dir: &Path,
        files: Arc<dyn LogFiles>,
        capacity: u64,
        last_purged: Option<u64>,
        committed: Option<u64>,
    ) -> Result<(Segments, Loaded), WalError> {
        std::fs::create_dir_all(dir).map_err(io_err("cannot create", dir))?;
        if let Some(parent) = dir.parent() {
            files.sync_dir(parent).map_err(io_err("cannot sync", parent))?;
        }
        let mut named: Vec<(u64, PathBuf)> = files
            .list(dir)
            .map_err(io_err("cannot list", dir))?
            .into_iter()
            .filter_map(|p| parse_name(&p).map(|first| (first, p)))
            .collect();
        named.sort();
        let mut log =
            Segments { dir: dir.to_path_buf(), files, capacity, segs: Vec::new(), counts: IoCounts::default() };
        let mut scan = Scan::new(last_purged);
        // Segments left behind by a purge (the next one starts at or before
        // the entry after the purge point) are removed unread.
        let upto_next = last_purged.map(|p| p.saturating_add(1));
        let stale = named.windows(2).take_while(|w| upto_next.is_some_and(|n| w[1].0 <= n)).count();
        for (_, path) in named.drain(..stale) {
            tracing::info!(file = %path.display(), "removing a log segment left behind by a purge");
            log.files.remove(&path).map_err(io_err("cannot remove", &path))?;
        }
        if stale > 0 {
            log.files.sync_dir(dir).map_err(io_err("cannot sync", dir))?;
        }
        let count = named.len();
        for (i, (first, path)) in named.into_iter().enumerate() {
            let is_last = i + 1 == count;
            if let Some(seg) = log.open_segment(first, path, is_last, &mut scan, committed)? {
                log.segs.push(seg);
            }
        }
        log.drop_purged(last_purged)?;
        Ok((log, Loaded { entries: scan.entries, sizes: scan.sizes }))
    }

    /// Opens and scans one segment, cutting a torn tail unless the cut would
    /// end the log before `committed`; `None` if it was a segment whose
    /// creation never finished (removed).
    fn open_segment(
        &self,
        first: u64,
        path: PathBuf,
        is_last: bool,
        scan: &mut Scan,
        committed: Option<u64>,
    ) -> Result<Option<Segment>, WalError> {
        let mut file = self.files.open(&path, false).map_err(io_err("cannot open", &path))?;
        let bytes = read_all(file.as_mut(), &path)?;
        let (starts, end, torn, dropped) = match scan_segment(&bytes, first, &path, is_last, scan)? {
            Scanned::Unwritten => {
                tracing::warn!(file = %path.display(), "removing a log segment whose creation did not finish");
                self.files.remove(&path).map_err(io_err("cannot remove", &path))?;
                self.files.sync_dir(&self.dir).map_err(io_err("cannot sync", &self.dir))?;
                return Ok(None);
            }
            Scanned::Records { starts, end, torn, dropped } => (starts, end, torn, dropped),
        };
        if let (Some(why), Some(c)) = (&torn, committed) {
            let last = scan.entries.last().map(|e| e.log_id.index).or(scan.last_purged);
            if last.is_none_or(|l| l < c) {
                let ends = last.map_or_else(|| "(none)".to_string(), |l| l.to_string());
                let why = format!(
                    "{why}: cutting it would end the log at index {ends}, before the committed index {c}, \
                     losing acknowledged entries; nothing was cut"
                );
                return Err(WalError::Corrupt { path, offset: end, why });
            }
        }
        let mut seg = Segment { first, path, file, starts, end };
        if let Some(why) = torn {
            tracing::warn!(
                file = %seg.path.display(),
                offset = end,
                why,
                dropped_entries = dropped,
                "cutting a torn write at the end of the log (never acknowledged: it was not synced)"
            );
            cut(&mut seg, end, self.capacity)?;
        }
        Ok(Some(seg))
    }

    /// Writes `recs` (consecutive indexes, following on from the log's last
    /// entry or starting a new segment after a purge) with one `write_at` per
    /// segment touched, without syncing the last one ([`Segments::sync`] does).
    /// A segment that gets full is synced before the next one is written.
    /// Whether anything was written.
    pub fn write(&mut self, recs: &[Rec]) -> Result<bool, WalError> {
        let mut pending: Option<(u64, Vec<u8>)> = None;
        let Some(batch) = recs.first().map(|r| r.index) else { return Ok(false) };
        if recs.len() as u64 > format::MAX_BATCH {
            return Err(WalError::Encode(format!("a batch of {} entries", recs.len())));
        }
        for r in recs {
            let len = format::record_len(r.payload.len()) as u64;
            if r.payload.is_empty() || r.payload.len() > format::MAX_PAYLOAD {
                return Err(WalError::Encode(format!("entry {} encodes to {} bytes", r.index, r.payload.len())));
            }
            let roll = match self.segs.last() {
                None => true,
                Some(s) if r.index < s.next_index() => {
                    let why =
                        format!("an append of index {} after index {}: truncate first", r.index, s.next_index() - 1);
                    return Err(WalError::Order(why));
                }
                Some(s) => r.index > s.next_index() || (!s.starts.is_empty() && s.end + len > self.capacity),
            };
            if roll {
                self.flush(pending.take())?;
                if !self.segs.is_empty() {
                    self.sync()?;
                }
                self.create_segment(r.index)?;
            }
            let seg = self.segs.last_mut().expect("a segment to write to");
            let (_, buf) = pending.get_or_insert_with(|| (seg.end, Vec::new()));
            seg.starts.push(seg.end);
            format::push_record(
                buf,
                RecordId { index: r.index, term: r.term, batch },
                codec::CODEC_CURRENT,
                &r.payload,
            );
            seg.end += len;
        }
        let wrote = pending.is_some();
        self.flush(pending)?;
        Ok(wrote)
    }

    /// Writes `pending` (offset, bytes) into the last segment.
    fn flush(&mut self, pending: Option<(u64, Vec<u8>)>) -> Result<(), WalError> {
        let (Some((at, buf)), Some(seg)) = (pending, self.segs.last_mut()) else { return Ok(()) };
        seg.file.write_at(&buf, at).map_err(io_err("cannot write", &seg.path))?;
        self.counts.writes += 1;
        Ok(())
    }

    /// `fdatasync` of the last segment: what [`Segments::write`] wrote is durable.
    pub fn sync(&mut self) -> Result<(), WalError> {
        let Some(seg) = self.segs.last_mut() else { return Ok(()) };
        seg.file.sync_data().map_err(io_err("cannot sync", &seg.path))?;
        self.counts.syncs += 1;
        Ok(())
    }

    /// A new, empty, preallocated and synced segment whose first record is
    /// `first`, as the last one.
    fn create_segment(&mut self, first: u64) -> Result<(), WalError> {
        let path = self.dir.join(segment_name(first));
        let mut file = self.files.open(&path, true).map_err(io_err("cannot create", &path))?;
        // A file of that name left over is replaced.
        file.set_len(0).map_err(io_err("cannot cut", &path))?;
        file.allocate(self.capacity).map_err(io_err("cannot preallocate", &path))?;
        file.write_at(&format::header(first), 0).map_err(io_err("cannot write", &path))?;
        file.sync_data().map_err(io_err("cannot sync", &path))?;
        self.files.sync_dir(&self.dir).map_err(io_err("cannot sync", &self.dir))?;
        self.segs.push(Segment { first, path, file, starts: Vec::new(), end: HEADER_LEN as u64 });
        Ok(())
    }

    /// Deletes the entries at `since` and after, durably: the segments that
    /// start at or after it are removed (last first, then the directory is
    /// synced), then the segment holding `since` is cut there.
    ///
    /// A crash in between leaves a prefix of the log as it was before the call
    /// (never a gap): the entries at `since` and after are the conflicting,
    /// uncommitted ones that openraft is replacing.
    pub fn truncate(&mut self, since: u64) -> Result<(), WalError> {
        let mut removed = false;
        while self.segs.last().is_some_and(|s| s.first >= since) {
            let seg = self.segs.pop().expect("a last segment");
            self.files.remove(&seg.path).map_err(io_err("cannot remove", &seg.path))?;
            removed = true;
        }
        if removed {
            self.files.sync_dir(&self.dir).map_err(io_err("cannot sync", &self.dir))?;
        }
        if let Some(seg) = self.segs.last_mut() {
            if seg.next_index() > since {
                let at = seg.starts[(since - seg.first) as usize];
                cut(seg, at, self.capacity)?;
            }
        }
        Ok(())
    }

    /// Removes the segments whose entries are all at or before `upto`. Called
    /// once `upto` is durable as the last purged log id (in redb): a crash
    /// before leaves segments that the next [`Segments::open`] removes.
    pub fn purge(&mut self, upto: u64) -> Result<(), WalError> {
        self.drop_purged(Some(upto))
    }

    /// The records of the entries `lo..hi`, read back from the segments (one
    /// read per segment): what [`Segments::write`] wrote, synced or not.
    /// Every index asked for must be in the log.
    pub fn read(&mut self, lo: u64, hi: u64) -> Result<Vec<Stored>, WalError> {
        let mut out = Vec::with_capacity(usize::try_from(hi.saturating_sub(lo)).unwrap_or(0));
        let mut next = lo;
        while next < hi {
            let Some(seg) = self.segs.iter_mut().rev().find(|s| s.first <= next) else { break };
            if next >= seg.next_index() {
                break;
            }
            let upto = hi.min(seg.next_index());
            read_records(seg, next, upto, &mut out)?;
            next = upto;
        }
        if next < hi {
            return Err(WalError::Order(format!("a read of entries {lo}..{hi}: entry {next} is not in the log")));
        }
        Ok(out)
    }

    /// The segment files, first to last (for tests).
    #[cfg(test)]
    pub fn paths(&self) -> Vec<PathBuf> {
        self.segs.iter().map(|s| s.path.clone()).collect()
    }

    /// Removes the segments whose records are all at or before `upto`
    /// (whole segments only; see [`Segments::purge`]).
    fn drop_purged(&mut self, upto: Option<u64>) -> Result<(), WalError> {
        let Some(upto) = upto else { return Ok(()) };
        let mut removed = false;
        while let Some(seg) = self.segs.first() {
            let all_purged = match self.segs.get(1) {
                Some(next) => next.first <= upto.saturating_add(1),
                None => seg.next_index() <= upto.saturating_add(1),
            };
            if !all_purged {
                break;
            }
            let seg = self.segs.remove(0);
            self.files.remove(&seg.path).map_err(io_err("cannot remove", &seg.path))?;
            removed = true;
        }
        if removed {
            self.files.sync_dir(&self.dir).map_err(io_err("cannot sync", &self.dir))?;
        }
        Ok(())
    }
}

/// The entries after `last_purged` of the log in `dir` (none if there is no
/// such directory), checked as [`Segments::open`] checks them, without writing
/// a byte: a torn tail, which a start would cut, is left out. For `fencelock
/// check-data`.
pub fn read(dir: &Path, last_purged: Option<u64>) -> Result<Vec<Entry<TypeConfig>>, WalError> {
    let listed = match std::fs::read_dir(dir) {
        Ok(listed) => listed,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(WalError::Io { what: "cannot list", path: dir.to_path_buf(), source }),
    };
    let mut named: Vec<(u64, PathBuf)> =
        listed.filter_map(Result::ok).filter_map(|e| parse_name(&e.path()).map(|first| (first, e.path()))).collect();
    named.sort();
    let mut scan = Scan::new(last_purged);
    let count = named.len();
    for (i, (first, path)) in named.into_iter().enumerate() {
        let bytes = std::fs::read(&path).map_err(io_err("cannot read", &path))?;
        scan_segment(&bytes, first, &path, i + 1 == count, &mut scan)?;
    }
    Ok(scan.entries)
}

/// What a segment holds.
enum Scanned {
    /// A segment whose creation did not finish (the last one, all zeros).
    Unwritten,
    /// Its records' offsets, the offset after the last one kept, why the bytes
    /// after it are a torn write to cut (if they are not zeros), and how many
    /// entries that cut drops (those of a torn batch that were read whole).
    Records { starts: Vec<u64>, end: u64, torn: Option<String>, dropped: usize },
}

/// Checks the segment `bytes` of `path`, named `first`, the last segment if
/// `is_last`, and hands its records to `scan`. See the module docs of
/// [`super`] for what is a torn tail and what is corruption.
fn scan_segment(bytes: &[u8], first: u64, path: &Path, is_last: bool, scan: &mut Scan) -> Result<Scanned, WalError> {
    let corrupt =
        |offset: usize, why: String| WalError::Corrupt { path: path.to_path_buf(), offset: offset as u64, why };
    match format::parse_header(bytes) {
        Ok(named) if named == first => {}
        Ok(named) => return Err(corrupt(0, format!("the header names first index {named}"))),
        Err(BadHeader::Version(version)) => return Err(WalError::Version { path: path.to_path_buf(), version }),
        Err(BadHeader::Unwritten) if is_last && format::all_zeros(bytes) => return Ok(Scanned::Unwritten),
        Err(BadHeader::Unwritten) => return Err(corrupt(0, "a zeroed segment header".into())),
        Err(BadHeader::Corrupt(why)) => return Err(corrupt(0, why)),
    }
    let mut starts = Vec::new();
    let mut at = HEADER_LEN;
    let bad = loop {
        if at >= bytes.len() {
            break None;
        }
        match format::parse_record(&bytes[at..]) {
            Parsed::Record(r, len) => {
                let expected = first + starts.len() as u64;
                if r.index != expected {
                    return Err(corrupt(at, format!("record of index {} where {expected} belongs", r.index)));
                }
                scan.take(&r).map_err(|why| corrupt(at, why))?;
                starts.push(at as u64);
                at += len;
            }
            Parsed::Zeros if format::all_zeros(&bytes[at..]) => break None,
            Parsed::Zeros => break Some("a zeroed record header".to_string()),
            Parsed::Bad(why) => break Some(why),
        }
    };
    let Some(why) = bad else { return Ok(Scanned::Records { starts, end: at as u64, torn: None, dropped: 0 }) };
    if !is_last {
        return Err(corrupt(at, format!("{why}, in a segment that is not the last")));
    }
    let next = first + starts.len() as u64;
    let Some(torn) =
        torn_batch(bytes, at, next, scan.last_batch).map_err(|after| corrupt(at, format!("{why}, {after}")))?
    else {
        return Ok(Scanned::Records { starts, end: at as u64, torn: Some(why), dropped: 0 });
    };
    // The whole batch goes, from its first record in this segment (a batch
    // that began in the segment before was synced there when it rolled).
    let kept = usize::try_from(torn.batch.saturating_sub(first)).map_or(starts.len(), |k| k.min(starts.len()));
    let end = starts.get(kept).copied().unwrap_or(at as u64);
    let read = starts.len() - kept;
    starts.truncate(kept);
    scan.drop_from(torn.batch);
    let why = format!(
        "{why} at offset {at}, inside batch {} ({} of its records after it): a batch torn by a power loss during its sync",
        torn.batch, torn.after
    );
    Ok(Scanned::Records { starts, end, torn: Some(why), dropped: read + torn.after })
}

/// Valid records of one unsynced batch found after a hole.
struct TornBatch {
    /// The index of the batch's first record.
    batch: u64,
    /// How many valid records of it follow the hole.
    after: usize,
}

/// Whether the bad bytes at `at` in the last segment, before which the
/// records end at index `next` (the last of them written by `last_batch`),
/// are a torn batch, a torn tail or corruption.
///
/// A power loss during a batch's `fdatasync` may persist any subset of the
/// batch's pages, so a hole can be followed by valid records of the same
/// batch; none of it was acknowledged (callbacks run after the sync), so that
/// is a torn batch: `Ok(Some)`. Valid records of a batch that did not start
/// at or before the hole (a later one, written after the hole was synced) or
/// of more than one batch are corruption: `Err` (why). No valid record after
/// the hole: a torn tail, `Ok(None)`.
fn torn_batch(bytes: &[u8], at: usize, next: u64, last_batch: Option<u64>) -> Result<Option<TornBatch>, String> {
    let mut torn: Option<TornBatch> = None;
    let mut from = at + 1;
    let mut after_index = next.checked_sub(1);
    while let Some(valid) = format::find_record(bytes, from) {
        let Parsed::Record(r, len) = format::parse_record(&bytes[valid..]) else {
            unreachable!("find_record returns offsets where a record parses")
        };
        let ours = r.batch == next || Some(r.batch) == last_batch;
        let one_batch = torn.as_ref().is_none_or(|t| t.batch == r.batch);
        let in_order = after_index.is_none_or(|i| r.index > i);
        if !(ours && one_batch && in_order) {
            return Err(format!(
                "followed by a valid record at offset {valid} (index {}, of the batch from index {}) that no batch torn at this hole can hold",
                r.index, r.batch
            ));
        }
        let t = torn.get_or_insert(TornBatch { batch: r.batch, after: 0 });
        t.after += 1;
        after_index = Some(r.index);
        from = valid + len;
    }
    Ok(torn)
}

/// Cuts `seg` at offset `at` (a record boundary): the file is shrunk to `at`,
/// preallocated again to `capacity` (zeros after `at`) and synced.
fn cut(seg: &mut Segment, at: u64, capacity: u64) -> Result<(), WalError> {
    let path = seg.path.clone();
    seg.file.set_len(at).map_err(io_err("cannot cut", &path))?;
    seg.file.allocate(capacity.max(at)).map_err(io_err("cannot preallocate", &path))?;
    seg.file.sync_data().map_err(io_err("cannot sync", &path))?;
    let kept = seg.starts.partition_point(|s| *s < at);
    seg.starts.truncate(kept);
    seg.end = at;
    Ok(())
}

/// What a start-up scan has read so far.
struct Scan {
    last_purged: Option<u64>,
    /// The index the next record must have, once a record after the purge
    /// point was read.
    next: Option<u64>,
    /// The batch of the last record read (purged or not).
    last_batch: Option<u64>,
    entries: Vec<Entry<TypeConfig>>,
    /// The payload length of each of `entries`' records.
    sizes: Vec<usize>,
}

impl Scan {
    fn new(last_purged: Option<u64>) -> Scan {
        Scan { last_purged, next: None, last_batch: None, entries: Vec::new(), sizes: Vec::new() }
    }

    /// Forgets the entries at `index` and after (a torn batch's).
    fn drop_from(&mut self, index: u64) {
        let kept = self.entries.partition_point(|e| e.log_id.index < index);
        self.entries.truncate(kept);
        self.sizes.truncate(kept);
        self.next = self.entries.last().map(|e| e.log_id.index + 1);
    }

    /// Takes record `r` (of the segment starting at `first`): records at or
    /// before the purge point are skipped; after it, indexes must follow on
    /// from the purge point and from each other.
    fn take(&mut self, r: &format::Record<'_>) -> Result<(), String> {
        self.last_batch = Some(r.batch);
        if self.last_purged.is_some_and(|p| r.index <= p) {
            return Ok(());
        }
        let expected = self.next.or(self.last_purged.map(|p| p + 1));
        if let Some(n) = expected {
            if r.index != n {
                return Err(format!("a gap in the log: index {} where {n} belongs", r.index));
            }
        }
        let entry = decode_record(r.index, r.term, r.codec, r.payload)?;
        self.entries.push(entry);
        self.sizes.push(r.payload.len());
        self.next = Some(r.index + 1);
        Ok(())
    }
}

/// Reads the records `lo..hi` of `seg` (all of them in it) into `out`.
fn read_records(seg: &mut Segment, lo: u64, hi: u64, out: &mut Vec<Stored>) -> Result<(), WalError> {
    let (k, kend) = ((lo - seg.first) as usize, (hi - seg.first) as usize);
    let from = seg.starts[k];
    let to = seg.starts.get(kend).copied().unwrap_or(seg.end);
    let corrupt = |at: usize, why: String| WalError::Corrupt { path: seg.path.clone(), offset: from + at as u64, why };
    let bytes = read_range(seg.file.as_mut(), &seg.path, from, to)?;
    let mut at = 0;
    for index in lo..hi {
        let Parsed::Record(r, len) = format::parse_record(&bytes[at..]) else {
            return Err(corrupt(at, format!("record {index} no longer reads back")));
        };
        if r.index != index {
            return Err(corrupt(at, format!("record of index {} where {index} belongs", r.index)));
        }
        out.push(Stored { index, term: r.term, codec: r.codec, payload: r.payload.to_vec() });
        at += len;
    }
    Ok(())
}

/// The bytes `from..to` of `file`: `Err` if it ends before `to`.
fn read_range(file: &mut dyn LogFile, path: &Path, from: u64, to: u64) -> Result<Vec<u8>, WalError> {
    let short = || WalError::Io {
        what: "cannot read",
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("bytes {from}..{to}")),
    };
    let mut bytes = vec![0u8; usize::try_from(to - from).map_err(|_| short())?];
    let mut at = 0;
    while at < bytes.len() {
        match file.read_at(&mut bytes[at..], from + at as u64).map_err(io_err("cannot read", path))? {
            0 => return Err(short()),
            n => at += n,
        }
    }
    Ok(bytes)
}

/// The whole content of `file`.
fn read_all(file: &mut dyn LogFile, path: &Path) -> Result<Vec<u8>, WalError> {
    let len = file.size().map_err(io_err("cannot stat", path))?;
    let len = usize::try_from(len).map_err(|_| WalError::Io {
        what: "cannot read",
        path: path.to_path_buf(),
        source: std::io::Error::other("file too large"),
    })?;
    let mut bytes = vec![0u8; len];
    let mut at = 0;
    while at < len {
        match file.read_at(&mut bytes[at..], at as u64).map_err(io_err("cannot read", path))? {
            0 => {
                bytes.truncate(at);
                break;
            }
            n => at += n,
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload, LogId};

    use super::*;

    /// A segment starting at index 1 holding `batches` (first and last index of
    /// each), and the start offset of each record.
    fn segment(batches: &[(u64, u64)]) -> (Vec<u8>, Vec<usize>) {
        let mut bytes = format::header(1).to_vec();
        let mut starts = Vec::new();
        for &(lo, hi) in batches {
            for index in lo..=hi {
                let entry: Entry<TypeConfig> =
                    Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Blank };
                let payload = serde_json::to_vec(&entry).unwrap();
                starts.push(bytes.len());
                format::push_record(&mut bytes, RecordId { index, term: 1, batch: lo }, format::CODEC_JSON, &payload);
            }
        }
        bytes.resize(bytes.len() + 256, 0);
        (bytes, starts)
    }

    /// Torn batch: the cut is at the batch's first record and the count of
    /// entries dropped (for the log line) holds the batch's records read
    /// before the hole and after it; the scan keeps only the entries before.
    #[test]
    fn a_torn_batch_counts_the_entries_it_drops() {
        let (mut bytes, starts) = segment(&[(1, 2), (3, 8)]);
        // Entry 6 (record 5) lost: 3, 4, 5 before it and 7, 8 after it go.
        bytes[starts[5]..starts[6]].fill(0);
        let mut scan = Scan::new(None);
        match scan_segment(&bytes, 1, Path::new("x.seg"), true, &mut scan) {
            Ok(Scanned::Records { starts: kept, end, torn: Some(why), dropped }) => {
                assert_eq!(kept, [starts[0] as u64, starts[1] as u64]);
                assert_eq!(end, starts[2] as u64, "cut at the batch's first record");
                assert_eq!(dropped, 5, "{why}");
                assert!(why.contains("batch 3"), "{why}");
            }
            Ok(_) => panic!("expected a torn batch"),
            Err(e) => panic!("expected a torn batch, got {e}"),
        }
        let read: Vec<u64> = scan.entries.iter().map(|e| e.log_id.index).collect();
        assert_eq!(read, [1, 2]);
    }
}
