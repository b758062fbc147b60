//! Helpers for testing sources (feature `test-support`): a tiny channel, a `Vec` behind a
//! mutex, with a capacity (to exercise the full case), a switch to fail puts, and the last
//! checkpoint it was given; a source context writing into it; options parsed from YAML.
//!
//! ```
//! use ferry_core::test_support::{TestChannel, config, context};
//! let channel = TestChannel::new(100, 10);
//! let (ctx, _shutdown) = context(&channel);
//! assert_eq!(ctx.name(), "test");
//! assert_eq!(config("seq", "count: 3").name(), "test");
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{
    Channel, ChannelError, Checkpoint, CheckpointStore, Event, MemoryCheckpointStore, PutBatch,
    Shutdown, SourceContext, TakeTransaction, async_trait,
};

#[derive(Default)]
struct State {
    events: Vec<Event>,
    checkpoint: Option<Checkpoint>,
    batches: usize,
}

/// A channel for source tests; see the module docs.
pub struct TestChannel {
    capacity: usize,
    transaction_capacity: usize,
    durable: bool,
    fail: AtomicBool,
    state: Mutex<State>,
}

impl TestChannel {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn new(capacity: usize, transaction_capacity: usize) -> Arc<Self> {
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
    pub fn volatile(capacity: usize, transaction_capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            transaction_capacity,
            durable: false,
            fail: AtomicBool::new(false),
            state: Mutex::default(),
        })
    }

    /// Makes every later put fail with a storage error (or succeed again).
    pub fn fail_puts(&self, fail: bool) {
        self.fail.store(fail, Ordering::SeqCst);
    }

    pub fn events(&self) -> Vec<Event> {
        self.state().events.clone()
    }

    pub fn bodies(&self) -> Vec<String> {
        self.events()
            .iter()
            .map(|e| String::from_utf8_lossy(&e.body).into_owned())
            .collect()
    }

    pub fn checkpoint(&self) -> Option<Checkpoint> {
        self.state().checkpoint.clone()
    }

    pub fn batches(&self) -> usize {
        self.state().batches
    }

    /// Removes every event, making room.
    pub fn drain(&self) -> Vec<Event> {
        std::mem::take(&mut self.state().events)
    }

    /// Waits until the channel holds at least `n` events (at most 10 s).
    pub async fn wait_for(&self, n: usize) {
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
        let mut state = self.state();
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
        self.state().events.len()
    }

    fn capacity(&self) -> usize {
        self.capacity
    }
}

/// A context of source `test` writing into `channel`, with a fresh shutdown signal and no
/// saved checkpoint.
pub fn context(channel: &Arc<TestChannel>) -> (SourceContext, Shutdown) {
    context_with(channel, "test", Arc::new(MemoryCheckpointStore::default()))
}

/// A context of source `name` writing into `channel`, with a fresh shutdown signal and the
/// checkpoints of `store`.
pub fn context_with(
    channel: &Arc<TestChannel>,
    name: &str,
    store: Arc<dyn CheckpointStore>,
) -> (SourceContext, Shutdown) {
    let shutdown = Shutdown::new();
    let ctx = SourceContext::new(
        name,
        vec![channel.clone() as Arc<dyn Channel>],
        vec![],
        shutdown.clone(),
        store,
    )
    .expect("a source context with one channel");
    (ctx, shutdown)
}

/// Parses a YAML snippet as the options of a source.
pub fn config(type_name: &str, yaml: &str) -> crate::ComponentConfig {
    crate::ComponentConfig::from_yaml(crate::ComponentKind::Source, "test", type_name, yaml)
        .expect("the test's options are YAML")
}
