//! The transaction coordinator: producer ids, and Kafka's transactions (KIP-98) across
//! partitions and group offsets.
//!
//! This single broker coordinates every transactional id (FindCoordinator with key type 1
//! answers with itself). Each transactional id has a producer id and epoch; InitProducerId bumps
//! the epoch, which fences the previous instance of the producer: its requests then get
//! PRODUCER_FENCED (INVALID_PRODUCER_EPOCH for versions older than KIP-588's).
//!
//! States and transitions, as Kafka's `TransactionMetadata`:
//!
//! ```text
//! Empty ──AddPartitions/AddOffsets──▶ Ongoing ──EndTxn──▶ PrepareCommit ──markers──▶ CompleteCommit
//!   ▲                                    │    └──EndTxn/timeout/fence──▶ PrepareAbort ──▶ CompleteAbort
//!   └────────── InitProducerId ◀─────────┴──────────────── (from Complete*: a new transaction) ─┘
//! ```
//!
//! - **Durability.** Every transition is written to the catalog (`transactions`, `txn_partitions`,
//!   `txn_groups`) before the client is answered. `PrepareCommit`/`PrepareAbort` is the durable
//!   decision: after it, the coordinator writes a COMMIT or ABORT marker to every partition of
//!   the transaction, then in one SQLite transaction applies (commit) or drops (abort) the
//!   offsets staged by TxnOffsetCommit (`txn_pending_offsets`) and records `CompleteCommit`/
//!   `CompleteAbort`. A broker that stops in between finds the `Prepare*` state at start and
//!   writes the markers again (a partition tolerates a duplicate marker) before serving.
//! - **Synchronous completion.** Markers are local appends, so EndTxn answers after completion.
//!   If a marker cannot be written (a storage error), the transaction stays in its `Prepare*`
//!   state, EndTxn still succeeds (the decision is durable, as in Kafka) and completion is retried
//!   by the next request on that transactional id or the periodic task; meanwhile a new
//!   transaction gets CONCURRENT_TRANSACTIONS.
//! - **Fencing.** InitProducerId on a transactional id with an open transaction aborts it with
//!   the epoch bumped (markers carry the new epoch, so the partitions fence the old instance's
//!   late writes), then bumps the epoch again for the new instance, as Kafka ends up doing after
//!   its CONCURRENT_TRANSACTIONS retry. An epoch at `i16::MAX - 1` is exhausted: the next
//!   InitProducerId hands out a new producer id at epoch 0. KIP-360: a request naming its current
//!   producer id and epoch is accepted when they are the current ones, or the previous ones of
//!   a bump whose answer the producer never got.
//! - **Timeouts.** Every `transaction.abort.timed.out.transaction.cleanup.interval.ms` an open
//!   transaction older than its `transaction.timeout.ms` is aborted with the epoch bumped, which
//!   fences its producer; idle transactional ids (`Empty`, `Complete*`) are forgotten after
//!   `transactional.id.expiration.ms`. A timeout longer than `transaction.max.timeout.ms` is
//!   refused with INVALID_TRANSACTION_TIMEOUT.
//! - **Producer ids** come from a durable counter in the catalog: never handed out twice.
//!
//! Transaction version 2 (KIP-890 part 2: an epoch bump per transaction, EndTxn v5,
//! TxnOffsetCommit v5, implicit AddPartitionsToTxn through Produce) is not served; the routes
//! advertise the versions before it, so clients use version 1 transactions.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use kafka_protocol::ResponseError;

use crate::catalog::{Catalog, CatalogError, CommittedOffset, TransactionRecord};
use crate::config::BrokerConfig;
use crate::log::{AppendError, ProducerError};
use crate::topics::Topics;

/// Kafka's `RecordBatch.NO_PRODUCER_ID`.
pub(crate) const NO_PRODUCER_ID: i64 = -1;
/// Kafka's `RecordBatch.NO_PRODUCER_EPOCH`.
pub(crate) const NO_PRODUCER_EPOCH: i16 = -1;
/// The coordinator epoch written in markers: a single broker's coordinator never moves.
const COORDINATOR_EPOCH: i32 = 0;

/// A transactional id's state, with Kafka's names (DescribeTransactions, ListTransactions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    /// Kafka's intermediate state of a fence; here a fence goes straight to `PrepareAbort`, so
    /// this state is only known by name (a ListTransactions filter).
    PrepareEpochFence,
    /// Kafka's state of an expiring id; here expiry removes the id at once, so this state is only
    /// known by name.
    Dead,
}

impl TxnState {
    const ALL: [TxnState; 8] = [
        TxnState::Empty,
        TxnState::Ongoing,
        TxnState::PrepareCommit,
        TxnState::PrepareAbort,
        TxnState::CompleteCommit,
        TxnState::CompleteAbort,
        TxnState::PrepareEpochFence,
        TxnState::Dead,
    ];

    /// Kafka's name of the state.
    pub(crate) fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::PrepareEpochFence => "PrepareEpochFence",
            TxnState::Dead => "Dead",
        }
    }

    /// The state with this Kafka name.
    pub(crate) fn from_name(name: &str) -> Option<TxnState> {
        TxnState::ALL.into_iter().find(|s| s.name() == name)
    }

    fn prepare(commit: bool) -> TxnState {
        if commit {
            TxnState::PrepareCommit
        } else {
            TxnState::PrepareAbort
        }
    }

    /// The outcome of a `Prepare*` state.
    fn preparing(self) -> Option<bool> {
        match self {
            TxnState::PrepareCommit => Some(true),
            TxnState::PrepareAbort => Some(false),
            _ => None,
        }
    }
}

/// Kafka's `TransactionMetadata.isEpochExhausted`: the last epochs are kept for fencing.
fn epoch_exhausted(epoch: i16) -> bool {
    epoch >= i16::MAX - 1
}

/// PRODUCER_FENCED as the request's version knows it: versions before `fenced_from` (KIP-588)
/// only know INVALID_PRODUCER_EPOCH.
pub(crate) fn for_version(error: ResponseError, version: i16, fenced_from: i16) -> ResponseError {
    if error == ResponseError::ProducerFenced && version < fenced_from {
        ResponseError::InvalidProducerEpoch
    } else {
        error
    }
}

