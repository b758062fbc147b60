//! [`HeaderMap`]: an event's headers as one vector of pairs kept in key order.
//!
//! An event has a handful of headers (a tailed line two or three, a Kafka record six or
//! seven). In one vector they cost one allocation, are found by a binary search over a few
//! entries and are dropped without walking tree nodes; a `BTreeMap` allocates a node of eleven
//! slots and walks it on every insert and drop. The methods are those of a map, named as on
//! `BTreeMap`.

use std::borrow::Borrow;
use std::fmt;

use compact_str::CompactString;

/// Header names to values, in key order, each name once.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HeaderMap {
    /// Sorted by key, keys unique.
    entries: Vec<(CompactString, CompactString)>,
}

impl HeaderMap {
    /// An empty map (no allocation).
    pub const fn new() -> Self {
        Self {
            entries: Vec::new(),
        }
    }

    /// An empty map with room for `capacity` headers.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            entries: Vec::with_capacity(capacity),
        }
    }

    /// Number of headers.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no headers.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn position(&self, key: &str) -> Result<usize, usize> {
        self.entries.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }

    /// The value of header `key`.
    pub fn get<Q: Borrow<str> + ?Sized>(&self, key: &Q) -> Option<&CompactString> {
        let index = self.position(key.borrow()).ok()?;
        Some(&self.entries[index].1)
    }

    /// The value of header `key`, to change in place.
    pub fn get_mut<Q: Borrow<str> + ?Sized>(&mut self, key: &Q) -> Option<&mut CompactString> {
        let index = self.position(key.borrow()).ok()?;
        Some(&mut self.entries[index].1)
    }

    /// Whether header `key` is set.
    pub fn contains_key<Q: Borrow<str> + ?Sized>(&self, key: &Q) -> bool {
        self.position(key.borrow()).is_ok()
    }

    /// Sets header `key`, returning the value it replaces.
    pub fn insert(&mut self, key: CompactString, value: CompactString) -> Option<CompactString> {
        // Headers are often given in order (decoded, or copied from another map).
        if self.entries.last().is_none_or(|(last, _)| *last < key) {
            self.entries.push((key, value));
            return None;
        }
        match self.position(&key) {
            Ok(index) => Some(std::mem::replace(&mut self.entries[index].1, value)),
            Err(index) => {
                self.entries.insert(index, (key, value));
                None
            }
        }
    }

    /// Removes header `key`, returning its value.
    pub fn remove<Q: Borrow<str> + ?Sized>(&mut self, key: &Q) -> Option<CompactString> {
        let index = self.position(key.borrow()).ok()?;
        Some(self.entries.remove(index).1)
    }

    /// Keeps the headers for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&CompactString, &mut CompactString) -> bool) {
        self.entries.retain_mut(|(k, v)| keep(k, v));
    }

    /// Removes every header.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// The headers in key order.
    pub fn iter(&self) -> Iter<'_> {
        Iter(self.entries.iter())
    }

    /// The header names in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &CompactString> + ExactSizeIterator {
        self.entries.iter().map(|(k, _)| k)
    }

    /// The header names in order, taken out of the map.
    pub fn into_keys(self) -> impl DoubleEndedIterator<Item = CompactString> + ExactSizeIterator {
        self.entries.into_iter().map(|(k, _)| k)
    }

    /// The values, in the order of their names.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &CompactString> + ExactSizeIterator {
        self.entries.iter().map(|(_, v)| v)
    }

    /// The values to change in place, in the order of their names.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut CompactString> {
        self.entries.iter_mut().map(|(_, v)| v)
    }
}

