//! Evidence records in their serialized form, and the columns a store indexes.
//!
//! The durable sink spools each record as its JSON text and a database stores that
//! same text. Passing the text through ([`EncodedRecord`]) spares the store
//! encoding each [`EvidenceRecord`] again: it reads only the few fields it indexes
//! ([`RecordHead`]), skipping the rest of the text without building it. Text not
//! known to be a record is decoded whole first, so no store keeps text it could
//! not read back.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use soulbase_errors::SoulError;

use crate::quick_head::quick_head;
use crate::store::store_refusal;
use crate::{EndStatus, EvidenceRecord};

/// An evidence record as the JSON text `serde_json` makes of an
/// [`EvidenceRecord`] (what the durable sink's spool holds and what a SQL store
/// keeps in its `record` column).
///
/// Either known to be a record — made by [`encode`](Self::encode), or text that
/// passed [`verified`](Self::verified) — or text not yet checked
/// ([`from_json`](Self::from_json)), which [`head`](Self::head) and
/// [`check`](Self::check) decode whole first, so no store takes text it could not
/// read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedRecord {
    /// Shared: a store that must own what it binds (SQLite's) takes a count,
    /// not a copy.
    json: Arc<str>,
    verified: bool,
}

/// `record` as its JSON text (what `serde_json` writes, by a faster serializer:
/// see `json.rs`), appended to `out`. Every record the spool and the stores take is
/// encoded here.
pub fn write_record(record: &EvidenceRecord, out: &mut Vec<u8>) -> Result<(), SoulError> {
    crate::json::write(record, out).map_err(SoulError::internal)
}

impl EncodedRecord {
    /// `record` serialized.
    pub fn encode(record: &EvidenceRecord) -> Result<Self, SoulError> {
        let mut out = Vec::with_capacity(1024);
        write_record(record, &mut out)?;
        let json = String::from_utf8(out).map_err(SoulError::internal)?;
        Ok(Self {
            json: json.into(),
            verified: true,
        })
    }

    /// Every record of `records` serialized (a typed batch on its way to
    /// [`EvidenceStore::write_encoded`](crate::EvidenceStore::write_encoded)).
    pub fn encode_all(records: &[EvidenceRecord]) -> Result<Vec<Self>, SoulError> {
        records.iter().map(Self::encode).collect()
    }

    /// Text that should be a serialized [`EvidenceRecord`], not checked yet.
    pub fn from_json(json: String) -> Self {
        Self {
            json: json.into(),
            verified: false,
        }
    }

    /// Text the caller knows to be `serde_json`'s serialization of an
    /// [`EvidenceRecord`] made by this process — the durable sink's own spool
    /// frames, read back with their checksum intact — taken without decoding it
    /// again. Text from anywhere else goes through [`verified`](Self::verified).
    pub fn known(json: &str) -> Self {
        Self {
            json: json.into(),
            verified: true,
        }
    }

    /// Text checked to be a record (decoded whole, then dropped): the check the
    /// drain makes when it reads the spool, off the request path. On failure the
    /// error and the unchecked text, which every store refuses.
    pub fn verified(json: String) -> Result<Self, (SoulError, Self)> {
        let record = Self::from_json(json);
        match record.decode() {
            Ok(_) => Ok(Self {
                verified: true,
                ..record
            }),
            Err(e) => Err((e, record)),
        }
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.json
    }

    /// The JSON text, shared: for a store that owns what it binds.
    pub fn shared(&self) -> Arc<str> {
        self.json.clone()
    }

    /// The record, decoded whole. Text that is not a record is a
    /// [`store_refusal`]: no store can ever take it, so the durable sink
    /// quarantines it instead of retrying.
    pub fn decode(&self) -> Result<EvidenceRecord, SoulError> {
        serde_json::from_str(&self.json)
            .map_err(|e| store_refusal(format!("not an evidence record: {e}")))
    }

    /// Ok when the text is a record: at once if known, else by decoding it. Text
    /// that is not is a [`store_refusal`], as with [`decode`](Self::decode).
    pub fn check(&self) -> Result<(), SoulError> {
        if self.verified {
            Ok(())
        } else {
            self.decode().map(drop)
        }
    }

    /// The fields a store indexes, read without decoding the rest (text not known
    /// to be a record is [`check`](Self::check)ed first). Text that is not a
    /// record is a [`store_refusal`].
    pub fn head(&self) -> Result<RecordHead<'_>, SoulError> {
        self.check()?;
        // Known to be a record: the quick scan reads what it can, the parser the rest.
        match quick_head(&self.json) {
            Some(head) => Ok(head),
            None => parsed_head(&self.json),
        }
    }
}

