//! Splitting a byte stream into lines without copying: one read fills a buffer, and every
//! complete line in it becomes an event body that shares that buffer (`Bytes`), so a read of
//! many lines costs one allocation, not one per line. Used by `netcat`, `exec`, `stdin`,
//! `taildir` and `spooldir`.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// How much room is made in the buffer before each read.
const READ_SIZE: usize = 64 * 1024;

/// A buffer of bytes read but not yet split into lines.
pub(crate) struct LineBuffer {
    buf: BytesMut,
    /// Bytes at the front of `buf` already known to hold no `\n`.
    scanned: usize,
    /// Whether a `\r` before the `\n` is removed too (as Java's `readLine` does).
    strip_cr: bool,
}

impl LineBuffer {
    pub(crate) fn new(strip_cr: bool) -> Self {
        Self {
            buf: BytesMut::new(),
            scanned: 0,
            strip_cr,
        }
    }

    /// Reads once from `reader`; returns the number of bytes read, 0 at end of input.
    /// Cancel-safe: if the future is dropped, no data is lost.
    pub(crate) async fn fill<R: AsyncRead + Unpin + ?Sized>(
        &mut self,
        reader: &mut R,
    ) -> std::io::Result<usize> {
        self.buf.reserve(READ_SIZE);
        reader.read_buf(&mut self.buf).await
    }

