//! The unit of data: an [`Event`] is Flume's event, string headers plus an opaque body.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use bytes::Bytes;
pub use compact_str::{CompactString, ToCompactString, format_compact};

/// Event headers: string keys to string values, as in Flume, in key order (so output that
/// prints headers is deterministic).
///
/// Keys and values are [`CompactString`]s: a string of up to 24 bytes (a header name, a
/// topic, a partition, an offset, a timestamp) is stored inline, without an allocation of its
/// own; a longer one is on the heap as a `String` would be. `CompactString` derefs to `str`
/// and converts from `&str`, `String` and integers (`to_compact_string`).
///
/// The map is shared and copied on write: cloning `Headers` costs a reference count, not an
/// allocation, so the events of one tailed file (or of one decoded channel batch) can carry
/// the same headers for the price of one map. Reading goes through `Deref` to the
/// [`HeaderMap`] (a map kept as one sorted vector); changing it (`insert`, `remove`, ... through `DerefMut`) first copies the map
/// if another event shares it.
///
/// ```
/// use ferry_core::Headers;
/// let mut a = Headers::new();
/// a.insert("file".into(), "/var/log/app.log".into());
/// let mut b = a.clone(); // shares a's map
/// assert!(a.shares_with(&b));
/// b.insert("host".into(), "web-1".into()); // b gets its own copy
/// assert_eq!(a.len(), 1);
/// assert_eq!(b.get("host").map(|v| v.as_str()), Some("web-1"));
/// ```
///
/// No headers at all cost no allocation.
#[derive(Clone, Default)]
pub struct Headers(Option<Arc<HeaderMap>>);

pub use crate::header_map::HeaderMap;

/// What empty `Headers` read as.
static EMPTY: HeaderMap = HeaderMap::new();

impl Headers {
    /// No headers.
    pub const fn new() -> Self {
        Self(None)
    }

    /// Whether `self` and `other` are the same shared map (then they are equal without
    /// comparing a single header).
    pub fn shares_with(&self, other: &Headers) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }

    /// Whether another `Headers` shares this map (a change would copy it first).
    pub fn is_shared(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|map| Arc::strong_count(map) > 1)
    }

    /// A header's value as a `&str`.
    pub fn value(&self, key: &str) -> Option<&str> {
        self.get(key).map(CompactString::as_str)
    }

    /// Sets a header from anything that converts into a [`CompactString`] (`&str`, `String`,
    /// ...), returning the value it replaces.
    pub fn set(
        &mut self,
        key: impl Into<CompactString>,
        value: impl Into<CompactString>,
    ) -> Option<CompactString> {
        self.insert(key.into(), value.into())
    }
}

impl Deref for Headers {
    type Target = HeaderMap;

    fn deref(&self) -> &Self::Target {
        self.0.as_deref().unwrap_or(&EMPTY)
    }
}

impl DerefMut for Headers {
    /// Copies the map first if another `Headers` shares it.
    fn deref_mut(&mut self) -> &mut Self::Target {
        Arc::make_mut(self.0.get_or_insert_with(Default::default))
    }
}

impl PartialEq for Headers {
    fn eq(&self, other: &Self) -> bool {
        self.shares_with(other) || **self == **other
    }
}

impl Eq for Headers {}

impl std::hash::Hash for Headers {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

impl std::fmt::Debug for Headers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl From<HeaderMap> for Headers {
    fn from(map: HeaderMap) -> Self {
        Self((!map.is_empty()).then(|| Arc::new(map)))
    }
}

impl From<BTreeMap<String, String>> for Headers {
    fn from(map: BTreeMap<String, String>) -> Self {
        map.into_iter().collect()
    }
}

impl<K: Into<CompactString>, V: Into<CompactString>> FromIterator<(K, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<HeaderMap>())
    }
}

impl<K: Into<CompactString>, V: Into<CompactString>> Extend<(K, V)> for Headers {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        (**self).extend(iter.into_iter().map(|(k, v)| (k.into(), v.into())));
    }
}

impl<'a> IntoIterator for &'a Headers {
    type Item = (&'a CompactString, &'a CompactString);
    type IntoIter = crate::header_map::Iter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        (**self).iter()
    }
}

impl IntoIterator for Headers {
    type Item = (CompactString, CompactString);
    type IntoIter = std::vec::IntoIter<(CompactString, CompactString)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0
            .map(Arc::unwrap_or_clone)
            .unwrap_or_default()
            .into_iter()
    }
}

impl serde::Serialize for Headers {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(serializer)
    }
}

impl<'de> serde::Deserialize<'de> for Headers {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        HeaderMap::deserialize(deserializer).map(Self::from)
    }
}

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
