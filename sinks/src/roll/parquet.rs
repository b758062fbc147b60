//! Parquet files from staged events.
//!
//! A Parquet file keeps its schema and the offsets of its row groups in a footer written last,
//! so it cannot grow batch by batch and survive a crash the way the staging file does. Its
//! events are staged as `json` lines instead (see [`super::format`]) and converted here at roll,
//! in two passes over the staging file:
//!
//! 1. every line is read for the header names, as the schema must be known before the first
//!    row group is written (this pass also finds a malformed line before anything is written);
//! 2. the lines are read again and written as row groups of at most [`MAX_ROW_GROUP_ROWS`] rows
//!    or about [`MAX_ROW_GROUP_BYTES`] of values, so memory is bounded by one row group
//!    whatever the size of the file.
//!
//! The schema: the header columns in the order of their names, then `body`:
//!
//! | column               | type                                 | value                        |
//! |----------------------|--------------------------------------|------------------------------|
//! | one per header name  | `optional binary (STRING)`           | the header, null if absent   |
//! | `body`               | `required binary (STRING)`           | the body                     |
//!
//! A header named `body` becomes the column `header_body` (`header_header_body` if a header
//! `header_body` is there too, and so on). The body is written as its bytes: a body that is not
//! UTF-8 is kept byte for byte, though readers that check `STRING` values may refuse it
//! (pyarrow reads the file, but its full validation and conversion to Python strings fail on
//! that value; cast to `binary` it gives the bytes).

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use parquet::basic::{LogicalType, Repetition, Type as PhysicalType, ZstdLevel};
use parquet::column::writer::ColumnWriter;
use parquet::data_type::ByteArray;
use parquet::errors::ParquetError;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::{Type, TypePtr};

use super::format::{Compression, decode_json_line};

/// The most rows in a row group.
const MAX_ROW_GROUP_ROWS: usize = 100_000;

/// About the most bytes of values (headers and bodies, before encoding) in a row group.
const MAX_ROW_GROUP_BYTES: usize = 64 << 20;

/// zstd's level in column chunks: the `zstd` tool's default, as for `json` and `text` files.
const ZSTD_LEVEL: i32 = 3;

/// Turns a staging file of `json` lines (written by [`super::format::encode_chunk`] with
/// `Format::Parquet`) into a Parquet file at `output` (see the module doc for the schema),
/// its columns compressed with `compression`, and fsyncs it. Returns the number of rows.
///
/// The same input gives the same bytes. Bodies are written as their bytes, so a body that is
/// not UTF-8 is kept byte for byte in its `STRING` column. A malformed line is an
/// [`io::ErrorKind::InvalidData`] error naming the file and the line, found before `output` is
/// created; after another error `output` may be left incomplete.
pub(crate) fn staging_to_parquet(
    input: &Path,
    output: &Path,
    compression: Compression,
) -> io::Result<u64> {
    let limits = RowGroupLimits {
        rows: MAX_ROW_GROUP_ROWS,
        bytes: MAX_ROW_GROUP_BYTES,
    };
    convert(input, output, compression, limits)
}

/// When a row group is full: whichever limit is reached first.
#[derive(Debug, Clone, Copy)]
struct RowGroupLimits {
    rows: usize,
    bytes: usize,
}

fn convert(
    input: &Path,
    output: &Path,
    compression: Compression,
    limits: RowGroupLimits,
) -> io::Result<u64> {
    let columns = header_columns(input)?;
    let schema = schema(&columns)?;
    let properties = Arc::new(writer_properties(compression)?);
    let file = File::create(output).map_err(|e| with_path(e, "cannot create", output))?;
    let mut writer = SerializedFileWriter::new(BufWriter::new(file), schema, properties)?;

    let mut group = RowGroupBuffer::new(columns.len());
    let mut rows = 0;
    for_each_line(input, |headers, body| {
        group.push(&columns, &headers, &body)?;
        rows += 1;
        if group.rows >= limits.rows || group.bytes >= limits.bytes {
            group.write(&mut writer)?;
        }
        Ok(())
    })?;
    if group.rows > 0 {
        group.write(&mut writer)?;
    }

    let file = writer
        .into_inner()?
        .into_inner()
        .map_err(|e| e.into_error())?;
    file.sync_all()?;
    Ok(rows)
}

/// A header and the column that holds it.
#[derive(Debug)]
struct HeaderColumn {
    header: String,
    column: String,
}

