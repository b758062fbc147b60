//! How events become bytes in a rolled file or object.
//!
//! The rolling writer appends events to a staging file a batch at a time and, after a crash,
//! cuts the file back to the end of the last committed batch. So each batch is encoded as a
//! self-contained *chunk*, and a file made of whole chunks is a valid file of its format:
//!
//! | format            | one event                                         | a chunk                 |
//! |-------------------|---------------------------------------------------|-------------------------|
//! | `text`            | the body, `\n` if `append_newline`                | the batch's events      |
//! | `header_and_text` | `{k=v, k2=v2}`, a space, the body, `\n` if asked  | the batch's events      |
//! | `json`            | `{"headers":{"k":"v"},"body":"..."}` and `\n`     | the batch's events      |
//! | `parquet`         | as `json` (staging only)                          | never compressed        |
//!
//! With `gzip` a chunk is one gzip member, with `zstd` one zstd frame: concatenated members
//! (RFC 1952 §2.2) and frames (RFC 8878 §3.1) are one valid stream, which `gzip -d`, `zstd -d`
//! and the common libraries read whole. Members carry no file name and a zero mtime, and zstd
//! frames carry their content size and a checksum, so the same events always give the same bytes.
//!
//! In `json` a body that is not UTF-8 is written as `"body_base64"` (standard alphabet, padded)
//! instead of `"body"`, so no byte is lost. Headers appear in their map's (sorted) order.
//!
//! Parquet keeps its schema and row-group offsets in a footer written last, so a Parquet file
//! cannot grow batch by batch: its events are staged as uncompressed `json` lines and turned
//! into Parquet at roll by [`super::parquet::staging_to_parquet`], which reads them back with
//! [`decode_json_line`].

use std::io::{self, Write};

use base64::Engine;
use base64::display::Base64Display;
use base64::engine::general_purpose::STANDARD as BASE64;
use ferry_core::Event;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};

/// How events are written.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// The body (Flume's `TEXT`, `DataStream`).
    #[default]
    Text,
    /// Headers as `{k=v, ...}`, a space, the body (Flume's `HEADER_AND_TEXT`).
    HeaderAndText,
    /// A JSON object per line: `{"headers":{...},"body":"..."}`.
    Json,
    /// Apache Parquet: a column per header and one for the body.
    Parquet,
}

/// How a file or object is compressed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    /// Not compressed.
    #[default]
    None,
    /// gzip.
    Gzip,
    /// Zstandard.
    Zstd,
}

/// gzip's level: `gzip`'s own default (`-6`), and flate2's.
const GZIP_LEVEL: u32 = 6;

/// zstd's level: the `zstd` tool's default.
const ZSTD_LEVEL: i32 = 3;

/// Appends one batch to `out` as a self-contained chunk (see the module doc), so that a file
/// made of chunks cut at any chunk boundary is a valid file: with gzip one gzip member per
/// chunk, with zstd one zstd frame per chunk.
///
/// For `Format::Parquet` writes the staging encoding, uncompressed `json` lines whatever
/// `compression`, which [`super::parquet::staging_to_parquet`] turns into the Parquet file at
/// roll. An empty batch appends nothing. On error `out` is left as it was.
///
/// Returns the chunk's size before compression: what `roll_size` counts.
pub(crate) fn encode_chunk(
    out: &mut Vec<u8>,
    events: &[&Event],
    format: Format,
    compression: Compression,
    append_newline: bool,
) -> io::Result<u64> {
    if events.is_empty() {
        return Ok(0);
    }
    let compression = match format {
        Format::Parquet => Compression::None,
        _ => compression,
    };
    let start = out.len();
    let encoded = match compression {
        Compression::None => {
            encode_plain(out, events, format, append_newline).map(|()| (out.len() - start) as u64)
        }
        Compression::Gzip | Compression::Zstd => {
            // One buffer per batch: the compressor then sees the batch in one call rather than
            // a few small writes per event.
            let mut plain = Vec::with_capacity(plain_size_hint(events, format));
            encode_plain(&mut plain, events, format, append_newline)
                .and_then(|()| compress(out, &plain, compression))
                .map(|()| plain.len() as u64)
        }
    };
    if encoded.is_err() {
        out.truncate(start);
    }
    encoded
}

