//! The worker's stdout protocol: one JSON object per line (NDJSON).
//!
//! A worker writes `{"progress": 0.5, "message": "..."}`, `{"log": "..."}` and finally
//! `{"done": true}`, each optionally carrying `"v": 1`. Whatever else appears on stdout becomes
//! a [`WorkerEvent::Error`] for the caller to see; it never crashes or stalls the host. The host
//! re-emits events in its own tagged form ([`WorkerEvent::to_ndjson`]).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Version of the event schema this host speaks. Lines carrying another `"v"` are rejected.
pub const PROTOCOL_VERSION: u32 = 1;

/// Longest line (without its newline) the host parses; longer lines become one error event.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// How much of an offending line an error event quotes.
pub const EXCERPT_BYTES: usize = 256;

/// One event from a worker, as the host understands and re-emits it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum WorkerEvent {
    /// The worker is `fraction` (0..=1) of the way through.
    Progress {
        fraction: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// Free-form diagnostic text.
    Log { message: String },
    /// The worker finished its job; its `out/` is ready to ingest.
    Done,
    /// A stdout line that is not a valid event: `line` quotes (at most [`EXCERPT_BYTES`] of) it.
    Error { line: String, reason: String },
}

impl WorkerEvent {
    /// The event as one line of the host's NDJSON output, newline included.
    pub fn to_ndjson(&self) -> String {
        let mut value = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(fields) = &mut value {
            fields.insert("v".into(), Value::from(PROTOCOL_VERSION));
        }
        let mut line = value.to_string();
        line.push('\n');
        line
    }

    pub fn is_done(&self) -> bool {
        matches!(self, Self::Done)
    }
}

/// Parses one stdout line (without its newline). Never panics: anything that is not a valid
/// v1 event comes back as [`WorkerEvent::Error`].
pub fn parse_line(line: &[u8]) -> WorkerEvent {
    if line.len() > MAX_LINE_BYTES {
        return too_long(line);
    }
    decode_event(line).unwrap_or_else(|reason| WorkerEvent::Error {
        line: excerpt(line),
        reason,
    })
}

fn too_long(line: &[u8]) -> WorkerEvent {
    WorkerEvent::Error {
        line: excerpt(line),
        reason: format!("line longer than {MAX_LINE_BYTES} bytes"),
    }
}

fn excerpt(line: &[u8]) -> String {
    if line.len() <= EXCERPT_BYTES {
        return String::from_utf8_lossy(line).into_owned();
    }
    let mut quoted = String::from_utf8_lossy(&line[..EXCERPT_BYTES]).into_owned();
    quoted.push('…');
    quoted
}

fn decode_event(line: &[u8]) -> Result<WorkerEvent, String> {
    let text = std::str::from_utf8(line).map_err(|err| {
        format!(
            "line is not valid UTF-8 (bad byte at {})",
            err.valid_up_to()
        )
    })?;
    let value: Value =
        serde_json::from_str(text).map_err(|err| format!("line is not valid JSON: {err}"))?;
    let Value::Object(mut fields) = value else {
        return Err("line is not a JSON object".into());
    };
    check_version(fields.remove("v"))?;
    match event_kind(&fields)? {
        "progress" => decode_progress(fields),
        "log" => decode_log(fields),
        _ => decode_done(fields),
    }
}

fn check_version(version: Option<Value>) -> Result<(), String> {
    match version {
        None => Ok(()),
        Some(v) if v.as_u64() == Some(u64::from(PROTOCOL_VERSION)) => Ok(()),
        Some(v) => Err(format!(
            "unsupported protocol version {v}; this host speaks version {PROTOCOL_VERSION}"
        )),
    }
}

fn event_kind(fields: &Map<String, Value>) -> Result<&'static str, String> {
    let kinds: Vec<&'static str> = ["progress", "log", "done"]
        .into_iter()
        .filter(|kind| fields.contains_key(*kind))
        .collect();
    match kinds.as_slice() {
        [kind] => Ok(kind),
        [] => Err("object has none of the keys \"progress\", \"log\", \"done\"".into()),
        _ => Err(format!("object mixes event kinds {kinds:?}")),
    }
}

