//! Delivery acknowledgements for events put into non-durable channels.
//!
//! When a source writes to a channel that cannot store its checkpoint (the memory channel), the
//! checkpoint may be saved only after every event of the batch, and of every batch before it,
//! was delivered by the sinks. Each put batch therefore carries an [`Acknowledgement`]: the
//! channel keeps it next to the batch's events and calls [`Acknowledgement::delivered`] when a
//! take transaction holding them commits. When all events of a batch, in all channels it was
//! put into, are delivered, the batch is done; the [`AckTracker`] saves checkpoints strictly in
//! batch order, so a later batch finishing first never moves the checkpoint past an earlier
//! batch that is still in flight.
//!
//! Events that are never delivered (the process dies) are never acknowledged: the checkpoint
//! stays behind them and they are read again on restart (at-least-once).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::checkpoint::{Checkpoint, CheckpointStore};

/// Shared delivery state of one put batch. Cheap to clone (an `Arc`).
#[derive(Clone)]
pub struct Acknowledgement(Arc<AckInner>);

struct AckInner {
    remaining: AtomicUsize,
    batch: u64,
    tracker: Arc<AckTracker>,
}

impl std::fmt::Debug for Acknowledgement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acknowledgement")
            .field("batch", &self.0.batch)
            .field("remaining", &self.0.remaining.load(Ordering::Relaxed))
            .finish()
    }
}

impl Acknowledgement {
    /// Records that `events` events carrying this acknowledgement were delivered.
    pub fn delivered(&self, events: usize) {
        let before = self.0.remaining.fetch_sub(events, Ordering::AcqRel);
        if before == events {
            self.0.tracker.complete(self.0.batch);
        }
    }

    /// Gives up on this batch after a failed put: its checkpoint is dropped (the source will
    /// send the events again or report the failure), and `events` copies that will never be
    /// delivered stop holding back later batches.
    pub fn failed(&self, events: usize) {
        self.0.tracker.drop_checkpoint(self.0.batch);
        self.delivered(events);
    }

    /// Acknowledges a run of entries in channel order, one call per run of the same batch.
    ///
    /// Channels call this on take commit with the acknowledgements of the committed events.
    pub fn delivered_all<'a>(acks: impl IntoIterator<Item = &'a Option<Acknowledgement>>) {
        let mut run: Option<(&Acknowledgement, usize)> = None;
        for ack in acks.into_iter().flatten() {
            match &mut run {
                Some((current, n)) if Arc::ptr_eq(&current.0, &ack.0) => *n += 1,
                _ => {
                    if let Some((current, n)) = run.take() {
                        current.delivered(n);
                    }
                    run = Some((ack, 1));
                }
            }
        }
        if let Some((current, n)) = run {
            current.delivered(n);
        }
    }
}

/// Orders the completion of a source's batches and saves their checkpoints.
pub struct AckTracker {
    source: String,
    store: Arc<dyn CheckpointStore>,
    state: Mutex<TrackerState>,
    /// The last checkpoint saved.
    saved: Mutex<Option<Checkpoint>>,
}

#[derive(Default)]
struct TrackerState {
    next_batch: u64,
    /// Batches in flight: checkpoint (if the batch had one) and whether it is done.
    pending: BTreeMap<u64, (Option<Checkpoint>, bool)>,
}

impl AckTracker {
    /// A tracker saving `source`'s checkpoints into `store`.
    pub fn new(source: impl Into<String>, store: Arc<dyn CheckpointStore>) -> Arc<Self> {
        Arc::new(Self {
            source: source.into(),
            store,
            state: Mutex::new(TrackerState::default()),
            saved: Mutex::new(None),
        })
    }