/// The file-name extension a format and compression usually have: `""`, `".gz"` or `".zst"`
/// for `text` and `header_and_text`; `".jsonl"`, `".jsonl.gz"` or `".jsonl.zst"` for `json`;
/// `".parquet"` for `parquet`, whose compression is inside the file.
pub(crate) fn default_suffix(format: Format, compression: Compression) -> &'static str {
    match (format, compression) {
        (Format::Text | Format::HeaderAndText, Compression::None) => "",
        (Format::Text | Format::HeaderAndText, Compression::Gzip) => ".gz",
        (Format::Text | Format::HeaderAndText, Compression::Zstd) => ".zst",
        (Format::Json, Compression::None) => ".jsonl",
        (Format::Json, Compression::Gzip) => ".jsonl.gz",
        (Format::Json, Compression::Zstd) => ".jsonl.zst",
        (Format::Parquet, _) => ".parquet",
    }
}

/// Reads one `json` line (with or without its `\n`) back into its headers and body: the body
/// from `"body"`, or decoded from `"body_base64"`.
pub(crate) fn decode_json_line(line: &[u8]) -> io::Result<(ferry_core::HeaderMap, Vec<u8>)> {
    let line: JsonLineIn =
        serde_json::from_slice(line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let body = match (line.body, line.body_base64) {
        (Some(body), None) => body.into_bytes(),
        (None, Some(encoded)) => BASE64.decode(encoded).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidData, format!("`body_base64`: {e}"))
        })?,
        (Some(_), Some(_)) => return Err(invalid_data("both `body` and `body_base64`")),
        (None, None) => return Err(invalid_data("neither `body` nor `body_base64`")),
    };
    Ok((line.headers, body))
}

/// Appends the events uncompressed.
fn encode_plain(
    out: &mut Vec<u8>,
    events: &[&Event],
    format: Format,
    append_newline: bool,
) -> io::Result<()> {
    match format {
        Format::Text => {
            for event in events {
                out.extend_from_slice(&event.body);
                if append_newline {
                    out.push(b'\n');
                }
            }
        }
        Format::HeaderAndText => {
            for event in events {
                crate::push_java_map(out, &event.headers);
                out.push(b' ');
                out.extend_from_slice(&event.body);
                if append_newline {
                    out.push(b'\n');
                }
            }
        }
        // A line per event whatever `append_newline`: lines are what make it JSON Lines.
        Format::Json | Format::Parquet => {
            for event in events {
                serde_json::to_writer(&mut *out, &JsonLineOut(event))?;
                out.push(b'\n');
            }
        }
    }
    Ok(())
}

/// Roughly the plain size of a batch, to size its buffer once.
fn plain_size_hint(events: &[&Event], format: Format) -> usize {
    let per_event = match format {
        Format::Text => 1,
        Format::HeaderAndText | Format::Json | Format::Parquet => 32,
    };
    events
        .iter()
        .map(|event| event.body.len() + per_event)
        .sum()
}

/// Appends `plain` as one gzip member or one zstd frame.
fn compress(out: &mut Vec<u8>, plain: &[u8], compression: Compression) -> io::Result<()> {
    match compression {
        Compression::None => out.extend_from_slice(plain),
        Compression::Gzip => {
            // GzBuilder's defaults: no file name, no comment, mtime 0.
            let mut member =
                flate2::GzBuilder::new().write(&mut *out, flate2::Compression::new(GZIP_LEVEL));
            member.write_all(plain)?;
            member.finish()?;
        }
        Compression::Zstd => {
            let mut frame = zstd::stream::Encoder::new(&mut *out, ZSTD_LEVEL)?;
            frame.set_pledged_src_size(Some(plain.len() as u64))?;
            frame.include_contentsize(true)?;
            // As gzip's CRC-32: a reader can tell a damaged frame from a good one.
            frame.include_checksum(true)?;
            frame.write_all(plain)?;
            frame.finish()?;
        }
    }
    Ok(())
}

