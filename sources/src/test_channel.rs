//! A tiny channel for driving sources in unit tests: a `Vec` behind a mutex, with a capacity
//! (to exercise the full case), a switch to fail puts, and the last checkpoint it was given.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_core::{
    Channel, ChannelError, Checkpoint, Event, MemoryCheckpointStore, PutBatch, Shutdown,
    SourceContext, TakeTransaction, async_trait,
};

#[derive(Default)]
struct State {
    events: Vec<Event>,
    checkpoint: Option<Checkpoint>,
    batches: usize,
}

pub(crate) struct TestChannel {
    capacity: usize,
    transaction_capacity: usize,
    durable: bool,
    fail: AtomicBool,
    state: Mutex<State>,
}

impl TestChannel {
    pub(crate) fn new(capacity: usize, transaction_capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            transaction_capacity,
            durable: true,
            fail: AtomicBool::new(false),
            state: Mutex::default(),
        })
    }

    /// A channel that is not durable, like the memory channel: the source's checkpoints go
    /// through acknowledgements, which this channel never gives (nothing is ever delivered).
    pub(crate) fn volatile(capacity: usize, transaction_capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            transaction_capacity,
            durable: false,
            fail: AtomicBool::new(false),
            state: Mutex::default(),
        })
    }

    /// Makes every later put fail with a storage error (or succeed again).
    pub(crate) fn fail_puts(&self, fail: bool) {
        self.fail.store(fail, Ordering::SeqCst);
    }

    pub(crate) fn events(&self) -> Vec<Event> {
        self.state.lock().unwrap().events.clone()
    }

    pub(crate) fn bodies(&self) -> Vec<String> {
        self.events()
            .iter()
            .map(|e| String::from_utf8_lossy(&e.body).into_owned())
            .collect()
    }

    pub(crate) fn checkpoint(&self) -> Option<Checkpoint> {
        self.state.lock().unwrap().checkpoint.clone()
    }

    pub(crate) fn batches(&self) -> usize {
        self.state.lock().unwrap().batches
    }

    /// Removes every event, making room.
    pub(crate) fn drain(&self) -> Vec<Event> {
        std::mem::take(&mut self.state.lock().unwrap().events)
    }

    /// Waits until the channel holds at least `n` events (at most 10 s).
    pub(crate) async fn wait_for(&self, n: usize) {
        for _ in 0..1000 {
            if self.len() >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("channel holds {} events, expected {n}", self.len());
    }

    fn try_store(&self, batch: &mut PutBatch) -> Result<bool, ChannelError> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(ChannelError::Storage {
                channel: "test".into(),
                message: "disk on fire".into(),
            });
        }
        if batch.events.len() > self.transaction_capacity {
            return Err(ChannelError::BatchTooLarge {
                channel: "test".into(),
                events: batch.events.len(),
                bytes: 0,
                limit: format!("transaction_capacity {}", self.transaction_capacity),
            });
        }
        let mut state = self.state.lock().unwrap();
        if state.events.len() + batch.events.len() > self.capacity {
            return Ok(false);
        }
        state.events.append(&mut batch.events);
        state.batches += 1;
        if batch.checkpoint.is_some() {
            state.checkpoint = batch.checkpoint.take();
        }
        Ok(true)
    }
}

#[async_trait]
impl Channel for TestChannel {
    fn name(&self) -> &str {
        "test"
    }

    async fn put(&self, mut batch: PutBatch) -> Result<(), ChannelError> {
        while !self.try_store(&mut batch)? {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    async fn try_put(&self, mut batch: PutBatch) -> Result<(), ChannelError> {
        if self.try_store(&mut batch)? {
            Ok(())
        } else {
            Err(ChannelError::Full {
                channel: "test".into(),
            })
        }
    }

    async fn take(
        &self,
        _max: usize,
        _wait: Duration,
    ) -> Result<Box<dyn TakeTransaction>, ChannelError> {
        Err(ChannelError::Storage {
            channel: "test".into(),
            message: "take is not used by source tests".into(),
        })
    }

    fn transaction_capacity(&self) -> usize {
        self.transaction_capacity
    }

    /// Durable unless made `volatile`: the checkpoint travels with the batch and the test can
    /// read it.
    fn is_durable(&self) -> bool {
        self.durable
    }

    fn len(&self) -> usize {
        self.state.lock().unwrap().events.len()
    }

    fn capacity(&self) -> usize {
        self.capacity
    }
}

/// A context writing into `channel`, with a fresh shutdown signal and no saved checkpoint.
pub(crate) fn context(channel: &Arc<TestChannel>) -> (SourceContext, Shutdown) {
    let shutdown = Shutdown::new();
    let ctx = SourceContext::new(
        "test",
        vec![channel.clone() as Arc<dyn Channel>],
        vec![],
        shutdown.clone(),
        Arc::new(MemoryCheckpointStore::default()),
    )
    .unwrap();
    (ctx, shutdown)
}

/// Parses a YAML snippet as the options of a source.
pub(crate) fn config(type_name: &str, yaml: &str) -> ferry_core::ComponentConfig {
    ferry_core::ComponentConfig::from_yaml(
        ferry_core::ComponentKind::Source,
        "test",
        type_name,
        yaml,
    )
    .unwrap()
}