/// Pass 1: the header columns of the file, in the order of their column names.
fn header_columns(input: &Path) -> io::Result<Vec<HeaderColumn>> {
    let mut names = BTreeSet::new();
    for_each_line(input, |headers, _| {
        names.extend(
            headers
                .into_keys()
                .map(ferry_core::CompactString::into_string),
        );
        Ok(())
    })?;
    let mut columns: Vec<HeaderColumn> = names
        .iter()
        .map(|header| {
            let mut column = header.clone();
            if column == "body" {
                // Prefixed until it names no other header.
                while column == "body" || names.contains(&column) {
                    column.insert_str(0, "header_");
                }
            }
            HeaderColumn {
                header: header.clone(),
                column,
            }
        })
        .collect();
    columns.sort_by(|a, b| a.column.cmp(&b.column));
    Ok(columns)
}

/// Calls `f` with the headers and body of each line of a staging file; a line that does not
/// decode is an error naming the file and the line.
fn for_each_line(
    path: &Path,
    mut f: impl FnMut(ferry_core::HeaderMap, Vec<u8>) -> io::Result<()>,
) -> io::Result<()> {
    let file = File::open(path).map_err(|e| with_path(e, "cannot open", path))?;
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let mut line = Vec::new();
    let mut number = 0_u64;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        number += 1;
        let (headers, body) = decode_json_line(&line).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("staging file {} line {number}: {e}", path.display()),
            )
        })?;
        f(headers, body)?;
    }
}

fn with_path(error: io::Error, action: &str, path: &Path) -> io::Error {
    io::Error::new(
        error.kind(),
        format!("{action} {}: {error}", path.display()),
    )
}

fn schema(columns: &[HeaderColumn]) -> Result<TypePtr, ParquetError> {
    let string = |name: &str, repetition| {
        Type::primitive_type_builder(name, PhysicalType::BYTE_ARRAY)
            .with_repetition(repetition)
            .with_logical_type(Some(LogicalType::String))
            .build()
            .map(Arc::new)
    };
    let mut fields = Vec::with_capacity(columns.len() + 1);
    for column in columns {
        fields.push(string(&column.column, Repetition::OPTIONAL)?);
    }
    fields.push(string("body", Repetition::REQUIRED)?);
    Ok(Arc::new(
        Type::group_type_builder("event")
            .with_fields(fields)
            .build()?,
    ))
}

fn writer_properties(compression: Compression) -> Result<WriterProperties, ParquetError> {
    let codec = match compression {
        Compression::None => parquet::basic::Compression::UNCOMPRESSED,
        Compression::Gzip => parquet::basic::Compression::GZIP(Default::default()),
        Compression::Zstd => parquet::basic::Compression::ZSTD(ZstdLevel::try_new(ZSTD_LEVEL)?),
    };
    Ok(WriterProperties::builder().set_compression(codec).build())
}

/// The rows of one row group, column by column.
struct RowGroupBuffer {
    headers: Vec<ColumnBuffer>,
    body: ColumnBuffer,
    rows: usize,
    /// Bytes of values in the buffers.
    bytes: usize,
}

impl RowGroupBuffer {
    fn new(header_columns: usize) -> Self {
        Self {
            headers: (0..header_columns)
                .map(|_| ColumnBuffer::default())
                .collect(),
            body: ColumnBuffer::default(),
            rows: 0,
            bytes: 0,
        }
    }

    fn push(
        &mut self,
        columns: &[HeaderColumn],
        headers: &ferry_core::HeaderMap,
        body: &[u8],
    ) -> io::Result<()> {
        let mut found = 0;
        for (buffer, column) in self.headers.iter_mut().zip(columns) {
            let value = headers.get(column.header.as_str());
            found += usize::from(value.is_some());
            self.bytes += value.map_or(0, |v| v.len());
            buffer.push(value.map(|v| v.as_bytes()));
        }
        if found != headers.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the staging file changed while it was converted: a header is not in the schema",
            ));
        }
        self.body.push(Some(body));
        self.bytes += body.len();
        self.rows += 1;
        Ok(())
    }

    /// Writes the buffered rows as a row group and empties the buffers.
    fn write<W: Write + Send>(
        &mut self,
        writer: &mut SerializedFileWriter<W>,
    ) -> Result<(), ParquetError> {
        let mut group = writer.next_row_group()?;
        for (buffer, optional) in self
            .headers
            .iter_mut()
            .map(|buffer| (buffer, true))
            .chain([(&mut self.body, false)])
        {
            let mut column = group
                .next_column()?
                .ok_or_else(|| ParquetError::General("fewer columns than buffers".into()))?;
            let ColumnWriter::ByteArrayColumnWriter(typed) = column.untyped() else {
                return Err(ParquetError::General("a column is not BYTE_ARRAY".into()));
            };
            let (values, def_levels) = buffer.take();
            typed.write_batch(&values, optional.then_some(&def_levels[..]), None)?;
            column.close()?;
        }
        group.close()?;
        self.rows = 0;
        self.bytes = 0;
        Ok(())
    }
}

