//! The producer state of a partition: what makes idempotent and transactional producing work.
//!
//! For every producer id that wrote to the partition it keeps the epoch, the metadata of its
//! last [`CACHED_BATCHES`] batches (sequence range and offsets, as Kafka keeps them), the first
//! offset of its open transaction and the time of its last write. With it a Produce batch is
//! checked as Kafka checks it:
//!
//! - a batch equal (same epoch, same sequence range) to a cached one is a retry: it is not
//!   appended again, and the producer gets the offsets of the original;
//! - an older epoch than the partition has seen is INVALID_PRODUCER_EPOCH (a fenced or
//!   zombie producer);
//! - a newer epoch must start at sequence 0;
//! - within an epoch, the first sequence must follow the last one (wrapping at `i32::MAX`),
//!   else OUT_OF_ORDER_SEQUENCE_NUMBER; a producer the partition does not know may start
//!   anywhere (its state may have expired, as in Kafka since KIP-360).
//!
//! Transactions: the first transactional batch of a producer opens its transaction at that
//! batch's offset; a marker (control batch) closes it. The smallest open transaction's first
//! offset is the first unstable offset: the last stable offset (LSO), up to which
//! read_committed consumers read. An abort yields an [`AbortedTxn`] for the `.txnindex`.
//!
//! The state is rebuilt on start from the last snapshot (see [`ProducerStates::encode`]) and
//! the batches after it, so a producer's retry after a broker restart is still recognised.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::batch::BatchHeader;
use super::control::Marker;

/// Batches remembered per producer: librdkafka and the Java client keep at most 5 in flight.
pub(crate) const CACHED_BATCHES: usize = 5;

/// Why a producer's batch or marker is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum ProducerError {
    /// The epoch is older than one this partition saw: a fenced producer.
    #[error("producer {producer_id} epoch {epoch} is older than the partition's epoch {current}")]
    InvalidProducerEpoch {
        /// The producer.
        producer_id: i64,
        /// The batch's epoch.
        epoch: i16,
        /// The newest epoch the partition saw.
        current: i16,
    },
    /// The sequence does not follow the producer's last one.
    #[error(
        "producer {producer_id} epoch {epoch}: batch starts at sequence {sequence}, expected {expected}"
    )]
    OutOfOrderSequence {
        /// The producer.
        producer_id: i64,
        /// The batch's epoch.
        epoch: i16,
        /// The batch's first sequence.
        sequence: i32,
        /// The sequence it had to start at.
        expected: i64,
    },
    /// A transactional batch from a non-transactional state or the reverse.
    #[error("producer {producer_id}: {reason}")]
    InvalidTxnState {
        /// The producer.
        producer_id: i64,
        /// What is wrong.
        reason: &'static str,
    },
    /// Idempotent and transactional batches must come one per partition per request.
    #[error("a request carries {0} batches of an idempotent producer for one partition")]
    SeveralBatches(usize),
    /// Clients may not write control batches.
    #[error("clients may not write control batches")]
    ControlBatch,
}

/// A batch as remembered for deduplication.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BatchMeta {
    pub(crate) first_seq: i32,
    pub(crate) last_seq: i32,
    pub(crate) first_offset: i64,
    pub(crate) offset_delta: i32,
    pub(crate) timestamp: i64,
}

/// What a partition knows of one producer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Producer {
    pub(crate) epoch: i16,
    /// The last batches of the current epoch, oldest first.
    pub(crate) batches: VecDeque<BatchMeta>,
    /// First offset of the open transaction.
    pub(crate) txn_first_offset: Option<i64>,
    /// Timestamp of the last batch or marker, for expiry.
    pub(crate) last_timestamp: i64,
    pub(crate) coordinator_epoch: i32,
}

impl Producer {
    fn new(epoch: i16) -> Producer {
        Producer {
            epoch,
            batches: VecDeque::new(),
            txn_first_offset: None,
            last_timestamp: -1,
            coordinator_epoch: -1,
        }
    }

