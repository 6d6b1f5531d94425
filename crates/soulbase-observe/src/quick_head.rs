//! The indexed fields of a record known to be one, read by a scan that stops as
//! soon as it has them.
//!
//! A store reads a [`RecordHead`] of every record it takes. Through `serde_json`
//! that parses the whole text — its digests, usage and side effects — which
//! cost ~7,900 instructions a record, 7 % of a governed HTTP call's, Begin and
//! End together (`xtask/call_instructions.py`, docs/performance.md); this scan
//! ~2,800. The fields a store
//! indexes come first: the envelope's `id`, `tenant` and `at` before its
//! `payload` (the last field), and in the payload its `event`, `call_id` and the
//! kind's `tool_id`, `tool` or `begin_id` and `status` before anything long. This
//! scan reads them and leaves the rest unread.
//!
//! It only speeds up the common case and never decides anything: on any text it
//! does not expect — a string with an escape, a number it does not read, a field
//! missing, JSON it cannot follow — it gives up (`None`) and the caller parses
//! with `serde_json`, whose answer (or error) stands. It runs only on text known
//! to be a record (encoded by this process, or decoded whole once), so what it
//! returns is what `serde_json` would read there: such text holds no duplicate
//! field and is valid JSON.

use std::borrow::Cow;

use memchr::memchr2;

use crate::{EndStatus, RecordHead};

/// The head of `json`, or `None` when the scan cannot tell (the caller parses).
pub(crate) fn quick_head(json: &str) -> Option<RecordHead<'_>> {
    let mut s = Scan { text: json, at: 0 };
    let (mut id, mut tenant, mut at_ms) = (None, None, None);
    s.expect(b'{')?;
    loop {
        match s.key()? {
            "id" => id = Some(s.string()?),
            "tenant" => tenant = Some(s.string()?),
            "at" => at_ms = Some(s.integer()?),
            // The last field: the scan ends in it, so what it has not read by
            // then is left to the parser.
            "payload" => {
                let p = s.payload()?;
                return Some(RecordHead {
                    id: Cow::Borrowed(id?),
                    at_ms: at_ms?,
                    tenant: Cow::Borrowed(tenant?),
                    kind: p.kind,
                    call_id: Cow::Borrowed(p.call_id),
                    tool_id: p.tool_id.map(Cow::Borrowed),
                    begin_id: p.begin_id.map(Cow::Borrowed),
                    status: p.status,
                });
            }
            _ => s.skip_value()?,
        }
        if !s.next_member()? {
            return None;
        }
    }
}

/// The payload's indexed fields.
struct Payload<'a> {
    kind: &'static str,
    call_id: &'a str,
    tool_id: Option<&'a str>,
    begin_id: Option<&'a str>,
    status: Option<EndStatus>,
}