/// The values of one column in a row group: the bytes of its non-null values end to end, so a
/// row group costs a few buffers rather than an allocation per value.
#[derive(Default)]
struct ColumnBuffer {
    data: Vec<u8>,
    /// Where each non-null value ends in `data`.
    ends: Vec<usize>,
    /// Per row: 1 for a value, 0 for null.
    def_levels: Vec<i16>,
}

impl ColumnBuffer {
    fn push(&mut self, value: Option<&[u8]>) {
        match value {
            Some(value) => {
                self.data.extend_from_slice(value);
                self.ends.push(self.data.len());
                self.def_levels.push(1);
            }
            None => self.def_levels.push(0),
        }
    }

    /// The values (slices of one buffer) and definition levels, leaving the buffer empty.
    fn take(&mut self) -> (Vec<ByteArray>, Vec<i16>) {
        let data = Bytes::from(std::mem::take(&mut self.data));
        let mut start = 0;
        let values = self
            .ends
            .drain(..)
            .map(|end| {
                let value = ByteArray::from(data.slice(start..end));
                start = end;
                value
            })
            .collect();
        (values, std::mem::take(&mut self.def_levels))
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use ferry_core::Event;
    use parquet::basic::ConvertedType;
    use parquet::column::reader::ColumnReader;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;

    use super::super::format::{Format, encode_chunk};
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

    /// A staging file of `events`, one batch of each slice.
    fn staging(dir: &Path, batches: &[&[Event]]) -> std::path::PathBuf {
        let path = dir.join("staging");
        let mut out = Vec::new();
        for batch in batches {
            let batch: Vec<&Event> = batch.iter().collect();
            encode_chunk(&mut out, &batch, Format::Parquet, Compression::Zstd, false).unwrap();
        }
        fs::write(&path, out).unwrap();
        path
    }

    /// A Parquet file read back through the column reader API, which (unlike the record API)
    /// returns bytes as they are.
    struct ReadBack {
        /// Per column: name, whether optional, converted type.
        schema: Vec<(String, bool, ConvertedType)>,
        /// Per column, per row: the value or null.
        columns: Vec<Vec<Option<Vec<u8>>>>,
        /// The rows of each row group.
        row_groups: Vec<usize>,
        /// The codecs of the column chunks, each once.
        codecs: Vec<parquet::basic::Compression>,
    }

    fn read_back(path: &Path) -> ReadBack {
        let reader = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
        let metadata = reader.metadata();
        let descr = metadata.file_metadata().schema_descr();
        let schema: Vec<_> = descr
            .columns()
            .iter()
            .map(|c| {
                let optional = c.self_type().get_basic_info().repetition() == Repetition::OPTIONAL;
                (c.name().to_string(), optional, c.converted_type())
            })
            .collect();
        let mut columns = vec![Vec::new(); schema.len()];
        let mut codecs = Vec::new();
        let mut row_groups = Vec::new();
        for g in 0..reader.num_row_groups() {
            let group = reader.get_row_group(g).unwrap();
            let rows = usize::try_from(group.metadata().num_rows()).unwrap();
            row_groups.push(rows);
            for (c, column) in columns.iter_mut().enumerate() {
                let codec = group.metadata().column(c).compression();
                if !codecs.contains(&codec) {
                    codecs.push(codec);
                }
                let ColumnReader::ByteArrayColumnReader(mut typed) =
                    group.get_column_reader(c).unwrap()
                else {
                    panic!("column {c} is not BYTE_ARRAY");
                };
                let (mut values, mut def_levels) = (Vec::new(), Vec::new());
                let (records, _, _) = typed
                    .read_records(rows, Some(&mut def_levels), None, &mut values)
                    .unwrap();
                assert_eq!(records, rows);
                let mut values = values.into_iter();
                if schema[c].1 {
                    for level in def_levels {
                        column.push((level == 1).then(|| values.next().unwrap().data().to_vec()));
                    }
                } else {
                    column.extend(values.map(|v| Some(v.data().to_vec())));
                }
            }
        }
        ReadBack {
            schema,
            columns,
            row_groups,
            codecs,
        }
    }

    fn some(s: &str) -> Option<Vec<u8>> {
        Some(s.as_bytes().to_vec())
    }

    #[test]
    fn a_column_per_header_sorted_then_the_body_with_nulls_where_a_header_is_absent() {
        let dir = tempfile::tempdir().unwrap();
        let input = staging(
            dir.path(),
            &[
                &[event(&[("host", "a"), ("file", "x.log")], b"one")],
                &[
                    event(&[], b"two"),
                    event(
                        &[("body", "header named body"), ("a.b", "dotted")],
                        &[0xff, 0xfe],
                    ),
                ],
            ],
        );
        let output = dir.path().join("out.parquet");
        let rows = staging_to_parquet(&input, &output, Compression::None).unwrap();
        assert_eq!(rows, 3);

        let read = read_back(&output);
        let names: Vec<_> = read.schema.iter().map(|(n, ..)| n.as_str()).collect();
        assert_eq!(names, ["a.b", "file", "header_body", "host", "body"]);
        assert!(read.schema[..4].iter().all(|(_, optional, _)| *optional));
        assert!(!read.schema[4].1, "body is required");
        assert!(read.schema.iter().all(|(.., t)| *t == ConvertedType::UTF8));
        assert_eq!(read.row_groups, [3]);
        assert_eq!(
            read.columns,
            [
                vec![None, None, some("dotted")],
                vec![some("x.log"), None, None],
                vec![None, None, some("header named body")],
                vec![some("a"), None, None],
                vec![some("one"), some("two"), Some(vec![0xff, 0xfe])],
            ]
        );
    }

    #[test]
    fn a_header_column_never_takes_the_name_of_another() {
        let dir = tempfile::tempdir().unwrap();
        let input = staging(
            dir.path(),
            &[&[event(&[("body", "1"), ("header_body", "2")], b"x")]],
        );
        let output = dir.path().join("out.parquet");
        staging_to_parquet(&input, &output, Compression::None).unwrap();
        let read = read_back(&output);
        let names: Vec<_> = read.schema.iter().map(|(n, ..)| n.as_str()).collect();
        assert_eq!(names, ["header_body", "header_header_body", "body"]);
        assert_eq!(read.columns[0], [some("2")]);
        assert_eq!(read.columns[1], [some("1")]);
    }

    #[test]
    fn rows_read_back_through_the_record_api() {
        let dir = tempfile::tempdir().unwrap();
        let input = staging(
            dir.path(),
            &[&[
                event(&[("k", "v")], b"first"),
                event(&[], "é \"q\"".as_bytes()),
            ]],
        );
        let output = dir.path().join("out.parquet");
        staging_to_parquet(&input, &output, Compression::Gzip).unwrap();
        let reader = SerializedFileReader::new(File::open(&output).unwrap()).unwrap();
        let rows: Vec<Vec<(String, Field)>> = reader
            .get_row_iter(None)
            .unwrap()
            .map(|row| {
                row.unwrap()
                    .get_column_iter()
                    .map(|(name, field)| (name.clone(), field.clone()))
                    .collect()
            })
            .collect();
        assert_eq!(
            rows,
            [
                vec![
                    ("k".to_string(), Field::Str("v".into())),
                    ("body".to_string(), Field::Str("first".into())),
                ],
                vec![
                    ("k".to_string(), Field::Null),
                    ("body".to_string(), Field::Str("é \"q\"".into())),
                ],
            ]
        );
    }

    #[test]
    fn row_groups_are_bounded_by_rows_and_by_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let events: Vec<Event> = (0..10)
            .map(|i| {
                let headers = if i % 3 == 0 {
                    vec![("n", "third")]
                } else {
                    vec![]
                };
                event(&headers, format!("event {i}").as_bytes())
            })
            .collect();
        let input = staging(dir.path(), &[&events[..4], &events[4..]]);
        let bodies: Vec<_> = (0..10).map(|i| some(&format!("event {i}"))).collect();
        let thirds: Vec<_> = (0..10)
            .map(|i| (i % 3 == 0).then(|| b"third".to_vec()))
            .collect();

        let limits = |rows, bytes| RowGroupLimits { rows, bytes };
        for (limits, row_groups) in [
            (limits(3, usize::MAX), vec![3, 3, 3, 1]),
            // "event i" is 7 bytes, "third" 5: 19 bytes are reached by the second row after
            // a row with the header, by the third otherwise.
            (limits(usize::MAX, 19), vec![2, 2, 3, 3]),
            (limits(10, usize::MAX), vec![10]),
            (limits(usize::MAX, usize::MAX), vec![10]),
        ] {
            let output = dir.path().join("out.parquet");
            let rows = convert(&input, &output, Compression::Zstd, limits).unwrap();
            assert_eq!(rows, 10);
            let read = read_back(&output);
            assert_eq!(read.row_groups, row_groups, "{limits:?}");
            assert_eq!(read.columns, [thirds.clone(), bodies.clone()], "{limits:?}");
        }
    }