    fn last_seq(&self) -> Option<i32> {
        self.batches.back().map(|b| b.last_seq)
    }

    /// Moves to `epoch`, forgetting the batches of an older one.
    fn set_epoch(&mut self, epoch: i16) {
        if epoch != self.epoch {
            self.epoch = epoch;
            self.batches.clear();
        }
    }
}

/// One producer of a partition, as DescribeProducers (`kafka-transactions.sh
/// describe-producers`) shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ActiveProducer {
    pub(crate) producer_id: i64,
    pub(crate) epoch: i16,
    /// -1 before its first batch of this epoch.
    pub(crate) last_sequence: i32,
    pub(crate) last_timestamp: i64,
    pub(crate) coordinator_epoch: i32,
    /// First offset of its open transaction; -1 when none is open.
    pub(crate) txn_start_offset: i64,
}

/// An aborted transaction, as a `.txnindex` entry holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AbortedTxn {
    pub(crate) producer_id: i64,
    pub(crate) first_offset: i64,
    /// The offset of the abort marker.
    pub(crate) last_offset: i64,
    /// The LSO right after the marker.
    pub(crate) last_stable_offset: i64,
}

/// What to do with a checked batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Check {
    /// Append it.
    Append,
    /// A retry of a batch already in the log at this base offset: answer with it.
    Duplicate { base_offset: i64 },
}

/// The producers of one partition.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct ProducerStates {
    producers: HashMap<i64, Producer>,
    /// Open transactions: first offset → producer id.
    open: BTreeMap<i64, i64>,
}

/// `next` follows `last` (sequences wrap from `i32::MAX` to 0).
fn in_sequence(last: i32, next: i32) -> bool {
    i64::from(next) == i64::from(last) + 1 || (next == 0 && last == i32::MAX)
}

impl ProducerStates {
    /// Checks a client's batch (with an assigned or placeholder base offset).
    pub(crate) fn check(&self, batch: &BatchHeader) -> Result<Check, ProducerError> {
        let producer_id = batch.producer_id;
        if batch.is_control() {
            return Err(ProducerError::ControlBatch);
        }
        let Some(producer) = self.producers.get(&producer_id) else {
            return Ok(Check::Append);
        };
        if batch.producer_epoch < producer.epoch {
            return Err(ProducerError::InvalidProducerEpoch {
                producer_id,
                epoch: batch.producer_epoch,
                current: producer.epoch,
            });
        }
        let first_seq = batch.base_sequence;
        if batch.producer_epoch == producer.epoch
            && let Some(original) = producer
                .batches
                .iter()
                .find(|b| b.first_seq == first_seq && b.last_seq == batch.last_sequence())
        {
            return Ok(Check::Duplicate {
                base_offset: original.first_offset,
            });
        }
        if batch.producer_epoch > producer.epoch {
            // A new epoch starts over at 0 (the epoch may have been bumped by a marker, which
            // leaves no batches).
            if first_seq != 0 {
                return Err(ProducerError::OutOfOrderSequence {
                    producer_id,
                    epoch: batch.producer_epoch,
                    sequence: first_seq,
                    expected: 0,
                });
            }
        } else if let Some(last) = producer.last_seq()
            && !in_sequence(last, first_seq)
        {
            return Err(ProducerError::OutOfOrderSequence {
                producer_id,
                epoch: batch.producer_epoch,
                sequence: first_seq,
                expected: (i64::from(last) + 1) % (i64::from(i32::MAX) + 1),
            });
        } else if producer.last_seq().is_none() && first_seq != 0 {
            // The epoch is known (a marker set it) but nothing was written in it yet.
            return Err(ProducerError::OutOfOrderSequence {
                producer_id,
                epoch: batch.producer_epoch,
                sequence: first_seq,
                expected: 0,
            });
        }
        let open = producer.txn_first_offset.is_some();
        if open && !batch.is_transactional() {
            return Err(ProducerError::InvalidTxnState {
                producer_id,
                reason: "a non-transactional batch while its transaction is open",
            });
        }
        Ok(Check::Append)
    }

