//! The counters the request path bumps: relaxed atomics, once per batch, per topic of a
//! fetch, per request or per connection, never per record. Nothing here takes a lock; readers
//! ([`super::BrokerObserver`]) load them when asked.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use kafka_protocol::messages::ApiKey;

/// Upper bounds of the request latency buckets, in milliseconds (the last bucket, +Inf, is
/// implicit).
pub(crate) const LATENCY_BUCKETS_MS: [f64; 14] = [
    0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
];

/// Error codes counted one by one: -1 (UNKNOWN_SERVER_ERROR) to `ERROR_SLOTS - 2`; any other
/// code is counted in the last slot.
const ERROR_SLOTS: usize = 160;

/// Traffic of one topic, as Kafka's `BytesInPerSec`/`BytesOutPerSec`/`MessagesInPerSec`.
#[derive(Debug, Default)]
pub(crate) struct TopicCounters {
    pub(crate) bytes_in: AtomicU64,
    pub(crate) records_in: AtomicU64,
    pub(crate) bytes_out: AtomicU64,
    pub(crate) records_out: AtomicU64,
}

impl TopicCounters {
    /// Counts an append of `records` records in `bytes` bytes.
    pub(crate) fn produced(&self, bytes: u64, records: u64) {
        self.bytes_in.fetch_add(bytes, Relaxed);
        self.records_in.fetch_add(records, Relaxed);
    }

    /// Counts `bytes` of batches holding `records` offsets sent to a consumer.
    pub(crate) fn fetched(&self, bytes: u64, records: u64) {
        self.bytes_out.fetch_add(bytes, Relaxed);
        self.records_out.fetch_add(records, Relaxed);
    }
}

/// The connections of one listener.
#[derive(Debug)]
pub(crate) struct ListenerCounters {
    pub(crate) name: String,
    pub(crate) accepted: AtomicU64,
    pub(crate) closed: AtomicU64,
    /// Connections refused by a connection limit or for want of file descriptors.
    pub(crate) refused: AtomicU64,
    /// Connections closed because a request could not be made sense of.
    pub(crate) malformed: AtomicU64,
    /// Connections closed because a request did not arrive whole within
    /// `request_receive_timeout_ms` of its first byte.
    pub(crate) receive_timeouts: AtomicU64,
    /// Connections closed because a request before SASL authentication was larger than
    /// `sasl_server_max_receive_size`.
    pub(crate) unauthenticated_too_large: AtomicU64,
    /// Connections closed because their TLS handshake was not done within
    /// `ssl_handshake_timeout_ms`.
    pub(crate) handshake_timeouts: AtomicU64,
    /// Connections closed because they had not authenticated within
    /// `sasl_authentication_timeout_ms`.
    pub(crate) authentication_timeouts: AtomicU64,
}

impl ListenerCounters {
    pub(crate) fn new(name: String) -> Self {
        ListenerCounters {
            name,
            accepted: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            receive_timeouts: AtomicU64::new(0),
            unauthenticated_too_large: AtomicU64::new(0),
            handshake_timeouts: AtomicU64::new(0),
            authentication_timeouts: AtomicU64::new(0),
        }
    }
}

/// The requests of one API.
#[derive(Debug)]
pub(crate) struct ApiCounters {
    pub(crate) key: ApiKey,
    pub(crate) requests: AtomicU64,
    /// Per error code (see [`ERROR_SLOTS`]).
    errors: Box<[AtomicU64]>,
    /// Per latency bucket, the +Inf one last; not cumulative.
    buckets: [AtomicU64; LATENCY_BUCKETS_MS.len() + 1],
    sum_micros: AtomicU64,
}

