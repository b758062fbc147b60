//! How events become bytes in a file: Flume's `TEXT` and `HEADER_AND_TEXT` serializers.

use ferry_core::Event;
use serde::Deserialize;

/// The event serializer of a `file_roll` sink.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SerializerKind {
    /// The body (Flume's `TEXT`).
    #[default]
    Text,
    /// Headers as `{k=v, ...}`, a space, the body (Flume's `HEADER_AND_TEXT`).
    HeaderAndText,
}

/// Appends a whole batch to `out`.
pub(super) fn write_batch<'a>(
    out: &mut Vec<u8>,
    events: impl IntoIterator<Item = &'a Event>,
    kind: SerializerKind,
    append_newline: bool,
) {
    for event in events {
        if kind == SerializerKind::HeaderAndText {
            crate::push_java_map(out, &event.headers);
            out.push(b' ');
        }
        out.extend_from_slice(&event.body);
        if append_newline {
            out.push(b'\n');
        }
    }
}
