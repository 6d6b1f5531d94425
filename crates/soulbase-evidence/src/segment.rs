//! Spool files: numbered segments, the drain checkpoint, scanning and reading.
//!
//! Layout of a spool directory:
//! - `seg-<20-digit id>.log` — append-only segments of frames, ids increasing;
//! - `checkpoint` — `<segment> <offset> <crc32c>`, made at its full length when
//!   the spool is opened and rewritten in place (no new space): everything before
//!   it is in the store;
//! - `reserve` — zero-filled bytes released when the disk fills, so the End of an
//!   accepted Begin can still be written;
//! - `LOCK` — held (advisory lock) by the one process using the spool;
//! - `next-<pid>-<n>.seg.tmp` — the next segment while it is zero-filled ahead of
//!   use (see the writer); never read, removed at start-up;
//! - `spare-<20-digit id>.seg.tmp` — a drained segment kept to be zero-filled as a
//!   next segment (see [`SPARE_PREFIX`]); never read, at most [`MAX_SPARES`];
//! - `next-room.seg.tmp` — written and removed at once to learn whether a full
//!   disk has room again (see [`room_for`]); removed at start-up like next segments.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use soulbase_observe::{EncodedRecord, EvidenceRecord};

use crate::frame::{self, Decoded};

/// A position in the spool: a segment id and a byte offset in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    /// The segment id.
    pub segment: u64,
    /// Bytes into the segment.
    pub offset: u64,
}

/// Prefix of a next segment's name while it is zero-filled
/// (`next-<pid>-<n>.seg.tmp`); not a segment name, so neither recovery nor the
/// drainer reads it.
pub const NEXT_PREFIX: &str = "next-";
/// Suffix of a next segment's name while it is zero-filled.
pub const NEXT_SUFFIX: &str = ".seg.tmp";

/// Removes next segments left by an earlier run (they hold nothing). Called with
/// the directory locked, so no writer of this spool is running.
pub fn remove_prepared(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(NEXT_PREFIX) && name.ends_with(NEXT_SUFFIX) {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// Prefix of a drained segment kept for reuse (`spare-<id>.seg.tmp`); not a
/// segment name, so neither recovery nor the drainer reads it.
///
/// Deleting a drained segment frees its blocks, and on a filesystem mounted with
/// online discard (as virtual disks often are) that discard holds up every fsync
/// on the disk until it is done: measured here, the commit waiting behind the
/// deletion of a 16 MiB segment took ~20 ms instead of ~0.05 ms, stalling every
/// call in flight. A spare is zero-filled in place as the next segment instead,
/// which frees nothing (and allocates only where the spare is shorter than a
/// segment). Beyond [`MAX_SPARES`] (a backlog drained at once) segments are still
/// deleted.
pub const SPARE_PREFIX: &str = "spare-";
/// Most drained segments kept as spares (uncounted against the spool cap, like a
/// prepared next segment); more are deleted. One is taken per segment written, so
/// at a steady load one or two are enough.
pub const MAX_SPARES: usize = 2;

/// The spares in `dir`.
pub fn spares(dir: &Path) -> io::Result<Vec<PathBuf>> {
    Ok(fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with(SPARE_PREFIX) && name.ends_with(NEXT_SUFFIX)
        })
        .map(|e| e.path())
        .collect())
}

/// Retires drained segment `id`: kept as a spare if `keep` and fewer than
/// [`MAX_SPARES`] are, deleted otherwise. Either way it is no longer a segment.
/// Returns the spare's path when it was kept (its new name is durable only once
/// the directory is synced).
pub fn retire(dir: &Path, id: u64, keep: bool) -> io::Result<Option<PathBuf>> {
    let path = segment_path(dir, id);
    if keep && spares(dir)?.len() < MAX_SPARES {
        let spare = dir.join(format!("{SPARE_PREFIX}{id:020}{NEXT_SUFFIX}"));
        fs::rename(&path, &spare)?;
        return Ok(Some(spare));
    }
    fs::remove_file(&path).map(|()| None)
}

