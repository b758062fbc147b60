//! Segment files and the batch frames in them (the byte layout is drawn in the module docs of
//! [`super`]). Encoding and decoding do no I/O beyond the positioned reads of one frame.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use ferry_core::{Bytes, CompactString, Event, HeaderMap, Headers};

use super::log::LogError;

/// The first bytes of every frame.
pub(super) const MAGIC: [u8; 4] = *b"FCB1";
/// Bytes of a frame before its payload.
pub(super) const HEADER_LEN: usize = 24;
/// Header count of an event whose headers are those of the event before it in the frame.
const SAME_HEADERS: u32 = u32::MAX;

/// The file of the segment whose first event has sequence number `base`.
pub(super) fn segment_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.log"))
}

/// The base sequence number named by a segment file name, if it is one.
pub(super) fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".log")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// A batch encoded as one frame, its sequence numbers not assigned yet.
pub(super) struct EncodedBatch {
    bytes: Vec<u8>,
    count: u32,
}

impl EncodedBatch {
    /// Encodes `events` (bodies copied once, into the frame). `None`: the payload would not
    /// fit a frame's 32-bit length.
    pub(super) fn new(events: &[Event]) -> Option<Self> {
        let size: usize = HEADER_LEN
            + events
                .iter()
                .map(|e| {
                    8 + e.body.len()
                        + e.headers
                            .iter()
                            .map(|(k, v)| 8 + k.len() + v.len())
                            .sum::<usize>()
                })
                .sum::<usize>();
        let count = u32::try_from(events.len()).ok()?;
        u32::try_from(size - HEADER_LEN).ok()?;
        let mut bytes = Vec::with_capacity(size);
        bytes.extend_from_slice(&[0; HEADER_LEN]);
        let mut previous: Option<&Headers> = None;
        for event in events {
            if previous.is_some_and(|p| *p == event.headers) {
                put_u32(&mut bytes, SAME_HEADERS);
            } else {
                put_u32(&mut bytes, event.headers.len() as u32);
                for (key, value) in &event.headers {
                    put_u32(&mut bytes, key.len() as u32);
                    bytes.extend_from_slice(key.as_bytes());
                    put_u32(&mut bytes, value.len() as u32);
                    bytes.extend_from_slice(value.as_bytes());
                }
            }
            previous = Some(&event.headers);
            put_u32(&mut bytes, event.body.len() as u32);
            bytes.extend_from_slice(&event.body);
        }
        let payload = (bytes.len() - HEADER_LEN) as u32;
        bytes[0..4].copy_from_slice(&MAGIC);
        bytes[4..8].copy_from_slice(&payload.to_le_bytes());
        bytes[20..24].copy_from_slice(&count.to_le_bytes());
        Some(Self { bytes, count })
    }

    /// Events in the batch.
    pub(super) fn count(&self) -> u64 {
        u64::from(self.count)
    }

    /// The frame's length in bytes.
    pub(super) fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// The whole frame with its events numbered from `first_seq`, checksum included.
    pub(super) fn seal(&mut self, first_seq: u64) -> &[u8] {
        self.bytes[12..20].copy_from_slice(&first_seq.to_le_bytes());
        let crc = crc32c::crc32c(&self.bytes[12..]);
        self.bytes[8..12].copy_from_slice(&crc.to_le_bytes());
        &self.bytes
    }
}

fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// What a frame's header says.
#[derive(Clone, Copy, Debug)]
pub(super) struct FrameHeader {
    pub(super) payload_len: u64,
    pub(super) crc: u32,
    pub(super) first_seq: u64,
    pub(super) count: u64,
}

impl FrameHeader {
    /// The frame's length, header included.
    pub(super) fn frame_len(&self) -> u64 {
        HEADER_LEN as u64 + self.payload_len
    }

    /// One past the last sequence number of the frame.
    pub(super) fn end_seq(&self) -> u64 {
        self.first_seq + self.count
    }
}

/// Reads the header of the frame at `offset` of `file`; `limit` is where the committed bytes
/// of the file end.
pub(super) fn read_header(
    file: &File,
    path: &Path,
    offset: u64,
    limit: u64,
) -> Result<FrameHeader, LogError> {
    let corrupt = |message: String| LogError::Corrupt {
        path: path.to_owned(),
        offset,
        message,
    };
    if offset + HEADER_LEN as u64 > limit {
        return Err(corrupt(format!(
            "a frame header does not fit before the committed end at byte {limit}"
        )));
    }
    let mut raw = [0u8; HEADER_LEN];
    file.read_exact_at(&mut raw, offset)
        .map_err(|e| LogError::io(path, "reading", e))?;
    if raw[0..4] != MAGIC {
        return Err(corrupt("not the start of a batch frame (bad magic)".into()));
    }
    let u32_at = |at: usize| u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]);
    let header = FrameHeader {
        payload_len: u64::from(u32_at(4)),
        crc: u32_at(8),
        first_seq: u64::from_le_bytes([
            raw[12], raw[13], raw[14], raw[15], raw[16], raw[17], raw[18], raw[19],
        ]),
        count: u64::from(u32_at(20)),
    };
    if offset + header.frame_len() > limit {
        return Err(corrupt(format!(
            "a frame of {} bytes runs past the committed end at byte {limit}",
            header.frame_len()
        )));
    }
    Ok(header)
}

