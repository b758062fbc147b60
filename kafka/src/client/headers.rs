//! Flume headers ↔ Kafka record headers. A Flume header is a string pair; a Kafka header's
//! value is bytes, read back as UTF-8 (lossy) and an absent value as the empty string.

use ferry_core::{Bytes, CompactString, Event, HeaderMap, Headers};
use rdkafka::message::{Header, Headers as _, Message, OwnedHeaders};

/// The Kafka record headers of `event`'s Flume headers.
pub(crate) fn record_headers(event: &Event) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new_with_capacity(event.headers.len());
    for (key, value) in &event.headers {
        headers = headers.insert(Header {
            key,
            value: Some(value.as_bytes()),
        });
    }
    headers
}

/// An event of `message`'s payload, with its Kafka headers as Flume headers when
/// `with_headers`.
pub(crate) fn event_of(message: &impl Message, with_headers: bool) -> Event {
    let headers = if with_headers {
        Headers::from(header_map(message, 0))
    } else {
        Headers::new()
    };
    Event::new(headers, body_of(message))
}

/// `message`'s payload, copied out of librdkafka's buffer.
pub(crate) fn body_of(message: &impl Message) -> Bytes {
    message
        .payload()
        .map(Bytes::copy_from_slice)
        .unwrap_or_default()
}

/// `message`'s Kafka headers as Flume headers, with room for `extra` more.
pub(crate) fn header_map(message: &impl Message, extra: usize) -> HeaderMap {
    let Some(headers) = message.headers() else {
        return HeaderMap::with_capacity(extra);
    };
    let mut map = HeaderMap::with_capacity(headers.count() + extra);
    for header in headers.iter() {
        let value = header
            .value
            .map(CompactString::from_utf8_lossy)
            .unwrap_or_default();
        map.insert(header.key.into(), value);
    }
    map
}

#[cfg(test)]
mod tests {
    use rdkafka::Timestamp;
    use rdkafka::message::OwnedMessage;

    use super::*;

    #[test]
    fn flume_headers_survive_a_round_trip_through_record_headers() {
        let mut event = Event::from_body("body");
        event.headers.insert("app".into(), "web".into());
        event.headers.insert("é".into(), "ü".into());
        let headers = record_headers(&event);
        let message = OwnedMessage::new(
            Some(b"body".to_vec()),
            None,
            "t".into(),
            Timestamp::NotAvailable,
            0,
            0,
            Some(headers),
        );
        assert_eq!(event_of(&message, true), event);
        let bare = event_of(&message, false);
        assert!(bare.headers.is_empty());
        assert_eq!(bare.body, event.body);
    }
}
