//! The spool's quarantine file, read and offered to a store again.
//!
//! The drainer keeps a record the store refused for good (or an intact spool
//! frame that is not a record) in `quarantine.jsonl` instead of blocking the
//! drain. Those records are durable but reach no store by themselves. Once the
//! cause is fixed (a newer version that reads them, a database that takes the
//! value), [`requeue`] offers them again: what the store takes leaves the file,
//! everything else stays in it, line for line.
//!
//! [`requeue`] holds the spool's `LOCK` throughout, so it runs only while no sink
//! (no `soulbased`) uses the spool: the drainer is the file's only other writer.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::{EncodedRecord, EvidenceStore};

use crate::drain::write_isolating;
use crate::segment;
pub use crate::segment::QUARANTINE_FILE;

/// The most records [`requeue`] offers the store in one batch.
const BATCH: usize = 256;

/// One line of the quarantine file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantineEntry {
    /// The line's number in the file, from 1.
    pub line: usize,
    /// Why the record was quarantined, as the store said then.
    pub refused: String,
    /// What is wrong with the line now: `None` when it holds a record this
    /// version can read, else why it cannot (a line that is not a quarantine
    /// entry, e.g. torn by a crash, or text that is not a record).
    pub unreadable: Option<String>,
    /// The record's envelope id, kind (`begin`, `end`, `denied`), call id and
    /// tenant, when it can be read.
    pub head: Option<EntryHead>,
}

/// The identifying fields of a quarantined record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryHead {
    /// The envelope id.
    pub id: String,
    /// `begin`, `end` or `denied`.
    pub kind: String,
    /// The call the record belongs to.
    pub call_id: String,
    /// The tenant.
    pub tenant: String,
}

/// What [`requeue`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequeueReport {
    /// Records the store took; they left the quarantine file.
    pub stored: usize,
    /// Records the store refused again, with its reason now; they stay.
    pub refused: Vec<(QuarantineEntry, String)>,
    /// Lines this version cannot read or offer; they stay.
    pub unreadable: Vec<QuarantineEntry>,
}

impl RequeueReport {
    /// How many lines the quarantine file holds afterwards.
    pub fn remaining(&self) -> usize {
        self.refused.len() + self.unreadable.len()
    }
}

/// A line parsed: its entry, and the record when this version can read it.
struct Parsed<'a> {
    raw: &'a [u8],
    entry: QuarantineEntry,
    record: Option<EncodedRecord>,
}

/// Parses one line of the file; `ended` tells whether a line end follows it.
fn parse(line: usize, raw: &[u8], ended: bool) -> Parsed<'_> {
    let unreadable = |refused: String, why: String| Parsed {
        raw,
        entry: QuarantineEntry {
            line,
            refused,
            unreadable: Some(why),
            head: None,
        },
        record: None,
    };
    // `{"refused": cause, "record": record}` (see `segment::QUARANTINE_FILE`).
    let mut value: serde_json::Value = match serde_json::from_slice(raw) {
        Ok(v) => v,
        Err(_) if !ended => {
            return unreadable(
                String::new(),
                "incomplete: being written, or torn by a crash".into(),
            );
        }
        Err(e) => return unreadable(String::new(), format!("not a quarantine entry: {e}")),
    };
    let refused = match value.get("refused").and_then(|r| r.as_str()) {
        Some(r) => r.to_owned(),
        None => {
            return unreadable(String::new(), "not a quarantine entry: no `refused`".into());
        }
    };
    // Text that was not JSON is kept as a JSON string; a record as its object.
    let text = match value.get_mut("record").map(serde_json::Value::take) {
        Some(serde_json::Value::String(s)) => s,
        Some(other) => other.to_string(),
        None => return unreadable(refused, "not a quarantine entry: no `record`".into()),
    };
    // Checked, and kept as it is (fields this version does not know included).
    let record = match EncodedRecord::verified(text) {
        Ok(r) => r,
        Err((e, _)) => {
            let why = e.field("reason").unwrap_or(e.message()).to_owned();
            return unreadable(refused, why);
        }
    };
    let head = record.head().ok().map(|h| EntryHead {
        id: h.id.into_owned(),
        kind: h.kind.to_owned(),
        call_id: h.call_id.into_owned(),
        tenant: h.tenant.into_owned(),
    });
    Parsed {
        raw,
        entry: QuarantineEntry {
            line,
            refused,
            unreadable: None,
            head,
        },
        record: Some(record),
    }
}

/// The file parsed line by line: each line's bytes kept exactly, whatever they
/// hold, blank lines skipped. A last line without a line end (being appended, or
/// torn by a crash) is a line too.
fn parse_all(text: &[u8]) -> Vec<Parsed<'_>> {
    let count = text.split(|b| *b == b'\n').count();
    text.split(|b| *b == b'\n')
        .enumerate()
        .filter(|(_, l)| !l.trim_ascii().is_empty())
        .map(|(i, l)| parse(i + 1, l, i + 1 < count))
        .collect()
}