/// The head of `json` as `serde_json` reads it (the rest of the text skipped,
/// not built).
pub(crate) fn parsed_head(json: &str) -> Result<RecordHead<'_>, SoulError> {
    let raw: RawHead<'_> = serde_json::from_str(json)
        .map_err(|e| store_refusal(format!("not an evidence record: {e}")))?;
    let p = raw.payload;
    let (kind, tool_id, begin_id, status) = match p.event.0.as_ref() {
        "begin" => ("begin", p.tool_id.map(|t| t.0), None, None),
        "end" => {
            let missing = |f: &str| store_refusal(format!("an End without `payload.{f}`"));
            let begin_id = p.begin_id.ok_or_else(|| missing("begin_id"))?;
            let status = p.status.ok_or_else(|| missing("status"))?;
            ("end", None, Some(begin_id.0), Some(status))
        }
        "denied" => ("denied", p.tool.map(|t| t.0), None, None),
        "conversation" => ("conversation", None, None, None),
        other => {
            return Err(store_refusal(format!(
                "unknown evidence event `{other}` in `payload.event`"
            )));
        }
    };
    if kind == "begin" && tool_id.is_none() {
        return Err(store_refusal("a Begin without `payload.tool_id`"));
    }
    Ok(RecordHead {
        id: raw.id.0,
        at_ms: raw.at,
        tenant: raw.tenant.0,
        kind,
        call_id: p.call_id.0,
        tool_id,
        begin_id,
        status,
    })
}

/// The indexed fields of an evidence record, borrowed from its text where it
/// holds them unescaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHead<'a> {
    /// The envelope id.
    pub id: Cow<'a, str>,
    /// The envelope's time, Unix milliseconds.
    pub at_ms: i64,
    /// The tenant.
    pub tenant: Cow<'a, str>,
    /// `begin`, `end`, `denied` or `conversation`.
    pub kind: &'static str,
    /// The call the record belongs to.
    pub call_id: Cow<'a, str>,
    /// The tool: a Begin's tool id, a Denial's requested tool; none for an End.
    pub tool_id: Option<Cow<'a, str>>,
    /// The Begin an End closes.
    pub begin_id: Option<Cow<'a, str>>,
    /// How an End's call ended.
    pub status: Option<EndStatus>,
}

/// The top level of a record's text, other fields skipped.
#[derive(Deserialize)]
struct RawHead<'a> {
    #[serde(borrow)]
    id: Text<'a>,
    #[serde(borrow)]
    tenant: Text<'a>,
    at: i64,
    #[serde(borrow)]
    payload: RawPayload<'a>,
}

/// The payload's fields of every kind of event, other fields skipped (an
/// internally tagged enum would buffer the whole payload first).
#[derive(Deserialize)]
struct RawPayload<'a> {
    #[serde(borrow)]
    event: Text<'a>,
    /// A conversation event's id is its call id.
    #[serde(borrow, alias = "conversation_id")]
    call_id: Text<'a>,
    #[serde(borrow, default)]
    tool_id: Option<Text<'a>>,
    #[serde(borrow, default)]
    tool: Option<Text<'a>>,
    #[serde(borrow, default)]
    begin_id: Option<Text<'a>>,
    #[serde(default)]
    status: Option<EndStatus>,
}

