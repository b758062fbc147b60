//! Syslog messages into events, as Flume's `SyslogUtils` makes them, and the framing of
//! syslog over TCP.
//!
//! # Messages
//!
//! ```text
//! RFC 5424  <PRI>VERSION SP TIMESTAMP SP HOSTNAME SP rest     <165>1 2003-10-11T22:14:15.003Z mymachine.example.com su - ID47 - hi
//! RFC 3164  <PRI>Mmm dd hh:mm:ss SP HOSTNAME SP rest          <34>Oct 11 22:14:15 mymachine su: hi
//! ```
//!
//! (`VERSION` may be absent before an RFC 3339 timestamp, as rsyslog writes it.) Headers:
//! `Facility` and `Severity` (PRI / 8 and PRI % 8), `priority` and `version` as written,
//! `timestamp` in epoch milliseconds, `host`. The body is `rest`, after the fields named by
//! `keep_fields` written back in front of it, or the whole message with `keep_fields: all`.
//!
//! - A PRI that is missing or not 1 to 3 digits makes the message **invalid**: `Facility` and
//!   `Severity` are `0`, `flume.syslog.status` is `Invalid` and the body the whole message.
//! - A valid PRI with a header that fits neither format gives `Facility` and `Severity` only,
//!   and the whole message as the body (as Flume).
//! - A message longer than `event_size` bytes is cut there: that event has
//!   `flume.syslog.status: Incomplete`; the bytes after the cut make the next message (which,
//!   without a PRI, is invalid). Nothing read is dropped.
//! - An RFC 3164 timestamp has no year: it gets the one that puts it between 11 months before
//!   and 1 month after now (as Flume). RFC 3164 times, and RFC 5424 times without an offset,
//!   are read as UTC (Flume reads them in the JVM's time zone).
//!
//! # Framing over TCP (RFC 6587)
//!
//! Each message is either **octet-counted** (`LEN SP MSG`: starts with a digit) or ends with
//! `\n` (**non-transparent framing**; a `\r` before it is removed), decided per message by its
//! first byte, as rsyslog does; the two may be mixed on one connection. Empty lines between
//! messages are skipped.

use bytes::{Buf, Bytes, BytesMut};
use ferry_core::{Event, Headers};

use crate::datetime::{DateTime, month_of_name, now_millis, year_month_of};
use crate::interceptors::regex_extractor::parse_offset;

/// The header telling an invalid or cut message, as Flume's.
pub(crate) const STATUS_HEADER: &str = "flume.syslog.status";

/// Which header fields are written back in front of the body. Flume: `keepFields`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeepFields {
    /// The whole message is the body.
    pub(crate) all: bool,
    pub(crate) priority: bool,
    pub(crate) version: bool,
    pub(crate) timestamp: bool,
    pub(crate) hostname: bool,
}

impl KeepFields {
    pub(crate) const ALL: KeepFields = KeepFields {
        all: true,
        priority: false,
        version: false,
        timestamp: false,
        hostname: false,
    };

    /// Reads Flume's forms: `none`/`false`, `all`/`true`, or a list of `priority`,
    /// `version`, `timestamp`, `hostname` separated by spaces or commas.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim().to_ascii_lowercase();
        match text.as_str() {
            "none" | "false" | "" => return Ok(Self::default()),
            "all" | "true" => return Ok(Self::ALL),
            _ => {}
        }
        let mut keep = Self::default();
        for field in text.split([' ', ',']).filter(|f| !f.is_empty()) {
            match field {
                "priority" => keep.priority = true,
                "version" => keep.version = true,
                "timestamp" => keep.timestamp = true,
                "hostname" => keep.hostname = true,
                other => {
                    return Err(ferry_core::config::unknown_name_message(
                        "field",
                        other,
                        [
                            "all",
                            "none",
                            "priority",
                            "version",
                            "timestamp",
                            "hostname",
                        ],
                    ));
                }
            }
        }
        Ok(keep)
    }
}

