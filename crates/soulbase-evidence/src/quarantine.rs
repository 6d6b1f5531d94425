//! The spool's quarantine file, read and offered to a store again.
//!
//! The drainer keeps a record the store refused for good (or an intact spool
//! frame that is not a record) in `quarantine.jsonl` instead of blocking the
//! drain. Those records are durable but reach no store by themselves. Once the
//! cause is fixed (a newer version that reads them, a database that takes the
//! value), they are offered again: what the store takes leaves the file, what it
//! still refuses stays with the reason it gives now, and lines this version cannot
//! read stay as they are. One implementation serves two callers:
//!
//! - [`requeue`], for a spool no sink uses (`soulbase evidence quarantine
//!   retry`, the server stopped): it holds the spool's `LOCK` throughout.
//! - [`DurableSink::retry_quarantine`](crate::DurableSink::retry_quarantine), for
//!   the running sink's own spool (`POST /api/quarantine/retry`): the drainer —
//!   the file's only other writer — runs it between two batches, with the store
//!   it drains into.
//!
//! Either way the file is rewritten only after the store took the records that
//! leave it, atomically (a temporary file, fsynced, renamed over it, the
//! directory fsynced): a crash leaves the old file or the new one, so a record is
//! never lost — at worst it is offered again, and the store skips what it has
//! (writes are idempotent by envelope id).

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

/// What offering the quarantine again did ([`requeue`],
/// [`DurableSink::retry_quarantine`](crate::DurableSink::retry_quarantine)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequeueReport {
    /// Records the store took; they left the quarantine file.
    pub stored: usize,
    /// Records the store refused again, with its reason now (the entry holds the
    /// reason it had); they stay, with the reason now.
    pub refused: Vec<(QuarantineEntry, String)>,
    /// Lines this version cannot read or offer; they stay as they are.
    pub unreadable: Vec<QuarantineEntry>,
    /// Whether the file was rewritten: records left it, or a reason changed.
    pub rewritten: bool,
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
/// again, and rewrites the file with the lines that are still not stored: those
/// refused again (with the reason the store gives now) and the unreadable ones
/// (unchanged); the file goes when none are left.
///
/// Holds the spool's `LOCK`: fails with `EVIDENCE.UNAVAILABLE` while a sink uses
/// the spool (and a sink cannot open it meanwhile) — the running sink offers its
/// own quarantine with [`DurableSink::retry_quarantine`](crate::DurableSink::retry_quarantine).
/// A store outage fails the whole run and leaves the file as it was; the records
/// already stored are skipped when offered again (writes are idempotent by
/// envelope id), so nothing is lost or stored twice.
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
                     stop it, then offer the quarantine again, or ask the running server \
                     (POST /api/quarantine/retry)",
                    spool_dir.display()
                ),
            ));
        }
        Err(e) => return Err(io_error("locking the spool", spool_dir, &e)),
    };
    // Read again under the lock: a sink may have appended before it stopped.
    offer(spool_dir, store, || Ok(()), || Ok(())).await
}

