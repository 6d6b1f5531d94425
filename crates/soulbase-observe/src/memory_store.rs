//! An in-process [`EvidenceStore`]: for linking without a database and for tests of
//! the layers above.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{CallId, EnvelopeId, TenantId, UnixMillis};

use crate::store::{
    CallEvidence, CallPage, DenialPage, DenialSummary, EvidenceQuery, EvidenceStore, PageCursor,
    summarize, summarize_denial,
};
use crate::{EvidenceEvent, EvidenceRecord};

#[derive(Default)]
struct Inner {
    /// Every record by envelope id.
    by_id: HashMap<EnvelopeId, EvidenceRecord>,
    /// Envelope ids of each call, in arrival order.
    by_call: HashMap<CallId, Vec<EnvelopeId>>,
    /// Begins ordered by (time, id) per tenant, for listings.
    begins: BTreeMap<(TenantId, UnixMillis, EnvelopeId), ()>,
    /// The End closing each Begin.
    end_of: HashMap<EnvelopeId, EnvelopeId>,
}

/// Evidence in memory, with the same idempotency and query semantics as the
/// database stores.
#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many records are stored.
    pub fn len(&self) -> usize {
        self.inner.lock().map(|i| i.by_id.len()).unwrap_or(0)
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of every record, in no particular order.
    pub fn records(&self) -> Vec<EvidenceRecord> {
        self.inner
            .lock()
            .map(|i| i.by_id.values().cloned().collect())
            .unwrap_or_default()
    }
}

fn poisoned() -> SoulError {
    SoulError::of(ErrorCode::EvidenceUnavailable).with_note("memory store poisoned")
}

#[async_trait]
impl EvidenceStore for MemoryStore {
    async fn write_batch(&self, records: &[EvidenceRecord]) -> Result<(), SoulError> {
        let mut inner = self.inner.lock().map_err(|_| poisoned())?;
        for r in records {
            if inner.by_id.contains_key(&r.id) {
                continue;
            }
            let call = match &r.payload {
                EvidenceEvent::Begin(b) => {
                    inner
                        .begins
                        .insert((r.tenant.clone(), r.at, r.id.clone()), ());
                    b.call_id.clone()
                }
                EvidenceEvent::End(e) => {
                    inner.end_of.insert(e.begin_id.clone(), r.id.clone());
                    e.call_id.clone()
                }
                EvidenceEvent::Denied(_) | EvidenceEvent::Conversation(_) => {
                    r.payload.call_id().clone()
                }
            };
            inner.by_call.entry(call).or_default().push(r.id.clone());
            inner.by_id.insert(r.id.clone(), r.clone());
        }
        Ok(())
    }

    async fn call(
        &self,
        tenant: Option<&TenantId>,
        call_id: &CallId,
    ) -> Result<CallEvidence, SoulError> {
        let inner = self.inner.lock().map_err(|_| poisoned())?;
        let mut records: Vec<EvidenceRecord> = inner
            .by_call
            .get(call_id)
            .into_iter()
            .flatten()
            .filter_map(|id| inner.by_id.get(id))
            .filter(|r| tenant.is_none_or(|t| &r.tenant == t))
            .cloned()
            .collect();
        // Ids are time-ordered only to the millisecond: an End recorded in its
        // Begin's millisecond must still come after it.
        let is_end = |r: &EvidenceRecord| matches!(r.payload, EvidenceEvent::End(_));
        records.sort_by(|a, b| (a.at, is_end(a), &a.id).cmp(&(b.at, is_end(b), &b.id)));
        Ok(CallEvidence { records })
    }

    async fn list(&self, q: &EvidenceQuery) -> Result<CallPage, SoulError> {
        q.validate()?;
        let inner = self.inner.lock().map_err(|_| poisoned())?;
        let mut calls = Vec::new();
        let mut more = false;
        for ((tenant, at, id), ()) in inner.begins.iter().rev() {
            if tenant != &q.tenant
                || q.from.is_some_and(|f| *at < f)
                || q.to.is_some_and(|t| *at >= t)
            {
                continue;
            }
            if let Some(c) = &q.after
                && (*at, id) >= (c.at, &c.id)
            {
                continue;
            }
            let Some(begin) = inner.by_id.get(id) else {
                continue;
            };
            let end = inner.end_of.get(id).and_then(|e| inner.by_id.get(e));
            let Some(summary) = summarize(begin, end) else {
                continue;
            };
            if q.tool.as_ref().is_some_and(|t| t != &summary.tool_id)
                || q.status.is_some_and(|s| summary.status != Some(s))
                || q.actor.as_ref().is_some_and(|a| a != &summary.actor)
                || q.code.is_some_and(|c| summary.error_code != Some(c))
            {
                continue;
            }
            if calls.len() == q.limit as usize {
                more = true;
                break;
            }
            calls.push(summary);
        }
        let next = if more {
            calls.last().map(|c| PageCursor {
                at: c.began_at,
                id: c.begin_id.clone(),
            })
        } else {
            None
        };
        Ok(CallPage { calls, next })
    }

    async fn list_denials(&self, q: &EvidenceQuery) -> Result<DenialPage, SoulError> {
        q.validate_denials()?;
        let inner = self.inner.lock().map_err(|_| poisoned())?;
        let mut denials: Vec<DenialSummary> = inner
            .by_id
            .values()
            .filter(|r| r.tenant == q.tenant)
            .filter_map(summarize_denial)
            .filter(|d| {
                q.from.is_none_or(|f| d.at >= f)
                    && q.to.is_none_or(|t| d.at < t)
                    && q.tool.as_ref().is_none_or(|t| t.as_str() == d.tool)
                    && q.actor.as_ref().is_none_or(|a| a == &d.actor)
                    && q.code.is_none_or(|c| c == d.code)
                    && q.after
                        .as_ref()
                        .is_none_or(|c| (d.at, &d.denial_id) < (c.at, &c.id))
            })
            .collect();
        denials.sort_by(|a, b| (b.at, &b.denial_id).cmp(&(a.at, &a.denial_id)));
        denials.truncate(q.limit as usize + 1);
        Ok(DenialPage::of(denials, q.limit))
    }

    async fn purge_before(&self, cutoff: UnixMillis) -> Result<u64, SoulError> {
        let mut inner = self.inner.lock().map_err(|_| poisoned())?;
        let old: Vec<EnvelopeId> = inner
            .by_id
            .values()
            .filter(|r| r.at < cutoff)
            .map(|r| r.id.clone())
            .collect();
        for id in &old {
            inner.by_id.remove(id);
            inner.end_of.remove(id);
        }
        inner.begins.retain(|(_, at, _), _| *at >= cutoff);
        let Inner { by_call, by_id, .. } = &mut *inner;
        by_call.retain(|_, ids| {
            ids.retain(|i| by_id.contains_key(i));
            !ids.is_empty()
        });
        Ok(old.len() as u64)
    }
}