    /// Records an appended data batch (its base offset assigned). Also used to replay the log,
    /// where nothing is checked.
    pub(crate) fn record(&mut self, batch: &BatchHeader) {
        let producer = self
            .producers
            .entry(batch.producer_id)
            .or_insert_with(|| Producer::new(batch.producer_epoch));
        if batch.producer_epoch > producer.epoch {
            producer.set_epoch(batch.producer_epoch);
        }
        if batch.base_sequence >= 0 {
            producer.batches.push_back(BatchMeta {
                first_seq: batch.base_sequence,
                last_seq: batch.last_sequence(),
                first_offset: batch.base_offset,
                offset_delta: batch.last_offset_delta,
                timestamp: batch.max_timestamp,
            });
            while producer.batches.len() > CACHED_BATCHES {
                producer.batches.pop_front();
            }
        }
        producer.last_timestamp = producer.last_timestamp.max(batch.max_timestamp);
        if batch.is_transactional() && producer.txn_first_offset.is_none() {
            producer.txn_first_offset = Some(batch.base_offset);
            self.open.insert(batch.base_offset, batch.producer_id);
        }
    }

    /// Checks that a marker of this producer's epoch may be written.
    pub(crate) fn check_marker(&self, producer_id: i64, epoch: i16) -> Result<(), ProducerError> {
        match self.producers.get(&producer_id) {
            Some(p) if epoch < p.epoch => Err(ProducerError::InvalidProducerEpoch {
                producer_id,
                epoch,
                current: p.epoch,
            }),
            _ => Ok(()),
        }
    }

    /// Applies a marker written at `offset` (after [`Self::check_marker`], or when replaying):
    /// closes the producer's open transaction; returns it when it was aborted. `log_end` is
    /// the offset after the marker.
    pub(crate) fn apply_marker(
        &mut self,
        producer_id: i64,
        epoch: i16,
        marker: Marker,
        offset: i64,
        timestamp: i64,
    ) -> Option<AbortedTxn> {
        let producer = self
            .producers
            .entry(producer_id)
            .or_insert_with(|| Producer::new(epoch));
        producer.set_epoch(epoch.max(producer.epoch));
        producer.coordinator_epoch = marker.coordinator_epoch;
        producer.last_timestamp = producer.last_timestamp.max(timestamp);
        let first_offset = producer.txn_first_offset.take()?;
        self.open.remove(&first_offset);
        (!marker.commit).then(|| AbortedTxn {
            producer_id,
            first_offset,
            last_offset: offset,
            last_stable_offset: self.first_unstable_offset().unwrap_or(offset + 1),
        })
    }

    /// The first offset of the oldest open transaction.
    pub(crate) fn first_unstable_offset(&self) -> Option<i64> {
        self.open.keys().next().copied()
    }

    /// Forgets producers without an open transaction whose last write is older than
    /// `now - max_idle_ms` (Kafka's `producer.id.expiration.ms`); returns how many.
    pub(crate) fn expire(&mut self, now: i64, max_idle_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers.retain(|_, p| {
            p.txn_first_offset.is_some() || now.saturating_sub(p.last_timestamp) <= max_idle_ms
        });
        before - self.producers.len()
    }