impl ApiCounters {
    fn new(key: ApiKey) -> Self {
        ApiCounters {
            key,
            requests: AtomicU64::new(0),
            errors: (0..ERROR_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            buckets: Default::default(),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Counts one occurrence of `code` in a response; 0 (NONE) is not an error.
    pub(crate) fn error(&self, code: i16) {
        if code != 0 {
            self.errors[error_slot(code)].fetch_add(1, Relaxed);
        }
    }

    /// Counts a request served in `elapsed`.
    pub(crate) fn served(&self, elapsed: Duration) {
        self.requests.fetch_add(1, Relaxed);
        let ms = elapsed.as_secs_f64() * 1000.0;
        let bucket = LATENCY_BUCKETS_MS
            .iter()
            .position(|le| ms <= *le)
            .unwrap_or(LATENCY_BUCKETS_MS.len());
        self.buckets[bucket].fetch_add(1, Relaxed);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Relaxed);
    }

    /// Each error code seen, with its count, by code.
    pub(crate) fn errors(&self) -> Vec<(i16, u64)> {
        self.errors
            .iter()
            .enumerate()
            .map(|(slot, count)| (slot_code(slot), count.load(Relaxed)))
            .filter(|(_, count)| *count > 0)
            .collect()
    }

    /// The count of each latency bucket (not cumulative, +Inf last) and the sum in
    /// microseconds.
    pub(crate) fn latency(&self) -> ([u64; LATENCY_BUCKETS_MS.len() + 1], u64) {
        (
            std::array::from_fn(|i| self.buckets[i].load(Relaxed)),
            self.sum_micros.load(Relaxed),
        )
    }
}

fn error_slot(code: i16) -> usize {
    usize::try_from(i32::from(code) + 1)
        .ok()
        .filter(|slot| *slot < ERROR_SLOTS - 1)
        .unwrap_or(ERROR_SLOTS - 1)
}

/// The code a slot counts; the last one, for codes out of range, reports as -1's neighbour
/// `i16::MAX` (an unknown code).
fn slot_code(slot: usize) -> i16 {
    if slot == ERROR_SLOTS - 1 {
        return i16::MAX;
    }
    slot as i16 - 1
}

/// The requests of every API served, found by api key without a search.
#[derive(Debug)]
pub(crate) struct RequestCounters {
    apis: Vec<ApiCounters>,
    /// Api key → index in `apis` + 1; 0 for an API not served.
    slots: [u8; 128],
}

impl RequestCounters {
    /// Counters for each of `keys`.
    pub(crate) fn new(keys: impl IntoIterator<Item = ApiKey>) -> Self {
        let mut slots = [0u8; 128];
        let mut apis = Vec::new();
        for key in keys {
            if let Some(slot) = slots.get_mut(key as i16 as usize) {
                apis.push(ApiCounters::new(key));
                *slot = u8::try_from(apis.len()).unwrap_or(0);
            }
        }
        RequestCounters { apis, slots }
    }

    /// The counters of `key`, if it is served.
    pub(crate) fn api(&self, key: ApiKey) -> Option<&ApiCounters> {
        let slot = *self.slots.get(usize::try_from(key as i16).ok()?)?;
        self.apis.get(usize::from(slot).checked_sub(1)?)
    }

    /// Every API's counters, in route order.
    pub(crate) fn all(&self) -> &[ApiCounters] {
        &self.apis
    }
}

/// Kafka's name of an error code (`UNKNOWN_TOPIC_OR_PARTITION`), from the codec's variant
/// name; `UNKNOWN` for a code it does not know.
pub(crate) fn error_name(code: i16) -> String {
    match kafka_protocol::ResponseError::try_from_code(code) {
        None => "NONE".to_owned(),
        Some(kafka_protocol::ResponseError::Unknown(_)) => "UNKNOWN".to_owned(),
        Some(error) => screaming_snake(&format!("{error:?}")),
    }
}

fn screaming_snake(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 8);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_are_counted_by_code_and_named_as_kafka_names_them() {
        let counters = RequestCounters::new([ApiKey::Produce, ApiKey::Fetch]);
        let produce = counters.api(ApiKey::Produce).unwrap();
        produce.error(0);
        produce.error(3);
        produce.error(3);
        produce.error(-1);
        produce.error(9999);
        assert_eq!(produce.errors(), vec![(-1, 1), (3, 2), (i16::MAX, 1)]);
        assert!(counters.api(ApiKey::Fetch).unwrap().errors().is_empty());
        assert!(counters.api(ApiKey::Metadata).is_none());
        assert_eq!(error_name(3), "UNKNOWN_TOPIC_OR_PARTITION");
        assert_eq!(error_name(-1), "UNKNOWN_SERVER_ERROR");
        assert_eq!(error_name(i16::MAX), "UNKNOWN");
    }

    #[test]
    fn latency_lands_in_the_first_bucket_that_holds_it() {
        let counters = RequestCounters::new([ApiKey::Metadata]);
        let api = counters.api(ApiKey::Metadata).unwrap();
        api.served(Duration::from_micros(300));
        api.served(Duration::from_millis(1));
        api.served(Duration::from_millis(7));
        api.served(Duration::from_secs(60));
        let (buckets, sum) = api.latency();
        assert_eq!(buckets[0], 1, "0.3 ms <= 0.5 ms");
        assert_eq!(buckets[1], 1, "1 ms <= 1 ms");
        assert_eq!(buckets[4], 1, "7 ms <= 10 ms");
        assert_eq!(buckets[LATENCY_BUCKETS_MS.len()], 1, "60 s in +Inf");
        assert_eq!(sum, 300 + 1000 + 7000 + 60_000_000);
        assert_eq!(api.requests.load(Relaxed), 4);
    }
}
