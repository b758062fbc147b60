//! Sink groups: several sinks on one channel driven by one runner, which hands each batch to
//! one member chosen by the group's processor (Flume's sink processors).
//!
//! - `default`: one sink; what every sink outside a group gets.
//! - `failover`: the available member of highest `priority` (Flume: a higher number wins)
//!   gets every batch. A member that fails is penalised: left out for 1 s × 2^failures
//!   (2 s after one failure, 4 s after two, ...), at most `max_penalty`, then tried again; once
//!   it delivers, its count starts over and, being first by priority, it takes over again.
//! - `load_balance`: the members take turns (`round_robin`) or are tried in a fresh random
//!   order for each batch (`random`). With `backoff`, a member that fails is left out as in
//!   failover, at most `max_timeout`; without, it is tried again on its next turn.
//!
//! The penalties are Flume's (`FailoverSinkProcessor` and `OrderSelector`: 1000 ms ×
//! 2^failures, capped). One difference: Flume's load balancer forgets a member's failures only
//! when the next one comes more than an hour later; here a member's count starts over once it
//! delivers, as in Flume's failover.
//!
//! The sink runner ([`crate::runner`]) asks [`SinkProcessor::order`] which members to try for a
//! batch, in order, and reports each outcome with [`SinkProcessor::delivered`] and
//! [`SinkProcessor::failed`]. A batch whose member fails goes on to the next member of that
//! order at once, with its take still open; only when every member failed is it rolled back.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::time::Duration;

use tokio::time::Instant;

/// The processor names of `processor.type`.
pub const PROCESSOR_TYPES: [&str; 3] = ["default", "failover", "load_balance"];

/// First penalty unit of a failed member: it is left out for this × 2^failures (Flume's
/// `FAILURE_PENALTY` and `OrderSelector`, 1000 ms).
const PENALTY_UNIT: Duration = Duration::from_secs(1);
/// Failures past this many no longer lengthen a penalty (Flume's `EXP_BACKOFF_COUNTER_LIMIT`);
/// the cap applies long before.
const MAX_COUNTED_FAILURES: u32 = 16;

/// Default `max_penalty` and `max_timeout`: 30 s (Flume's `maxpenalty` and
/// `selector.maxTimeOut`, 30000 ms).
pub const DEFAULT_MAX_PENALTY: Duration = Duration::from_secs(30);

/// How a load-balancing group orders its members for each batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selector {
    /// In turn: the member after the one that took the last batch goes first.
    RoundRobin,
    /// A fresh random order for every batch.
    Random,
}

/// A group's processor as configured, with the priorities in the order of the group's
/// `sinks`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SinkProcessorConfig {
    /// One sink, no choice (Flume's `DefaultSinkProcessor`).
    Default,
    /// The available member of highest priority takes every batch.
    Failover {
        /// One per member; higher goes first.
        priorities: Vec<i64>,
        /// Longest time a failed member is left out.
        max_penalty: Duration,
    },
    /// The members share the batches.
    LoadBalance {
        /// `round_robin` or `random`.
        selector: Selector,
        /// Whether a failed member is left out for a while.
        backoff: bool,
        /// Longest time a failed member is left out, with `backoff`.
        max_timeout: Duration,
    },
}

impl SinkProcessorConfig {
    /// Flume's name of the processor (`processor.type`).
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Failover { .. } => "failover",
            Self::LoadBalance { .. } => "load_balance",
        }
    }
}

/// The penalty of one member.
#[derive(Clone, Copy, Debug, Default)]
struct Penalty {
    /// Failures since it last delivered.
    failures: u32,
    /// Left out until then.
    until: Option<Instant>,
}

/// Chooses which members of a group get a batch, and keeps their penalties.
#[derive(Debug)]
pub struct SinkProcessor {
    choice: Choice,
    penalties: Vec<Penalty>,
    /// The longest penalty; `None` when failed members are not left out.
    max_penalty: Option<Duration>,
}

#[derive(Debug)]
enum Choice {
    /// Members by priority, highest first.
    Priority(Vec<usize>),
    /// The member to go first next time.
    RoundRobin { next: usize },
    /// State of a xorshift generator (never 0).
    Random { state: u64 },
}

impl SinkProcessor {
    /// The processor of a group of `members` sinks.
    pub fn new(config: &SinkProcessorConfig, members: usize) -> Self {
        let (choice, max_penalty) = match config {
            SinkProcessorConfig::Default => (Choice::Priority((0..members).collect()), None),
            SinkProcessorConfig::Failover {
                priorities,
                max_penalty,
            } => {
                let mut order: Vec<usize> = (0..members).collect();
                // Stable: equal priorities (refused by validation) keep the file's order.
                order.sort_by_key(|&m| std::cmp::Reverse(priorities.get(m).copied()));
                (Choice::Priority(order), Some(*max_penalty))
            }
            SinkProcessorConfig::LoadBalance {
                selector,
                backoff,
                max_timeout,
            } => {
                let choice = match selector {
                    Selector::RoundRobin => Choice::RoundRobin { next: 0 },
                    Selector::Random => Choice::Random {
                        state: RandomState::new().hash_one(members) | 1,
                    },
                };
                (choice, backoff.then_some(*max_timeout))
            }
        };
        Self {
            choice,
            penalties: vec![Penalty::default(); members],
            max_penalty,
        }
    }