/// One transactional id.
#[derive(Debug, Clone, PartialEq)]
struct Txn {
    id: String,
    producer_id: i64,
    /// The producer id before the last rotation (epoch exhaustion), for KIP-360 retries.
    last_producer_id: i64,
    producer_epoch: i16,
    /// The epoch before the last bump, for KIP-360 retries of that bump.
    last_producer_epoch: i16,
    timeout_ms: i32,
    state: TxnState,
    partitions: BTreeSet<(String, i32)>,
    groups: BTreeSet<String>,
    /// Wall-clock ms when the open transaction started; -1 when none is open.
    start_ms: i64,
    last_update_ms: i64,
}

impl Txn {
    fn record(&self) -> TransactionRecord {
        TransactionRecord {
            transactional_id: self.id.clone(),
            producer_id: self.producer_id,
            last_producer_id: self.last_producer_id,
            producer_epoch: self.producer_epoch,
            last_producer_epoch: self.last_producer_epoch,
            timeout_ms: self.timeout_ms,
            state: self.state.name().to_owned(),
            start_ms: self.start_ms,
            last_update_ms: self.last_update_ms,
            partitions: self.partitions.clone(),
            groups: self.groups.clone(),
        }
    }

    fn from_record(r: TransactionRecord) -> Option<Txn> {
        Some(Txn {
            state: TxnState::from_name(&r.state)?,
            id: r.transactional_id,
            producer_id: r.producer_id,
            last_producer_id: r.last_producer_id,
            producer_epoch: r.producer_epoch,
            last_producer_epoch: r.last_producer_epoch,
            timeout_ms: r.timeout_ms,
            partitions: r.partitions,
            groups: r.groups,
            start_ms: r.start_ms,
            last_update_ms: r.last_update_ms,
        })
    }

    /// Producer id and epoch of a request against this transactional id.
    fn check_producer(&self, producer_id: i64, epoch: i16) -> Result<(), ResponseError> {
        if producer_id != self.producer_id {
            Err(ResponseError::InvalidProducerIdMapping)
        } else if epoch != self.producer_epoch {
            Err(ResponseError::ProducerFenced)
        } else {
            Ok(())
        }
    }
}

/// A transaction as DescribeTransactions and ListTransactions show it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TxnDescription {
    pub(crate) transactional_id: String,
    pub(crate) state: TxnState,
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i16,
    pub(crate) timeout_ms: i32,
    pub(crate) start_ms: i64,
    pub(crate) partitions: BTreeSet<(String, i32)>,
}