/// An event as a `json` line, serialized straight into the output (no `serde_json::Value`).
struct JsonLineOut<'a>(&'a Event);

impl Serialize for JsonLineOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let Self(event) = self;
        let mut line = serializer.serialize_struct("JsonLine", 2)?;
        line.serialize_field("headers", &event.headers)?;
        match std::str::from_utf8(&event.body) {
            Ok(body) => line.serialize_field("body", body)?,
            Err(_) => line.serialize_field("body_base64", &Base64(&event.body))?,
        }
        line.end()
    }
}

/// Bytes serialized as a standard base64 string, encoded straight into the output.
struct Base64<'a>(&'a [u8]);

impl Serialize for Base64<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&Base64Display::new(self.0, &BASE64))
    }
}

/// A `json` line as read back.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonLineIn {
    headers: ferry_core::HeaderMap,
    body: Option<String>,
    body_base64: Option<String>,
}

fn invalid_data(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn event(headers: &[(&str, &str)], body: &[u8]) -> Event {
        Event {
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.to_vec().into(),
        }
    }

    fn decompress(bytes: &[u8], compression: Compression) -> io::Result<Vec<u8>> {
        match compression {
            Compression::None => Ok(bytes.to_vec()),
            Compression::Gzip => {
                let mut plain = Vec::new();
                flate2::read::MultiGzDecoder::new(bytes).read_to_end(&mut plain)?;
                Ok(plain)
            }
            Compression::Zstd => zstd::stream::decode_all(bytes),
        }
    }

    const FORMATS: [Format; 4] = [
        Format::Text,
        Format::HeaderAndText,
        Format::Json,
        Format::Parquet,
    ];
    const COMPRESSIONS: [Compression; 3] =
        [Compression::None, Compression::Gzip, Compression::Zstd];

    /// Two batches, and what each format makes of them uncompressed.
    fn two_batches() -> (Vec<Event>, Vec<Event>) {
        (
            vec![
                event(&[("host", "a"), ("file", "x.log")], b"one"),
                event(&[], b"two"),
            ],
            vec![event(&[("host", "b")], b"three")],
        )
    }

    fn expected_plain(format: Format) -> &'static str {
        match format {
            Format::Text => "one\ntwo\nthree\n",
            Format::HeaderAndText => "{file=x.log, host=a} one\n{} two\n{host=b} three\n",
            Format::Json | Format::Parquet => concat!(
                r#"{"headers":{"file":"x.log","host":"a"},"body":"one"}"#,
                "\n",
                r#"{"headers":{},"body":"two"}"#,
                "\n",
                r#"{"headers":{"host":"b"},"body":"three"}"#,
                "\n",
            ),
        }
    }

    #[test]
    fn every_format_and_compression_round_trips() {
        let (first, second) = two_batches();
        for format in FORMATS {
            for compression in COMPRESSIONS {
                let mut out = Vec::new();
                let plain_sizes = encode_chunk(
                    &mut out,
                    &first.iter().collect::<Vec<_>>(),
                    format,
                    compression,
                    true,
                )
                .unwrap()
                    + encode_chunk(
                        &mut out,
                        &second.iter().collect::<Vec<_>>(),
                        format,
                        compression,
                        true,
                    )
                    .unwrap();
                let stored = if format == Format::Parquet {
                    Compression::None
                } else {
                    compression
                };
                let plain = decompress(&out, stored).unwrap();
                assert_eq!(
                    plain_sizes,
                    plain.len() as u64,
                    "the size before compression, {format:?} {compression:?}"
                );
                assert_eq!(
                    String::from_utf8(plain).unwrap(),
                    expected_plain(format),
                    "{format:?} {compression:?}"
                );
            }
        }
    }

    #[test]
    fn json_lines_decode_back_to_the_events() {
        let (first, second) = two_batches();
        let events: Vec<&Event> = first.iter().chain(&second).collect();
        let mut out = Vec::new();
        encode_chunk(&mut out, &events, Format::Json, Compression::None, false).unwrap();
        let decoded: Vec<_> = out
            .split_inclusive(|&b| b == b'\n')
            .map(|line| decode_json_line(line).unwrap())
            .collect();
        let original: Vec<_> = events
            .iter()
            .map(|e| ((*e.headers).clone(), e.body.to_vec()))
            .collect();
        assert_eq!(decoded, original);
    }

    #[test]
    fn a_file_cut_at_a_chunk_boundary_stays_valid() {
        let batches: Vec<Event> = (0..3)
            .map(|i| event(&[("n", &i.to_string())], format!("event {i}").as_bytes()))
            .collect();
        for compression in [Compression::Gzip, Compression::Zstd] {
            let mut out = Vec::new();
            let mut ends = Vec::new();
            for event in &batches {
                encode_chunk(&mut out, &[event], Format::Json, compression, true).unwrap();
                ends.push(out.len());
            }
            let first_two = decompress(&out[..ends[1]], compression).unwrap();
            let lines: Vec<_> = first_two.split_inclusive(|&b| b == b'\n').collect();
            assert_eq!(lines.len(), 2, "{compression:?}");
            assert_eq!(decode_json_line(lines[1]).unwrap().1, b"event 1");

            // The test can fail: a cut inside a chunk is not a valid file.
            assert!(
                decompress(&out[..ends[1] + 5], compression).is_err(),
                "{compression:?}"
            );
        }
    }

    #[test]
    fn a_body_that_is_not_utf8_is_kept_as_base64() {
        let events = [
            event(&[("k", "v")], &[0xff, 0x00, b'a']),
            event(&[], b"plain"),
        ];
        let mut out = Vec::new();
        encode_chunk(
            &mut out,
            &events.iter().collect::<Vec<_>>(),
            Format::Json,
            Compression::None,
            true,
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            concat!(
                r#"{"headers":{"k":"v"},"body_base64":"/wBh"}"#,
                "\n",
                r#"{"headers":{},"body":"plain"}"#,
                "\n",
            )
        );
        let first_line = out.split_inclusive(|&b| b == b'\n').next().unwrap();
        assert_eq!(decode_json_line(first_line).unwrap().1, [0xff, 0x00, b'a']);
    }

    #[test]
    fn json_escapes_quotes_and_control_characters_and_keeps_unicode() {
        let body = "say \"hi\"\\ \n\t\u{1}\u{7f} é 日本 😀";
        let events = [event(
            &[("quote\"key", "tab\tvalue"), ("ü", "\u{1f}")],
            body.as_bytes(),
        )];
        let mut out = Vec::new();
        encode_chunk(
            &mut out,
            &events.iter().collect::<Vec<_>>(),
            Format::Json,
            Compression::None,
            false,
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            concat!(
                r#"{"headers":{"quote\"key":"tab\tvalue","ü":"\u001f"},"#,
                r#""body":"say \"hi\"\\ \n\t\u0001"#,
                "\u{7f} é 日本 😀\"}\n",
            )
        );
        let (headers, decoded) = decode_json_line(&out).unwrap();
        assert_eq!(decoded, body.as_bytes());
        assert_eq!(headers, *events[0].headers);
        // Any JSON reader agrees.
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["body"], body);
    }

    #[test]
    fn text_formats_end_lines_only_when_asked() {
        let events = [event(&[("a", "1"), ("b", "2")], b"x"), event(&[], b"y")];
        let events: Vec<&Event> = events.iter().collect();
        let encode = |format, append_newline| {
            let mut out = Vec::new();
            encode_chunk(&mut out, &events, format, Compression::None, append_newline).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert_eq!(encode(Format::Text, false), "xy");
        assert_eq!(encode(Format::HeaderAndText, false), "{a=1, b=2} x{} y");
        assert_eq!(encode(Format::HeaderAndText, true), "{a=1, b=2} x\n{} y\n");
        assert_eq!(encode(Format::Json, false).lines().count(), 2);
    }

    #[test]
    fn parquet_stages_uncompressed_json_whatever_the_compression() {
        let events = [event(&[("a", "1")], b"x")];
        let events: Vec<&Event> = events.iter().collect();
        let mut json = Vec::new();
        encode_chunk(&mut json, &events, Format::Json, Compression::None, false).unwrap();
        for compression in COMPRESSIONS {
            let mut staged = Vec::new();
            encode_chunk(&mut staged, &events, Format::Parquet, compression, false).unwrap();
            assert_eq!(staged, json, "{compression:?}");
        }
    }

    #[test]
    fn the_same_events_give_the_same_bytes() {
        let (first, _) = two_batches();
        let events: Vec<&Event> = first.iter().collect();
        for format in FORMATS {
            for compression in COMPRESSIONS {
                let encode = || {
                    let mut out = Vec::new();
                    encode_chunk(&mut out, &events, format, compression, true).unwrap();
                    out
                };
                assert_eq!(encode(), encode(), "{format:?} {compression:?}");
            }
        }
        let mut gzip = Vec::new();
        encode_chunk(&mut gzip, &events, Format::Text, Compression::Gzip, true).unwrap();
        assert_eq!(gzip[3], 0, "no FNAME or other flags");
        assert_eq!(gzip[4..8], [0; 4], "mtime 0");
    }

    #[test]
    fn an_empty_batch_appends_nothing() {
        for format in FORMATS {
            for compression in COMPRESSIONS {
                let mut out = b"before".to_vec();
                encode_chunk(&mut out, &[], format, compression, true).unwrap();
                assert_eq!(out, b"before");
            }
        }
        // A batch whose events encode to nothing is still a whole (empty) member or frame.
        let empty = [Event::from_body(Vec::new())];
        for compression in [Compression::Gzip, Compression::Zstd] {
            let mut out = Vec::new();
            encode_chunk(&mut out, &[&empty[0]], Format::Text, compression, false).unwrap();
            assert!(!out.is_empty());
            assert_eq!(decompress(&out, compression).unwrap(), b"");
        }
    }

    #[test]
    fn malformed_json_lines_are_invalid_data() {
        for line in [
            &b"not json"[..],
            br#"{"headers":{},"body":"a""#,
            br#"{"headers":{}}"#,
            br#"{"headers":{},"body":"a","body_base64":"YQ=="}"#,
            br#"{"headers":{},"body_base64":"not base64!"}"#,
            br#"{"headers":{},"body":"a","extra":1}"#,
            br#"{"body":"a"}"#,
            br#"{"headers":{"k":1},"body":"a"}"#,
            b"",
        ] {
            let error = decode_json_line(line).unwrap_err();
            assert_eq!(
                error.kind(),
                io::ErrorKind::InvalidData,
                "{}",
                line.escape_ascii()
            );
        }
        let (headers, body) = decode_json_line(b"{\"headers\":{},\"body\":\"\"}\n").unwrap();
        assert!(headers.is_empty() && body.is_empty());
    }

    #[test]
    fn default_suffixes() {
        let suffixes: Vec<_> = FORMATS
            .iter()
            .flat_map(|&f| COMPRESSIONS.map(|c| default_suffix(f, c)))
            .collect();
        assert_eq!(
            suffixes,
            [
                "",
                ".gz",
                ".zst",
                "",
                ".gz",
                ".zst",
                ".jsonl",
                ".jsonl.gz",
                ".jsonl.zst",
                ".parquet",
                ".parquet",
                ".parquet",
            ]
        );
    }
}
