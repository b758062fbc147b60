//! Telling files apart across renames, restarts and reused inodes: used by `taildir` and
//! `spooldir`.
//!
//! A file is its device and inode ([`FileKey`]) while it exists; once it is deleted the
//! filesystem may give the inode to a new file. So a saved position also carries a
//! [`Fingerprint`]: the CRC-32C of the first bytes of the file (up to [`FINGERPRINT_LEN`]), and
//! how many bytes that was. A file whose first bytes differ is not the file the position was
//! saved for, whatever its inode. A fingerprint of fewer bytes (the file was shorter when it
//! was taken) is checked against that many bytes and grows as the file does.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};

use serde::{Deserialize, Serialize};

/// How many leading bytes of a file its fingerprint covers at most.
pub(crate) const FINGERPRINT_LEN: u64 = 1024;

/// Device and inode of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct FileKey {
    pub(crate) dev: u64,
    pub(crate) inode: u64,
}

impl FileKey {
    pub(crate) fn of(metadata: &std::fs::Metadata) -> Self {
        Self {
            dev: metadata.dev(),
            inode: metadata.ino(),
        }
    }
}

/// CRC-32C of the first `len` bytes of a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Fingerprint {
    /// Bytes covered, at most [`FINGERPRINT_LEN`].
    #[serde(rename = "fp_len")]
    pub(crate) len: u64,
    /// Their CRC-32C.
    #[serde(rename = "fp_crc")]
    pub(crate) crc: u32,
}

impl Fingerprint {
    /// The fingerprint of `file`, whose size is `size`.
    pub(crate) fn of(file: &File, size: u64) -> io::Result<Self> {
        let len = size.min(FINGERPRINT_LEN);
        let head = read_head(file, len)?;
        Ok(Self {
            len: head.len() as u64,
            crc: crc32c::crc32c(&head),
        })
    }

    /// Checks that `file` (of size `size`) starts with the bytes this fingerprint was taken
    /// of; if so, returns the fingerprint grown to the file's current size.
    pub(crate) fn verify(&self, file: &File, size: u64) -> io::Result<Option<Self>> {
        if size < self.len {
            return Ok(None);
        }
        let head = read_head(file, size.min(FINGERPRINT_LEN).max(self.len))?;
        if (head.len() as u64) < self.len {
            return Ok(None);
        }
        let covered = usize::try_from(self.len).unwrap_or(usize::MAX);
        if crc32c::crc32c(&head[..covered]) != self.crc {
            return Ok(None);
        }
        Ok(Some(Self {
            len: head.len() as u64,
            crc: crc32c::crc32c(&head),
        }))
    }
}

/// Reads up to `len` bytes from the start of `file`, without moving its position.
fn read_head(file: &File, len: u64) -> io::Result<Vec<u8>> {
    read_range(file, 0, len)
}

/// Reads up to `len` bytes of `file` from `offset` (fewer at its end), without moving its
/// position.
pub(crate) fn read_range(file: &File, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    let mut bytes = vec![0; usize::try_from(len).unwrap_or(0)];
    let mut filled = 0;
    while filled < bytes.len() {
        match file.read_at(&mut bytes[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    bytes.truncate(filled);
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn fingerprint_grows_with_the_file_and_rejects_other_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        std::fs::write(&path, b"hello\n").unwrap();
        let file = File::open(&path).unwrap();
        let small = Fingerprint::of(&file, 6).unwrap();
        assert_eq!(small.len, 6);
        let mut writer = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        writer.write_all(&[b'x'; 2000]).unwrap();
        let grown = small.verify(&file, 2006).unwrap().unwrap();
        assert_eq!(grown.len, FINGERPRINT_LEN);
        assert_eq!(grown, Fingerprint::of(&file, 2006).unwrap());
        assert_eq!(grown.verify(&file, 2006).unwrap(), Some(grown));
        std::fs::write(&path, b"HELLO\n and more").unwrap();
        assert_eq!(small.verify(&file, 15).unwrap(), None, "other content");
        assert_eq!(grown.verify(&file, 15).unwrap(), None, "shorter file");
    }
}
