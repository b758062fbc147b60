//! Flume headers ↔ Kafka record headers. A Flume header is a string pair; a Kafka header's
//! value is bytes, read back as UTF-8 (lossy) and an absent value as the empty string.

use ferry_core::{CompactString, Event};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};

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
    let mut event = Event::from_body(message.payload().map(<[u8]>::to_vec).unwrap_or_default());
    if with_headers && let Some(headers) = message.headers() {
        for header in headers.iter() {
            let value = header
                .value
                .map(CompactString::from_utf8_lossy)
                .unwrap_or_default();
            event.headers.insert(header.key.into(), value);
        }
    }
    event
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