/// The header fields of a message that fits a format, as byte ranges of it.
struct Parsed<'a> {
    priority: &'a str,
    version: Option<&'a str>,
    /// As written (`-` for RFC 5424's none) and in epoch milliseconds, if it could be read.
    timestamp: (&'a str, Option<i64>),
    hostname: Option<&'a str>,
    rest: &'a [u8],
}

/// The event of one message. `cut`: the message was cut at `event_size`.
pub(crate) fn event_of(message: &[u8], cut: bool, keep: KeepFields) -> Event {
    event_at(message, cut, keep, now_millis())
}

fn event_at(message: &[u8], cut: bool, keep: KeepFields, now: i64) -> Event {
    let mut headers = Headers::new();
    let Some((pri, after_pri)) = priority(message) else {
        headers.insert("Facility".into(), "0".into());
        headers.insert("Severity".into(), "0".into());
        headers.insert(STATUS_HEADER.into(), "Invalid".into());
        return Event::new(headers, Bytes::copy_from_slice(message));
    };
    let value: u32 = pri.parse().unwrap_or(0);
    headers.set("Facility", (value / 8).to_string());
    headers.set("Severity", (value % 8).to_string());
    if cut {
        headers.insert(STATUS_HEADER.into(), "Incomplete".into());
    }
    let parsed = rfc5424(pri, after_pri).or_else(|| rfc3164(pri, after_pri, now));
    let Some(parsed) = parsed else {
        return Event::new(headers, Bytes::copy_from_slice(message));
    };
    headers.set("priority", parsed.priority.to_owned());
    if let Some(version) = parsed.version {
        headers.set("version", version.to_owned());
    }
    if let Some(millis) = parsed.timestamp.1 {
        headers.set("timestamp", millis.to_string());
    }
    if let Some(host) = parsed.hostname {
        headers.set("host", host.to_owned());
    }
    let body = if keep.all {
        Bytes::copy_from_slice(message)
    } else if keep == KeepFields::default() {
        Bytes::copy_from_slice(parsed.rest)
    } else {
        let mut body = Vec::with_capacity(message.len());
        if keep.priority {
            body.extend_from_slice(format!("<{}>", parsed.priority).as_bytes());
        }
        if keep.version
            && let Some(version) = parsed.version
        {
            body.extend_from_slice(version.as_bytes());
            body.push(b' ');
        }
        if keep.timestamp {
            body.extend_from_slice(parsed.timestamp.0.as_bytes());
            body.push(b' ');
        }
        if keep.hostname {
            body.extend_from_slice(parsed.hostname.unwrap_or("-").as_bytes());
            body.push(b' ');
        }
        body.extend_from_slice(parsed.rest);
        Bytes::from(body)
    };
    Event::new(headers, body)
}

/// `<PRI>`: 1 to 3 digits; the digits and what follows.
fn priority(message: &[u8]) -> Option<(&str, &[u8])> {
    let rest = message.strip_prefix(b"<")?;
    let end = rest.iter().take(4).position(|b| *b == b'>')?;
    let digits = &rest[..end];
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some((std::str::from_utf8(digits).ok()?, &rest[end + 1..]))
}

/// Splits `text` at its first space: the word before it (not empty) and what follows.
fn word(text: &[u8]) -> Option<(&str, &[u8])> {
    let end = text.iter().position(|b| *b == b' ')?;
    let word = std::str::from_utf8(&text[..end]).ok()?;
    (!word.is_empty()).then_some((word, &text[end + 1..]))
}

/// A host name as Flume accepts it: a letter, digit or `_` first, then those and `.@-`.
fn is_hostname(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_alphanumeric() || c == '_')
        && chars.all(|c| c.is_alphanumeric() || "_.@-:".contains(c))
}