/// The quarantine file's bytes; `None` when there is none. A missing spool
/// directory is an error naming it (a mistyped `--spool` must not look empty).
fn read_file(spool_dir: &Path) -> Result<Option<Vec<u8>>, SoulError> {
    if !spool_dir.is_dir() {
        return Err(SoulError::new(
            ErrorCode::ConfigInvalid,
            format!("no spool directory at {}", spool_dir.display()),
        )
        .with_field("field", "spool"));
    }
    match fs::read(spool_dir.join(QUARANTINE_FILE)) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error("reading the quarantine file", spool_dir, &e)),
    }
}

fn io_error(what: &str, dir: &Path, e: &io::Error) -> SoulError {
    SoulError::new(
        ErrorCode::EvidenceUnavailable,
        format!("{what} in {}: {e}", dir.display()),
    )
}

/// The entries of the quarantine file in `spool_dir`, in file order; empty when
/// there is none (`CONFIG.INVALID` when the directory does not exist). Reads
/// only, so it works beside a running sink.
pub fn read(spool_dir: &Path) -> Result<Vec<QuarantineEntry>, SoulError> {
    let Some(text) = read_file(spool_dir)? else {
        return Ok(Vec::new());
    };
    Ok(parse_all(&text).into_iter().map(|p| p.entry).collect())
}

/// Offers every readable record of the quarantine file in `spool_dir` to `store`
/// again, and rewrites the file with the lines that are still not stored (refused
/// again, or unreadable), unchanged; the file goes when none are left.
///
/// Holds the spool's `LOCK`: fails with `EVIDENCE.UNAVAILABLE` while a sink uses
/// the spool (and a sink cannot open it meanwhile). A store outage fails the
/// whole run and leaves the file as it was; the records already stored are
/// skipped when offered again (writes are idempotent by envelope id), so nothing
/// is lost or stored twice.
pub async fn requeue(
    spool_dir: &Path,
    store: &dyn EvidenceStore,
) -> Result<RequeueReport, SoulError> {
    let dir = spool_dir.to_owned();
    if blocking(move || read_file(&dir)).await?.is_none() {
        return Ok(RequeueReport::default());
    }
    let _lock = match segment::lock_dir(spool_dir) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            return Err(SoulError::new(
                ErrorCode::EvidenceUnavailable,
                format!(
                    "the spool {} is in use (its LOCK is held, e.g. by a running soulbased); \
                     stop it, then offer the quarantine again",
                    spool_dir.display()
                ),
            ));
        }
        Err(e) => return Err(io_error("locking the spool", spool_dir, &e)),
    };
    // Read again under the lock: a sink may have appended before it stopped.
    let dir = spool_dir.to_owned();
    let text = blocking(move || read_file(&dir)).await?.unwrap_or_default();
    let parsed = parse_all(&text);

    let mut report = RequeueReport::default();
    // Which lines stay in the file.
    let mut stays = vec![false; parsed.len()];
    let mut offered: Vec<(usize, EncodedRecord)> = Vec::new();
    for (i, p) in parsed.iter().enumerate() {
        match &p.record {
            Some(r) => offered.push((i, r.clone())),
            None => {
                stays[i] = true;
                report.unreadable.push(p.entry.clone());
            }
        }
    }
    for batch in offered.chunks(BATCH) {
        let records: Vec<EncodedRecord> = batch.iter().map(|(_, r)| r.clone()).collect();
        for (j, e) in write_isolating(store, &records, || Ok(())).await? {
            let i = batch[j].0;
            stays[i] = true;
            let reason = e.field("reason").unwrap_or(e.message()).to_owned();
            report.refused.push((parsed[i].entry.clone(), reason));
        }
    }
    report.stored = offered.len() - report.refused.len();
    if report.stored == 0 {
        // Nothing left the file: leave it as it is.
        return Ok(report);
    }
    let keep: Vec<Vec<u8>> = parsed
        .iter()
        .zip(&stays)
        .filter(|(_, stays)| **stays)
        .map(|(p, _)| p.raw.to_vec())
        .collect();
    let dir = spool_dir.to_owned();
    blocking(move || {
        rewrite(&dir, &keep).map_err(|e| io_error("rewriting the quarantine file", &dir, &e))
    })
    .await?;
    Ok(report)
}

/// Runs blocking file work off the async runtime's workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SoulError> + Send + 'static,
) -> Result<T, SoulError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(SoulError::internal)?
}

/// Replaces the quarantine file with `lines` (removes it when there are none),
/// durably: a crash leaves the old file or the new one.
fn rewrite(dir: &Path, lines: &[Vec<u8>]) -> io::Result<()> {
    let path = dir.join(QUARANTINE_FILE);
    if lines.is_empty() {
        fs::remove_file(&path)?;
        return segment::sync_dir(dir);
    }
    let tmp = dir.join(format!("{QUARANTINE_FILE}.tmp"));
    let written = (|| {
        let mut f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&tmp)?;
        for l in lines {
            f.write_all(l)?;
            f.write_all(b"\n")?;
        }
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, &path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    segment::sync_dir(dir)
}