    #[test]
    fn an_empty_staging_file_gives_no_rows_and_only_the_body_column() {
        let dir = tempfile::tempdir().unwrap();
        let input = staging(dir.path(), &[]);
        let output = dir.path().join("out.parquet");
        assert_eq!(
            staging_to_parquet(&input, &output, Compression::Zstd).unwrap(),
            0
        );
        let read = read_back(&output);
        assert_eq!(
            read.schema,
            [("body".to_string(), false, ConvertedType::UTF8)]
        );
        assert!(read.row_groups.is_empty());
        let reader = SerializedFileReader::new(File::open(&output).unwrap()).unwrap();
        assert_eq!(reader.metadata().file_metadata().num_rows(), 0);
    }

    #[test]
    fn columns_are_compressed_as_asked_and_the_same_input_gives_the_same_bytes() {
        use parquet::basic::Compression as Codec;
        let dir = tempfile::tempdir().unwrap();
        let events: Vec<Event> = (0..1000)
            .map(|i| {
                event(
                    &[("host", "web-1"), ("n", &i.to_string())],
                    b"the same body",
                )
            })
            .collect();
        let input = staging(dir.path(), &[&events]);
        let mut sizes = Vec::new();
        for (compression, codec) in [
            (Compression::None, Codec::UNCOMPRESSED),
            (Compression::Gzip, Codec::GZIP(Default::default())),
            (
                Compression::Zstd,
                Codec::ZSTD(ZstdLevel::try_new(ZSTD_LEVEL).unwrap()),
            ),
        ] {
            let (a, b) = (dir.path().join("a.parquet"), dir.path().join("b.parquet"));
            convert(
                &input,
                &a,
                compression,
                RowGroupLimits {
                    rows: 300,
                    bytes: usize::MAX,
                },
            )
            .unwrap();
            convert(
                &input,
                &b,
                compression,
                RowGroupLimits {
                    rows: 300,
                    bytes: usize::MAX,
                },
            )
            .unwrap();
            let bytes = fs::read(&a).unwrap();
            assert_eq!(bytes, fs::read(&b).unwrap(), "{compression:?}");
            sizes.push(bytes.len());
            let read = read_back(&a);
            assert_eq!(read.row_groups, [300, 300, 300, 100]);
            // The reader reports the codec, not the level it was written with.
            let codec = match codec {
                Codec::GZIP(_) => Codec::GZIP(Default::default()),
                Codec::ZSTD(_) => Codec::ZSTD(Default::default()),
                other => other,
            };
            assert_eq!(read.codecs, [codec], "{compression:?}");
            assert_eq!(read.columns[1][999], some("999"));
        }
        assert!(sizes[1] < sizes[0] && sizes[2] < sizes[0], "{sizes:?}");
    }

    #[test]
    fn a_malformed_line_is_invalid_data_naming_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let input = staging(dir.path(), &[&[event(&[], b"fine"), event(&[], b"fine")]]);
        let mut bytes = fs::read(&input).unwrap();
        bytes.extend_from_slice(b"{\"headers\":{},\"body\":\"cut\n");
        fs::write(&input, bytes).unwrap();
        let output = dir.path().join("out.parquet");
        let error = staging_to_parquet(&input, &output, Compression::None).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        let message = error.to_string();
        assert!(
            message.contains(&format!("staging file {} line 3:", input.display())),
            "{message}"
        );
        assert!(
            !output.exists(),
            "found in the first pass, before the output is created"
        );
    }
}
