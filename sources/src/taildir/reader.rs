//! Reading one tailed file: lines out of 64 KiB reads, multi-line joining, held partial lines,
//! and the offset a checkpoint may resume from.
//!
//! Three offsets matter, in file order:
//!
//! ```text
//! 0 ......... committed ......... consumed ............ read position
//!   in events   | joined, not sent  | buffered, not split   |
//! ```
//!
//! - `committed`: just after the last line of the last event made from this file; this is what
//!   the checkpoint says, so lines held back (an event still being joined, a partial last line)
//!   are read again after a restart rather than lost;
//! - `consumed`: just after the last complete line taken from the buffer;
//! - the read position (`consumed` + bytes buffered): where the next read continues.

use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_core::{Event, Headers};

use super::config::{Joining, Multiline};
use crate::file_id::{FINGERPRINT_LEN, FileKey, Fingerprint, read_range};
use crate::lines::LineBuffer;

/// How lines become events: the options that apply to every file.
#[derive(Debug, Clone)]
pub(crate) struct EventOptions {
    /// Header key of the file's path, if `file_header` is on.
    pub(crate) file_header_key: Option<String>,
    pub(crate) byte_offset_header: bool,
    /// Header key of each event's position, if a `position` interceptor asks for it.
    pub(crate) position_header: Option<String>,
    pub(crate) multiline: Option<Multiline>,
    pub(crate) partial_line_flush: Option<Duration>,
    /// Lines longer than this come in pieces.
    pub(crate) max_line_length: usize,
}

/// The events of one round, with room for at most `capacity`.
pub(crate) struct Batch<'a> {
    pub(crate) events: Vec<Event>,
    capacity: usize,
    options: &'a EventOptions,
    /// Headers of each file group.
    group_headers: &'a [Headers],
}

impl<'a> Batch<'a> {
    pub(crate) fn new(
        capacity: usize,
        options: &'a EventOptions,
        group_headers: &'a [Headers],
    ) -> Self {
        Self {
            events: Vec::with_capacity(capacity),
            capacity,
            options,
            group_headers,
        }
    }

    pub(crate) fn is_full(&self) -> bool {
        self.events.len() >= self.capacity
    }

    /// Adds an event with the file's `headers`, its `byteoffset` and its position if
    /// configured.
    fn push(&mut self, mut headers: Headers, body: Bytes, offset: u64, position: Option<String>) {
        if self.options.byte_offset_header {
            headers.set("byteoffset", offset.to_string());
        }
        if let (Some(key), Some(position)) = (&self.options.position_header, position) {
            headers.set(key.clone(), position);
        }
        self.events.push(Event::new(headers, body));
    }
}

/// Lines being joined into one multi-line event.
struct Joined {
    body: Vec<u8>,
    lines: usize,
    /// Offset of the first line.
    start: u64,
    /// Offset just after the last line.
    end: u64,
}

/// One file being tailed.
pub(crate) struct TailedFile {
    pub(crate) key: FileKey,
    pub(crate) fingerprint: Fingerprint,
    /// Where the file was last seen.
    path: PathBuf,
    /// The headers every event of the file gets (group headers, path), made at its first
    /// event and again after a rename, so an event costs one clone of them.
    headers: Option<Headers>,
    /// The last CRC-32C of the file's first bytes made for a position: bytes covered, CRC.
    head_crc: Option<(u64, u32)>,
    /// Index of the file group it belongs to.
    pub(crate) group: usize,
    /// Just after the last line of the last event made: where a restart resumes.
    pub(crate) committed: u64,
    /// Just after the last complete line taken from `lines`.
    consumed: u64,
    /// Open while the file is active; closed after `idle_timeout` without growth.
    handle: Option<File>,
    lines: LineBuffer,
    joined: Option<Joined>,
    /// When bytes were last read (or the file was opened).
    pub(crate) last_growth: Instant,
    /// Whether a glob matched the file at the last scan.
    pub(crate) in_view: bool,
}

