//! The unit of data: an [`Event`] is Flume's event, string headers plus an opaque body.

use std::collections::BTreeMap;

use bytes::Bytes;

/// Event headers: string keys to string values, as in Flume.
///
/// A `BTreeMap` keeps header order stable, so output that prints headers is deterministic.
pub type Headers = BTreeMap<String, String>;

/// One event: headers plus a body of bytes.
///
/// The body is `Bytes`, so cloning an event for replicating fan-out does not copy the payload.
///
/// ```
/// use ferry_core::Event;
/// let mut event = Event::from_body("hello");
/// event.headers.insert("host".into(), "web-1".into());
/// assert_eq!(&event.body[..], b"hello");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// Headers, e.g. `timestamp`, `host`, `file`.
    pub headers: Headers,
    /// The payload, passed through untouched (it need not be UTF-8).
    pub body: Bytes,
}

impl Event {
    /// An event with no headers.
    pub fn from_body(body: impl Into<Bytes>) -> Self {
        Self {
            headers: Headers::new(),
            body: body.into(),
        }
    }

    /// An event with headers and body.
    pub fn new(headers: Headers, body: impl Into<Bytes>) -> Self {
        Self {
            headers,
            body: body.into(),
        }
    }

    /// Approximate memory used by this event: body plus header keys and values.
    ///
    /// Channels use it for their `byte_capacity`.
    pub fn byte_size(&self) -> usize {
        self.body.len()
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
    }
}