/// The work of offering the quarantine again, for a caller that has the file to
/// itself against every other writer: [`requeue`] (the spool's `LOCK`) and the
/// running sink's drainer (the file's only appender). `access` is asked before
/// each file operation and kept until it ends (the drainer's hold on the
/// directory); `stop` before each store write (shutdown).
pub(crate) async fn offer<A: Send + 'static>(
    spool_dir: &Path,
    store: &dyn EvidenceStore,
    access: impl Fn() -> Result<A, SoulError>,
    stop: impl Fn() -> Result<(), SoulError>,
) -> Result<RequeueReport, SoulError> {
    let held = access()?;
    let dir = spool_dir.to_owned();
    let text = blocking(move || {
        let _held = held;
        read_file(&dir)
    })
    .await?
    .unwrap_or_default();
    let parsed = parse_all(&text);

    let mut report = RequeueReport::default();
    // The line each one becomes: `None` when it leaves the file.
    let mut lines: Vec<Option<Vec<u8>>> = parsed.iter().map(|p| Some(p.raw.to_vec())).collect();
    let mut offered: Vec<(usize, EncodedRecord)> = Vec::new();
    for (i, p) in parsed.iter().enumerate() {
        match &p.record {
            Some(r) => offered.push((i, r.clone())),
            None => report.unreadable.push(p.entry.clone()),
        }
    }
    let mut refused_at = vec![false; parsed.len()];
    for batch in offered.chunks(BATCH) {
        let records: Vec<EncodedRecord> = batch.iter().map(|(_, r)| r.clone()).collect();
        for (j, e) in write_isolating(store, &records, &stop).await? {
            let i = batch[j].0;
            refused_at[i] = true;
            let reason = e.field("reason").unwrap_or(e.message()).to_owned();
            if reason != parsed[i].entry.refused {
                let line = segment::quarantine_line(&batch[j].1, &reason)
                    .map_err(|e| io_error("writing a quarantine line", spool_dir, &e))?;
                lines[i] = Some(line);
                report.rewritten = true;
            }
            report.refused.push((parsed[i].entry.clone(), reason));
        }
    }
    for (i, _) in &offered {
        if !refused_at[*i] {
            lines[*i] = None;
        }
    }
    report.stored = offered.len() - report.refused.len();
    report.rewritten |= report.stored > 0;
    if !report.rewritten {
        // Nothing left the file and no reason changed: leave it as it is.
        return Ok(report);
    }
    let keep: Vec<Vec<u8>> = lines.into_iter().flatten().collect();
    let held = access()?;
    let dir = spool_dir.to_owned();
    blocking(move || {
        let _held = held;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Mutex;

    use async_trait::async_trait;
    use soulbase_observe::fixtures::sample_begin;
    use soulbase_observe::{
        CallEvidence, CallPage, EvidenceQuery, EvidenceRecord, MemoryStore, store_refusal,
    };
    use soulbase_types::{CallId, EnvelopeId, TenantId, UnixMillis};

    use super::*;

    /// A [`MemoryStore`] that refuses the records listed, for `reason`.
    #[derive(Default)]
    struct Refusing {
        inner: MemoryStore,
        refused: Mutex<Vec<EnvelopeId>>,
        reason: Mutex<String>,
    }

    #[async_trait]
    impl EvidenceStore for Refusing {
        async fn write_batch(&self, records: &[EvidenceRecord]) -> Result<(), SoulError> {
            let refused = self.refused.lock().unwrap().clone();
            if records.iter().any(|r| refused.contains(&r.id)) {
                return Err(store_refusal(self.reason.lock().unwrap().clone()));
            }
            self.inner.write_batch(records).await
        }
        async fn call(&self, t: Option<&TenantId>, c: &CallId) -> Result<CallEvidence, SoulError> {
            self.inner.call(t, c).await
        }
        async fn list(&self, q: &EvidenceQuery) -> Result<CallPage, SoulError> {
            self.inner.list(q).await
        }
        async fn list_denials(
            &self,
            q: &EvidenceQuery,
        ) -> Result<soulbase_observe::DenialPage, SoulError> {
            self.inner.list_denials(q).await
        }
        async fn purge_before(&self, c: UnixMillis) -> Result<u64, SoulError> {
            self.inner.purge_before(c).await
        }
    }

    fn line(record: &EvidenceRecord, why: &str) -> String {
        serde_json::json!({"refused": why, "record": record}).to_string()
    }

    /// Three records, then a line this version cannot read.
    fn seed(dir: &Path) -> (Vec<EvidenceRecord>, Vec<u8>) {
        let records: Vec<EvidenceRecord> = (0..3).map(|_| sample_begin()).collect();
        let mut text = String::new();
        for r in &records {
            text.push_str(&line(r, "value too long"));
            text.push('\n');
        }
        text.push_str("not a quarantine entry\n");
        fs::write(dir.join(QUARANTINE_FILE), &text).unwrap();
        (records, text.into_bytes())
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("quarantine"))
            .collect();
        names.sort();
        names
    }

    /// The crash window of a retry: the store took the records, the file was not
    /// rewritten yet (here the rewrite fails: its temporary file cannot be made).
    /// Nothing is lost — the file is as it was — and the next offer completes,
    /// the store skipping what it already has.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rewrite_that_fails_after_the_store_took_the_records_loses_none() {
        let dir = tempfile::tempdir().unwrap();
        let (records, text) = seed(dir.path());
        let store = Refusing::default();
        let tmp = dir.path().join(format!("{QUARANTINE_FILE}.tmp"));
        fs::create_dir(&tmp).unwrap();
        let e = requeue(dir.path(), &store).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::EvidenceUnavailable);
        assert!(e.message().contains("rewriting"), "{e:?}");
        assert_eq!(fs::read(dir.path().join(QUARANTINE_FILE)).unwrap(), text);
        assert_eq!(
            store.inner.records().len(),
            3,
            "they landed before the crash"
        );

        fs::remove_dir(&tmp).unwrap();
        let report = requeue(dir.path(), &store).await.unwrap();
        assert_eq!(report.stored, 3);
        assert!(report.rewritten);
        assert_eq!(report.unreadable.len(), 1);
        let ids: Vec<EnvelopeId> = store.inner.records().into_iter().map(|r| r.id).collect();
        assert_eq!(ids.len(), 3, "offered twice, stored once");
        for r in &records {
            assert!(ids.contains(&r.id));
        }
        assert_eq!(
            fs::read_to_string(dir.path().join(QUARANTINE_FILE)).unwrap(),
            "not a quarantine entry\n"
        );
        assert_eq!(names(dir.path()), [QUARANTINE_FILE]);
    }

    /// A temporary file left by a crash in the middle of a rewrite is never read:
    /// the file is the old one, and the next rewrite replaces the leftover.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_temporary_file_left_by_a_crash_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let (records, _) = seed(dir.path());
        let tmp = dir.path().join(format!("{QUARANTINE_FILE}.tmp"));
        fs::write(&tmp, "{\"refused\":\"half a li").unwrap();
        assert_eq!(read(dir.path()).unwrap().len(), 4);
        let store = Refusing::default();
        store.refused.lock().unwrap().push(records[1].id.clone());
        *store.reason.lock().unwrap() = "value too long".into();
        let report = requeue(dir.path(), &store).await.unwrap();
        assert_eq!((report.stored, report.refused.len()), (2, 1));
        assert_eq!(
            fs::read_to_string(dir.path().join(QUARANTINE_FILE)).unwrap(),
            format!(
                "{}\nnot a quarantine entry\n",
                line(&records[1], "value too long")
            )
        );
        assert_eq!(names(dir.path()), [QUARANTINE_FILE]);
    }

    /// A record refused again stays with the reason the store gives now (the
    /// record itself unchanged); when nothing changes, the file is not touched.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_refused_again_keeps_the_new_reason() {
        let dir = tempfile::tempdir().unwrap();
        let (records, text) = seed(dir.path());
        let store = Refusing::default();
        store
            .refused
            .lock()
            .unwrap()
            .extend(records.iter().map(|r| r.id.clone()));
        *store.reason.lock().unwrap() = "value too long".into();
        let path = dir.path().join(QUARANTINE_FILE);
        let before = fs::metadata(&path).unwrap().modified().unwrap();
        let report = requeue(dir.path(), &store).await.unwrap();
        assert_eq!((report.stored, report.refused.len()), (0, 3));
        assert!(!report.rewritten, "{report:?}");
        assert_eq!(fs::read(&path).unwrap(), text);
        assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), before);

        *store.reason.lock().unwrap() = "check constraint violated".into();
        let report = requeue(dir.path(), &store).await.unwrap();
        assert!(report.rewritten);
        assert_eq!(report.refused[0].0.refused, "value too long");
        assert_eq!(report.refused[0].1, "check constraint violated");
        let entries = read(dir.path()).unwrap();
        assert_eq!(entries.len(), 4);
        for (e, r) in entries.iter().zip(&records) {
            assert_eq!(e.refused, "check constraint violated");
            assert_eq!(e.head.as_ref().unwrap().id, r.id.to_string());
        }
        assert!(entries[3].unreadable.is_some());
        // The record kept is the same record.
        let first = fs::read_to_string(&path).unwrap();
        let first: serde_json::Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
        let kept: EvidenceRecord = serde_json::from_value(first["record"].clone()).unwrap();
        assert_eq!(kept, records[0]);
        assert!(store.inner.records().is_empty());
    }
}