    /// Keeps at most `max` producers: past it, the least recently written ones without an open
    /// transaction are forgotten, a tenth of `max` more at once so that the work is not done
    /// again at every new producer. "Recently" is by the offset of a producer's last batch,
    /// which the broker assigns (its timestamps are the client's). A forgotten producer that
    /// writes again is taken as new, as after `producer.id.expiration.ms`: its retries of
    /// batches from before are no longer recognised. Returns how many were forgotten.
    pub(crate) fn bound(&mut self, max: usize) -> usize {
        if self.producers.len() <= max {
            return 0;
        }
        let keep = max - max / 10;
        let mut idle: Vec<(i64, i64)> = self
            .producers
            .iter()
            .filter(|(_, p)| p.txn_first_offset.is_none())
            .map(|(id, p)| (p.batches.back().map_or(-1, |b| b.first_offset), *id))
            .collect();
        let surplus = (self.producers.len() - keep).min(idle.len());
        if surplus == 0 {
            return 0;
        }
        idle.select_nth_unstable(surplus - 1);
        for (_, id) in &idle[..surplus] {
            self.producers.remove(id);
        }
        surplus
    }

    /// Number of producers known.
    pub(crate) fn len(&self) -> usize {
        self.producers.len()
    }

    /// Every producer known, by id, as DescribeProducers shows them.
    pub(crate) fn active(&self) -> Vec<ActiveProducer> {
        let mut active: Vec<ActiveProducer> = self
            .producers
            .iter()
            .map(|(&producer_id, p)| ActiveProducer {
                producer_id,
                epoch: p.epoch,
                last_sequence: p.last_seq().unwrap_or(-1),
                last_timestamp: p.last_timestamp,
                coordinator_epoch: p.coordinator_epoch,
                txn_start_offset: p.txn_first_offset.unwrap_or(-1),
            })
            .collect();
        active.sort_unstable_by_key(|p| p.producer_id);
        active
    }

    /// The state of one producer.
    #[cfg(test)]
    pub(crate) fn get(&self, producer_id: i64) -> Option<&Producer> {
        self.producers.get(&producer_id)
    }