    /// Reads once from a blocking `reader` (a file, read on a blocking thread); returns the
    /// number of bytes read, 0 at end of input.
    pub(crate) fn fill_from<R: std::io::Read + ?Sized>(
        &mut self,
        reader: &mut R,
    ) -> std::io::Result<usize> {
        let start = self.buf.len();
        self.buf.resize(start + READ_SIZE, 0);
        let result = loop {
            match reader.read(&mut self.buf[start..]) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                other => break other,
            }
        };
        self.buf.truncate(start + result.as_ref().map_or(0, |n| *n));
        result
    }

    /// Bytes buffered, complete lines and partial tail.
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// Forgets everything buffered.
    pub(crate) fn clear(&mut self) {
        self.buf.clear();
        self.scanned = 0;
    }

    /// Appends bytes read elsewhere.
    pub(crate) fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Length of the next complete line (without its `\n`), if a complete line is buffered.
    pub(crate) fn next_line_len(&mut self) -> Option<usize> {
        match memchr::memchr(b'\n', &self.buf[self.scanned..]) {
            Some(i) => Some(self.scanned + i),
            None => {
                self.scanned = self.buf.len();
                None
            }
        }
    }

    /// Takes the next complete line off the front, without its line ending.
    pub(crate) fn next_line(&mut self) -> Option<Bytes> {
        self.next_line_and_size().map(|(line, _)| line)
    }

    /// Takes the next complete line off the front, without its line ending, with the number
    /// of bytes it took from the input (line ending included).
    pub(crate) fn next_line_and_size(&mut self) -> Option<(Bytes, usize)> {
        let len = self.next_line_len()?;
        Some(self.take_line(len))
    }

    /// Takes a complete line of `len` bytes (found by [`next_line_len`](Self::next_line_len))
    /// and its `\n` off the front, without its line ending, with its size in the input.
    fn take_line(&mut self, len: usize) -> (Bytes, usize) {
        let mut line = self.buf.split_to(len + 1);
        self.scanned = 0;
        line.truncate(len);
        if self.strip_cr && line.last() == Some(&b'\r') {
            line.truncate(len - 1);
        }
        (line.freeze(), len + 1)
    }

    /// Like [`next_line_and_size`](Self::next_line_and_size), but a line longer than `max`
    /// bytes comes in pieces of `max` bytes (the last piece ends at the `\n`), so that input
    /// without line endings never fills memory.
    pub(crate) fn next_line_within(&mut self, max: usize) -> Option<(Bytes, usize)> {
        match self.next_line_len() {
            // The line was found: take it without looking for its end a second time.
            Some(len) if len <= max => Some(self.take_line(len)),
            _ if self.buf.len() > max => {
                let piece = self.buf.split_to(max).freeze();
                // Only bytes known to hold no `\n` are counted in `scanned`.
                self.scanned = self.scanned.saturating_sub(max);
                Some((piece, max))
            }
            _ => None,
        }
    }

    /// Takes everything buffered as one line (a last line without its `\n`), with its size
    /// in the input; `None` if nothing is buffered. Unlike [`take_rest`](Self::take_rest) it
    /// does not look for complete lines first, and keeps a trailing `\r` (more may follow).
    pub(crate) fn take_partial(&mut self) -> Option<(Bytes, usize)> {
        if self.buf.is_empty() {
            return None;
        }
        self.scanned = 0;
        let line = self.buf.split().freeze();
        let size = line.len();
        Some((line, size))
    }

    /// Bytes buffered that are not yet part of a complete line.
    pub(crate) fn partial_len(&mut self) -> usize {
        match self.next_line_len() {
            Some(_) => 0,
            None => self.buf.len(),
        }
    }

    /// At end of input: the last line if it had no line ending.
    pub(crate) fn take_rest(&mut self) -> Option<Bytes> {
        if let Some(line) = self.next_line() {
            return Some(line);
        }
        if self.buf.is_empty() {
            return None;
        }
        self.scanned = 0;
        let mut line = self.buf.split();
        if self.strip_cr && line.last() == Some(&b'\r') {
            line.truncate(line.len() - 1);
        }
        Some(line.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn splits_lines_across_reads_and_keeps_the_partial_tail() {
        let mut reader: &[u8] = b"one\ntw";
        let mut lines = LineBuffer::new(false);
        lines.fill(&mut reader).await.unwrap();
        assert_eq!(lines.next_line().as_deref(), Some(&b"one"[..]));
        assert_eq!(lines.next_line(), None);
        assert_eq!(lines.partial_len(), 2);
        let mut reader: &[u8] = b"o\r\nthree";
        lines.fill(&mut reader).await.unwrap();
        assert_eq!(lines.next_line().as_deref(), Some(&b"two\r"[..]));
        assert_eq!(lines.take_rest().as_deref(), Some(&b"three"[..]));
        assert_eq!(lines.take_rest(), None);
    }

    #[test]
    fn long_lines_come_in_pieces() {
        let mut lines = LineBuffer::new(true);
        lines.push(b"abcdefgh\nij");
        assert_eq!(lines.next_line_within(3), Some((Bytes::from("abc"), 3)));
        assert_eq!(lines.next_line_within(3), Some((Bytes::from("def"), 3)));
        assert_eq!(lines.next_line_within(3), Some((Bytes::from("gh"), 3)));
        assert_eq!(lines.next_line_within(3), None, "`ij` may still grow");
        lines.push(b"kl");
        assert_eq!(lines.next_line_within(3), Some((Bytes::from("ijk"), 3)));
        assert_eq!(lines.partial_len(), 1);
    }

    #[test]
    fn lines_within_the_limit_keep_their_sizes_across_crlf_partial_and_long_lines() {
        let mut lines = LineBuffer::new(true);
        lines.push(b"a\r\nbb\nlonglong\r\n\r\npa");
        let mut taken = Vec::new();
        while let Some((line, size)) = lines.next_line_within(4) {
            taken.push((line, size));
        }
        let expected: [(&str, usize); 6] = [
            ("a", 3),    // `\r\n` stripped, both counted
            ("bb", 3),   // a bare `\n`
            ("long", 4), // a line over the limit comes in pieces ...
            ("long", 4),
            ("", 2), // ... and its `\r\n` ends the last piece
            ("", 2), // an empty CRLF line
        ];
        let expected: Vec<(Bytes, usize)> = expected
            .iter()
            .map(|(line, size)| (Bytes::from(*line), *size))
            .collect();
        assert_eq!(taken, expected);
        assert_eq!(lines.partial_len(), 2, "`pa` waits for its line end");
        lines.push(b"rt\r");
        assert_eq!(
            lines.next_line_within(16),
            None,
            "a `\\r` alone ends no line"
        );
        lines.push(b"\nnext\n");
        assert_eq!(lines.next_line_within(16), Some((Bytes::from("part"), 6)));
        assert_eq!(lines.next_line_within(16), Some((Bytes::from("next"), 5)));
        assert_eq!(lines.next_line_within(16), None);
        assert_eq!(lines.len(), 0);
    }

    #[tokio::test]
    async fn strips_carriage_returns_when_asked() {
        let mut reader: &[u8] = b"a\r\nb\r";
        let mut lines = LineBuffer::new(true);
        lines.fill(&mut reader).await.unwrap();
        assert_eq!(lines.next_line().as_deref(), Some(&b"a"[..]));
        assert_eq!(lines.take_rest().as_deref(), Some(&b"b"[..]));
    }
}