/// Moves one of `spares` to `to`, for the caller to zero-fill as the next segment,
/// taking it off the list (as are spares that are gone). Returns whether there was one.
pub fn take_spare(spares: &mut Vec<PathBuf>, to: &Path) -> bool {
    while let Some(spare) = spares.pop() {
        if fs::rename(&spare, to).is_ok() {
            return true;
        }
    }
    false
}

/// Deletes the spares (the disk is full: their room goes to the Ends of accepted
/// calls). Returns whether there were any.
pub fn remove_spares(dir: &Path) -> bool {
    spares(dir).is_ok_and(|s| s.iter().filter(|p| fs::remove_file(p).is_ok()).count() > 0)
}

/// The file name of segment `id`.
pub fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("seg-{id:020}.log"))
}

/// The ids of the segments in `dir`, ascending.
pub fn list_segments(dir: &Path) -> io::Result<Vec<u64>> {
    let mut ids: Vec<u64> = fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name();
            let name = name.to_str()?;
            name.strip_prefix("seg-")?
                .strip_suffix(".log")?
                .parse::<u64>()
                .ok()
        })
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// The file of records the store refused for good, one JSON object per line:
/// `{"refused": cause, "record": record}` (text that is not JSON kept as a JSON
/// string). A crash right after quarantining may repeat a line; a record's
/// envelope id tells.
pub const QUARANTINE_FILE: &str = "quarantine.jsonl";

/// One line of the quarantine file for `record`, refused because of `cause`,
/// without its line end.
pub fn quarantine_line(record: &EncodedRecord, cause: &str) -> io::Result<Vec<u8>> {
    let text = record.as_str();
    let kept = serde_json::from_str::<serde_json::Value>(text)
        .unwrap_or_else(|_| serde_json::Value::String(text.to_owned()));
    serde_json::to_vec(&serde_json::json!({
        "refused": cause,
        "record": kept,
    }))
    .map_err(io::Error::other)
}

/// Appends `record` to the quarantine file and makes it durable.
pub fn quarantine(dir: &Path, record: &EncodedRecord, cause: &str) -> io::Result<()> {
    let mut line = quarantine_line(record, cause)?;
    line.push(b'\n');
    let path = dir.join(QUARANTINE_FILE);
    let created = !path.exists();
    let mut f = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(&path)?;
    // A line torn by a crash gets its end first, so this one stays whole.
    let len = f.metadata()?.len();
    if len > 0 {
        let mut last = [0u8];
        f.read_exact_at(&mut last, len - 1)?;
        if last[0] != b'\n' {
            line.insert(0, b'\n');
        }
    }
    f.write_all(&line)?;
    f.sync_data()?;
    if created {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Opens and locks the spool's `LOCK` file: held for as long as the returned file
/// is open. `WouldBlock` when another process (or another sink in this one)
/// holds it.
pub fn lock_dir(dir: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("LOCK"))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(io::ErrorKind::WouldBlock.into()),
        Err(fs::TryLockError::Error(e)) => Err(e),
    }
}

/// A file's identity (device, inode): tells whether the `LOCK` in the directory is
/// still the file a sink holds open.
pub fn identity(meta: &fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// Makes a directory entry change (create, rename, delete) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Reads the drain checkpoint; `None` when there is none (nothing drained yet) or
/// it cannot be trusted (a torn write fails its checksum), so the drain starts
/// again from the oldest segment: the store skips what it already has.
pub fn read_checkpoint(dir: &Path) -> io::Result<Option<Pos>> {
    let text = match fs::read_to_string(dir.join(CHECKPOINT_FILE)) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => String::new(),
        Err(e) => return Err(e),
    };
    let pos = parse_checkpoint(&text);
    if pos.is_none() {
        tracing::warn!(
            dir = %dir.display(),
            "the spool checkpoint is unreadable; draining again from the oldest segment"
        );
    }
    Ok(pos)
}

