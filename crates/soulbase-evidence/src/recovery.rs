//! Start-up recovery: make the spool whole again after a crash.
//!
//! Truncates a torn tail, finds every Begin without an End in the retained segments
//! (segments holding an open Begin are never deleted, so this is complete) and closes
//! each with an `aborted` End written durably before the sink accepts new calls.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use soulbase_errors::SoulError;
use soulbase_observe::{BudgetUsage, EndStatus, EvidenceEnd, EvidenceEvent, EvidenceRecord};
use soulbase_types::{CallId, Envelope, EnvelopeId, UnixMillis};

use crate::frame;
use crate::segment::{self, Pos};
use crate::shared::unavailable;

/// What recovery found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segments found.
    pub segments: usize,
    /// Records found in them.
    pub records: usize,
    /// Bytes cut off torn or corrupt segment tails (preallocated zeros not counted).
    pub truncated_bytes: u64,
    /// Calls whose Begin had no End, now closed as aborted.
    pub aborted: Vec<CallId>,
    /// Where draining resumes.
    pub resume_at: Pos,
    /// The segment new records go to.
    pub active_segment: u64,
    /// Bytes in the spool after recovery.
    pub disk_bytes: u64,
}

fn io_err(what: &str, e: std::io::Error) -> SoulError {
    unavailable("the evidence spool cannot be opened").with_note(format!("{what}: {e}"))
}

/// The aborted End closing `begin`.
pub fn aborted_end(begin: &EvidenceRecord) -> Option<EvidenceRecord> {
    let EvidenceEvent::Begin(b) = &begin.payload else {
        return None;
    };
    let now = UnixMillis::now();
    let elapsed_ms = u64::try_from(now.0.saturating_sub(begin.at.0)).unwrap_or(0);
    Some(Envelope {
        id: EnvelopeId::generate(),
        tenant: begin.tenant.clone(),
        actor: begin.actor.clone(),
        origin: begin.origin,
        trace: begin.trace,
        at: now,
        payload: EvidenceEvent::End(EvidenceEnd {
            call_id: b.call_id.clone(),
            begin_id: begin.id.clone(),
            status: EndStatus::Aborted,
            error_code: None,
            output_digest: None,
            side_effects: Vec::new(),
            usage: BudgetUsage {
                calls: 1,
                ..BudgetUsage::default()
            },
            duration_us: elapsed_ms.saturating_mul(1_000),
            client_requests: Vec::new(),
        }),
    })
}

/// Recovers the spool in `dir` (which must be locked by the caller).
pub fn recover(dir: &Path) -> Result<RecoveryReport, SoulError> {
    // A next segment prepared before a crash holds nothing; the writer makes a new one.
    segment::remove_prepared(dir);
    let ids = segment::list_segments(dir).map_err(|e| io_err("listing segments", e))?;
    let mut report = RecoveryReport {
        segments: ids.len(),
        ..RecoveryReport::default()
    };
    let mut open: HashMap<EnvelopeId, EvidenceRecord> = HashMap::new();
    for &id in &ids {
        let path = segment::segment_path(dir, id);
        let scan = segment::scan(&path).map_err(|e| io_err("reading a segment", e))?;
        if scan.valid_len < scan.file_len {
            if scan.torn_bytes > 0 {
                tracing::warn!(
                    segment = id,
                    bytes = scan.torn_bytes,
                    "truncating a torn spool tail"
                );
                report.truncated_bytes += scan.torn_bytes;
            }
            let f = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| io_err("opening a segment", e))?;
            f.set_len(scan.valid_len)
                .and_then(|()| f.sync_all())
                .map_err(|e| io_err("truncating a segment", e))?;
        }
        report.records += scan.records.len();
        report.disk_bytes += scan.valid_len;
        for (_, r) in scan.records {
            match &r.payload {
                EvidenceEvent::Begin(_) => {
                    open.insert(r.id.clone(), r);
                }
                EvidenceEvent::End(e) => {
                    open.remove(&e.begin_id);
                }
                EvidenceEvent::Denied(_) | EvidenceEvent::Conversation(_) => {}
            }
        }
    }
    let checkpoint =
        segment::read_checkpoint(dir).map_err(|e| io_err("reading the checkpoint", e))?;
    let first = ids.first().copied().unwrap_or(1);
    report.resume_at = match checkpoint {
        Some(p) if p.segment >= first => p,
        _ => Pos {
            segment: first,
            offset: 0,
        },
    };
    let active = ids.last().map_or(1, |last| last + 1);
    report.active_segment = active;
    let mut orphans: Vec<EvidenceRecord> = open.into_values().collect();
    orphans.sort_by(|a, b| (a.at, &a.id).cmp(&(b.at, &b.id)));
    if !orphans.is_empty() {
        let mut bytes = Vec::new();
        for begin in &orphans {
            if let Some(end) = aborted_end(begin) {
                frame::encode_with(&mut bytes, |out| soulbase_observe::write_record(&end, out))?;
                if let EvidenceEvent::Begin(b) = &begin.payload {
                    report.aborted.push(b.call_id.clone());
                }
            }
        }
        let path = segment::segment_path(dir, active);
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| io_err("creating a segment", e))?;
        f.write_all(&bytes)
            .and_then(|()| f.sync_data())
            .map_err(|e| io_err("writing aborted Ends", e))?;
        report.disk_bytes += bytes.len() as u64;
        tracing::warn!(
            count = report.aborted.len(),
            "closed Begins orphaned by a crash as aborted"
        );
    }
    Ok(report)
}
