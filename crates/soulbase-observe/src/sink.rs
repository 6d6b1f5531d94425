//! The evidence seam and the in-memory sinks.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use soulbase_errors::{ErrorCode, SoulError};
use tokio::sync::mpsc;

use crate::EvidenceRecord;

/// Resolves once a record accepted by [`EvidenceSink::submit`] is as durable as
/// `record` would have made it, or with the error that kept it from being so.
pub type Durable = Pin<Box<dyn Future<Output = Result<(), SoulError>> + Send + 'static>>;

/// Where the pipeline writes evidence.
///
/// `record` returns once the record is as durable as the sink promises (a durable
/// store in `sync` mode: on disk). An error before execution makes the pipeline refuse
/// the call (`EVIDENCE.UNAVAILABLE`): nothing runs without its Begin (queued, for a
/// call that can change nothing; durable, for every other).
#[async_trait]
pub trait EvidenceSink: Send + Sync + 'static {
    /// Persists one record.
    async fn record(&self, record: EvidenceRecord) -> Result<(), SoulError>;

    /// Accepts a Begin without waiting for it to be durable, so that a call that
    /// cannot change anything (see the pipeline) runs while its Begin is written;
    /// the returned [`Durable`] tells when it is. An error means the Begin was
    /// refused and nothing may run.
    ///
    /// A sink that overrides this writes records in the order they were accepted
    /// and never persists the End of a submitted Begin that turned out not
    /// durable: once the End is recorded, the Begin is durable too or the End
    /// failed. The default records the Begin before returning, which keeps both
    /// promises trivially.
    ///
    /// The pipeline awaits the [`Durable`] while the call runs (and after its End,
    /// if it has not resolved by then), so a sink may have it do work of its own
    /// once awaited — ask for the Begin to be written, say — instead of waking a
    /// writer for every Begin. A tool that finishes at its first poll has it
    /// polled only once its End is recorded. Otherwise, just before the End is
    /// recorded it is polled once with a waker that does nothing, and not again
    /// until the End is: a sink that answers the Begin in the End's round wakes the
    /// call once for both. Either way its `record` of the End must not wait on the
    /// Begin's answer being polled.
    async fn submit(&self, begin: EvidenceRecord) -> Result<Durable, SoulError> {
        self.record(begin).await?;
        Ok(Box::pin(std::future::ready(Ok(()))))
    }
}

/// Keeps every record in memory, in order. For linking without storage, and for tests.
#[derive(Clone, Default)]
pub struct MemorySink {
    records: Arc<Mutex<Vec<EvidenceRecord>>>,
}

impl MemorySink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of everything recorded so far.
    pub fn records(&self) -> Vec<EvidenceRecord> {
        self.records.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

#[async_trait]
impl EvidenceSink for MemorySink {
    async fn record(&self, record: EvidenceRecord) -> Result<(), SoulError> {
        self.records
            .lock()
            .map_err(|_| {
                SoulError::of(ErrorCode::EvidenceUnavailable).with_note("memory sink poisoned")
            })?
            .push(record);
        Ok(())
    }
}

/// Sends records down a bounded channel to a consumer (a batching writer, a test).
///
/// When the channel is full the sink waits (backpressure); when the consumer is gone
/// it fails with `EVIDENCE.UNAVAILABLE`, so calls stop rather than run unrecorded.
#[derive(Clone)]
pub struct ChannelSink {
    tx: mpsc::Sender<EvidenceRecord>,
}

impl ChannelSink {
    /// A sink and the receiving end, with room for `capacity` records in flight.
    pub fn new(capacity: usize) -> (Self, mpsc::Receiver<EvidenceRecord>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (Self { tx }, rx)
    }
}

#[async_trait]
impl EvidenceSink for ChannelSink {
    async fn record(&self, record: EvidenceRecord) -> Result<(), SoulError> {
        self.tx.send(record).await.map_err(|_| {
            SoulError::of(ErrorCode::EvidenceUnavailable).with_note("evidence consumer is gone")
        })
    }
}

#[cfg(test)]
mod tests {
    use soulbase_types::{ActorId, CallId, Envelope, Origin, TenantId};

    use super::*;
    use crate::{Denial, EvidenceEvent};

    fn denial() -> EvidenceRecord {
        Envelope::new(
            TenantId::new("t").unwrap(),
            ActorId::new("a").unwrap(),
            Origin::Api,
            EvidenceEvent::Denied(Denial {
                call_id: CallId::generate(),
                tool: "a.b.c".into(),
                code: ErrorCode::PolicyDenyTool,
            }),
        )
    }

    #[tokio::test]
    async fn memory_sink_keeps_order() {
        let sink = MemorySink::new();
        let (a, b) = (denial(), denial());
        sink.record(a.clone()).await.unwrap();
        sink.record(b.clone()).await.unwrap();
        assert_eq!(sink.records(), vec![a, b]);
    }

    #[tokio::test]
    async fn channel_sink_fails_closed_when_consumer_is_gone() {
        let (sink, rx) = ChannelSink::new(4);
        drop(rx);
        let err = sink.record(denial()).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::EvidenceUnavailable);
    }

    #[test]
    fn records_serialize_with_event_tag() {
        let v = serde_json::to_value(denial()).unwrap();
        assert_eq!(v["payload"]["event"], "denied");
        assert_eq!(v["payload"]["code"], "POLICY.DENY_TOOL");
    }
}