/// The headers of a [`HeaderMap`] in key order, borrowed.
#[derive(Clone, Debug)]
pub struct Iter<'a>(std::slice::Iter<'a, (CompactString, CompactString)>);

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a CompactString, &'a CompactString);

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|(k, v)| (k, v))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.0.next_back().map(|(k, v)| (k, v))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a HeaderMap {
    type Item = (&'a CompactString, &'a CompactString);
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl IntoIterator for HeaderMap {
    type Item = (CompactString, CompactString);
    type IntoIter = std::vec::IntoIter<(CompactString, CompactString)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl<K: Into<CompactString>, V: Into<CompactString>> Extend<(K, V)> for HeaderMap {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        for (k, v) in iter {
            self.insert(k.into(), v.into());
        }
    }
}

impl<K: Into<CompactString>, V: Into<CompactString>> FromIterator<(K, V)> for HeaderMap {
    /// A name given twice keeps its last value, as inserting one by one would.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut entries: Vec<(CompactString, CompactString)> = iter
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        if !entries.is_sorted_by(|a, b| a.0 < b.0) {
            // A stable sort keeps the pairs of one name in the order given; reversed, the
            // last one given comes first in its run, which is the one `dedup_by` keeps.
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            entries.reverse();
            entries.dedup_by(|pair, kept| pair.0 == kept.0);
            entries.reverse();
        }
        Self { entries }
    }
}

impl<Q: Borrow<str> + ?Sized> std::ops::Index<&Q> for HeaderMap {
    type Output = CompactString;

    /// The value of header `key`; panics when it is not set (as a map's index does).
    fn index(&self, key: &Q) -> &CompactString {
        match self.get(key) {
            Some(value) => value,
            None => panic!("no header {:?}", key.borrow()),
        }
    }
}

impl fmt::Debug for HeaderMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl serde::Serialize for HeaderMap {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> serde::Deserialize<'de> for HeaderMap {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = HeaderMap;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of header names to string values")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut access: A,
            ) -> Result<HeaderMap, A::Error> {
                let mut map = HeaderMap::with_capacity(access.size_hint().unwrap_or(0).min(64));
                while let Some((k, v)) = access.next_entry::<CompactString, CompactString>()? {
                    map.insert(k, v);
                }
                Ok(map)
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs.iter().copied().collect()
    }

    #[test]
    fn keeps_keys_in_order_once_and_finds_them() {
        let mut m = HeaderMap::new();
        for (k, v) in [
            ("topic", "t"),
            ("offset", "7"),
            ("file", "a.log"),
            ("host", "h"),
        ] {
            assert_eq!(m.insert(k.into(), v.into()), None);
        }
        assert_eq!(m.insert("offset".into(), "8".into()).as_deref(), Some("7"));
        let keys: Vec<&str> = m.keys().map(|k| k.as_str()).collect();
        assert_eq!(keys, ["file", "host", "offset", "topic"]);
        assert_eq!(m.get("offset").map(|v| v.as_str()), Some("8"));
        assert_eq!(&m["file"], "a.log");
        assert!(m.contains_key("host") && !m.contains_key("key"));
        assert_eq!(m.remove("host").as_deref(), Some("h"));
        assert_eq!(m.remove("host"), None);
        m.retain(|k, _| k != "topic");
        assert_eq!(m, map(&[("file", "a.log"), ("offset", "8")]));
    }

    #[test]
    fn collecting_sorts_and_keeps_the_last_value_of_a_name_given_twice() {
        let m = map(&[("b", "1"), ("a", "2"), ("b", "3"), ("c", "4"), ("a", "5")]);
        let pairs: Vec<(&str, &str)> = m.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(pairs, [("a", "5"), ("b", "3"), ("c", "4")]);
        let mut by_insert = HeaderMap::new();
        by_insert.extend([("b", "1"), ("a", "2"), ("b", "3"), ("c", "4"), ("a", "5")]);
        assert_eq!(by_insert, m);
    }

    #[test]
    fn reads_and_writes_as_a_json_object() {
        let m = map(&[("host", "web-1"), ("app", "api")]);
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json, r#"{"app":"api","host":"web-1"}"#);
        let back: HeaderMap =
            serde_json::from_str(r#"{"host":"web-1","app":"api","host":"x"}"#).unwrap();
        assert_eq!(back, map(&[("app", "api"), ("host", "x")]));
        assert!(serde_json::from_str::<HeaderMap>(r#"{"a":1}"#).is_err());
    }
}
