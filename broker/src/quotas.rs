//! Byte-rate quotas per client id, as Kafka's: `producer_byte_rate` bounds the bytes of
//! record batches a client produces per second, `consumer_byte_rate` the bytes of records it
//! fetches. A client over its quota gets its response with `throttle_time_ms` set (how long
//! to wait for its rate to fall back to the quota), and its connection reads nothing more
//! from it for that long, so a client that ignores the hint is held back all the same (KIP-219).
//!
//! The rate is Kafka's: bytes over `quota_window_num` samples of `quota_window_size_seconds`
//! each, divided by the time they span (at least all the samples but the current one), and
//! the throttle time is `(rate - quota) / quota × span`, at most the whole window.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

/// The client id whose quota applies to every client id without one of its own (Kafka's
/// name for the default entity).
pub const DEFAULT_CLIENT: &str = "<default>";

/// Client ids whose usage is kept before idle ones are forgotten.
const CLIENTS_REMEMBERED: usize = 10_000;

/// The quotas of one client id. Default: none, no limit.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClientQuota {
    /// Bytes per second of record batches produced (Kafka `producer_byte_rate`).
    #[serde(default)]
    pub producer_byte_rate: Option<u64>,
    /// Bytes per second of records fetched (Kafka `consumer_byte_rate`).
    #[serde(default)]
    pub consumer_byte_rate: Option<u64>,
}

/// What a quota is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Direction {
    Produce,
    Fetch,
}

/// Bytes recorded in the samples of one client id and direction.
#[derive(Debug)]
struct Usage {
    /// (start, bytes) of each sample, oldest first; at most `samples` of them.
    samples: Vec<(Instant, u64)>,
}

/// The quotas and what each client id used.
#[derive(Debug)]
pub(crate) struct Quotas {
    rules: HashMap<String, ClientQuota>,
    default: ClientQuota,
    sample: Duration,
    samples: usize,
    usage: Mutex<HashMap<(String, Direction), Usage>>,
    /// Until when each throttled client id's connections read nothing.
    muted: Mutex<HashMap<String, Instant>>,
}

impl Quotas {
    /// The quotas of a broker's settings.
    pub(crate) fn of(config: &crate::config::BrokerConfig) -> Quotas {
        Quotas::new(
            &config.client_quotas,
            config.quota_window_num,
            config.quota_window_size_seconds,
        )
    }

    pub(crate) fn new(
        rules: &BTreeMap<String, ClientQuota>,
        window_num: u32,
        window_size_seconds: u32,
    ) -> Quotas {
        Quotas {
            default: rules.get(DEFAULT_CLIENT).copied().unwrap_or_default(),
            rules: rules
                .iter()
                .filter(|(id, _)| *id != DEFAULT_CLIENT)
                .map(|(id, quota)| (id.clone(), *quota))
                .collect(),
            sample: Duration::from_secs(u64::from(window_size_seconds.max(1))),
            samples: window_num.max(2) as usize,
            usage: Mutex::new(HashMap::new()),
            muted: Mutex::new(HashMap::new()),
        }
    }

    fn quota(&self, client_id: &str, direction: Direction) -> Option<u64> {
        let quota = self.rules.get(client_id).unwrap_or(&self.default);
        match direction {
            Direction::Produce => quota.producer_byte_rate,
            Direction::Fetch => quota.consumer_byte_rate,
        }
        .filter(|rate| *rate > 0)
    }