fn rfc5424<'a>(priority: &'a str, text: &'a [u8]) -> Option<Parsed<'a>> {
    let (first, rest) = word(text)?;
    // A version (one digit in practice, up to 2 by RFC 5424) or directly a timestamp.
    let (version, (stamp, rest)) =
        if !first.is_empty() && first.len() <= 2 && first.bytes().all(|b| b.is_ascii_digit()) {
            (Some(first), word(rest)?)
        } else {
            (None, (first, rest))
        };
    let millis = if stamp == "-" {
        None
    } else {
        Some(rfc3339(stamp)?)
    };
    let (host, rest) = word(rest).or_else(|| {
        // A host name and nothing after it.
        std::str::from_utf8(rest).ok().map(|h| (h, &b""[..]))
    })?;
    let hostname = match host {
        "-" => None,
        h if is_hostname(h) => Some(h),
        _ => return None,
    };
    Some(Parsed {
        priority,
        version,
        timestamp: (stamp, millis),
        hostname,
        rest,
    })
}

/// `2003-10-11T22:14:15.003Z`, `2003-08-24T05:14:15.000003-07:00`: epoch milliseconds.
fn rfc3339(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let number = |range: std::ops::Range<usize>| -> Option<u32> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())
            .flatten()
    };
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let mut at = DateTime {
        year: i64::from(number(0..4)?),
        month: number(5..7)?,
        day: number(8..10)?,
        hour: number(11..13)?,
        minute: number(14..16)?,
        second: number(17..19)?,
        ..DateTime::default()
    };
    let mut rest = &text[19..];
    if let Some(fraction) = rest.strip_prefix('.') {
        let len = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if len == 0 || len > 9 {
            return None;
        }
        let digits = format!("{:0<3}", &fraction[..len]);
        at.millis = digits[..3].parse().ok()?;
        rest = &fraction[len..];
    }
    if !rest.is_empty() {
        let (offset, tail) = parse_offset(rest)?;
        if !tail.is_empty() {
            return None;
        }
        at.offset_seconds = offset;
    }
    at.epoch_millis()
}

fn rfc3164<'a>(priority: &'a str, text: &'a [u8], now: i64) -> Option<Parsed<'a>> {
    // `Mmm dd hh:mm:ss` with a day of one digit after two spaces (or one).
    let month_name = std::str::from_utf8(text.get(..3)?).ok()?;
    let month = month_of_name(month_name)?;
    let mut at = 3;
    if text.get(at) != Some(&b' ') {
        return None;
    }
    at += 1;
    if text.get(at) == Some(&b' ') {
        at += 1;
    }
    let day_len = text[at..]
        .iter()
        .take(2)
        .take_while(|b| b.is_ascii_digit())
        .count();
    if day_len == 0 {
        return None;
    }
    let day: u32 = std::str::from_utf8(&text[at..at + day_len])
        .ok()?
        .parse()
        .ok()?;
    at += day_len;
    let clock = text.get(at..at + 9)?;
    if clock[0] != b' ' || clock[3] != b':' || clock[6] != b':' {
        return None;
    }
    let two = |i: usize| -> Option<u32> {
        let part = &clock[i..i + 2];
        part.iter()
            .all(u8::is_ascii_digit)
            .then(|| u32::from(part[0] - b'0') * 10 + u32::from(part[1] - b'0'))
    };
    let (hour, minute, second) = (two(1)?, two(4)?, two(7)?);
    let stamp = std::str::from_utf8(&text[..at + 9]).ok()?;
    let (host, rest) = word(text.get(at + 10..)?)?;
    if text[at + 9] != b' ' || !is_hostname(host) {
        return None;
    }
    let millis_in = |year: i64| {
        DateTime {
            year,
            month,
            day,
            hour,
            minute,
            second,
            ..DateTime::default()
        }
        .epoch_millis()
    };
    let (year, _) = year_month_of(now);
    let mut millis = millis_in(year);
    // Flume's window: from 11 months before now to 1 month after.
    const MONTH: i64 = 31 * 86_400_000;
    if let Some(t) = millis {
        if t > now + MONTH {
            millis = millis_in(year - 1);
        } else if t < now - 11 * MONTH {
            millis = millis_in(year + 1);
        }
    }
    Some(Parsed {
        priority,
        version: None,
        timestamp: (stamp, millis),
        hostname: Some(host),
        rest,
    })
}