/// `<segment> <offset> <crc32c of the two, hex>`, or the `<segment> <offset>` of
/// earlier versions (written by rename, never torn).
fn parse_checkpoint(text: &str) -> Option<Pos> {
    let mut parts = text.split_whitespace();
    let (segment, offset) = (parts.next()?, parts.next()?);
    if let Some(crc) = parts.next()
        && u32::from_str_radix(crc, 16).ok()? != checkpoint_crc(segment, offset)
    {
        return None;
    }
    Some(Pos {
        segment: segment.parse().ok()?,
        offset: offset.parse().ok()?,
    })
}

/// The checksum of a checkpoint's two numbers as written.
fn checkpoint_crc(segment: &str, offset: &str) -> u32 {
    frame::checksum(format!("{segment} {offset}").as_bytes())
}

/// The drain checkpoint's file name in the spool directory.
pub const CHECKPOINT_FILE: &str = "checkpoint";

/// The checkpoint line for `pos`: fixed width (51 bytes for every position), so
/// each write covers the last one exactly.
fn checkpoint_line(pos: Pos) -> String {
    let (segment, offset) = (
        format!("{:020}", pos.segment),
        format!("{:020}", pos.offset),
    );
    let crc = checkpoint_crc(&segment, &offset);
    format!("{segment} {offset} {crc:08x}\n")
}

/// Makes sure the checkpoint file exists at its full, fixed length, so every
/// later [`write_checkpoint`] rewrites it in place and needs no new space (a
/// drain after a full disk must be able to checkpoint with 0 bytes free). Called
/// when the spool is opened, with the position the drain resumes at: a file
/// already of that length is left as it is; none yet, or the unchecksummed line of
/// an earlier version, is replaced by a new file holding `pos`, renamed into place
/// (temp file, fsync, rename, directory fsync; on failure the temp file is
/// removed, so a full disk is not filled further).
pub fn ensure_checkpoint(dir: &Path, pos: Pos) -> io::Result<()> {
    let line = checkpoint_line(pos);
    if fs::metadata(dir.join(CHECKPOINT_FILE)).is_ok_and(|m| m.len() == line.len() as u64) {
        return Ok(());
    }
    create_checkpoint(dir, &line)
}