    /// Records `bytes` for `client_id` and returns how long it must now wait (zero within
    /// its quota, or without one).
    pub(crate) fn record(&self, client_id: &str, direction: Direction, bytes: u64) -> Duration {
        let Some(quota) = self.quota(client_id, direction) else {
            return Duration::ZERO;
        };
        let now = Instant::now();
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        if usage.len() >= CLIENTS_REMEMBERED {
            // Client ids come and go (some put a process id in theirs): forget idle ones.
            let window = self.sample * self.samples as u32;
            usage.retain(|_, u| {
                u.samples
                    .last()
                    .is_some_and(|(start, _)| now.duration_since(*start) < window)
            });
        }
        let entry = usage
            .entry((client_id.to_owned(), direction))
            .or_insert_with(|| Usage {
                samples: Vec::new(),
            });
        let window = self.sample * self.samples as u32;
        entry
            .samples
            .retain(|(start, _)| now.duration_since(*start) < window);
        match entry.samples.last_mut() {
            Some((start, total)) if now.duration_since(*start) < self.sample => *total += bytes,
            _ => entry.samples.push((now, bytes)),
        }
        let total: u64 = entry.samples.iter().map(|(_, b)| b).sum();
        let oldest = entry.samples.first().map_or(now, |(start, _)| *start);
        let span = now
            .duration_since(oldest)
            .max(self.sample * (self.samples as u32 - 1));
        let rate = total as f64 / span.as_secs_f64();
        if rate <= quota as f64 {
            return Duration::ZERO;
        }
        let throttle = span
            .mul_f64((rate - quota as f64) / quota as f64)
            .min(window);
        drop(usage);
        let mut muted = self.muted.lock().unwrap_or_else(|p| p.into_inner());
        let until = now + throttle;
        let slot = muted.entry(client_id.to_owned()).or_insert(until);
        *slot = (*slot).max(until);
        throttle
    }

    /// How long connections of `client_id` must still wait before reading its next request.
    pub(crate) fn muted_for(&self, client_id: &str) -> Duration {
        let mut muted = self.muted.lock().unwrap_or_else(|p| p.into_inner());
        let Some(until) = muted.get(client_id).copied() else {
            return Duration::ZERO;
        };
        let now = Instant::now();
        if until <= now {
            muted.remove(client_id);
            return Duration::ZERO;
        }
        until - now
    }

    /// Whether any quota is configured (so that nothing is recorded otherwise).
    pub(crate) fn any(&self) -> bool {
        self.default != ClientQuota::default() || !self.rules.is_empty()
    }
}

/// The throttle time as the protocol's `throttle_time_ms`.
pub(crate) fn throttle_ms(throttle: Duration) -> i32 {
    i32::try_from(throttle.as_millis()).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(rate: u64) -> Quotas {
        let mut rules = BTreeMap::new();
        rules.insert(
            "limited".to_owned(),
            ClientQuota {
                producer_byte_rate: Some(rate),
                consumer_byte_rate: None,
            },
        );
        Quotas::new(&rules, 11, 1)
    }

    #[test]
    fn within_the_quota_there_is_no_throttle_and_past_it_the_time_follows_kafkas_formula() {
        let q = quotas(1000);
        // Ten seconds' worth (the span is at least ten samples) is within the quota.
        assert_eq!(
            q.record("limited", Direction::Produce, 10_000),
            Duration::ZERO
        );
        // 20,000 bytes over 10 s is twice the rate: (2000 - 1000) / 1000 × 10 s.
        let throttle = q.record("limited", Direction::Produce, 10_000);
        assert!(
            throttle >= Duration::from_millis(9_900) && throttle <= Duration::from_secs(10),
            "{throttle:?}"
        );
        assert!(q.muted_for("limited") > Duration::from_secs(9));
        // Other client ids, and the other direction, are not limited.
        assert_eq!(
            q.record("other", Direction::Produce, 1 << 30),
            Duration::ZERO
        );
        assert_eq!(
            q.record("limited", Direction::Fetch, 1 << 30),
            Duration::ZERO
        );
        assert_eq!(q.muted_for("other"), Duration::ZERO);
    }

    #[test]
    fn the_default_entity_applies_to_client_ids_without_their_own() {
        let mut rules = BTreeMap::new();
        rules.insert(
            DEFAULT_CLIENT.to_owned(),
            ClientQuota {
                producer_byte_rate: None,
                consumer_byte_rate: Some(10),
            },
        );
        let q = Quotas::new(&rules, 11, 1);
        assert!(q.any());
        assert!(q.record("anyone", Direction::Fetch, 1000) > Duration::ZERO);
    }
}