    /// Registers a batch of `events` events, put into `copies` channels, with its checkpoint.
    ///
    /// A batch with no events completes at once.
    pub fn begin(
        self: &Arc<Self>,
        events: usize,
        copies: usize,
        checkpoint: Option<Checkpoint>,
    ) -> Acknowledgement {
        let batch = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let batch = state.next_batch;
            state.next_batch += 1;
            state.pending.insert(batch, (checkpoint, false));
            batch
        };
        let ack = Acknowledgement(Arc::new(AckInner {
            remaining: AtomicUsize::new(events * copies),
            batch,
            tracker: Arc::clone(self),
        }));
        if events * copies == 0 {
            self.complete(batch);
        }
        ack
    }

    fn drop_checkpoint(&self, batch: u64) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = state.pending.get_mut(&batch) {
            entry.0 = None;
        }
    }

    /// Marks `batch` delivered, then saves the checkpoint of the newest batch before which
    /// every batch is delivered. A batch that could not be put never completes, so it holds the
    /// checkpoint back and is read again after a restart.
    fn complete(&self, batch: u64) {
        let (to_save, mut saved) = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = state.pending.get_mut(&batch) {
                entry.1 = true;
            }
            let mut latest = None;
            while let Some(entry) = state.pending.first_entry() {
                if !entry.get().1 {
                    break;
                }
                let (checkpoint, _) = entry.remove();
                if checkpoint.is_some() {
                    latest = checkpoint;
                }
            }
            // Taken before the state lock is released: a later completion computes a newer
            // checkpoint only after this one holds the save lock, so saves land in order.
            let saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
            (latest, saved)
        };
        if let Some(checkpoint) = to_save {
            match self.store.save(&self.source, &checkpoint) {
                Ok(()) => *saved = Some(checkpoint),
                Err(error) => {
                    tracing::error!(source = %self.source, %error, "could not save checkpoint")
                }
            }
        }
    }

    /// The last checkpoint saved to the store by this tracker.
    pub fn saved(&self) -> Option<Checkpoint> {
        self.saved.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Number of batches put but not yet fully delivered.
    pub fn in_flight(&self) -> usize {
        self.state
            .lock()
            .map(|s| s.pending.len())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::MemoryCheckpointStore;

    #[test]
    fn checkpoint_waits_for_earlier_batches() {
        let store = Arc::new(MemoryCheckpointStore::default());
        let tracker = AckTracker::new("src", store.clone());
        let first = tracker.begin(2, 1, Some(Checkpoint::new(b"1".to_vec())));
        let second = tracker.begin(1, 1, Some(Checkpoint::new(b"2".to_vec())));
        second.delivered(1);
        assert_eq!(
            store.load("src").unwrap(),
            None,
            "batch 1 is still in flight"
        );
        first.delivered(1);
        assert_eq!(store.load("src").unwrap(), None);
        first.delivered(1);
        assert_eq!(
            store.load("src").unwrap(),
            Some(Checkpoint::new(b"2".to_vec()))
        );
        assert_eq!(tracker.in_flight(), 0);
    }

    #[test]
    fn failed_batch_does_not_save_its_checkpoint() {
        let store = Arc::new(MemoryCheckpointStore::default());
        let tracker = AckTracker::new("src", store.clone());
        let ok = tracker.begin(1, 1, Some(Checkpoint::new(b"1".to_vec())));
        let bad = tracker.begin(1, 1, Some(Checkpoint::new(b"2".to_vec())));
        assert_eq!(tracker.saved(), None);
        ok.delivered(1);
        bad.failed(1);
        assert_eq!(
            store.load("src").unwrap(),
            Some(Checkpoint::new(b"1".to_vec()))
        );
        assert_eq!(tracker.saved(), Some(Checkpoint::new(b"1".to_vec())));
        assert_eq!(tracker.in_flight(), 0);
    }

    #[test]
    fn fan_out_needs_every_copy() {
        let store = Arc::new(MemoryCheckpointStore::default());
        let tracker = AckTracker::new("src", store.clone());
        let ack = tracker.begin(3, 2, Some(Checkpoint::new(b"x".to_vec())));
        let entries: Vec<Option<Acknowledgement>> = (0..3).map(|_| Some(ack.clone())).collect();
        Acknowledgement::delivered_all(&entries);
        assert_eq!(
            store.load("src").unwrap(),
            None,
            "second channel not delivered"
        );
        Acknowledgement::delivered_all(&entries);
        assert_eq!(
            store.load("src").unwrap(),
            Some(Checkpoint::new(b"x".to_vec()))
        );
    }
}