fn reject_other_keys(fields: &Map<String, Value>, allowed: &[&str]) -> Result<(), String> {
    match fields.keys().find(|key| !allowed.contains(&key.as_str())) {
        Some(key) => Err(format!("unknown key {key:?}")),
        None => Ok(()),
    }
}

fn decode_progress(fields: Map<String, Value>) -> Result<WorkerEvent, String> {
    reject_other_keys(&fields, &["progress", "message"])?;
    let fraction = fields
        .get("progress")
        .and_then(Value::as_f64)
        .ok_or("\"progress\" is not a number")?;
    if !fraction.is_finite() || !(0.0..=1.0).contains(&fraction) {
        return Err(format!("\"progress\" {fraction} is outside 0..=1"));
    }
    let message = match fields.get("message") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(_) => return Err("\"message\" is not a string".into()),
    };
    Ok(WorkerEvent::Progress { fraction, message })
}

fn decode_log(fields: Map<String, Value>) -> Result<WorkerEvent, String> {
    reject_other_keys(&fields, &["log"])?;
    match fields.get("log") {
        Some(Value::String(text)) => Ok(WorkerEvent::Log {
            message: text.clone(),
        }),
        _ => Err("\"log\" is not a string".into()),
    }
}

fn decode_done(fields: Map<String, Value>) -> Result<WorkerEvent, String> {
    reject_other_keys(&fields, &["done"])?;
    match fields.get("done") {
        Some(Value::Bool(true)) => Ok(WorkerEvent::Done),
        _ => Err("\"done\" must be true".into()),
    }
}

/// Turns a worker's stdout, read in arbitrary chunks, into events.
///
/// At most [`MAX_LINE_BYTES`] + 1 bytes of a partial line are buffered: a line that grows past
/// that is reported once as an error and the rest of it is discarded up to its newline. Blank
/// lines are ignored and a trailing `\r` is tolerated.
#[derive(Debug, Default)]
pub struct EventDecoder {
    partial: Vec<u8>,
    discarding_long_line: bool,
    done_seen: bool,
}