/// What reading a file to its current end found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReadEnd {
    /// The batch filled up before the end of the file.
    BatchFull,
    /// At the end of the file (or the file is closed).
    EndOfFile,
}

impl TailedFile {
    /// Starts tailing `handle` (opened at `path`) at `offset`.
    pub(crate) fn open(
        key: FileKey,
        fingerprint: Fingerprint,
        path: PathBuf,
        group: usize,
        mut handle: File,
        offset: u64,
        now: Instant,
    ) -> io::Result<Self> {
        handle.seek(SeekFrom::Start(offset))?;
        Ok(Self {
            key,
            fingerprint,
            path,
            headers: None,
            head_crc: None,
            group,
            committed: offset,
            consumed: offset,
            handle: Some(handle),
            lines: LineBuffer::new(true),
            joined: None,
            last_growth: now,
            in_view: true,
        })
    }

    /// Where the file was last seen.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The file was renamed.
    pub(crate) fn set_path(&mut self, path: PathBuf) {
        self.path = path;
        self.headers = None;
    }

    /// The headers of this file's events.
    fn headers(&mut self, batch: &Batch<'_>) -> Headers {
        let group = self.group;
        let path = &self.path;
        self.headers
            .get_or_insert_with(|| {
                let mut headers = batch.group_headers.get(group).cloned().unwrap_or_default();
                if let Some(key) = &batch.options.file_header_key {
                    headers.set(key.clone(), path.to_string_lossy().into_owned());
                }
                headers
            })
            .clone()
    }

    /// Where the next read continues.
    pub(crate) fn read_position(&self) -> u64 {
        self.consumed + self.lines.len() as u64
    }

    pub(crate) fn is_open(&self) -> bool {
        self.handle.is_some()
    }

    pub(crate) fn handle(&self) -> Option<&File> {
        self.handle.as_ref()
    }

    /// Closes the handle; bytes buffered are kept and reading continues after them.
    pub(crate) fn close(&mut self) {
        self.handle = None;
    }

    /// Reopens a closed file (`handle` is the same file, checked by the caller) where reading
    /// stopped.
    pub(crate) fn reopen(&mut self, mut handle: File, now: Instant) -> io::Result<()> {
        handle.seek(SeekFrom::Start(self.read_position()))?;
        self.handle = Some(handle);
        self.last_growth = now;
        Ok(())
    }

    /// Forgets everything read and starts again at byte 0 (the file was truncated or its
    /// content replaced).
    pub(crate) fn restart_at_zero(&mut self, fingerprint: Fingerprint) -> io::Result<()> {
        if let Some(handle) = &mut self.handle {
            handle.seek(SeekFrom::Start(0))?;
        }
        self.fingerprint = fingerprint;
        self.head_crc = None;
        self.committed = 0;
        self.consumed = 0;
        self.lines.clear();
        self.joined = None;
        Ok(())
    }

    /// Turns buffered and newly read lines into events until the batch is full or the file
    /// ends. Reads are 64 KiB; a read happens only once the buffered lines are used up, so a
    /// file never buffers more than one read beyond its partial last line.
    pub(crate) fn read(&mut self, batch: &mut Batch<'_>, now: Instant) -> io::Result<ReadEnd> {
        loop {
            while !batch.is_full() {
                let max = batch.options.max_line_length;
                let Some((line, size)) = self.lines.next_line_within(max) else {
                    break;
                };
                let start = self.consumed;
                self.consumed += size as u64;
                self.push_line(batch, line, start);
            }
            if batch.is_full() {
                return Ok(ReadEnd::BatchFull);
            }
            let Some(handle) = &mut self.handle else {
                return Ok(ReadEnd::EndOfFile);
            };
            if self.lines.fill_from(handle)? == 0 {
                return Ok(ReadEnd::EndOfFile);
            }
            self.last_growth = now;
        }
    }