/// A string borrowed from the text when it needs no unescaping, owned otherwise.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use soulbase_errors::ErrorCode;
    use soulbase_types::{CallId, EnvelopeId};

    use super::*;
    use crate::{BudgetUsage, Denial, EvidenceEnd, EvidenceEvent, is_store_refusal};

    fn envelope(payload: EvidenceEvent) -> EvidenceRecord {
        crate::quick_head::tests::envelope(payload, false)
    }

    fn begin(tool: &str) -> EvidenceRecord {
        envelope(crate::quick_head::tests::begin(tool, true))
    }

    #[test]
    fn the_head_of_each_kind_matches_the_record() {
        let b = begin("demo.a.echo");
        let e = envelope(EvidenceEvent::End(EvidenceEnd {
            call_id: CallId::new("call-1").unwrap(),
            begin_id: b.id.clone(),
            status: EndStatus::Timeout,
            error_code: Some(ErrorCode::ProviderTimeout),
            output_digest: None,
            side_effects: Vec::new(),
            usage: BudgetUsage::default(),
            duration_us: 7,
            client_requests: Vec::new(),
        }));
        let d = envelope(EvidenceEvent::Denied(Denial {
            call_id: CallId::new("call-2").unwrap(),
            tool: "weird \"tool\"\n".into(),
            code: ErrorCode::AuthForbidden,
        }));

        let enc = EncodedRecord::encode(&b).unwrap();
        let h = enc.head().unwrap();
        assert_eq!(h.id, b.id.as_str());
        assert!(
            matches!(h.id, Cow::Borrowed(_)),
            "an unescaped id is borrowed"
        );
        assert_eq!(
            (h.at_ms, h.tenant.as_ref(), h.kind),
            (b.at.0, "acme", "begin")
        );
        assert_eq!(h.call_id, "call-1");
        assert_eq!(h.tool_id.as_deref(), Some("demo.a.echo"));
        assert_eq!((h.begin_id, h.status), (None, None));
        assert_eq!(enc.decode().unwrap(), b);

        let enc = EncodedRecord::encode(&e).unwrap();
        let h = enc.head().unwrap();
        assert_eq!((h.kind, h.tool_id.as_deref()), ("end", None));
        assert_eq!(h.begin_id.as_deref(), Some(b.id.as_str()));
        assert_eq!(h.status, Some(EndStatus::Timeout));

        // An escaped string is unescaped (owned), not cut at the escape.
        let enc = EncodedRecord::encode(&d).unwrap();
        let h = enc.head().unwrap();
        assert_eq!((h.kind, h.call_id.as_ref()), ("denied", "call-2"));
        assert_eq!(h.tool_id.as_deref(), Some("weird \"tool\"\n"));
        assert_eq!(enc.decode().unwrap(), d);
        let _ = EnvelopeId::new(h.id.as_ref()).unwrap();
    }

    #[test]
    fn text_that_is_not_a_record_is_refused_naming_what_is_wrong() {
        let record = serde_json::to_value(begin("demo.a.echo")).unwrap();
        let mut no_payload = record.clone();
        no_payload.as_object_mut().unwrap().remove("payload");
        let mut unknown_event = record.clone();
        unknown_event["payload"]["event"] = "maybe".into();
        let mut end_without_begin = record.clone();
        end_without_begin["payload"] = serde_json::json!({
            "event": "end", "call_id": "c", "status": "ok",
            "usage": BudgetUsage::default(), "duration_us": 1,
        });
        let cases = [
            ("not json".to_owned(), "not an evidence record"),
            (no_payload.to_string(), "payload"),
            (unknown_event.to_string(), "maybe"),
            (end_without_begin.to_string(), "begin_id"),
        ];
        for (text, why) in cases {
            let unchecked = EncodedRecord::from_json(text.clone());
            for e in [
                unchecked.head().unwrap_err(),
                unchecked.check().unwrap_err(),
                unchecked.decode().unwrap_err(),
            ] {
                assert!(is_store_refusal(&e), "{text}: {e}");
                let reason = e.field("reason").unwrap_or_default();
                assert!(reason.contains(why), "{text}: {reason}");
            }
            let (e, back) = EncodedRecord::verified(text.clone()).unwrap_err();
            assert!(is_store_refusal(&e));
            assert_eq!(back, unchecked, "the text comes back, unchecked");
        }
    }

    #[test]
    fn only_text_that_decodes_whole_is_taken_even_when_its_head_reads() {
        // The indexed fields are all there, the rest is not a record (no actor):
        // a store must not keep what it could not read back.
        let mut headless = serde_json::to_value(begin("demo.a.echo")).unwrap();
        headless.as_object_mut().unwrap().remove("actor");
        let e = EncodedRecord::from_json(headless.to_string())
            .head()
            .unwrap_err();
        assert!(is_store_refusal(&e), "{e}");
        assert!(
            e.field("reason").unwrap_or_default().contains("actor"),
            "{e}"
        );

        let good = serde_json::to_string(&begin("demo.a.echo")).unwrap();
        let unchecked = EncodedRecord::from_json(good.clone());
        unchecked.check().unwrap();
        assert_eq!(unchecked.head().unwrap().kind, "begin");
        let verified = EncodedRecord::verified(good).unwrap();
        // Known to be a record, and the very text encoding it gives.
        let again = EncodedRecord::encode(&verified.decode().unwrap()).unwrap();
        assert_eq!(verified, again);
    }
}
