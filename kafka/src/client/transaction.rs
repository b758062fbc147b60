//! The transactional session the channel's puts and the exactly-once sink share.
//!
//! [`TransactionalProducer::init`] creates the producer and initialises its transactions,
//! which fences an older instance with the same `transactional.id` and settles the
//! transaction it left open. Then, over and over: [`begin`](TransactionalProducer::begin),
//! [`send`](Producer::send) records, [`commit`](TransactionalProducer::commit), which waits for
//! every record, adds a group's offset (its metadata holding the component's progress) with
//! `send_offsets_to_transaction` and commits: records and progress become visible together or
//! not at all. After any failure, [`abort`](TransactionalProducer::abort) consumes the session:
//! the next one is initialised anew, which settles whatever state the transaction was in.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::producer::{Producer as _, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use super::producer::DeliveryReports;
use super::security::TokenContext;
use super::{CALL_TIMEOUT, ClientError, GroupConsumer, Producer, call_blocking};

/// An offset committed in a transaction: partition 0 of `topic` for `group`, with `metadata`.
pub(crate) struct GroupOffset {
    pub(crate) group: Arc<GroupConsumer>,
    pub(crate) topic: String,
    pub(crate) offset: i64,
    pub(crate) metadata: String,
}

/// Waits (a second at most) until librdkafka counts no record in flight.
///
/// Every record was reported when this is called, but librdkafka counts a record in flight
/// until the event that reported it is destroyed, just after the delivery callbacks return.
/// rust-rdkafka's `commit_transaction` flushes first, and a flush that finds a record in flight
/// polls the producer's queue in steps of 100 ms, a queue whose events the producer's own
/// polling thread takes: a commit that came a few microseconds early lost 100 ms (one in three
/// commits of 50,000 records, measured in the shipped pipeline).
fn settle(producer: &ThreadedProducer<DeliveryReports>) {
    let until = Instant::now() + Duration::from_secs(1);
    while producer.in_flight_count() > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// A transactional producer and whether a transaction is open.
pub(crate) struct TransactionalProducer {
    producer: Producer,
    open: bool,
}

impl TransactionalProducer {
    /// Creates the producer of `client` (which names its `transactional.id`) and initialises
    /// its transactions, once the cluster has answered it about `topic` (see
    /// [`Producer::connect`]: librdkafka looks for the transaction coordinator as soon as the
    /// producer exists and, with no connection up yet, looks again only 500 ms later).
    pub(crate) async fn init(
        client: &ClientConfig,
        context: TokenContext,
        topic: &str,
    ) -> Result<Self, ClientError> {
        let producer = Producer::new(client, context)?;
        producer.connect(topic).await;
        let p = producer.client().clone();
        call_blocking("initialising the transactional producer", move || {
            p.init_transactions(CALL_TIMEOUT)
        })
        .await?;
        Ok(Self {
            producer,
            open: false,
        })
    }

    /// The producer, to send the transaction's records.
    pub(crate) fn producer(&self) -> &Producer {
        &self.producer
    }

    /// Whether a transaction is open (begun and neither committed nor aborted).
    pub(crate) fn is_open(&self) -> bool {
        self.open
    }

    /// Begins a transaction unless one is open.
    pub(crate) fn begin(&mut self) -> Result<(), ClientError> {
        if !self.open {
            self.producer
                .client()
                .begin_transaction()
                .map_err(|e| ClientError::kafka("beginning a transaction", e))?;
            self.open = true;
        }
        Ok(())
    }

    /// Waits for every record of the open transaction, then commits it with `offset`.
    pub(crate) async fn commit(&mut self, offset: Option<GroupOffset>) -> Result<(), ClientError> {
        // Waiting for every record here, rather than leaving it to the commit, keeps the
        // commit's own flush from polling in 100 ms steps (rust-rdkafka's flush loop).
        self.producer.acknowledged().await?;
        let producer = self.producer.client().clone();
        let group_metadata = match &offset {
            Some(offset) => Some(offset.group.metadata()?),
            None => None,
        };
        call_blocking("committing the transaction", move || {
            settle(&producer);
            if let (Some(offset), Some(group_metadata)) = (offset, group_metadata) {
                let mut offsets = TopicPartitionList::new();
                let mut entry = offsets.add_partition(&offset.topic, 0);
                entry.set_offset(Offset::Offset(offset.offset))?;
                entry.set_metadata(offset.metadata);
                producer.send_offsets_to_transaction(&offsets, &group_metadata, CALL_TIMEOUT)?;
            }
            producer.commit_transaction(CALL_TIMEOUT)
        })
        .await?;
        self.open = false;
        Ok(())
    }

    /// Aborts the open transaction, if any, and ends the session (see the module docs).
    pub(crate) async fn abort(self) {
        if self.open {
            let producer = self.producer.client().clone();
            let _ = call_blocking("aborting the transaction", move || {
                producer.abort_transaction(CALL_TIMEOUT)
            })
            .await;
        }
    }
}