    /// At the end of the file: sends a partial last line or an event being joined whose time
    /// is up (`force`: now, because the file will not grow any more).
    pub(crate) fn flush_expired(&mut self, batch: &mut Batch<'_>, now: Instant, force: bool) {
        let idle = now.saturating_duration_since(self.last_growth);
        let options = batch.options;
        let flush_partial = force
            || options
                .partial_line_flush
                .is_some_and(|after| idle >= after);
        if flush_partial && !batch.is_full() {
            let start = self.consumed;
            if let Some((line, size)) = self.lines.take_partial() {
                self.consumed += size as u64;
                self.push_line(batch, line, start);
            }
        }
        let join_expired = force
            || options
                .multiline
                .as_ref()
                .is_some_and(|m| idle >= m.timeout);
        if join_expired && !batch.is_full() {
            self.send_joined(batch);
        }
    }

    /// The next moment [`flush_expired`](Self::flush_expired) has something to do, if any.
    pub(crate) fn next_flush(&self, options: &EventOptions) -> Option<Instant> {
        let partial = options
            .partial_line_flush
            .filter(|_| self.lines.len() > 0)
            .map(|after| self.last_growth + after);
        let joined = options
            .multiline
            .as_ref()
            .filter(|_| self.joined.is_some())
            .map(|m| self.last_growth + m.timeout);
        partial.into_iter().chain(joined).min()
    }

    /// Whether everything read was sent (nothing held back).
    pub(crate) fn is_drained(&self) -> bool {
        self.joined.is_none() && self.lines.len() == 0
    }

    /// The position of the event of bytes `start..end`: inode, CRC-32C of the file's first
    /// bytes up to `end` (at most 1 KiB; bytes that cannot change once the event was read, so
    /// the same line read again after a restart gets the same position) and `start`.
    fn position(&mut self, options: &EventOptions, start: u64, end: u64) -> Option<String> {
        options.position_header.as_ref()?;
        let len = end.min(FINGERPRINT_LEN);
        let crc = match self.head_crc {
            Some((covered, crc)) if covered == len => crc,
            _ if self.fingerprint.len == len => self.fingerprint.crc,
            _ => {
                // Only the events of a file's first KiB need a read of their own.
                let head = self.handle.as_ref().map(|file| read_range(file, 0, len));
                match head {
                    Some(Ok(head)) if head.len() as u64 == len => crc32c::crc32c(&head),
                    // Not readable any more: the fingerprint is the best there is.
                    _ => self.fingerprint.crc,
                }
            }
        };
        self.head_crc = Some((len, crc));
        Some(format!("{}-{crc:08x}-{start}", self.key.inode))
    }

    fn push_line(&mut self, batch: &mut Batch<'_>, line: Bytes, start: u64) {
        let end = self.consumed;
        let options = batch.options;
        let Some(multiline) = &options.multiline else {
            let headers = self.headers(batch);
            let position = self.position(options, start, end);
            batch.push(headers, line, start, position);
            self.committed = end;
            return;
        };
        let continues = match &multiline.joining {
            Joining::Start(pattern) => !pattern.is_match(&line),
            Joining::Continuation(pattern) => pattern.is_match(&line),
        };
        let fits = self.joined.as_ref().is_some_and(|joined| {
            joined.lines < multiline.max_lines
                && joined.body.len() + 1 + line.len() <= multiline.max_bytes
        });
        if continues
            && fits
            && let Some(joined) = &mut self.joined
        {
            joined.body.push(b'\n');
            joined.body.extend_from_slice(&line);
            joined.lines += 1;
            joined.end = end;
            return;
        }
        // The line starts an event: the one before it is complete. At most one event is
        // made per line, so the batch never overflows.
        self.send_joined(batch);
        self.joined = Some(Joined {
            body: line.to_vec(),
            lines: 1,
            start,
            end,
        });
    }

    fn send_joined(&mut self, batch: &mut Batch<'_>) {
        if let Some(joined) = self.joined.take() {
            let headers = self.headers(batch);
            let position = self.position(batch.options, joined.start, joined.end);
            batch.push(headers, Bytes::from(joined.body), joined.start, position);
            self.committed = joined.end;
        }
    }
}