    /// The members to try for the next batch, in order, leaving out those penalised at `now`.
    pub fn order(&mut self, now: Instant) -> Vec<usize> {
        let members = self.penalties.len();
        let all: Vec<usize> = match &mut self.choice {
            Choice::Priority(order) => order.clone(),
            Choice::RoundRobin { next } => (0..members).map(|i| (*next + i) % members).collect(),
            Choice::Random { state } => {
                let mut order: Vec<usize> = (0..members).collect();
                // Fisher-Yates.
                for i in (1..members).rev() {
                    let j = (xorshift(state) % (i as u64 + 1)) as usize;
                    order.swap(i, j);
                }
                order
            }
        };
        all.into_iter()
            .filter(|&m| self.penalties[m].until.is_none_or(|until| until <= now))
            .collect()
    }

    /// `member` took a batch (its first send): with round robin, the next batch goes to the
    /// member after it.
    pub fn chosen(&mut self, member: usize) {
        if let Choice::RoundRobin { next } = &mut self.choice {
            *next = (member + 1) % self.penalties.len();
        }
    }

    /// `member` delivered: its failures are forgotten.
    pub fn delivered(&mut self, member: usize) {
        self.penalties[member] = Penalty::default();
    }

    /// `member` failed at `now`: penalised, when the processor penalises.
    pub fn failed(&mut self, member: usize, now: Instant) {
        let Some(max_penalty) = self.max_penalty else {
            return;
        };
        let penalty = &mut self.penalties[member];
        penalty.failures = (penalty.failures + 1).min(MAX_COUNTED_FAILURES);
        penalty.until = Some(now + penalty_after(penalty.failures, max_penalty));
    }

    /// When the first penalised member may be tried again, if any is penalised at `now`.
    pub fn next_available(&self, now: Instant) -> Option<Instant> {
        self.penalties
            .iter()
            .filter_map(|p| p.until)
            .filter(|&until| until > now)
            .min()
    }
}

/// How long a member is left out after `failures` failures in a row.
fn penalty_after(failures: u32, max: Duration) -> Duration {
    PENALTY_UNIT
        .saturating_mul(1 << failures.min(MAX_COUNTED_FAILURES))
        .min(max)
}

fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failover(priorities: &[i64], max_penalty: u64) -> SinkProcessor {
        SinkProcessor::new(
            &SinkProcessorConfig::Failover {
                priorities: priorities.to_vec(),
                max_penalty: Duration::from_secs(max_penalty),
            },
            priorities.len(),
        )
    }

    fn load_balance(selector: Selector, backoff: bool, members: usize) -> SinkProcessor {
        SinkProcessor::new(
            &SinkProcessorConfig::LoadBalance {
                selector,
                backoff,
                max_timeout: Duration::from_secs(10),
            },
            members,
        )
    }

    #[test]
    fn failover_tries_the_highest_priority_first() {
        let now = Instant::now();
        let mut processor = failover(&[5, 10, -1], 30);
        assert_eq!(processor.order(now), [1, 0, 2]);
        // The order does not move on by itself.
        processor.chosen(1);
        assert_eq!(processor.order(now), [1, 0, 2]);
    }

    #[test]
    fn a_failed_member_is_left_out_for_a_penalty_doubling_up_to_the_cap() {
        let start = Instant::now();
        let mut processor = failover(&[10, 5], 10);
        let mut penalties = Vec::new();
        let mut now = start;
        for _ in 0..5 {
            processor.failed(0, now);
            let until = processor.next_available(now).unwrap();
            penalties.push((until - now).as_secs());
            assert_eq!(processor.order(now), [1], "left out while penalised");
            assert_eq!(
                processor.order(until),
                [0, 1],
                "first again after its penalty"
            );
            now = until;
        }
        assert_eq!(penalties, [2, 4, 8, 10, 10]);
        // Once it delivers, its count starts over.
        processor.delivered(0);
        processor.failed(0, now);
        assert_eq!(
            processor.next_available(now).unwrap() - now,
            Duration::from_secs(2)
        );
    }

    #[test]
    fn round_robin_takes_turns_and_skips_a_member_backing_off() {
        let now = Instant::now();
        let mut processor = load_balance(Selector::RoundRobin, true, 3);
        let mut firsts = Vec::new();
        for _ in 0..4 {
            let first = processor.order(now)[0];
            processor.chosen(first);
            firsts.push(first);
        }
        assert_eq!(firsts, [0, 1, 2, 0]);
        assert_eq!(processor.order(now), [1, 2, 0]);
        processor.failed(1, now);
        assert_eq!(processor.order(now), [2, 0]);
        processor.chosen(2);
        assert_eq!(processor.order(now), [0, 2]);
        assert_eq!(
            processor.order(now + Duration::from_secs(2)),
            [0, 1, 2],
            "back after its backoff"
        );
    }

    #[test]
    fn without_backoff_a_failed_member_keeps_its_turn() {
        let now = Instant::now();
        let mut processor = load_balance(Selector::RoundRobin, false, 2);
        processor.failed(0, now);
        processor.failed(0, now);
        assert_eq!(processor.order(now), [0, 1]);
        assert_eq!(processor.next_available(now), None);
    }

    #[test]
    fn random_orders_hold_every_member_once_and_vary() {
        let now = Instant::now();
        let mut processor = load_balance(Selector::Random, true, 3);
        let mut firsts = [0; 3];
        for _ in 0..300 {
            let mut order = processor.order(now);
            firsts[order[0]] += 1;
            order.sort_unstable();
            assert_eq!(order, [0, 1, 2]);
        }
        assert!(firsts.iter().all(|&n| n > 50), "{firsts:?}");
        processor.failed(2, now);
        for _ in 0..20 {
            assert!(!processor.order(now).contains(&2));
        }
    }

    #[test]
    fn the_default_processor_never_leaves_its_sink_out() {
        let now = Instant::now();
        let mut processor = SinkProcessor::new(&SinkProcessorConfig::Default, 1);
        processor.failed(0, now);
        assert_eq!(processor.order(now), [0]);
    }
}