impl EventDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next chunk of stdout; returns the events completed by it.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<WorkerEvent> {
        let mut events = Vec::new();
        let mut lines = chunk.split(|&byte| byte == b'\n');
        let last = lines.next_back().unwrap_or_default();
        for complete in lines {
            self.buffer(complete, &mut events);
            self.end_line(&mut events);
        }
        self.buffer(last, &mut events);
        events
    }

    /// Flushes a final line that lacks its newline.
    pub fn finish(mut self) -> Vec<WorkerEvent> {
        let mut events = Vec::new();
        self.end_line(&mut events);
        events
    }

    /// Whether a `done` event has been decoded so far.
    pub fn done_seen(&self) -> bool {
        self.done_seen
    }

    fn buffer(&mut self, bytes: &[u8], events: &mut Vec<WorkerEvent>) {
        if self.discarding_long_line {
            return;
        }
        let room = MAX_LINE_BYTES + 1 - self.partial.len();
        self.partial
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
        if self.partial.len() > MAX_LINE_BYTES {
            events.push(too_long(&self.partial));
            self.partial.clear();
            self.discarding_long_line = true;
        }
    }

    fn end_line(&mut self, events: &mut Vec<WorkerEvent>) {
        if std::mem::take(&mut self.discarding_long_line) {
            return;
        }
        if !self.partial.iter().all(u8::is_ascii_whitespace) {
            let event = parse_line(self.partial.trim_ascii_end());
            self.done_seen |= event.is_done();
            events.push(event);
        }
        self.partial.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_reason(event: &WorkerEvent) -> &str {
        match event {
            WorkerEvent::Error { reason, .. } => reason,
            other => panic!("expected an error event, got {other:?}"),
        }
    }

    #[test]
    fn parses_the_three_event_kinds() {
        assert_eq!(
            parse_line(br#"{"progress": 0.5, "message": "half"}"#),
            WorkerEvent::Progress {
                fraction: 0.5,
                message: Some("half".into())
            }
        );
        assert_eq!(
            parse_line(br#"{"progress": 1}"#),
            WorkerEvent::Progress {
                fraction: 1.0,
                message: None
            }
        );
        assert_eq!(
            parse_line(br#"{"log": "hello"}"#),
            WorkerEvent::Log {
                message: "hello".into()
            }
        );
        assert_eq!(parse_line(br#"{"done": true}"#), WorkerEvent::Done);
    }

    #[test]
    fn accepts_version_one_and_rejects_others() {
        assert_eq!(parse_line(br#"{"v": 1, "done": true}"#), WorkerEvent::Done);
        for line in [
            &br#"{"v": 2, "done": true}"#[..],
            br#"{"v": "1", "done": true}"#,
            br#"{"v": 1.5, "done": true}"#,
            br#"{"v": 0, "done": true}"#,
        ] {
            let event = parse_line(line);
            assert!(
                error_reason(&event).contains("protocol version"),
                "{event:?}"
            );
        }
    }

    #[test]
    fn invalid_events_become_errors() {
        for line in [
            &br#"{"progress": 1.5}"#[..],
            br#"{"progress": -0.1}"#,
            br#"{"progress": 1e400}"#,
            br#"{"progress": "half"}"#,
            br#"{"progress": 0.5, "message": 3}"#,
            br#"{"progress": 0.5, "extra": 1}"#,
            br#"{"log": 1}"#,
            br#"{"done": false}"#,
            br#"{"done": true, "log": "x"}"#,
            br#"{}"#,
            br#"[1, 2]"#,
            b"\"just a string\"",
            b"hello world",
            b"{\"log\": \"unterminated",
            b"",
        ] {
            let event = parse_line(line);
            assert!(
                matches!(event, WorkerEvent::Error { .. }),
                "{:?} gave {event:?}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let line = "[".repeat(MAX_LINE_BYTES);
        assert!(matches!(
            parse_line(line.as_bytes()),
            WorkerEvent::Error { .. }
        ));
    }

    #[test]
    fn invalid_utf8_is_an_error_with_a_lossy_excerpt() {
        let event = parse_line(b"{\"log\": \"\xff\xfe\"}");
        assert!(error_reason(&event).contains("UTF-8"));
        let WorkerEvent::Error { line, .. } = event else {
            unreachable!()
        };
        assert!(line.contains('\u{FFFD}'));
    }

    #[test]
    fn huge_line_is_an_error_with_a_truncated_excerpt() {
        let line = format!(r#"{{"log": "{}"}}"#, "a".repeat(MAX_LINE_BYTES));
        let event = parse_line(line.as_bytes());
        assert!(error_reason(&event).contains("longer than"));
        let WorkerEvent::Error { line: quoted, .. } = event else {
            unreachable!()
        };
        assert!(quoted.len() <= EXCERPT_BYTES + '…'.len_utf8());
    }

    #[test]
    fn line_of_exactly_the_limit_is_parsed() {
        let padding = MAX_LINE_BYTES - r#"{"log": ""}"#.len();
        let line = format!(r#"{{"log": "{}"}}"#, "a".repeat(padding));
        assert_eq!(line.len(), MAX_LINE_BYTES);
        assert!(matches!(
            parse_line(line.as_bytes()),
            WorkerEvent::Log { .. }
        ));
        let mut decoder = EventDecoder::new();
        let mut events = decoder.feed(line.as_bytes());
        events.extend(decoder.feed(b"\n"));
        assert!(matches!(events.as_slice(), [WorkerEvent::Log { .. }]));
    }

    fn sample_stream() -> Vec<u8> {
        let mut stream = Vec::new();
        stream.extend_from_slice(b"{\"progress\": 0.25, \"message\": \"caf\xc3\xa9\"}\n");
        stream.extend_from_slice(b"\n   \n");
        stream.extend_from_slice(b"{\"log\": \"windows line\"}\r\n");
        stream.extend_from_slice(b"garbage \xff\xfe here\n");
        stream.extend_from_slice(b"{\"log\": \"");
        stream.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 10));
        stream.extend_from_slice(b"\"}\n");
        stream.extend_from_slice(b"{\"v\": 1, \"progress\": 1}\n");
        stream.extend_from_slice(b"{\"done\": true}");
        stream
    }

    fn decode_in_chunks(stream: &[u8], cuts: &[usize]) -> Vec<WorkerEvent> {
        let mut decoder = EventDecoder::new();
        let mut events = Vec::new();
        let mut start = 0;
        for &cut in cuts {
            events.extend(decoder.feed(&stream[start..cut]));
            start = cut;
        }
        events.extend(decoder.feed(&stream[start..]));
        events.extend(decoder.finish());
        events
    }

    #[test]
    fn decoder_yields_expected_events_for_the_sample() {
        let events = decode_in_chunks(&sample_stream(), &[]);
        assert_eq!(events.len(), 6, "{events:?}");
        assert_eq!(
            events[0],
            WorkerEvent::Progress {
                fraction: 0.25,
                message: Some("café".into())
            }
        );
        assert_eq!(
            events[1],
            WorkerEvent::Log {
                message: "windows line".into()
            }
        );
        assert!(error_reason(&events[2]).contains("UTF-8"));
        assert!(error_reason(&events[3]).contains("longer than"));
        assert!(matches!(events[4], WorkerEvent::Progress { fraction, .. } if fraction == 1.0));
        assert_eq!(events[5], WorkerEvent::Done);
    }

    #[test]
    fn any_single_split_point_gives_the_same_events() {
        let stream = sample_stream();
        let expected = decode_in_chunks(&stream, &[]);
        let step = 97; // every byte would be slow in debug builds; 97 is coprime with the layout
        for cut in (0..=stream.len()).step_by(step).chain(0..64) {
            assert_eq!(decode_in_chunks(&stream, &[cut]), expected, "cut at {cut}");
        }
    }

    #[test]
    fn random_chunkings_give_the_same_events() {
        let stream = sample_stream();
        let expected = decode_in_chunks(&stream, &[]);
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..200 {
            let mut cuts = Vec::new();
            let mut at = 0;
            loop {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                at += (state % 4096) as usize;
                if at >= stream.len() {
                    break;
                }
                cuts.push(at);
            }
            assert_eq!(decode_in_chunks(&stream, &cuts), expected);
        }
    }

    #[test]
    fn byte_at_a_time_gives_the_same_events() {
        let stream = b"{\"progress\": 0.5}\nnot json\n{\"done\": true}\n";
        let cuts: Vec<usize> = (1..stream.len()).collect();
        let events = decode_in_chunks(stream, &cuts);
        assert_eq!(events, decode_in_chunks(stream, &[]));
        assert_eq!(events.len(), 3);
    }

    #[test]
    fn decoder_bounds_its_buffer_on_an_endless_line() {
        let mut decoder = EventDecoder::new();
        let chunk = vec![b'a'; 1 << 20];
        let mut events = Vec::new();
        for _ in 0..8 {
            events.extend(decoder.feed(&chunk));
            assert!(decoder.partial.capacity() <= 2 * (MAX_LINE_BYTES + 1));
        }
        assert_eq!(events.len(), 1, "one error for the whole long line");
        assert!(decoder.feed(b"\n{\"done\": true}\n")[0].is_done());
    }

    #[test]
    fn done_detection() {
        let mut decoder = EventDecoder::new();
        decoder.feed(b"{\"progress\": 0.1}\n{\"done\": tr");
        assert!(!decoder.done_seen());
        decoder.feed(b"ue}\n");
        assert!(decoder.done_seen());

        let mut unterminated = EventDecoder::new();
        assert!(unterminated.feed(b"{\"done\": true}").is_empty());
        assert_eq!(unterminated.finish(), vec![WorkerEvent::Done]);
    }

    #[test]
    fn host_ndjson_round_trips_and_carries_the_version() {
        let events = [
            WorkerEvent::Progress {
                fraction: 0.5,
                message: None,
            },
            WorkerEvent::Progress {
                fraction: 0.75,
                message: Some("m".into()),
            },
            WorkerEvent::Log {
                message: "a\nb".into(),
            },
            WorkerEvent::Done,
            WorkerEvent::Error {
                line: "x".into(),
                reason: "y".into(),
            },
        ];
        for event in events {
            let line = event.to_ndjson();
            assert!(line.ends_with('\n') && !line.trim_end().contains('\n'));
            let value: Value = serde_json::from_str(&line).unwrap();
            assert_eq!(value["v"], Value::from(PROTOCOL_VERSION));
            assert_eq!(serde_json::from_str::<WorkerEvent>(&line).unwrap(), event);
        }
        assert_eq!(
            WorkerEvent::Done.to_ndjson(),
            "{\"event\":\"done\",\"v\":1}\n"
        );
    }
}