/// A position in JSON text.
struct Scan<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        self.skip_space();
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// A string without escapes, borrowed; `None` at an escape.
    fn string(&mut self) -> Option<&'a str> {
        self.expect(b'"')?;
        let start = self.at;
        let len = memchr2(b'"', b'\\', self.text.as_bytes().get(start..)?)?;
        if self.text.as_bytes()[start + len] != b'"' {
            return None;
        }
        self.at = start + len + 1;
        self.text.get(start..start + len)
    }

    /// An object member's key and its colon.
    fn key(&mut self) -> Option<&'a str> {
        let key = self.string()?;
        self.expect(b':')?;
        Some(key)
    }

    /// After a member: `true` at a comma (another member follows), `false` at the
    /// object's end.
    fn next_member(&mut self) -> Option<bool> {
        self.skip_space();
        match self.peek()? {
            b',' => {
                self.at += 1;
                Some(true)
            }
            b'}' => {
                self.at += 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// An integer as `serde_json` reads one into an `i64`: digits, a leading
    /// minus; no fraction or exponent.
    fn integer(&mut self) -> Option<i64> {
        self.skip_space();
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        let digits = self.at;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
        if self.at == digits || matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        self.text.get(start..self.at)?.parse().ok()
    }

    /// The rest of a string whose opening quote was read, escapes included.
    fn skip_string_rest(&mut self) -> Option<()> {
        loop {
            let rest = self.text.as_bytes().get(self.at..)?;
            let n = memchr2(b'"', b'\\', rest)?;
            // Past the quote, or past the backslash and the byte it escapes
            // (a `\u` escape's hex digits are never a quote or a backslash).
            self.at += n + if rest[n] == b'"' { 1 } else { 2 };
            if rest[n] == b'"' {
                return Some(());
            }
        }
    }

    /// Any value, unread: a string (escapes included), an object or array with
    /// whatever it holds, a number or a literal.
    fn skip_value(&mut self) -> Option<()> {
        self.skip_space();
        match self.peek()? {
            b'"' => {
                self.at += 1;
                self.skip_string_rest()
            }
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match self.peek()? {
                        b'"' => {
                            self.at += 1;
                            self.skip_string_rest()?;
                        }
                        b'{' | b'[' => {
                            depth += 1;
                            self.at += 1;
                        }
                        b'}' | b']' => {
                            depth = depth.checked_sub(1)?;
                            self.at += 1;
                            if depth == 0 {
                                return Some(());
                            }
                        }
                        _ => self.at += 1,
                    }
                }
            }
            _ => {
                let start = self.at;
                while !matches!(
                    self.peek(),
                    None | Some(b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t')
                ) {
                    self.at += 1;
                }
                (self.at > start).then_some(())
            }
        }
    }

    /// The payload object's indexed fields, the rest of it unread; the scan ends
    /// inside it (the payload is the envelope's last field).
    fn payload(&mut self) -> Option<Payload<'a>> {
        self.expect(b'{')?;
        let (mut event, mut call_id, mut tool_id, mut tool, mut begin_id, mut status) =
            (None, None, None, None, None, None);
        loop {
            match self.key()? {
                "event" => event = Some(self.string()?),
                "call_id" | "conversation_id" => call_id = Some(self.string()?),
                "tool_id" => tool_id = Some(self.string()?),
                "tool" => tool = Some(self.string()?),
                "begin_id" => begin_id = Some(self.string()?),
                "status" => status = Some(EndStatus::from_name(self.string()?)?),
                _ => self.skip_value()?,
            }
            let done = match (event, call_id) {
                (Some("begin"), Some(call_id)) => tool_id.map(|t| Payload {
                    kind: "begin",
                    call_id,
                    tool_id: Some(t),
                    begin_id: None,
                    status: None,
                }),
                (Some("end"), Some(call_id)) => begin_id.zip(status).map(|(b, st)| Payload {
                    kind: "end",
                    call_id,
                    tool_id: None,
                    begin_id: Some(b),
                    status: Some(st),
                }),
                (Some("denied"), Some(call_id)) => tool.map(|t| Payload {
                    kind: "denied",
                    call_id,
                    tool_id: Some(t),
                    begin_id: None,
                    status: None,
                }),
                (Some("conversation"), Some(call_id)) => Some(Payload {
                    kind: "conversation",
                    call_id,
                    tool_id: None,
                    begin_id: None,
                    status: None,
                }),
                _ => None,
            };
            if done.is_some() {
                return done;
            }
            if !self.next_member()? {
                return None;
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use soulbase_errors::ErrorCode;
    use soulbase_types::{
        ActorId, CallId, Envelope, Origin, Surface, TenantId, ToolId, TraceContext, UnixMillis,
    };

    use super::*;
    use crate::encoded::parsed_head;
    use crate::{
        BudgetUsage, ClientRequestKind, ClientRequestRecord, ConsentUsed, ConversationEnd,
        ConversationEvent, ConversationRef, ConversationStep, Denial, EncodedRecord, EvidenceBegin,
        EvidenceEnd, EvidenceEvent, EvidenceRecord, SideEffectRecord, TurnCall,
    };

    /// A record of `payload` from a fixed tenant, actor and time; `traced` adds a
    /// trace context.
    pub(crate) fn envelope(payload: EvidenceEvent, traced: bool) -> EvidenceRecord {
        let mut r = Envelope::new(
            TenantId::new("acme").unwrap(),
            ActorId::new("alice").unwrap(),
            Origin::Llm,
            payload,
        );
        r.at = UnixMillis(1_790_000_000_123);
        if traced {
            r.trace = TraceContext::new([7; 16], [9; 8], true);
        }
        r
    }

    /// A Begin of `tool`; `full` sets every optional field (an idempotency key
    /// with characters JSON escapes among them).
    pub(crate) fn begin(tool: &str, full: bool) -> EvidenceEvent {
        EvidenceEvent::Begin(EvidenceBegin {
            call_id: CallId::new("call-1").unwrap(),
            tool_id: ToolId::new(tool).unwrap(),
            tool_version: "1.0.0".into(),
            manifest_digest: "sha256:m".into(),
            profile_hash: "sha256:p".into(),
            policy_hash: "sha256:q".into(),
            config_hash: "sha256:c".into(),
            args_digest: "sha256:a".into(),
            idempotency_key: full.then(|| "key \"quoted\" \\ {[,".into()),
            calling_skill: full.then(|| "skill.x".into()),
            consent: full.then(|| ConsentUsed {
                token_id: Some("tok".into()),
                token_digest: "sha256:t".into(),
                issued_at: Some(-5),
                expires_at: 1_790_000_000_999,
                args_bound: true,
            }),
            conversation: full.then(|| {
                Box::new(ConversationRef {
                    id: "conv_1".into(),
                    iteration: 2,
                })
            }),
            surface: full.then_some(Surface::Mcp),
        })
    }

    fn end(status: EndStatus, full: bool) -> EvidenceEvent {
        EvidenceEvent::End(EvidenceEnd {
            call_id: CallId::new("call-1").unwrap(),
            begin_id: soulbase_types::EnvelopeId::generate(),
            status,
            error_code: full.then_some(ErrorCode::ProviderTimeout),
            output_digest: full.then(|| "sha256:o".into()),
            side_effects: if full {
                vec![SideEffectRecord {
                    kind: "fs.write".into(),
                    target: "/tmp/\"x\"".into(),
                }]
            } else {
                Vec::new()
            },
            usage: BudgetUsage::default(),
            duration_us: 7,
            client_requests: if full {
                vec![ClientRequestRecord {
                    kind: ClientRequestKind::Sampling,
                    request_digest: "sha256:r".into(),
                    outcome: "answered".into(),
                    response_digest: None,
                    response_bytes: 12,
                    model: Some("m".into()),
                    error_code: None,
                }]
            } else {
                Vec::new()
            },
        })
    }

    fn conversation(step: ConversationStep) -> EvidenceEvent {
        EvidenceEvent::Conversation(Box::new(ConversationEvent {
            conversation_id: CallId::new("conv_1").unwrap(),
            step,
        }))
    }

    /// Records of every kind, with their optional fields absent and present.
    pub(crate) fn records() -> Vec<EvidenceRecord> {
        let mut events = vec![
            begin("demo.a.echo", false),
            begin("demo.a.echo", true),
            EvidenceEvent::Denied(Denial {
                call_id: CallId::new("call-2").unwrap(),
                tool: "demo.missing".into(),
                code: ErrorCode::AuthForbidden,
            }),
            conversation(ConversationStep::Start {
                model: "m".into(),
                messages: 1,
                messages_digest: "sha256:d".into(),
                max_iterations: 4,
                tools_offered: 2,
            }),
            conversation(ConversationStep::Turn {
                iteration: 1,
                response_digest: "sha256:r".into(),
                tokens: None,
                tool_calls: vec![TurnCall {
                    id: "t1".into(),
                    tool: "demo.a.echo".into(),
                    call_id: None,
                    code: None,
                }],
            }),
            conversation(ConversationStep::End {
                reason: ConversationEnd::Answered,
                iterations: 1,
                tool_calls: 1,
                tokens: 0,
                error_code: None,
            }),
        ];
        for status in [
            EndStatus::Ok,
            EndStatus::Error,
            EndStatus::Timeout,
            EndStatus::Cancelled,
            EndStatus::Aborted,
        ] {
            events.push(end(status, false));
            events.push(end(status, true));
        }
        events
            .into_iter()
            .flat_map(|e| [envelope(e.clone(), false), envelope(e, true)])
            .collect()
    }

    #[test]
    fn the_scan_reads_what_the_parser_reads_from_every_kind_of_record() {
        for record in records() {
            for text in [
                EncodedRecord::encode(&record).unwrap().as_str().to_owned(),
                serde_json::to_string_pretty(&record).unwrap(),
            ] {
                let quick = quick_head(&text).unwrap_or_else(|| panic!("not scanned: {text}"));
                assert_eq!(quick, parsed_head(&text).unwrap(), "{text}");
                assert!(
                    matches!(quick.id, Cow::Borrowed(_)),
                    "borrowed from the text"
                );
            }
        }
    }

    #[test]
    fn what_the_scan_does_not_expect_is_left_to_the_parser() {
        // An escape in an indexed field: the parser unescapes it.
        let denied = envelope(
            EvidenceEvent::Denied(Denial {
                call_id: CallId::new("call-2").unwrap(),
                tool: "weird \"tool\"\n".into(),
                code: ErrorCode::AuthForbidden,
            }),
            false,
        );
        let text = serde_json::to_string(&denied).unwrap();
        assert!(quick_head(&text).is_none());
        let encoded = EncodedRecord::encode(&denied).unwrap();
        assert_eq!(
            encoded.head().unwrap().tool_id.as_deref(),
            Some("weird \"tool\"\n")
        );

        // The payload before the envelope's other fields (keys in another order).
        let v = serde_json::to_value(envelope(begin("demo.a.echo", true), true)).unwrap();
        let reordered = format!(
            "{{\"payload\":{},\"id\":{},\"tenant\":{},\"actor\":{},\"origin\":{},\"trace\":{},\"at\":{}}}",
            v["payload"], v["id"], v["tenant"], v["actor"], v["origin"], v["trace"], v["at"]
        );
        assert!(quick_head(&reordered).is_none());
        assert_eq!(parsed_head(&reordered).unwrap().kind, "begin");

        // A time that is not an integer, an unknown status, an unknown event.
        let text = EncodedRecord::encode(&envelope(end(EndStatus::Ok, false), false))
            .unwrap()
            .as_str()
            .to_owned();
        for (from, to) in [
            ("\"at\":1790000000123", "\"at\":1790000000123.0"),
            ("\"status\":\"ok\"", "\"status\":\"fine\""),
            ("\"event\":\"end\"", "\"event\":\"maybe\""),
        ] {
            assert!(text.contains(from), "{text}");
            assert!(quick_head(&text.replace(from, to)).is_none(), "{to}");
        }
    }

    #[test]
    fn no_prefix_of_a_record_makes_the_scan_panic_or_read_a_field_wrong() {
        for record in records() {
            let text = EncodedRecord::encode(&record).unwrap().as_str().to_owned();
            let whole = quick_head(&text).unwrap();
            for cut in (0..text.len()).filter(|&i| text.is_char_boundary(i)) {
                // A prefix holding all the indexed fields reads them; none reads
                // anything else.
                if let Some(head) = quick_head(&text[..cut]) {
                    assert_eq!(head, whole, "{}", &text[..cut]);
                }
            }
        }
    }
}