/// Writes `line` as a new checkpoint file renamed into place; removes the temp
/// file when that fails.
fn create_checkpoint(dir: &Path, line: &str) -> io::Result<()> {
    let tmp = dir.join("checkpoint.tmp");
    let write = || {
        let mut f = File::create(&tmp)?;
        f.write_all(line.as_bytes())?;
        f.sync_data()?;
        fs::rename(&tmp, dir.join(CHECKPOINT_FILE))?;
        sync_dir(dir)
    };
    let written = write();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// Replaces the checkpoint: one fixed-width line with a checksum, written over the
/// last in place and made durable with `fdatasync`. Unlike a new file renamed into
/// place, this changes no metadata, so it never makes the spool's own commits wait
/// for a journal commit (measured: a rename-based checkpoint ten times a second
/// delayed one spool commit in a hundred by ~1 ms), and it needs no new space: the
/// file is made at its full length when the spool is opened
/// ([`ensure_checkpoint`]). A write torn by a crash fails the checksum (see
/// [`read_checkpoint`]). Only a file missing or of another length (the directory
/// deleted under a running sink, or the spool opened on a full disk) is made again
/// as [`ensure_checkpoint`] makes it.
pub fn write_checkpoint(dir: &Path, pos: Pos) -> io::Result<()> {
    let line = checkpoint_line(pos);
    let path = dir.join(CHECKPOINT_FILE);
    if let Ok(f) = OpenOptions::new().write(true).open(&path)
        && f.metadata()?.len() == line.len() as u64
    {
        f.write_all_at(line.as_bytes(), 0)?;
        return f.sync_data();
    }
    create_checkpoint(dir, &line)
}

/// The intact frames of one segment, and where the intact prefix ends.
pub struct Scan {
    /// Each record with the offset just past its frame.
    pub records: Vec<(u64, EvidenceRecord)>,
    /// Length of the intact prefix (the file is longer when its tail is torn or
    /// corrupt, or preallocated).
    pub valid_len: u64,
    /// The file's length.
    pub file_len: u64,
    /// Bytes of a torn or corrupt tail: from the end of the intact prefix to the last
    /// byte that is not zero (0 when only zeros follow: preallocated space).
    pub torn_bytes: u64,
}

/// Reads a whole segment, stopping at the first torn or corrupt frame. A frame that
/// is intact but does not decode as a record is skipped (and logged).
pub fn scan(path: &Path) -> io::Result<Scan> {
    let bytes = fs::read(path)?;
    let mut records = Vec::new();
    let mut at = 0usize;
    while let Decoded::Frame(payload, n) = frame::decode(&bytes[at..]) {
        at += n;
        match serde_json::from_slice::<EvidenceRecord>(payload) {
            Ok(r) => records.push((at as u64, r)),
            Err(e) => tracing::error!(path = %path.display(), offset = at, error = %e,
                "skipping an undecodable spool record"),
        }
    }
    Ok(Scan {
        records,
        valid_len: at as u64,
        file_len: bytes.len() as u64,
        torn_bytes: bytes[at..]
            .iter()
            .rposition(|b| *b != 0)
            .map_or(0, |i| i as u64 + 1),
    })
}

/// Reads records from `from` (within one segment) up to `limit` bytes into the
/// segment (`None`: to its end) or `max` records, whichever comes first.
/// Returns the records and the offset just past the last one read. `own`: the
/// frames were written by this process (from `from` on), so an intact one is a
/// record it serialized and is not decoded again.
pub fn read_range(
    dir: &Path,
    from: Pos,
    limit: Option<u64>,
    max: usize,
    own: bool,
) -> io::Result<(Vec<EncodedRecord>, u64, bool)> {
    let mut file = File::open(segment_path(dir, from.segment))?;
    let len = file.metadata()?.len();
    let end = limit.unwrap_or(len).min(len);
    if from.offset >= end {
        return Ok((Vec::new(), from.offset, false));
    }
    file.seek(SeekFrom::Start(from.offset))?;
    let mut reader = BufReader::with_capacity(256 << 10, file.take(end - from.offset));
    let mut out = Vec::new();
    let mut offset = from.offset;
    let mut header = [0u8; frame::HEADER];
    let mut buf = Vec::new();
    let mut corrupt = false;
    while out.len() < max && offset < end {
        if end - offset < frame::HEADER as u64 {
            // Too short for a frame: the zeros after a sealed segment's data, or garbage.
            let mut rest = Vec::new();
            reader.read_to_end(&mut rest)?;
            corrupt = rest.iter().any(|b| *b != 0);
            break;
        }
        if reader.read_exact(&mut header).is_err() {
            corrupt = true;
            break;
        }
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if len == 0 {
            // Preallocated space: the end of the data.
            break;
        }
        if len > frame::MAX_PAYLOAD {
            corrupt = true;
            break;
        }
        buf.clear();
        buf.extend_from_slice(&header);
        buf.resize(frame::HEADER + len, 0);
        if reader.read_exact(&mut buf[frame::HEADER..]).is_err() {
            corrupt = true;
            break;
        }
        let Decoded::Frame(payload, n) = frame::decode(&buf) else {
            corrupt = true;
            break;
        };
        offset += n as u64;
        // Passed on as its text, which the store keeps without encoding it again.
        // A frame of this process's own is a record it serialized (its checksum
        // is intact). Any other is checked here (decoded whole, off the request
        // path); what is not a record goes on unchecked: every store refuses it,
        // so the drain quarantines it. A frame that is not UTF-8 goes on as a JSON
        // string of its text, which is not a record either.
        let text = match std::str::from_utf8(payload) {
            Ok(t) if own => {
                out.push(EncodedRecord::known(t));
                continue;
            }
            Ok(t) => t.to_owned(),
            Err(_) => serde_json::to_string(&String::from_utf8_lossy(payload))
                .map_err(io::Error::other)?,
        };
        match EncodedRecord::verified(text) {
            Ok(r) => out.push(r),
            Err((e, r)) => {
                tracing::error!(segment = from.segment, offset, error = %e,
                    "a spool record is not an evidence record; it will be quarantined");
                out.push(r);
            }
        }
    }
    Ok((out, offset, corrupt))
}

/// Creates (or re-creates) the zero-filled reserve file of `bytes`. On failure
/// (the disk is full) nothing is left behind: a partial reserve would take the
/// room the Ends of accepted calls need.
pub fn ensure_reserve(dir: &Path, bytes: u64) -> io::Result<()> {
    let path = dir.join("reserve");
    if fs::metadata(&path).is_ok_and(|m| m.len() == bytes) {
        return Ok(());
    }
    zero_file(&path, bytes, true)
}

/// Whether `bytes` can be written on the spool's disk now: writes them to a file
/// of their own and removes it (no fsync: a full disk refuses the write itself).
pub fn room_for(dir: &Path, bytes: u64) -> io::Result<()> {
    let path = dir.join(format!("{NEXT_PREFIX}room{NEXT_SUFFIX}"));
    let written = zero_file(&path, bytes, false);
    let _ = fs::remove_file(&path);
    written
}

/// Writes `bytes` zeros as the whole of `path` (made durable when `sync`); removes
/// the file when that fails.
fn zero_file(path: &Path, bytes: u64, sync: bool) -> io::Result<()> {
    let write = || {
        let f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(path)?;
        write_zeros_at(&f, 0, bytes, || Ok(()))?;
        if sync { f.sync_all() } else { Ok(()) }
    };
    let written = write();
    if written.is_err() {
        let _ = fs::remove_file(path);
    }
    written
}

/// Writes zeros over `from..to` of `file` a MiB at a time, calling `after_each`
/// after each MiB (to flush it, or to stop early with an error).
pub fn write_zeros_at(
    file: &File,
    from: u64,
    to: u64,
    mut after_each: impl FnMut() -> io::Result<()>,
) -> io::Result<()> {
    let zeros = vec![0u8; (1u64 << 20).min(to.saturating_sub(from)) as usize];
    let mut at = from;
    while at < to {
        let n = (to - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
        after_each()?;
    }
    Ok(())
}

/// Frees the reserve (when the disk is full). Returns whether there was one.
pub fn release_reserve(dir: &Path) -> bool {
    fs::remove_file(dir.join("reserve")).is_ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_quarantined_record_after_a_torn_line_stays_whole() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join(QUARANTINE_FILE),
            b"{\"refused\":\"x\",\"rec",
        )
        .unwrap();
        quarantine(
            dir.path(),
            &EncodedRecord::from_json("garbage".into()),
            "why",
        )
        .unwrap();
        let text = fs::read_to_string(dir.path().join(QUARANTINE_FILE)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0], "{\"refused\":\"x\",\"rec");
        let kept: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
        assert_eq!(
            kept,
            serde_json::json!({"refused": "why", "record": "garbage"})
        );
        // An ended file gets no blank line.
        quarantine(dir.path(), &EncodedRecord::from_json("more".into()), "why").unwrap();
        let text = fs::read_to_string(dir.path().join(QUARANTINE_FILE)).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(!text.contains("\n\n"), "{text}");
    }

    /// Segment 1 in `dir`: one frame, then `tail`.
    fn segment_with_tail(dir: &Path, tail: &[u8]) {
        let mut bytes = Vec::new();
        frame::encode_into(b"{}", &mut bytes);
        bytes.extend_from_slice(tail);
        fs::write(segment_path(dir, 1), bytes).unwrap();
    }

    #[test]
    fn zeros_too_short_for_a_frame_end_a_sealed_segment_and_garbage_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let from = Pos {
            segment: 1,
            offset: 0,
        };
        segment_with_tail(dir.path(), &[0; 5]);
        let (records, offset, corrupt) = read_range(dir.path(), from, None, 10, false).unwrap();
        assert_eq!((records.len(), offset, corrupt), (1, 10, false));
        segment_with_tail(dir.path(), &[0, 0, 7, 0, 0]);
        let (records, offset, corrupt) = read_range(dir.path(), from, None, 10, false).unwrap();
        assert_eq!((records.len(), offset, corrupt), (1, 10, true));
    }

    #[test]
    fn the_checkpoint_is_rewritten_in_place_and_a_torn_one_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_checkpoint(dir.path()).unwrap(), None);
        // The format of earlier versions is still read, and replaced.
        fs::write(dir.path().join("checkpoint"), "123456 7890123456789\n").unwrap();
        let old = Pos {
            segment: 123_456,
            offset: 7_890_123_456_789,
        };
        assert_eq!(read_checkpoint(dir.path()).unwrap(), Some(old));
        let pos = Pos {
            segment: 3,
            offset: 4096,
        };
        write_checkpoint(dir.path(), pos).unwrap();
        assert_eq!(read_checkpoint(dir.path()).unwrap(), Some(pos));
        // From now on it is the same file, rewritten in place.
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
        let first = inode(&dir.path().join("checkpoint"));
        let next = Pos {
            segment: 12,
            offset: 77,
        };
        write_checkpoint(dir.path(), next).unwrap();
        assert_eq!(read_checkpoint(dir.path()).unwrap(), Some(next));
        assert_eq!(inode(&dir.path().join("checkpoint")), first);
        let text = fs::read_to_string(dir.path().join("checkpoint")).unwrap();
        assert_eq!(text.lines().count(), 1, "{text:?}");
        // Half the new line over the old one: the checksum fails, nothing is trusted.
        let path = dir.path().join("checkpoint");
        let mut torn = fs::read(&path).unwrap();
        torn[15..20].copy_from_slice(b"99999");
        fs::write(&path, &torn).unwrap();
        assert_eq!(read_checkpoint(dir.path()).unwrap(), None);
        fs::write(&path, b"\xff\xfe").unwrap();
        assert_eq!(read_checkpoint(dir.path()).unwrap(), None);
    }

    #[test]
    fn drained_segments_are_kept_as_spares_up_to_the_limit_then_deleted() {
        let dir = tempfile::tempdir().unwrap();
        for id in 1..=4 {
            fs::write(segment_path(dir.path(), id), [1u8; 16]).unwrap();
        }
        let kept: Vec<_> = (1..=4)
            .filter_map(|id| retire(dir.path(), id, true).unwrap())
            .collect();
        assert!(list_segments(dir.path()).unwrap().is_empty());
        assert_eq!(kept.len(), MAX_SPARES);
        let mut on_disk = spares(dir.path()).unwrap();
        on_disk.sort();
        assert_eq!(on_disk, kept);
        // Not kept when told not to (the disk is full).
        fs::write(segment_path(dir.path(), 5), [1u8; 16]).unwrap();
        assert_eq!(retire(dir.path(), 5, false).unwrap(), None);
        assert!(list_segments(dir.path()).unwrap().is_empty());
        // Only listed spares are taken: one not on the list stays where it is.
        let next = dir.path().join("next-1-0.seg.tmp");
        let mut listed = vec![kept[0].clone()];
        assert!(take_spare(&mut listed, &next));
        assert!(listed.is_empty());
        assert_eq!(fs::read(&next).unwrap(), [1u8; 16]);
        assert_eq!(spares(dir.path()).unwrap(), vec![kept[1].clone()]);
        // A listed spare that is gone is skipped and dropped from the list.
        let mut listed = vec![kept[1].clone(), kept[0].clone()];
        let next = dir.path().join("next-1-1.seg.tmp");
        assert!(take_spare(&mut listed, &next));
        assert!(listed.is_empty());
        assert!(spares(dir.path()).unwrap().is_empty());
        // Deleted spares are gone for good.
        fs::write(segment_path(dir.path(), 6), [1u8; 16]).unwrap();
        let spare = retire(dir.path(), 6, true).unwrap().unwrap();
        assert!(remove_spares(dir.path()));
        assert!(!take_spare(
            &mut vec![spare],
            &dir.path().join("next-1-2.seg.tmp")
        ));
        assert!(!remove_spares(dir.path()));
    }
}