/// Reads and checks the payload of the frame at `offset` (whose header is `header`) and
/// decodes its events. Bodies are slices of one buffer read for the whole frame.
pub(super) fn read_events(
    file: &File,
    path: &Path,
    offset: u64,
    header: &FrameHeader,
) -> Result<Vec<Event>, LogError> {
    let mut frame = vec![0u8; header.frame_len() as usize];
    file.read_exact_at(&mut frame, offset)
        .map_err(|e| LogError::io(path, "reading", e))?;
    if crc32c::crc32c(&frame[12..]) != header.crc {
        return Err(LogError::Corrupt {
            path: path.to_owned(),
            offset,
            message: format!(
                "the checksum of the batch of {} events from sequence number {} does not match",
                header.count, header.first_seq
            ),
        });
    }
    let payload = Bytes::from(frame).slice(HEADER_LEN..);
    decode_events(&payload, header.count).map_err(|message| LogError::Corrupt {
        path: path.to_owned(),
        offset,
        message,
    })
}

/// Decodes `count` events from a checked payload.
fn decode_events(payload: &Bytes, count: u64) -> Result<Vec<Event>, String> {
    let mut reader = Reader { payload, at: 0 };
    let mut events: Vec<Event> = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let headers = match reader.u32()? {
            SAME_HEADERS => match events.last() {
                Some(previous) => previous.headers.clone(),
                None => return Err("the first event refers to headers before it".into()),
            },
            n => {
                // Written in key order, so each header goes at the end. (Each takes 8 bytes or
                // more: a count past what is left is a corrupt frame, found below.)
                let room = (payload.len() - reader.at) / 8;
                let mut headers = HeaderMap::with_capacity((n as usize).min(room));
                for _ in 0..n {
                    let key = reader.string()?;
                    let value = reader.string()?;
                    headers.insert(key, value);
                }
                Headers::from(headers)
            }
        };
        let len = reader.u32()? as usize;
        let body = reader.bytes(len)?;
        events.push(Event { headers, body });
    }
    if reader.at != payload.len() {
        return Err("bytes left over after the last event".into());
    }
    Ok(events)
}

struct Reader<'a> {
    payload: &'a Bytes,
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<std::ops::Range<usize>, String> {
        if self.payload.len() - self.at < n {
            return Err("an event runs past the end of its frame".into());
        }
        let range = self.at..self.at + n;
        self.at += n;
        Ok(range)
    }

    fn u32(&mut self) -> Result<u32, String> {
        let range = self.take(4)?;
        let raw = &self.payload[range];
        Ok(u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]))
    }

    fn bytes(&mut self, n: usize) -> Result<Bytes, String> {
        let range = self.take(n)?;
        Ok(self.payload.slice(range))
    }

    /// A header key or value: up to 24 bytes inline, without an allocation.
    fn string(&mut self) -> Result<CompactString, String> {
        let n = self.u32()? as usize;
        let range = self.take(n)?;
        CompactString::from_utf8(&self.payload[range]).map_err(|_| "a header is not UTF-8".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(body: &str, headers: &[(&str, &str)]) -> Event {
        let mut e = Event::from_body(body.to_owned());
        for (k, v) in headers {
            e.headers.insert((*k).into(), (*v).into());
        }
        e
    }

    #[test]
    fn frames_round_trip_with_repeated_headers() {
        let events = vec![
            event("a", &[("file", "/var/log/app.log"), ("host", "web-1")]),
            event("b", &[("file", "/var/log/app.log"), ("host", "web-1")]),
            event("", &[]),
            event("d", &[("k", "v")]),
        ];
        let mut batch = EncodedBatch::new(&events).unwrap();
        let frame = batch.seal(42).to_vec();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, &frame).unwrap();
        let file = File::open(&path).unwrap();
        let header = read_header(&file, &path, 0, frame.len() as u64).unwrap();
        assert_eq!((header.first_seq, header.count), (42, 4));
        assert_eq!(read_events(&file, &path, 0, &header).unwrap(), events);
    }

    #[test]
    fn damage_is_reported_with_file_and_offset() {
        let mut batch = EncodedBatch::new(&[event("hello", &[("a", "b")])]).unwrap();
        let mut frame = batch.seal(1).to_vec();
        let last = frame.len() - 1;
        frame[last] ^= 1;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, &frame).unwrap();
        let file = File::open(&path).unwrap();
        let header = read_header(&file, &path, 0, frame.len() as u64).unwrap();
        let err = read_events(&file, &path, 0, &header).unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
        assert!(err.to_string().contains("byte 0"), "{err}");
        let err = read_header(&file, &path, 0, 10).unwrap_err();
        assert!(err.to_string().contains("committed end"), "{err}");
        let err = read_header(&file, &path, 1, frame.len() as u64 + 1).unwrap_err();
        assert!(err.to_string().contains("magic"), "{err}");
    }

    #[test]
    fn damaged_payloads_are_errors_not_panics() {
        let bytes = Bytes::from_static(&[1, 0, 0, 0, 9, 0, 0, 0, b'k']);
        assert!(decode_events(&bytes, 1).is_err());
        let bytes = Bytes::from_static(&[255, 255, 255, 255, 0, 0, 0, 0]);
        assert!(decode_events(&bytes, 1).is_err());
        let bytes = Bytes::from_static(&[0, 0, 0, 0, 0, 0, 0, 0, 7]);
        assert!(decode_events(&bytes, 1).is_err());
    }

    #[test]
    fn segment_names_round_trip() {
        let path = segment_path(Path::new("/d"), 1200);
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(name, "00000000000000001200.log");
        assert_eq!(parse_segment_name(name), Some(1200));
        assert_eq!(parse_segment_name("1200.log"), None);
        assert_eq!(parse_segment_name("0000000000000000120x.log"), None);
    }
}