    /// The snapshot file's bytes:
    ///
    /// ```text
    /// crc32c u32 (of what follows) | version u16 (1) | count u32 | producer*
    /// producer: id i64 | epoch i16 | coordinator epoch i32 | last timestamp i64
    ///           | open transaction's first offset i64 (-1: none) | batch count u8 | batch*
    /// batch:    first sequence i32 | last sequence i32 | first offset i64 | offset delta i32
    ///           | timestamp i64
    /// ```
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(6 + self.producers.len() * 64);
        body.extend_from_slice(&1u16.to_be_bytes());
        body.extend_from_slice(&(self.producers.len() as u32).to_be_bytes());
        let mut ids: Vec<&i64> = self.producers.keys().collect();
        ids.sort_unstable();
        for id in ids {
            let p = &self.producers[id];
            body.extend_from_slice(&id.to_be_bytes());
            body.extend_from_slice(&p.epoch.to_be_bytes());
            body.extend_from_slice(&p.coordinator_epoch.to_be_bytes());
            body.extend_from_slice(&p.last_timestamp.to_be_bytes());
            body.extend_from_slice(&p.txn_first_offset.unwrap_or(-1).to_be_bytes());
            body.push(p.batches.len() as u8);
            for b in &p.batches {
                body.extend_from_slice(&b.first_seq.to_be_bytes());
                body.extend_from_slice(&b.last_seq.to_be_bytes());
                body.extend_from_slice(&b.first_offset.to_be_bytes());
                body.extend_from_slice(&b.offset_delta.to_be_bytes());
                body.extend_from_slice(&b.timestamp.to_be_bytes());
            }
        }
        let mut out = Vec::with_capacity(4 + body.len());
        out.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Reads a snapshot written by [`Self::encode`]; `None` when it is damaged.
    pub(crate) fn decode(bytes: &[u8]) -> Option<ProducerStates> {
        let mut r = Reader(bytes.get(4..)?);
        let crc = u32::from_be_bytes(bytes.get(..4)?.try_into().ok()?);
        if crc32c::crc32c(r.0) != crc || r.u16()? != 1 {
            return None;
        }
        let count = r.u32()?;
        let mut states = ProducerStates::default();
        for _ in 0..count {
            let id = r.i64()?;
            let mut p = Producer::new(r.i16()?);
            p.coordinator_epoch = r.i32()?;
            p.last_timestamp = r.i64()?;
            let first = r.i64()?;
            if first >= 0 {
                p.txn_first_offset = Some(first);
                states.open.insert(first, id);
            }
            for _ in 0..r.u8()? {
                p.batches.push_back(BatchMeta {
                    first_seq: r.i32()?,
                    last_seq: r.i32()?,
                    first_offset: r.i64()?,
                    offset_delta: r.i32()?,
                    timestamp: r.i64()?,
                });
            }
            states.producers.insert(id, p);
        }
        r.0.is_empty().then_some(states)
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_at_checked(N)?;
        self.0 = rest;
        head.try_into().ok()
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_be_bytes)
    }
    fn i16(&mut self) -> Option<i16> {
        self.take().map(i16::from_be_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_be_bytes)
    }
    fn i32(&mut self) -> Option<i32> {
        self.take().map(i32::from_be_bytes)
    }
    fn i64(&mut self) -> Option<i64> {
        self.take().map(i64::from_be_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::batch::{TRANSACTIONAL, tests::make_batch};

    fn batch(pid: i64, epoch: i16, seq: i32, count: i32, offset: i64, txn: bool) -> BatchHeader {
        let mut h = crate::log::batch::parse_header(&make_batch(offset, count, 10)).unwrap();
        h.producer_id = pid;
        h.producer_epoch = epoch;
        h.base_sequence = seq;
        if txn {
            h.attributes |= TRANSACTIONAL;
        }
        h
    }

    #[test]
    fn retries_are_recognised_and_gaps_and_stale_epochs_refused() {
        let mut s = ProducerStates::default();
        let b0 = batch(7, 0, 0, 3, 0, false);
        assert_eq!(s.check(&b0), Ok(Check::Append));
        s.record(&b0);
        let b1 = batch(7, 0, 3, 2, 3, false);
        assert_eq!(s.check(&b1), Ok(Check::Append));
        s.record(&b1);
        // Retries of either batch get their original offsets.
        assert_eq!(
            s.check(&batch(7, 0, 0, 3, 99, false)),
            Ok(Check::Duplicate { base_offset: 0 })
        );
        assert_eq!(
            s.check(&batch(7, 0, 3, 2, 99, false)),
            Ok(Check::Duplicate { base_offset: 3 })
        );
        // A gap.
        assert!(matches!(
            s.check(&batch(7, 0, 6, 1, 5, false)),
            Err(ProducerError::OutOfOrderSequence { expected: 5, .. })
        ));
        // A new epoch must start at 0; then the old epoch is fenced.
        assert!(s.check(&batch(7, 1, 5, 1, 5, false)).is_err());
        let e1 = batch(7, 1, 0, 1, 5, false);
        assert_eq!(s.check(&e1), Ok(Check::Append));
        s.record(&e1);
        assert!(matches!(
            s.check(&batch(7, 0, 5, 1, 6, false)),
            Err(ProducerError::InvalidProducerEpoch { current: 1, .. })
        ));
        // Only the last five batches are remembered.
        for i in 1..=6 {
            let b = batch(7, 1, i, 1, 5 + i64::from(i), false);
            s.record(&b);
        }
        assert_eq!(s.get(7).unwrap().batches.len(), CACHED_BATCHES);
        // Sequences wrap.
        let mut w = ProducerStates::default();
        w.record(&batch(8, 0, i32::MAX - 1, 2, 0, false));
        assert_eq!(w.check(&batch(8, 0, 0, 1, 2, false)), Ok(Check::Append));
        // An unknown producer may start anywhere.
        assert_eq!(w.check(&batch(9, 3, 40, 1, 2, false)), Ok(Check::Append));
    }

    #[test]
    fn past_the_bound_the_least_recently_written_idle_producers_are_forgotten() {
        let mut s = ProducerStates::default();
        // Producer 0 holds an open transaction from the start; 1..=100 write one batch each.
        s.record(&batch(0, 0, 0, 1, 0, true));
        for pid in 1..=100 {
            s.record(&batch(pid, 0, 0, 1, pid, false));
        }
        // Producer 1 writes again last: the most recent.
        s.record(&batch(1, 0, 1, 1, 101, false));
        assert_eq!(s.bound(200), 0);
        let forgotten = s.bound(50);
        // Down to 45 (a tenth below the bound): the open transaction and the recent stay.
        assert_eq!(forgotten, 101 - 45);
        assert_eq!(s.len(), 45);
        assert!(
            s.get(0).is_some(),
            "the open transaction's producer was forgotten"
        );
        assert!(s.get(1).is_some(), "the most recent producer was forgotten");
        // And the 43 most recent of the others: 58 to 100.
        assert!(s.get(100).is_some() && s.get(58).is_some());
        assert!(s.get(57).is_none() && s.get(2).is_none());
        assert_eq!(s.first_unstable_offset(), Some(0));
        // A forgotten producer writing again is taken as new, wherever its sequence is.
        assert_eq!(s.check(&batch(2, 0, 1, 1, 102, false)), Ok(Check::Append));
    }

    #[test]
    fn transactions_set_the_first_unstable_offset_and_aborts_are_reported() {
        let mut s = ProducerStates::default();
        s.record(&batch(1, 0, 0, 2, 10, true));
        s.record(&batch(2, 0, 0, 2, 12, true));
        s.record(&batch(1, 0, 2, 2, 14, true));
        assert_eq!(s.first_unstable_offset(), Some(10));
        assert!(matches!(
            s.check(&batch(1, 0, 4, 1, 16, false)),
            Err(ProducerError::InvalidTxnState { .. })
        ));
        let commit = Marker {
            commit: true,
            coordinator_epoch: 0,
        };
        assert_eq!(s.apply_marker(1, 0, commit, 16, 20), None);
        assert_eq!(s.first_unstable_offset(), Some(12));
        let abort = Marker {
            commit: false,
            coordinator_epoch: 0,
        };
        // A fencing abort carries a bumped epoch.
        assert_eq!(s.check_marker(2, 1), Ok(()));
        assert_eq!(
            s.apply_marker(2, 1, abort, 17, 20),
            Some(AbortedTxn {
                producer_id: 2,
                first_offset: 12,
                last_offset: 17,
                last_stable_offset: 18
            })
        );
        assert_eq!(s.first_unstable_offset(), None);
        assert!(s.check_marker(2, 0).is_err());
        // A repeated marker changes nothing.
        assert_eq!(s.apply_marker(2, 1, abort, 18, 20), None);
        // The fenced epoch's batches are refused; the new epoch starts at 0.
        assert!(s.check(&batch(2, 0, 2, 1, 19, true)).is_err());
        assert!(s.check(&batch(2, 1, 1, 1, 19, true)).is_err());
        assert_eq!(s.check(&batch(2, 1, 0, 1, 19, true)), Ok(Check::Append));
    }

    #[test]
    fn snapshots_round_trip_and_damage_is_detected() {
        let mut s = ProducerStates::default();
        for pid in 0..20 {
            s.record(&batch(pid, 2, 0, 3, pid * 10, pid % 3 == 0));
            s.record(&batch(pid, 2, 3, 3, pid * 10 + 3, pid % 3 == 0));
        }
        let bytes = s.encode();
        assert_eq!(ProducerStates::decode(&bytes), Some(s.clone()));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert_eq!(ProducerStates::decode(&bad), None, "byte {i}");
            assert_eq!(ProducerStates::decode(&bytes[..i]), None);
        }
        assert_eq!(s.expire(1_000_000, 1000), 13);
        assert_eq!(s.len(), 7);
    }
}