/// One message cut out of a TCP stream.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) message: Bytes,
    /// Cut at `event_size`: the rest of the message follows as another frame.
    pub(crate) cut: bool,
}

/// Cuts the bytes of one TCP connection into messages (see the module docs).
#[derive(Debug)]
pub(crate) struct Framer {
    buffer: BytesMut,
    event_size: usize,
    /// Bytes still to come of an octet-counted message that was cut.
    counted_rest: usize,
}

/// The longest octet count read: 10 digits, more than any `event_size`.
const MAX_COUNT_DIGITS: usize = 10;

impl Framer {
    pub(crate) fn new(event_size: usize) -> Self {
        Self {
            buffer: BytesMut::with_capacity(64 * 1024),
            event_size,
            counted_rest: 0,
        }
    }

    /// Where the next read goes.
    pub(crate) fn buffer(&mut self) -> &mut BytesMut {
        &mut self.buffer
    }

    /// The next complete message, if the buffer holds one.
    pub(crate) fn next_frame(&mut self) -> Option<Frame> {
        let max = self.event_size;
        if self.counted_rest > 0 {
            let n = self.counted_rest.min(max);
            if self.buffer.len() < n {
                return None;
            }
            self.counted_rest -= n;
            let message = self.buffer.split_to(n).freeze();
            return Some(Frame {
                message,
                cut: self.counted_rest > 0,
            });
        }
        // Line ends between messages.
        let skip = self
            .buffer
            .iter()
            .take_while(|b| matches!(b, b'\n' | b'\r'))
            .count();
        self.buffer.advance(skip);
        let first = *self.buffer.first()?;
        if first.is_ascii_digit() {
            let digits = self
                .buffer
                .iter()
                .take(MAX_COUNT_DIGITS + 1)
                .take_while(|b| b.is_ascii_digit())
                .count();
            match self.buffer.get(digits) {
                // Not all digits arrived yet.
                None if digits <= MAX_COUNT_DIGITS => return None,
                Some(b' ') if digits <= MAX_COUNT_DIGITS => {
                    let count: usize = std::str::from_utf8(&self.buffer[..digits])
                        .ok()
                        .and_then(|d| d.parse().ok())
                        .unwrap_or(usize::MAX);
                    let n = count.min(max);
                    if self.buffer.len() < digits + 1 + n {
                        return None;
                    }
                    self.buffer.advance(digits + 1);
                    self.counted_rest = count - n;
                    let message = self.buffer.split_to(n).freeze();
                    return Some(Frame {
                        message,
                        cut: self.counted_rest > 0,
                    });
                }
                // Digits, but no count: a line.
                _ => {}
            }
        }
        match self.buffer.iter().take(max + 1).position(|b| *b == b'\n') {
            Some(end) => {
                let mut line = self.buffer.split_to(end + 1);
                line.truncate(end);
                if line.last() == Some(&b'\r') {
                    line.truncate(end - 1);
                }
                Some(Frame {
                    message: line.freeze(),
                    cut: false,
                })
            }
            None if self.buffer.len() >= max => Some(Frame {
                message: self.buffer.split_to(max).freeze(),
                cut: true,
            }),
            None => None,
        }
    }

