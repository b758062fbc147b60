//! librdkafka's producer, with one counter of the records sent since the last wait.
//!
//! Each record carries a clone of one shared [`Deliveries`] (a reference count, not an
//! allocation) as its delivery opaque; librdkafka's delivery callback counts it down and keeps
//! the first failure, so waiting for a batch, a transaction or a flush of many batches waits
//! on one counter, not on a future per record.
//!
//! A full local queue (`queue.buffering.max.messages`) has one answer here: wait until about
//! half of the records outstanding are reported (10 ms at most), then offer the record again.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::client::{ClientContext, OAuthToken};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{
    BaseRecord, DeliveryResult, Producer as _, ProducerContext, ThreadedProducer,
};

use super::security::TokenContext;
use super::{CALL_TIMEOUT, ClientError, call_blocking};

/// The records sent since the last wait that Kafka has not yet reported on, and the first
/// failure among them.
#[derive(Debug, Default)]
pub(crate) struct Deliveries {
    outstanding: AtomicUsize,
    /// A waiter wants waking once `outstanding` is at most this.
    wake_at: AtomicUsize,
    failed: AtomicBool,
    /// The first failure; locked only when a record fails and when a waiter reports it.
    failure: Mutex<Option<KafkaError>>,
    woken: tokio::sync::Notify,
}

impl Deliveries {
    /// A record is about to be queued.
    fn sending(&self) {
        self.outstanding.fetch_add(1, Ordering::SeqCst);
    }

    /// A record counted by [`Self::sending`] was refused, so no report will come for it.
    fn refused(&self) {
        self.outstanding.fetch_sub(1, Ordering::SeqCst);
    }

    /// Kafka's report on one record (from librdkafka's polling thread).
    fn reported(&self, failure: Option<&KafkaError>) {
        if let Some(error) = failure {
            let mut first = self.failure.lock().unwrap_or_else(|e| e.into_inner());
            first.get_or_insert_with(|| error.clone());
            self.failed.store(true, Ordering::SeqCst);
        }
        let left = self
            .outstanding
            .fetch_sub(1, Ordering::SeqCst)
            .saturating_sub(1);
        if left <= self.wake_at.load(Ordering::SeqCst) || failure.is_some() {
            self.woken.notify_waiters();
        }
    }

    /// Waits until at most `target` records are outstanding; fails as soon as one failed.
    async fn fallen_to(&self, target: usize) -> Result<(), ClientError> {
        self.wake_at.store(target, Ordering::SeqCst);
        loop {
            // Registered before looking, so a report between the look and the wait wakes it.
            let woken = self.woken.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.failed.load(Ordering::SeqCst)
                || self.outstanding.load(Ordering::SeqCst) <= target
            {
                break;
            }
            woken.await;
        }
        self.wake_at.store(0, Ordering::SeqCst);
        self.failure()
    }

    /// The producer's queue is full: waits until half the outstanding records are reported,
    /// or 10 ms at most (the queue may hold records of earlier waits, counted elsewhere).
    async fn room(&self) -> Result<(), ClientError> {
        let outstanding = self.outstanding.load(Ordering::SeqCst);
        let wait = Duration::from_millis(10);
        if outstanding == 0 {
            tokio::time::sleep(wait).await;
        } else {
            let _ = tokio::time::timeout(wait, self.fallen_to(outstanding / 2)).await;
        }
        self.wake_at.store(0, Ordering::SeqCst);
        self.failure()
    }

    fn failure(&self) -> Result<(), ClientError> {
        if !self.failed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let first = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        match &*first {
            Some(error) => Err(ClientError::kafka("record not acknowledged", error.clone())),
            None => Err(ClientError::other(
                "record not acknowledged",
                "no report came",
            )),
        }
    }
}

/// The producer's context: hands each delivery report to the record's [`Deliveries`].
pub(crate) struct DeliveryReports(TokenContext);

impl ClientContext for DeliveryReports {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(
        &self,
        _config: Option<&str>,
    ) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        self.0.oauth_token()
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.0.client_error(error, reason);
    }

    fn stats_raw(&self, statistics: &[u8]) {
        self.0.client_statistics(statistics);
    }
}

impl ProducerContext for DeliveryReports {
    type DeliveryOpaque = Arc<Deliveries>;

    fn delivery(&self, result: &DeliveryResult<'_>, deliveries: Arc<Deliveries>) {
        deliveries.reported(result.as_ref().err().map(|(error, _)| error));
    }
}

/// A record for [`Producer::send`]: bytes for key and payload, counted by the producer's
/// [`Deliveries`].
pub(crate) type Record<'a> = BaseRecord<'a, [u8], [u8], Arc<Deliveries>>;