/// What to add to the open transaction.
pub(crate) enum Addition<'a> {
    /// AddPartitionsToTxn.
    Partitions(&'a BTreeSet<(String, i32)>),
    /// AddOffsetsToTxn.
    Group(&'a str),
}

/// The coordinator of every transactional id on this broker.
pub(crate) struct TxnCoordinator {
    catalog: Arc<Catalog>,
    max_timeout_ms: i32,
    id_expiration_ms: i64,
    /// max_transactional_ids
    max_ids: usize,
    reached: Arc<crate::limits::Reached>,
    txns: Mutex<HashMap<String, Txn>>,
}

impl TxnCoordinator {
    /// Loads the transactional ids known to the catalog, in the state they were left in
    /// (`Prepare*` ones are completed by [`TxnCoordinator::recover`]).
    /// Limits reached are counted in `reached`.
    pub(crate) fn load(
        config: &BrokerConfig,
        catalog: Arc<Catalog>,
        reached: Arc<crate::limits::Reached>,
    ) -> Result<Self, CatalogError> {
        let mut txns = HashMap::new();
        for record in catalog.transactions()? {
            let id = record.transactional_id.clone();
            let state = record.state.clone();
            match Txn::from_record(record) {
                Some(txn) => {
                    txns.insert(id, txn);
                }
                None => tracing::error!(
                    transactional_id = %id,
                    state,
                    "unknown transaction state in the metadata database: transactional id ignored"
                ),
            }
        }
        Ok(TxnCoordinator {
            catalog,
            max_timeout_ms: config.transaction_max_timeout_ms,
            id_expiration_ms: config.transactional_id_expiration_ms,
            max_ids: usize::try_from(config.max_transactional_ids.max(1)).unwrap_or(usize::MAX),
            reached,
            txns: Mutex::new(txns),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Txn>> {
        // Every transition replaces a whole `Txn` after it was stored, so a panic elsewhere
        // cannot leave one half-changed.
        self.txns.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn new_producer_id(&self) -> Result<i64, ResponseError> {
        self.catalog.next_producer_id().map_err(|e| {
            tracing::error!(error = %e, "cannot allocate a producer id");
            ResponseError::CoordinatorNotAvailable
        })
    }

    /// Stores `next` and makes it the current state of its transactional id.
    fn transition(&self, txn: &mut Txn, next: Txn) -> Result<(), ResponseError> {
        if let Err(e) = self.catalog.save_transaction(&next.record()) {
            tracing::error!(transactional_id = %next.id, state = next.state.name(), error = %e,
                "cannot store the transaction state");
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        *txn = next;
        Ok(())
    }

    /// Completes a `Prepare*` transaction: markers, then offsets and the `Complete*` state in
    /// one SQLite transaction. `false` when it stays prepared (logged; retried later).
    fn finish(&self, topics: &Topics, txn: &mut Txn, now: i64) -> bool {
        let Some(commit) = txn.state.preparing() else {
            return true;
        };
        if !write_markers(topics, txn, commit) {
            return false;
        }
        let next = Txn {
            state: if commit {
                TxnState::CompleteCommit
            } else {
                TxnState::CompleteAbort
            },
            partitions: BTreeSet::new(),
            groups: BTreeSet::new(),
            last_update_ms: now,
            ..txn.clone()
        };
        match self.catalog.complete_transaction(&next.record(), commit) {
            Ok(offsets) => {
                tracing::debug!(transactional_id = %txn.id, producer_id = txn.producer_id,
                    epoch = txn.producer_epoch, commit, partitions = txn.partitions.len(), offsets,
                    "transaction completed");
                *txn = next;
                true
            }
            Err(e) => {
                tracing::error!(transactional_id = %txn.id, commit, error = %e,
                    "markers written but the transaction's completion cannot be stored; retried later");
                false
            }
        }
    }

    /// Aborts the open transaction with the epoch bumped, fencing its producer. `Ok(false)`
    /// when the abort is decided but not complete yet.
    fn fence(&self, topics: &Topics, txn: &mut Txn, now: i64) -> Result<bool, ResponseError> {
        let next = Txn {
            producer_epoch: txn
                .producer_epoch
                .checked_add(1)
                .unwrap_or(txn.producer_epoch),
            last_producer_epoch: NO_PRODUCER_EPOCH,
            state: TxnState::PrepareAbort,
            last_update_ms: now,
            ..txn.clone()
        };
        self.transition(txn, next)?;
        Ok(self.finish(topics, txn, now))
    }

    /// Completes the transactions left prepared by the last run (call once at start).
    pub(crate) fn recover(&self, topics: &Topics) {
        let now = crate::log::now_ms();
        let mut txns = self.lock();
        for txn in txns.values_mut() {
            if let Some(commit) = txn.state.preparing() {
                tracing::info!(transactional_id = %txn.id, commit, partitions = txn.partitions.len(),
                    "completing a transaction prepared before the restart");
                self.finish(topics, txn, now);
            }
        }
    }

    /// Handles an InitProducerId: the producer id and epoch to use.
    pub(crate) fn init_producer_id(
        &self,
        topics: &Topics,
        transactional_id: Option<&str>,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
        now: i64,
    ) -> Result<(i64, i16), ResponseError> {
        // An idempotent producer without transactions: a fresh id every time.
        let Some(id) = transactional_id else {
            return Ok((self.new_producer_id()?, 0));
        };
        if id.is_empty() {
            return Err(ResponseError::InvalidRequest);
        }
        if timeout_ms <= 0 || timeout_ms > self.max_timeout_ms {
            return Err(ResponseError::InvalidTransactionTimeout);
        }
        let mut txns = self.lock();
        if !txns.contains_key(id) {
            if txns.len() >= self.max_ids {
                let held = txns.len();
                self.reached
                    .count(crate::limits::Held::TransactionalIds, || {
                        format!(
                            "InitProducerId for a new transactional id {id:?} refused with \
                             POLICY_VIOLATION: the coordinator holds {held} transactional ids, \
                             the most max_transactional_ids allows (idle ones go after \
                             transactional_id_expiration_ms)"
                        )
                    });
                return Err(ResponseError::PolicyViolation);
            }
            let producer_id = self.new_producer_id()?;
            let txn = Txn {
                id: id.to_owned(),
                producer_id,
                last_producer_id: NO_PRODUCER_ID,
                producer_epoch: NO_PRODUCER_EPOCH,
                last_producer_epoch: NO_PRODUCER_EPOCH,
                timeout_ms,
                state: TxnState::Empty,
                partitions: BTreeSet::new(),
                groups: BTreeSet::new(),
                start_ms: -1,
                last_update_ms: now,
            };
            txns.insert(id.to_owned(), txn);
        }
        let Some(txn) = txns.get_mut(id) else {
            return Err(ResponseError::UnknownServerError);
        };
        if let Some((producer_id, epoch)) = expected {
            let valid = txn.producer_epoch == NO_PRODUCER_EPOCH
                || producer_id == txn.producer_id
                || (producer_id == txn.last_producer_id && epoch_exhausted(epoch));
            if !valid {
                tracing::info!(
                    transactional_id = id,
                    producer_id,
                    epoch,
                    current = txn.producer_id,
                    "InitProducerId names another producer: fenced"
                );
                return Err(ResponseError::ProducerFenced);
            }
        }
        // A transaction that is still open or completing ends first (aborted, for an open one).
        let ended = match txn.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort => self.finish(topics, txn, now),
            TxnState::Ongoing => {
                tracing::info!(
                    transactional_id = id,
                    producer_id = txn.producer_id,
                    epoch = txn.producer_epoch,
                    "new producer instance: aborting the open transaction of the previous one"
                );
                self.fence(topics, txn, now)?
            }
            _ => true,
        };
        if !ended {
            return Err(ResponseError::ConcurrentTransactions);
        }
        let mut next = Txn {
            timeout_ms,
            state: TxnState::Empty,
            partitions: BTreeSet::new(),
            groups: BTreeSet::new(),
            start_ms: -1,
            last_update_ms: now,
            ..txn.clone()
        };
        if epoch_exhausted(txn.producer_epoch)
            && expected.is_none_or(|(_, epoch)| epoch == txn.producer_epoch)
        {
            next.producer_id = self.new_producer_id()?;
            next.producer_epoch = 0;
            next.last_producer_id = txn.producer_id;
            next.last_producer_epoch = if expected.is_some() {
                txn.producer_epoch
            } else {
                NO_PRODUCER_EPOCH
            };
            tracing::info!(
                transactional_id = id,
                old = txn.producer_id,
                new = next.producer_id,
                "producer epoch exhausted: new producer id"
            );
        } else {
            let bumped = txn.producer_epoch.checked_add(1);
            match (expected, bumped) {
                (None, Some(bumped)) => {
                    next.producer_epoch = bumped;
                    next.last_producer_epoch = NO_PRODUCER_EPOCH;
                }
                (Some((_, epoch)), Some(bumped))
                    if txn.producer_epoch == NO_PRODUCER_EPOCH || epoch == txn.producer_epoch =>
                {
                    next.producer_epoch = bumped;
                    next.last_producer_epoch = txn.producer_epoch;
                }
                // A retry of a bump whose answer was lost: the same epoch again.
                (Some((_, epoch)), _) if epoch == txn.last_producer_epoch => {}
                _ => {
                    tracing::info!(
                        transactional_id = id,
                        epoch = txn.producer_epoch,
                        ?expected,
                        "InitProducerId with a stale epoch: fenced"
                    );
                    return Err(ResponseError::ProducerFenced);
                }
            }
        }
        self.transition(txn, next)?;
        tracing::info!(
            transactional_id = id,
            producer_id = txn.producer_id,
            epoch = txn.producer_epoch,
            "initialized transactional producer"
        );
        Ok((txn.producer_id, txn.producer_epoch))
    }

    /// Handles an AddPartitionsToTxn or an AddOffsetsToTxn: starts a transaction if none is
    /// open.
    pub(crate) fn add(
        &self,
        topics: &Topics,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        addition: Addition<'_>,
        now: i64,
    ) -> Result<(), ResponseError> {
        if transactional_id.is_empty() {
            return Err(ResponseError::InvalidRequest);
        }
        let mut txns = self.lock();
        let Some(txn) = txns.get_mut(transactional_id) else {
            return Err(ResponseError::InvalidProducerIdMapping);
        };
        txn.check_producer(producer_id, epoch)?;
        if txn.state.preparing().is_some() && !self.finish(topics, txn, now) {
            return Err(ResponseError::ConcurrentTransactions);
        }
        let ongoing = txn.state == TxnState::Ongoing;
        let present = match addition {
            Addition::Partitions(p) => p.is_subset(&txn.partitions),
            Addition::Group(g) => txn.groups.contains(g),
        };
        if ongoing && present {
            return Ok(());
        }
        let mut next = Txn {
            state: TxnState::Ongoing,
            last_update_ms: now,
            ..txn.clone()
        };
        if !ongoing {
            next.start_ms = now;
            next.partitions.clear();
            next.groups.clear();
        }
        match addition {
            Addition::Partitions(p) => next.partitions.extend(p.iter().cloned()),
            Addition::Group(g) => {
                next.groups.insert(g.to_owned());
            }
        }
        self.transition(txn, next)
    }

    /// Handles the transactional part of a TxnOffsetCommit: checks that the group is in the
    /// producer's open transaction, then stages `offsets` (checked by the group coordinator),
    /// invisible to OffsetFetch until the transaction commits.
    pub(crate) fn stage_offsets(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        group_id: &str,
        offsets: &[CommittedOffset],
    ) -> Result<(), ResponseError> {
        let txns = self.lock();
        let Some(txn) = txns.get(transactional_id) else {
            return Err(ResponseError::InvalidProducerIdMapping);
        };
        txn.check_producer(producer_id, epoch)?;
        if txn.state != TxnState::Ongoing || !txn.groups.contains(group_id) {
            tracing::debug!(
                transactional_id,
                group = group_id,
                state = txn.state.name(),
                "TxnOffsetCommit for a group not in the open transaction"
            );
            return Err(ResponseError::InvalidTxnState);
        }
        if offsets.is_empty() {
            return Ok(());
        }
        // Staged under the coordinator's lock, so EndTxn cannot complete in between.
        self.catalog
            .stage_txn_offsets(transactional_id, group_id, offsets)
            .map_err(|e| {
                tracing::error!(transactional_id, group = group_id, error = %e,
                    "cannot stage transactional offsets");
                e.response_error()
            })
    }

    /// Handles an EndTxn: answers once the transaction is complete, or its outcome durable.
    pub(crate) fn end(
        &self,
        topics: &Topics,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        commit: bool,
        now: i64,
    ) -> Result<(), ResponseError> {
        if transactional_id.is_empty() {
            return Err(ResponseError::InvalidRequest);
        }
        let mut txns = self.lock();
        let Some(txn) = txns.get_mut(transactional_id) else {
            return Err(ResponseError::InvalidProducerIdMapping);
        };
        txn.check_producer(producer_id, epoch)?;
        match (txn.state, commit) {
            (TxnState::Ongoing, _) => {
                let next = Txn {
                    state: TxnState::prepare(commit),
                    last_update_ms: now,
                    ..txn.clone()
                };
                self.transition(txn, next)?;
                // The outcome is durable: success even if a marker has to wait for a retry.
                self.finish(topics, txn, now);
                Ok(())
            }
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => Ok(()),
            (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => {
                if self.finish(topics, txn, now) {
                    Ok(())
                } else {
                    Err(ResponseError::ConcurrentTransactions)
                }
            }
            (state, _) => {
                tracing::debug!(
                    transactional_id,
                    state = state.name(),
                    commit,
                    "EndTxn in a state that cannot end that way"
                );
                Err(ResponseError::InvalidTxnState)
            }
        }
    }

    /// The periodic work: completes prepared transactions whose markers failed, aborts open
    /// transactions past their timeout (fencing their producers) and forgets transactional ids
    /// idle past `transactional.id.expiration.ms`.
    pub(crate) fn tick(&self, topics: &Topics, now: i64) {
        let mut txns = self.lock();
        let mut expired = Vec::new();
        for txn in txns.values_mut() {
            match txn.state {
                TxnState::PrepareCommit | TxnState::PrepareAbort => {
                    self.finish(topics, txn, now);
                }
                TxnState::Ongoing
                    if txn.start_ms.saturating_add(i64::from(txn.timeout_ms)) < now =>
                {
                    tracing::info!(transactional_id = %txn.id, producer_id = txn.producer_id,
                        epoch = txn.producer_epoch, timeout_ms = txn.timeout_ms,
                        "aborting a transaction past its timeout; its producer is fenced");
                    // A failure is logged; the next tick tries again.
                    let _ = self.fence(topics, txn, now);
                }
                TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
                    if txn.last_update_ms.saturating_add(self.id_expiration_ms) <= now =>
                {
                    expired.push(txn.id.clone());
                }
                _ => {}
            }
        }
        for id in expired {
            if let Err(e) = self.catalog.delete_transaction(&id) {
                tracing::error!(transactional_id = %id, error = %e, "cannot remove an expired transactional id");
                continue;
            }
            txns.remove(&id);
            tracing::info!(transactional_id = %id, "removed an expired transactional id");
        }
    }

    /// A transactional id's state: TRANSACTIONAL_ID_NOT_FOUND when unknown.
    pub(crate) fn describe(&self, transactional_id: &str) -> Result<TxnDescription, ResponseError> {
        if transactional_id.is_empty() {
            return Err(ResponseError::InvalidRequest);
        }
        self.lock()
            .get(transactional_id)
            .map(describe)
            .ok_or(ResponseError::TransactionalIdNotFound)
    }

    /// Every transactional id in one of `states` (all when empty), with one of `producer_ids`
    /// (all when empty), whose open transaction is older than `min_duration_ms` (all when
    /// negative), sorted by transactional id.
    pub(crate) fn list(
        &self,
        states: &[TxnState],
        producer_ids: &[i64],
        min_duration_ms: i64,
        now: i64,
    ) -> Vec<TxnDescription> {
        let mut all: Vec<_> = self
            .lock()
            .values()
            .filter(|t| states.is_empty() || states.contains(&t.state))
            .filter(|t| producer_ids.is_empty() || producer_ids.contains(&t.producer_id))
            .filter(|t| min_duration_ms < 0 || now.saturating_sub(t.start_ms) > min_duration_ms)
            .map(describe)
            .collect();
        all.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        all
    }

    /// The partitions of `group` with offsets staged by open transactions.
    pub(crate) fn pending_offsets(
        &self,
        group: &str,
    ) -> Result<BTreeSet<(String, i32)>, CatalogError> {
        self.catalog.pending_txn_offsets(group)
    }
}

fn describe(txn: &Txn) -> TxnDescription {
    TxnDescription {
        transactional_id: txn.id.clone(),
        state: txn.state,
        producer_id: txn.producer_id,
        producer_epoch: txn.producer_epoch,
        timeout_ms: txn.timeout_ms,
        start_ms: txn.start_ms,
        partitions: txn.partitions.clone(),
    }
}

/// Writes the transaction's COMMIT or ABORT marker to each of its partitions; `false` when one
/// could not be written (those written are written again by the retry, which partitions
/// tolerate).
fn write_markers(topics: &Topics, txn: &Txn, commit: bool) -> bool {
    let mut all = true;
    for (topic, index) in &txn.partitions {
        let Some(partition) = topics.get(topic).and_then(|t| t.partition(*index).cloned()) else {
            tracing::warn!(transactional_id = %txn.id, topic, partition = index,
                "partition of the transaction no longer exists: no marker to write");
            continue;
        };
        let written = partition.log().append_marker(
            txn.producer_id,
            txn.producer_epoch,
            commit,
            COORDINATOR_EPOCH,
        );
        match written {
            Ok(offset) => tracing::trace!(transactional_id = %txn.id, topic, partition = index,
                offset, commit, "wrote a transaction marker"),
            // The partition saw a newer epoch of this producer: the epoch's transaction there
            // is closed already.
            Err(AppendError::Producer(ProducerError::InvalidProducerEpoch { .. })) => {
                tracing::warn!(transactional_id = %txn.id, topic, partition = index,
                    epoch = txn.producer_epoch, "stale transaction marker not written: the partition has a newer epoch")
            }
            Err(e) => {
                tracing::error!(transactional_id = %txn.id, topic, partition = index, commit,
                    error = %e, "cannot write a transaction marker; retried later");
                all = false;
            }
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::tests::context;
    use crate::groups::{Committer, OffsetToCommit};
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
    use std::collections::BTreeMap;

    const T0: i64 = 1_000_000;

    fn set(partitions: &[(&str, i32)]) -> BTreeSet<(String, i32)> {
        partitions
            .iter()
            .map(|(t, p)| (t.to_string(), *p))
            .collect()
    }

    fn end_offset(ctx: &crate::api::Context, topic: &str, partition: i32) -> i64 {
        let topic = ctx.topics.get(topic).unwrap();
        topic.partition(partition).unwrap().log().log_end_offset()
    }

    fn state(ctx: &crate::api::Context, id: &str) -> TxnState {
        ctx.txns.describe(id).unwrap().state
    }

    fn offset(topic: &str, partition: i32, offset: i64) -> OffsetToCommit {
        OffsetToCommit {
            topic: topic.into(),
            partition,
            offset,
            leader_epoch: -1,
            metadata: None,
        }
    }

    const ANYONE: Committer<'static> = Committer {
        member_id: "",
        instance_id: None,
        generation: -1,
    };

    /// TxnOffsetCommit as its handler runs it.
    fn commit_in_txn(
        ctx: &crate::api::Context,
        id: &str,
        (pid, epoch): (i64, i16),
        group: &str,
        offsets: Vec<OffsetToCommit>,
    ) -> Result<(), ResponseError> {
        let (answers, rows) = ctx
            .groups
            .check_txn_commit(&ctx.topics, group, ANYONE, offsets)?;
        assert!(answers.iter().all(Option::is_none), "{answers:?}");
        ctx.txns.stage_offsets(id, pid, epoch, group, &rows)
    }

    fn with_topic(dir: &std::path::Path) -> Arc<crate::api::Context> {
        let ctx = context(dir);
        ctx.topics
            .create("x", 2, 1, BTreeMap::new(), false)
            .unwrap();
        ctx
    }

    #[test]
    fn idempotent_producers_get_fresh_ids_never_reused_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        let a = ctx
            .txns
            .init_producer_id(&ctx.topics, None, 0, None, T0)
            .unwrap();
        let b = ctx
            .txns
            .init_producer_id(&ctx.topics, None, 0, None, T0)
            .unwrap();
        assert_eq!((a.1, b.1), (0, 0));
        assert!(b.0 > a.0);
        drop(ctx);
        let ctx = context(dir.path());
        let c = ctx
            .txns
            .init_producer_id(&ctx.topics, None, 0, None, T0)
            .unwrap();
        assert!(c.0 > b.0);
    }

    #[test]
    fn a_new_instance_bumps_the_epoch_and_fences_the_previous_one() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = with_topic(dir.path());
        let txns = &ctx.txns;
        let (pid, e0) = txns
            .init_producer_id(&ctx.topics, Some("t"), 60_000, None, T0)
            .unwrap();
        assert_eq!(e0, 0);
        let (pid2, e1) = txns
            .init_producer_id(&ctx.topics, Some("t"), 60_000, None, T0)
            .unwrap();
        assert_eq!((pid2, e1), (pid, 1));
        let p = set(&[("x", 0)]);
        let old = txns.add(&ctx.topics, "t", pid, e0, Addition::Partitions(&p), T0);
        assert_eq!(old, Err(ResponseError::ProducerFenced));
        assert_eq!(
            for_version(ResponseError::ProducerFenced, 1, 2),
            ResponseError::InvalidProducerEpoch
        );
        assert_eq!(
            txns.add(
                &ctx.topics,
                "t",
                pid + 100,
                e1,
                Addition::Partitions(&p),
                T0
            ),
            Err(ResponseError::InvalidProducerIdMapping)
        );
        assert_eq!(
            txns.add(
                &ctx.topics,
                "unknown",
                pid,
                e1,
                Addition::Partitions(&p),
                T0
            ),
            Err(ResponseError::InvalidProducerIdMapping)
        );
        txns.add(&ctx.topics, "t", pid, e1, Addition::Partitions(&p), T0)
            .unwrap();
        assert_eq!(state(&ctx, "t"), TxnState::Ongoing);
        assert_eq!(
            txns.end(&ctx.topics, "t", pid, e0, true, T0),
            Err(ResponseError::ProducerFenced)
        );
    }

    #[test]
    fn a_timeout_above_the_maximum_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        for timeout in [0, 900_001] {
            assert_eq!(
                ctx.txns
                    .init_producer_id(&ctx.topics, Some("t"), timeout, None, T0),
                Err(ResponseError::InvalidTransactionTimeout)
            );
        }
        assert_eq!(
            ctx.txns
                .init_producer_id(&ctx.topics, Some(""), 1000, None, T0),
            Err(ResponseError::InvalidRequest)
        );
    }

    #[test]
    fn commit_writes_a_marker_to_every_partition_and_a_retry_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = with_topic(dir.path());
        let txns = &ctx.txns;
        let (pid, epoch) = txns
            .init_producer_id(&ctx.topics, Some("t"), 60_000, None, T0)
            .unwrap();
        assert_eq!(
            txns.end(&ctx.topics, "t", pid, epoch, true, T0),
            Err(ResponseError::InvalidTxnState),
            "nothing to commit in Empty"
        );
        let p = set(&[("x", 0), ("x", 1)]);
        txns.add(&ctx.topics, "t", pid, epoch, Addition::Partitions(&p), T0)
            .unwrap();
        let described = txns.describe("t").unwrap();
        assert_eq!((described.start_ms, described.partitions), (T0, p.clone()));
        txns.end(&ctx.topics, "t", pid, epoch, true, T0 + 5)
            .unwrap();
        assert_eq!(state(&ctx, "t"), TxnState::CompleteCommit);
        assert_eq!((end_offset(&ctx, "x", 0), end_offset(&ctx, "x", 1)), (1, 1));
        txns.end(&ctx.topics, "t", pid, epoch, true, T0 + 6)
            .unwrap();
        assert_eq!(
            txns.end(&ctx.topics, "t", pid, epoch, false, T0 + 6),
            Err(ResponseError::InvalidTxnState)
        );
        assert_eq!(
            end_offset(&ctx, "x", 0),
            1,
            "a retry writes no second marker"
        );
        // The next transaction starts afresh.
        let q = set(&[("x", 1)]);
        txns.add(
            &ctx.topics,
            "t",
            pid,
            epoch,
            Addition::Partitions(&q),
            T0 + 7,
        )
        .unwrap();
        assert_eq!(txns.describe("t").unwrap().partitions, q);
        txns.end(&ctx.topics, "t", pid, epoch, false, T0 + 8)
            .unwrap();
        assert_eq!(state(&ctx, "t"), TxnState::CompleteAbort);
        assert_eq!((end_offset(&ctx, "x", 0), end_offset(&ctx, "x", 1)), (1, 2));
    }

    #[test]
    fn a_new_instance_aborts_the_open_transaction_of_the_previous_one() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = with_topic(dir.path());
        let txns = &ctx.txns;
        let (pid, e0) = txns
            .init_producer_id(&ctx.topics, Some("t"), 60_000, None, T0)
            .unwrap();
        let p = set(&[("x", 0)]);
        txns.add(&ctx.topics, "t", pid, e0, Addition::Partitions(&p), T0)
            .unwrap();
        let (pid2, e2) = txns
            .init_producer_id(&ctx.topics, Some("t"), 60_000, None, T0)
            .unwrap();
        // One bump for the fence (the abort marker's epoch), one for the new instance.
        assert_eq!((pid2, e2), (pid, 2));
        assert_eq!(state(&ctx, "t"), TxnState::Empty);
        assert_eq!(end_offset(&ctx, "x", 0), 1, "abort marker written");
    }

    #[test]
    fn kip_360_retries_of_a_bump_get_the_same_epoch_and_others_are_fenced() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        let txns = &ctx.txns;
        let (pid, e0) = txns
            .init_producer_id(&ctx.topics, Some("t"), 60_000, None, T0)
            .unwrap();
        let bumped = txns
            .init_producer_id(&ctx.topics, Some("t"), 60_000, Some((pid, e0)), T0)
            .unwrap();
        assert_eq!(bumped, (pid, 1));
        let retried = txns
            .init_producer_id(&ctx.topics, Some("t"), 60_000, Some((pid, e0)), T0)
            .unwrap();
        assert_eq!(retried, (pid, 1));
        for expected in [(pid, 7), (pid + 1, 1)] {
            assert_eq!(
                txns.init_producer_id(&ctx.topics, Some("t"), 60_000, Some(expected), T0),
                Err(ResponseError::ProducerFenced),
                "{expected:?}"
            );
        }
    }

    #[test]
    fn an_exhausted_epoch_rotates_the_producer_id() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        let txns = &ctx.txns;
        let (pid, _) = txns
            .init_producer_id(&ctx.topics, Some("t"), 60_000, None, T0)
            .unwrap();
        txns.lock().get_mut("t").unwrap().producer_epoch = i16::MAX - 2;
        let last = txns
            .init_producer_id(&ctx.topics, Some("t"), 60_000, None, T0)
            .unwrap();
        assert_eq!(last, (pid, i16::MAX - 1));
        let rotated = txns
            .init_producer_id(&ctx.topics, Some("t"), 60_000, Some(last), T0)
            .unwrap();
        assert!(rotated.0 > pid);
        assert_eq!(rotated.1, 0);
        // The answer was lost: the retry names the old id and exhausted epoch.
        let retried = txns
            .init_producer_id(&ctx.topics, Some("t"), 60_000, Some(last), T0)
            .unwrap();
        assert_eq!(retried, rotated);
        // And it survives a restart.
        drop(ctx);
        let ctx = context(dir.path());
        let d = ctx.txns.describe("t").unwrap();
        assert_eq!((d.producer_id, d.producer_epoch), rotated);
    }

    #[test]
    fn a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = with_topic(dir.path());
        let txns = &ctx.txns;
        let (pid, epoch) = txns
            .init_producer_id(&ctx.topics, Some("t"), 1000, None, T0)
            .unwrap();
        let p = set(&[("x", 0)]);
        txns.add(&ctx.topics, "t", pid, epoch, Addition::Partitions(&p), T0)
            .unwrap();
        txns.tick(&ctx.topics, T0 + 1000);
        assert_eq!(state(&ctx, "t"), TxnState::Ongoing);
        txns.tick(&ctx.topics, T0 + 1001);
        let d = txns.describe("t").unwrap();
        assert_eq!(
            (d.state, d.producer_epoch),
            (TxnState::CompleteAbort, epoch + 1)
        );
        assert_eq!(end_offset(&ctx, "x", 0), 1, "abort marker written");
        assert_eq!(
            txns.end(&ctx.topics, "t", pid, epoch, true, T0 + 1002),
            Err(ResponseError::ProducerFenced)
        );
        assert_eq!(
            txns.add(
                &ctx.topics,
                "t",
                pid,
                epoch,
                Addition::Partitions(&p),
                T0 + 1002
            ),
            Err(ResponseError::ProducerFenced)
        );
    }

    #[test]
    fn an_ongoing_transaction_keeps_its_start_time_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = with_topic(dir.path());
        let (pid, epoch) = ctx
            .txns
            .init_producer_id(&ctx.topics, Some("t"), 1000, None, T0)
            .unwrap();
        let p = set(&[("x", 1)]);
        ctx.txns
            .add(&ctx.topics, "t", pid, epoch, Addition::Partitions(&p), T0)
            .unwrap();
        drop(ctx);
        let ctx = context(dir.path());
        let d = ctx.txns.describe("t").unwrap();
        assert_eq!(
            (d.state, d.start_ms, d.partitions),
            (TxnState::Ongoing, T0, p)
        );
        ctx.txns.tick(&ctx.topics, T0 + 2000);
        assert_eq!(state(&ctx, "t"), TxnState::CompleteAbort);
        assert_eq!(end_offset(&ctx, "x", 1), 1);
    }

    #[test]
    fn idle_transactional_ids_expire() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        ctx.txns
            .init_producer_id(&ctx.topics, Some("t"), 1000, None, T0)
            .unwrap();
        let expiry = BrokerConfig::default().transactional_id_expiration_ms;
        ctx.txns.tick(&ctx.topics, T0 + expiry - 1);
        assert!(ctx.txns.describe("t").is_ok());
        ctx.txns.tick(&ctx.topics, T0 + expiry);
        assert_eq!(
            ctx.txns.describe("t"),
            Err(ResponseError::TransactionalIdNotFound)
        );
        drop(ctx);
        let ctx = context(dir.path());
        assert_eq!(
            ctx.txns.describe("t"),
            Err(ResponseError::TransactionalIdNotFound)
        );
    }

    #[test]
    fn transactional_offsets_are_invisible_until_the_transaction_commits() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = with_topic(dir.path());
        let txns = &ctx.txns;
        let ids = txns
            .init_producer_id(&ctx.topics, Some("t"), 60_000, None, T0)
            .unwrap();
        assert_eq!(
            commit_in_txn(&ctx, "t", ids, "g", vec![offset("x", 0, 5)]),
            Err(ResponseError::InvalidTxnState),
            "the group was not added to a transaction"
        );
        txns.add(&ctx.topics, "t", ids.0, ids.1, Addition::Group("g"), T0)
            .unwrap();
        commit_in_txn(&ctx, "t", ids, "g", vec![offset("x", 0, 5)]).unwrap();
        assert!(ctx.groups.committed("g").unwrap().is_empty());
        assert_eq!(txns.pending_offsets("g").unwrap(), set(&[("x", 0)]));
        txns.end(&ctx.topics, "t", ids.0, ids.1, true, T0).unwrap();
        assert!(txns.pending_offsets("g").unwrap().is_empty());
        let committed = ctx.groups.committed("g").unwrap();
        assert_eq!(committed[&("x".to_string(), 0)].offset, 5);
        // An aborted transaction's offsets never show.
        txns.add(&ctx.topics, "t", ids.0, ids.1, Addition::Group("g"), T0)
            .unwrap();
        commit_in_txn(&ctx, "t", ids, "g", vec![offset("x", 0, 9)]).unwrap();
        txns.end(&ctx.topics, "t", ids.0, ids.1, false, T0).unwrap();
        assert!(txns.pending_offsets("g").unwrap().is_empty());
        assert_eq!(
            ctx.groups.committed("g").unwrap()[&("x".to_string(), 0)].offset,
            5
        );
    }

    #[test]
    fn txn_offset_commit_checks_member_and_generation_unless_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = with_topic(dir.path());
        let check = |member_id, generation| {
            let committer = Committer {
                member_id,
                instance_id: None,
                generation,
            };
            ctx.groups
                .check_txn_commit(&ctx.topics, "g", committer, vec![offset("x", 0, 1)])
                .map(|(answers, _)| answers)
        };
        assert_eq!(check("", -1), Ok(vec![None]));
        assert_eq!(check("m", -1), Err(ResponseError::UnknownMemberId));
        assert_eq!(check("", 3), Err(ResponseError::IllegalGeneration));
        let unknown = ctx.groups.check_txn_commit(
            &ctx.topics,
            "g",
            ANYONE,
            vec![offset("nope", 0, 1), offset("x", 7, 1)],
        );
        assert_eq!(
            unknown.map(|(answers, rows)| (answers, rows.len())),
            Ok((vec![Some(ResponseError::UnknownTopicOrPartition); 2], 0))
        );
    }

    #[test]
    fn a_prepared_transaction_is_completed_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = with_topic(dir.path());
        let ids = ctx
            .txns
            .init_producer_id(&ctx.topics, Some("t"), 60_000, None, T0)
            .unwrap();
        let p = set(&[("x", 0), ("x", 1)]);
        ctx.txns
            .add(&ctx.topics, "t", ids.0, ids.1, Addition::Partitions(&p), T0)
            .unwrap();
        ctx.txns
            .add(&ctx.topics, "t", ids.0, ids.1, Addition::Group("g"), T0)
            .unwrap();
        commit_in_txn(&ctx, "t", ids, "g", vec![offset("x", 1, 42)]).unwrap();
        // The broker stopped right after recording the decision.
        let mut record = ctx.txns.lock()["t"].record();
        record.state = TxnState::PrepareCommit.name().into();
        ctx.topics.catalog().save_transaction(&record).unwrap();
        drop(ctx);
        let ctx = context(dir.path());
        assert_eq!(state(&ctx, "t"), TxnState::CompleteCommit);
        assert_eq!((end_offset(&ctx, "x", 0), end_offset(&ctx, "x", 1)), (1, 1));
        assert_eq!(
            ctx.groups.committed("g").unwrap()[&("x".to_string(), 1)].offset,
            42
        );
        // The producer goes on where it was.
        ctx.txns
            .end(&ctx.topics, "t", ids.0, ids.1, true, T0)
            .unwrap();
    }

    #[test]
    fn list_filters_by_state_producer_and_duration() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = with_topic(dir.path());
        let a = ctx
            .txns
            .init_producer_id(&ctx.topics, Some("a"), 60_000, None, T0)
            .unwrap();
        let b = ctx
            .txns
            .init_producer_id(&ctx.topics, Some("b"), 60_000, None, T0)
            .unwrap();
        let p = set(&[("x", 0)]);
        ctx.txns
            .add(&ctx.topics, "b", b.0, b.1, Addition::Partitions(&p), T0)
            .unwrap();
        let ids = |l: Vec<TxnDescription>| {
            l.into_iter()
                .map(|d| d.transactional_id)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(ctx.txns.list(&[], &[], -1, T0)), ["a", "b"]);
        assert_eq!(ids(ctx.txns.list(&[TxnState::Ongoing], &[], -1, T0)), ["b"]);
        assert_eq!(ids(ctx.txns.list(&[], &[a.0], -1, T0)), ["a"]);
        assert!(
            ctx.txns
                .list(&[TxnState::Ongoing], &[], 100, T0 + 100)
                .is_empty()
        );
        assert_eq!(
            ids(ctx.txns.list(&[TxnState::Ongoing], &[], 100, T0 + 101)),
            ["b"]
        );
        assert_eq!(
            TxnState::from_name("PrepareEpochFence"),
            Some(TxnState::PrepareEpochFence)
        );
        assert_eq!(TxnState::from_name("Nope"), None);
    }

    /// Sends a request through the routes as a client would and decodes the answer.
    async fn call<Q, R>(ctx: &Arc<crate::api::Context>, key: ApiKey, version: i16, request: Q) -> R
    where
        Q: Encodable,
        R: Decodable,
    {
        let mut body = bytes::BytesMut::new();
        request.encode(&mut body, version).unwrap();
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(1);
        let route = crate::api::route_for(key as i16).unwrap();
        let frame = route
            .call(ctx, header, body.freeze())
            .await
            .unwrap()
            .unwrap();
        let mut bytes = frame.bytes.slice(4..);
        ResponseHeader::decode(&mut bytes, key.response_header_version(version)).unwrap();
        R::decode(&mut bytes, version).unwrap()
    }

    fn txn_id(id: &'static str) -> TransactionalId {
        TransactionalId(StrBytes::from_static_str(id))
    }

    #[tokio::test]
    async fn find_coordinator_answers_for_transactions_with_this_broker() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        let request = FindCoordinatorRequest::default()
            .with_key(StrBytes::from_static_str("t"))
            .with_key_type(1);
        let response: FindCoordinatorResponse =
            call(&ctx, ApiKey::FindCoordinator, 3, request).await;
        assert_eq!(response.error_code, 0);
        assert_eq!((response.node_id.0, response.port), (0, 9092));
    }

    #[tokio::test]
    async fn old_versions_hear_invalid_producer_epoch_where_new_ones_hear_producer_fenced() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        let init = |version| {
            let request = InitProducerIdRequest::default()
                .with_transactional_id(Some(txn_id("t")))
                .with_transaction_timeout_ms(60_000);
            call::<_, InitProducerIdResponse>(&ctx, ApiKey::InitProducerId, version, request)
        };
        let first = init(4).await;
        assert_eq!((first.error_code, first.producer_epoch), (0, 0));
        let second = init(4).await;
        assert_eq!(second.producer_epoch, 1);
        for (version, expected) in [
            (1, ResponseError::InvalidProducerEpoch),
            (3, ResponseError::ProducerFenced),
        ] {
            let request = EndTxnRequest::default()
                .with_transactional_id(txn_id("t"))
                .with_producer_id(first.producer_id)
                .with_producer_epoch(first.producer_epoch)
                .with_committed(true);
            let response: EndTxnResponse = call(&ctx, ApiKey::EndTxn, version, request).await;
            assert_eq!(response.error_code, expected.code(), "EndTxn v{version}");
        }
    }

    #[tokio::test]
    async fn add_partitions_with_an_unknown_partition_adds_none() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = with_topic(dir.path());
        let (pid, epoch) = ctx
            .txns
            .init_producer_id(&ctx.topics, Some("t"), 60_000, None, T0)
            .unwrap();
        let topic = |name: &'static str, partitions: Vec<i32>| {
            add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
                .with_name(TopicName(StrBytes::from_static_str(name)))
                .with_partitions(partitions)
        };
        let request = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(txn_id("t"))
            .with_v3_and_below_producer_id(ProducerId(pid))
            .with_v3_and_below_producer_epoch(epoch)
            .with_v3_and_below_topics(vec![topic("x", vec![0, 5])]);
        let response: AddPartitionsToTxnResponse =
            call(&ctx, ApiKey::AddPartitionsToTxn, 3, request).await;
        let codes: Vec<i16> = response.results_by_topic_v3_and_below[0]
            .results_by_partition
            .iter()
            .map(|p| p.partition_error_code)
            .collect();
        assert_eq!(
            codes,
            [
                ResponseError::OperationNotAttempted.code(),
                ResponseError::UnknownTopicOrPartition.code()
            ]
        );
        assert_eq!(state(&ctx, "t"), TxnState::Empty);
    }

    #[tokio::test]
    async fn offset_fetch_requiring_stable_offsets_waits_for_the_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = with_topic(dir.path());
        let ids = ctx
            .txns
            .init_producer_id(&ctx.topics, Some("t"), 60_000, None, T0)
            .unwrap();
        ctx.txns
            .add(&ctx.topics, "t", ids.0, ids.1, Addition::Group("g"), T0)
            .unwrap();
        commit_in_txn(&ctx, "t", ids, "g", vec![offset("x", 0, 5)]).unwrap();
        let ctx = &ctx;
        let fetch = |require_stable| {
            let request = OffsetFetchRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str("g")))
                .with_topics(Some(vec![
                    offset_fetch_request::OffsetFetchRequestTopic::default()
                        .with_name(TopicName(StrBytes::from_static_str("x")))
                        .with_partition_indexes(vec![0, 1]),
                ]))
                .with_require_stable(require_stable);
            async move {
                let response: OffsetFetchResponse =
                    call(ctx, ApiKey::OffsetFetch, 7, request).await;
                response.topics[0]
                    .partitions
                    .iter()
                    .map(|p| (p.error_code, p.committed_offset))
                    .collect::<Vec<_>>()
            }
        };
        let unstable = ResponseError::UnstableOffsetCommit.code();
        assert_eq!(fetch(true).await, [(unstable, -1), (0, -1)]);
        assert_eq!(fetch(false).await, [(0, -1), (0, -1)]);
        ctx.txns
            .end(&ctx.topics, "t", ids.0, ids.1, true, T0)
            .unwrap();
        assert_eq!(fetch(true).await, [(0, 5), (0, -1)]);
    }
}