    /// At the end of the stream: what is left, as a last message.
    pub(crate) fn rest(&mut self) -> Option<Frame> {
        let skip = self
            .buffer
            .iter()
            .take_while(|b| matches!(b, b'\n' | b'\r'))
            .count();
        self.buffer.advance(skip);
        if self.buffer.is_empty() {
            return None;
        }
        let cut = self.counted_rest > 0;
        self.counted_rest = 0;
        Some(Frame {
            message: self.buffer.split().freeze(),
            cut,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2003-11-01T00:00:00Z: some weeks after the examples of RFC 3164.
    const NOW: i64 = 1_067_644_800_000;

    fn event(message: &str) -> Event {
        event_at(message.as_bytes(), false, KeepFields::default(), NOW)
    }

    fn headers(event: &Event) -> Vec<(&str, &str)> {
        event
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    #[test]
    fn rfc5424_messages_give_flumes_headers() {
        let e = event(
            "<165>1 2003-10-11T22:14:15.003Z mymachine.example.com evntslog - ID47 [exampleSDID@32473 iut=\"3\"] An application event",
        );
        assert_eq!(
            headers(&e),
            [
                ("Facility", "20"),
                ("Severity", "5"),
                ("host", "mymachine.example.com"),
                ("priority", "165"),
                ("timestamp", "1065910455003"),
                ("version", "1"),
            ]
        );
        assert_eq!(
            &e.body[..],
            &b"evntslog - ID47 [exampleSDID@32473 iut=\"3\"] An application event"[..]
        );
        let offset =
            event("<34>1 2003-08-24T05:14:15.000003-07:00 192.0.2.1 myproc 8710 - - %% It's time");
        assert_eq!(offset.headers["timestamp"], "1061727255000");
        assert_eq!(offset.headers["host"], "192.0.2.1");
        assert_eq!(&offset.body[..], b"myproc 8710 - - %% It's time");
    }

    #[test]
    fn rfc5424_nil_values_set_no_header() {
        let e = event("<13>1 - - app - - - hello");
        assert!(!e.headers.contains_key("timestamp"));
        assert!(!e.headers.contains_key("host"));
        assert_eq!(&e.body[..], b"app - - - hello");
    }

    #[test]
    fn rfc3164_messages_get_the_year_of_flumes_window() {
        let e =
            event("<34>Oct 11 22:14:15 mymachine su: 'su root' failed for lonvick on /dev/pts/8");
        assert_eq!(e.headers["Facility"], "4");
        assert_eq!(e.headers["Severity"], "2");
        assert_eq!(e.headers["host"], "mymachine");
        assert_eq!(e.headers["timestamp"], "1065910455000");
        assert!(!e.headers.contains_key("version"));
        assert_eq!(
            &e.body[..],
            b"su: 'su root' failed for lonvick on /dev/pts/8"
        );
        // A one-digit day after two spaces; December seen in November is last year's.
        let december = event("<13>Dec  5 01:02:03 host msg");
        assert_eq!(december.headers["timestamp"], "1039050123000");
    }

    #[test]
    fn rfc3339_without_version_as_rsyslog_writes_it() {
        let e = event("<13>2003-10-11T22:14:15Z web-1 app: hi");
        assert_eq!(e.headers["timestamp"], "1065910455000");
        assert_eq!(e.headers["host"], "web-1");
        assert!(!e.headers.contains_key("version"));
        assert_eq!(&e.body[..], b"app: hi");
    }

    #[test]
    fn keep_fields_write_the_header_back() {
        let message = "<34>1 2003-10-11T22:14:15.003Z host1 app - - - hi";
        let all = event_at(message.as_bytes(), false, KeepFields::ALL, NOW);
        assert_eq!(&all.body[..], message.as_bytes());
        assert_eq!(all.headers["host"], "host1");
        let some = KeepFields::parse("priority hostname").unwrap();
        let e = event_at(message.as_bytes(), false, some, NOW);
        assert_eq!(&e.body[..], b"<34>host1 app - - - hi");
        assert_eq!(KeepFields::parse("true").unwrap(), KeepFields::ALL);
        assert_eq!(KeepFields::parse("none").unwrap(), KeepFields::default());
        let error = KeepFields::parse("priority hostnme").unwrap_err();
        assert!(error.contains("did you mean `hostname`"), "{error}");
    }

    #[test]
    fn invalid_messages_are_marked_and_kept_whole() {
        for message in ["no priority", "<abc>x", "<1234>x", "<>x", "", "<13"] {
            let e = event(message);
            assert_eq!(e.headers[STATUS_HEADER], "Invalid", "{message:?}");
            assert_eq!(e.headers["Facility"], "0");
            assert_eq!(&e.body[..], message.as_bytes());
        }
        // A valid priority but neither format: kept whole, not invalid.
        let e = event("<13>just text");
        assert_eq!(e.headers["Severity"], "5");
        assert!(!e.headers.contains_key(STATUS_HEADER));
        assert!(!e.headers.contains_key("timestamp"));
        assert_eq!(&e.body[..], b"<13>just text");
        // Bad dates are not read as dates, and nothing panics on odd bytes.
        assert!(
            !event("<13>1 2003-13-11T22:14:15Z h m")
                .headers
                .contains_key("timestamp")
        );
        for odd in [
            "<13>1 \u{ff}\u{fe} x",
            "<13>Oct",
            "<13>Oct 1",
            "<13>Oct 11 22:14:1",
            "<0>1 2003-10-11T22:14:15.Z h m",
        ] {
            let _ = event(odd);
        }
        let _ = event_at(b"<13>\xff\xfe\xfd", true, KeepFields::default(), NOW);
    }

    #[test]
    fn a_cut_message_is_incomplete() {
        let e = event_at(
            b"<13>Oct 11 22:14:15 host par",
            true,
            KeepFields::default(),
            NOW,
        );
        assert_eq!(e.headers[STATUS_HEADER], "Incomplete");
        assert_eq!(&e.body[..], b"par");
    }

    fn frames(framer: &mut Framer, input: &[u8]) -> Vec<(String, bool)> {
        framer.buffer().extend_from_slice(input);
        std::iter::from_fn(|| framer.next_frame())
            .map(|f| (String::from_utf8_lossy(&f.message).into_owned(), f.cut))
            .collect()
    }

    #[test]
    fn newline_framing_strips_line_ends_and_waits_for_the_rest() {
        let mut framer = Framer::new(100);
        assert_eq!(
            frames(&mut framer, b"<13>a\n\n<14>b\r\n<15>c"),
            [("<13>a".to_string(), false), ("<14>b".to_string(), false)]
        );
        assert_eq!(
            frames(&mut framer, b" d\n"),
            [("<15>c d".to_string(), false)]
        );
        assert_eq!(framer.rest(), None);
    }

    #[test]
    fn octet_counted_framing_across_reads_and_mixed_with_lines() {
        let mut framer = Framer::new(100);
        assert_eq!(frames(&mut framer, b"12 <13>a\nb c d"), []);
        assert_eq!(
            frames(&mut framer, b"e4 <1>x<2>line\n"),
            [
                ("<13>a\nb c de".to_string(), false),
                ("<1>x".to_string(), false),
                ("<2>line".to_string(), false)
            ]
        );
        // Digits but no count: a line like any other.
        assert_eq!(
            frames(&mut framer, b"12abc\n"),
            [("12abc".to_string(), false)]
        );
        // A count that is still arriving.
        assert_eq!(frames(&mut framer, b"1"), []);
        assert_eq!(
            frames(&mut framer, b"0 0123456789"),
            [("0123456789".to_string(), false)]
        );
    }

    #[test]
    fn messages_longer_than_event_size_are_cut_not_dropped() {
        let mut framer = Framer::new(10);
        assert_eq!(
            frames(&mut framer, b"<13>abcdefghij\n"),
            [
                ("<13>abcdef".to_string(), true),
                ("ghij".to_string(), false)
            ]
        );
        assert_eq!(
            frames(&mut framer, b"25 <13>abcdefghijklmnopqrstu"),
            [
                ("<13>abcdef".to_string(), true),
                ("ghijklmnop".to_string(), true),
                ("qrstu".to_string(), false)
            ]
        );
        // A huge count allocates nothing ahead.
        assert_eq!(
            frames(&mut framer, b"9999999999 <13>abcdef"),
            [("<13>abcdef".to_string(), true)]
        );
        framer.buffer().extend_from_slice(b"xyz");
        assert_eq!(
            framer.rest(),
            Some(Frame {
                message: Bytes::from_static(b"xyz"),
                cut: true
            })
        );
    }
}