/// librdkafka's producer (with a thread serving its reports) and the records sent since the
/// last [`Producer::acknowledged`].
pub(crate) struct Producer {
    inner: ThreadedProducer<DeliveryReports>,
    deliveries: Arc<Deliveries>,
}

impl Producer {
    /// A producer with the settings of `client` (no network traffic yet).
    pub(crate) fn new(client: &ClientConfig, context: TokenContext) -> Result<Self, ClientError> {
        let inner = client
            .create_with_context(DeliveryReports(context))
            .map_err(|e| ClientError::kafka("creating the Kafka producer", e))?;
        Ok(Self {
            inner,
            deliveries: Arc::default(),
        })
    }

    /// Waits until the cluster has answered this producer about `topic` over a connection to
    /// one of its brokers (two seconds at most: an unreachable cluster is for the sends, or
    /// the transactions' initialisation, to report).
    ///
    /// librdkafka asks a broker for the producer id when a metadata answer comes. The first
    /// one comes over the bootstrap connection, which librdkafka drops as soon as it knows the
    /// brokers; found without a broker to ask, it looks again only 500 ms later (the first
    /// record of a pipeline waited that long in about one start of five). A second answer
    /// comes from a broker it keeps, and it asks that one.
    pub(crate) async fn connect(&self, topic: &str) {
        let producer = self.inner.clone();
        let topic = topic.to_owned();
        let _ = call_blocking("connecting to the cluster", move || {
            for _ in 0..2 {
                producer
                    .client()
                    .fetch_metadata(Some(&topic), Duration::from_secs(2))?;
            }
            Ok(())
        })
        .await;
    }

    /// How many partitions `topic` has, asked of the cluster (two seconds at most); `None` when
    /// it cannot tell (unreachable, or no such topic yet).
    pub(crate) async fn partition_count(&self, topic: &str) -> Option<i32> {
        let producer = self.inner.clone();
        let topic = topic.to_owned();
        call_blocking("reading the topic's partitions", move || {
            let metadata = producer
                .client()
                .fetch_metadata(Some(&topic), Duration::from_secs(2))?;
            Ok(metadata
                .topics()
                .iter()
                .find(|t| t.name() == topic && t.error().is_none())
                .and_then(|t| i32::try_from(t.partitions().len()).ok()))
        })
        .await
        .ok()
        .flatten()
        .filter(|&n| n > 0)
    }

    /// librdkafka's producer, for calls this module does not wrap.
    pub(crate) fn client(&self) -> &ThreadedProducer<DeliveryReports> {
        &self.inner
    }

    /// A record to `topic`, to be counted with the records sent since the last wait.
    pub(crate) fn record<'a>(&self, topic: &'a str) -> Record<'a> {
        BaseRecord::with_opaque_to(topic, Arc::clone(&self.deliveries))
    }

    /// Queues `record`. A full local queue makes it wait for room (see the module docs).
    pub(crate) async fn send(&self, mut record: Record<'_>) -> Result<(), ClientError> {
        self.deliveries.sending();
        loop {
            match self.inner.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    if let Err(error) = self.deliveries.room().await {
                        self.deliveries.refused();
                        return Err(error);
                    }
                }
                Err((error, back)) => {
                    self.deliveries.refused();
                    return Err(ClientError::kafka(
                        format!("sending to {}", back.topic),
                        error,
                    ));
                }
            }
        }
    }

    /// Waits until every record sent since the last call is acknowledged (`acks`), or one
    /// failed; the records sent after it are counted anew.
    pub(crate) async fn acknowledged(&mut self) -> Result<(), ClientError> {
        std::mem::take(&mut self.deliveries).fallen_to(0).await
    }

    /// Forgets the records sent since the last wait (after a failure: they are sent again).
    pub(crate) fn forget_sent(&mut self) {
        self.deliveries = Arc::default();
    }

    /// Records sent since the last wait and not yet reported on.
    #[cfg(test)]
    pub(crate) fn outstanding(&self) -> usize {
        self.deliveries.outstanding.load(Ordering::SeqCst)
    }

    /// librdkafka's fatal error, if it had one: such a producer never works again.
    pub(crate) fn fatal_error(&self) -> Option<(RDKafkaErrorCode, String)> {
        self.inner.client().fatal_error()
    }

    /// Waits until every queued record is reported (at stop).
    pub(crate) async fn flush(&self) -> Result<(), ClientError> {
        let producer = self.inner.clone();
        call_blocking("flushing the producer", move || {
            producer.flush(CALL_TIMEOUT)
        })
        .await
    }
}
