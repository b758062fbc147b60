//! The sink runner with test sinks and real channels: pipelining, failover, dead letters,
//! draining.

use super::*;
use std::sync::Mutex;

use ferry_channels::{MemoryChannel, MemoryChannelConfig};
use ferry_core::{ChannelError, Event, PutBatch, async_trait};

/// What happened, in order: `send e10`, `flush`, `commit e10`, `rollback e10`, ...
type Log = Arc<Mutex<Vec<String>>>;

fn note(log: &Log, line: String) {
    log.lock().unwrap().push(line);
}

fn first_body(events: &[Event]) -> String {
    events
        .first()
        .map(|e| String::from_utf8_lossy(&e.body).into_owned())
        .unwrap_or_default()
}

/// A memory channel that notes each take's commit and rollback by its first event, and, when
/// `syncs` is set, each `sync_takes` that has commits to sync, as a file channel defers them.
struct NotedChannel {
    inner: MemoryChannel,
    log: Log,
    max_open_takes: Option<usize>,
    syncs: bool,
    /// Whether a take committed since the last sync.
    unsynced: Arc<std::sync::atomic::AtomicBool>,
}

struct NotedTake {
    inner: Box<dyn TakeTransaction>,
    log: Log,
    unsynced: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait]
impl Channel for NotedChannel {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn put(&self, batch: PutBatch) -> Result<(), ChannelError> {
        self.inner.put(batch).await
    }
    async fn try_put(&self, batch: PutBatch) -> Result<(), ChannelError> {
        self.inner.try_put(batch).await
    }
    async fn take(
        &self,
        max: usize,
        wait: Duration,
    ) -> Result<Box<dyn TakeTransaction>, ChannelError> {
        Ok(Box::new(NotedTake {
            inner: self.inner.take(max, wait).await?,
            log: Arc::clone(&self.log),
            unsynced: Arc::clone(&self.unsynced),
        }))
    }
    fn transaction_capacity(&self) -> usize {
        self.inner.transaction_capacity()
    }
    fn max_open_takes(&self) -> Option<usize> {
        self.max_open_takes
    }
    async fn sync_takes(&self) -> Result<(), ChannelError> {
        if self.syncs
            && self
                .unsynced
                .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            note(&self.log, "sync".into());
        }
        Ok(())
    }
    fn is_durable(&self) -> bool {
        false
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
}

#[async_trait]
impl TakeTransaction for NotedTake {
    fn events(&self) -> &[Event] {
        self.inner.events()
    }
    async fn commit(self: Box<Self>) -> Result<(), ChannelError> {
        note(&self.log, format!("commit {}", first_body(self.events())));
        self.unsynced
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.inner.commit().await
    }
    async fn rollback(self: Box<Self>) -> Result<(), ChannelError> {
        note(&self.log, format!("rollback {}", first_body(self.events())));
        self.inner.rollback().await
    }
}

/// A pipelining sink that notes sends and flushes and keeps the bodies each successful
/// flush made safe. It fails the flushes whose numbers (from 0) are in `failing_flushes`,
/// and each send takes `send_time`.
struct PipelinedSink {
    log: Log,
    pipelining: Pipelining,
    failing_flushes: Vec<usize>,
    send_time: Duration,
    flushes: usize,
    pending: Vec<String>,
    delivered: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl Sink for PipelinedSink {
    async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        self.send(batch).await?;
        self.flush().await
    }
    async fn send(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        note(&self.log, format!("send {}", first_body(batch.events)));
        tokio::time::sleep(self.send_time).await;
        self.pending.extend(
            batch
                .events
                .iter()
                .map(|e| String::from_utf8_lossy(&e.body).into_owned()),
        );
        Ok(())
    }
    async fn flush(&mut self) -> Result<(), SinkError> {
        let number = self.flushes;
        self.flushes += 1;
        if self.failing_flushes.contains(&number) {
            note(&self.log, "flush failed".into());
            self.pending.clear();
            return Err(SinkError::Delivery("the destination is down".into()));
        }
        note(&self.log, "flush".into());
        self.delivered.lock().unwrap().append(&mut self.pending);
        Ok(())
    }
    fn pipelining(&self) -> Pipelining {
        self.pipelining
    }
}

/// A sink as written before pipelining: `deliver` only.
struct DeliveringSink {
    log: Log,
}

#[async_trait]
impl Sink for DeliveringSink {
    async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        note(&self.log, format!("deliver {}", first_body(batch.events)));
        Ok(())
    }
}

fn pipelined(log: &Log, max_batches: usize) -> PipelinedSink {
    PipelinedSink {
        log: Arc::clone(log),
        pipelining: Pipelining {
            max_batches,
            max_events: usize::MAX,
            max_bytes: usize::MAX,
            max_delay: Duration::from_secs(3600),
        },
        failing_flushes: Vec::new(),
        send_time: Duration::ZERO,
        flushes: 0,
        pending: Vec::new(),
        delivered: Arc::default(),
    }
}

/// A memory channel holding `events` events `e0`, `e1`, ..., noting commits and rollbacks
/// in `log`.
async fn filled_channel(log: &Log, events: usize, max_open_takes: Option<usize>) -> NotedChannel {
    let inner = MemoryChannel::new(
        "buffer",
        &MemoryChannelConfig {
            capacity: 1000,
            transaction_capacity: 10,
            byte_capacity: None,
        },
    );
    let channel = NotedChannel {
        inner,
        log: Arc::clone(log),
        max_open_takes,
        syncs: false,
        unsynced: Arc::default(),
    };
    let bodies: Vec<Event> = (0..events)
        .map(|i| Event::from_body(format!("e{i}")))
        .collect();
    for chunk in bodies.chunks(10) {
        channel
            .put(PutBatch {
                source: "test".into(),
                events: chunk.to_vec(),
                checkpoint: None,
                ack: None,
                joint: None,
            })
            .await
            .unwrap();
    }
    channel
}

/// Runs `sink` over a memory channel holding `events` events `e0`, `e1`, ... until the
/// channel is drained; returns the runner's log and the sink's counters.
async fn drain_through(
    sink: impl Sink,
    log: &Log,
    events: usize,
    max_open_takes: Option<usize>,
) -> ComponentMetrics {
    let channel = filled_channel(log, events, max_open_takes).await;
    let metrics = ComponentMetrics::new("sink", "runner-test");
    let ctx = SinkContext {
        name: "runner-test".into(),
        metrics: metrics.clone(),
        state: None,
    };
    let drain = Shutdown::new();
    // Draining from the start: the runner delivers what the channel holds, then stops.
    drain.trigger();
    SinkRunner::new(ctx, Box::new(sink), Arc::new(channel), 10, drain)
        .run()
        .await;
    metrics
}

/// A sink that notes `<name> e10` for each batch it delivers and `<name> e10 failed` for
/// each of its first `failures` batches, which it fails.
struct NamedSink {
    name: &'static str,
    log: Log,
    failures: usize,
}

#[async_trait]
impl Sink for NamedSink {
    async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        let first = first_body(batch.events);
        if self.failures > 0 {
            self.failures -= 1;
            note(&self.log, format!("{} {first} failed", self.name));
            return Err(SinkError::Delivery("the destination is down".into()));
        }
        note(&self.log, format!("{} {first}", self.name));
        Ok(())
    }
}

/// Runs a group of `sinks` with `processor` over a channel of `events` events until it is
/// drained; returns each member's counters.
async fn drain_group(
    sinks: Vec<NamedSink>,
    processor: SinkProcessorConfig,
    log: &Log,
    events: usize,
) -> Vec<ComponentMetrics> {
    let channel = filled_channel(log, events, None).await;
    let mut metrics = Vec::new();
    let members = sinks
        .into_iter()
        .map(|sink| {
            let ctx = SinkContext {
                name: sink.name.into(),
                metrics: ComponentMetrics::new("sink", sink.name),
                state: None,
            };
            metrics.push(ctx.metrics.clone());
            Member::new(ctx, Box::new(sink), 10)
        })
        .collect();
    let drain = Shutdown::new();
    drain.trigger();
    SinkRunner::with_members(
        Some("group".into()),
        members,
        &processor,
        Arc::new(channel),
        drain,
    )
    .run()
    .await;
    metrics
}

fn named(name: &'static str, log: &Log, failures: usize) -> NamedSink {
    NamedSink {
        name,
        log: Arc::clone(log),
        failures,
    }
}

#[tokio::test(start_paused = true)]
async fn failover_hands_a_failed_batch_to_the_standby_without_a_rollback() {
    let log = Log::default();
    let processor = SinkProcessorConfig::Failover {
        priorities: vec![10, 5],
        max_penalty: Duration::from_secs(30),
    };
    let sinks = vec![named("primary", &log, 1), named("standby", &log, 0)];
    let metrics = drain_group(sinks, processor, &log, 30).await;
    assert_eq!(
        lines(&log),
        expected(&[
            "primary e0 failed, standby e0, commit e0",
            // The primary is left out while penalised.
            "standby e10, commit e10, standby e20, commit e20",
        ])
    );
    assert_eq!(metrics[0].counter("EventWriteFail").get(), 10);
    assert_eq!(metrics[0].counter("EventDrainSuccessCount").get(), 0);
    assert_eq!(metrics[1].counter("EventDrainSuccessCount").get(), 30);
}

#[tokio::test(start_paused = true)]
async fn a_batch_every_member_failed_is_rolled_back_and_retried() {
    let log = Log::default();
    let processor = SinkProcessorConfig::LoadBalance {
        selector: crate::sinkgroup::Selector::RoundRobin,
        backoff: false,
        max_timeout: Duration::from_secs(30),
    };
    let sinks = vec![named("a", &log, 1), named("b", &log, 1)];
    drain_group(sinks, processor, &log, 20).await;
    assert_eq!(
        lines(&log),
        expected(&[
            "a e0 failed, b e0 failed, rollback e0",
            // Without backoff no sink is left out; the retry is the next turn, `b`'s.
            "b e0, commit e0, a e10, commit e10",
        ])
    );
}

#[tokio::test(start_paused = true)]
async fn round_robin_gives_each_member_a_batch_in_turn() {
    let log = Log::default();
    let processor = SinkProcessorConfig::LoadBalance {
        selector: crate::sinkgroup::Selector::RoundRobin,
        backoff: true,
        max_timeout: Duration::from_secs(30),
    };
    let sinks = vec![
        named("a", &log, 0),
        named("b", &log, 0),
        named("c", &log, 0),
    ];
    drain_group(sinks, processor, &log, 40).await;
    assert_eq!(
        lines(&log),
        expected(&[
            "a e0, commit e0, b e10, commit e10",
            "c e20, commit e20, a e30, commit e30",
        ])
    );
}

fn lines(log: &Log) -> Vec<String> {
    log.lock().unwrap().clone()
}

fn expected(steps: &[&str]) -> Vec<String> {
    steps
        .iter()
        .flat_map(|step| step.split(", "))
        .map(str::to_owned)
        .collect()
}

/// A pipelining sink whose destination refuses for good every flush holding one of
/// `refused`, and fails for a while the flushes numbered in `transient`.
struct RefusingSink {
    refused: Vec<&'static str>,
    transient: Vec<usize>,
    flushes: usize,
    pending: Vec<String>,
    delivered: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl Sink for RefusingSink {
    async fn deliver(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        self.send(batch).await?;
        self.flush().await
    }
    async fn send(&mut self, batch: SinkBatch<'_>) -> Result<(), SinkError> {
        self.pending.extend(
            batch
                .events
                .iter()
                .map(|e| String::from_utf8_lossy(&e.body).into_owned()),
        );
        Ok(())
    }
    async fn flush(&mut self) -> Result<(), SinkError> {
        let number = self.flushes;
        self.flushes += 1;
        let pending = std::mem::take(&mut self.pending);
        if self.transient.contains(&number) {
            return Err(SinkError::Delivery("the destination is down".into()));
        }
        if let Some(bad) = pending.iter().find(|b| self.refused.contains(&b.as_str())) {
            return Err(SinkError::permanent(format!("refused {bad}")));
        }
        self.delivered.lock().unwrap().extend(pending);
        Ok(())
    }
    fn pipelining(&self) -> Pipelining {
        Pipelining {
            max_batches: 4,
            max_events: 1000,
            max_bytes: usize::MAX,
            max_delay: Duration::from_secs(1),
        }
    }
}

/// Drains 50 events `e0`..`e49` through `sink` with a memory dead-letter channel; returns
/// what the sink delivered, the dead letters and the sink's counters.
async fn drain_refusing(
    refused: Vec<&'static str>,
    transient: Vec<usize>,
) -> (Vec<String>, Vec<Event>, ComponentMetrics) {
    let log = Log::default();
    let channel = filled_channel(&log, 50, None).await;
    let dead_letter: Arc<dyn Channel> = Arc::new(MemoryChannel::new(
        "refused",
        &MemoryChannelConfig {
            capacity: 1000,
            transaction_capacity: 100,
            byte_capacity: None,
        },
    ));
    let delivered = Arc::new(Mutex::new(Vec::new()));
    let sink = RefusingSink {
        refused,
        transient,
        flushes: 0,
        pending: Vec::new(),
        delivered: Arc::clone(&delivered),
    };
    let metrics = ComponentMetrics::new("sink", "api");
    let ctx = SinkContext {
        name: "api".into(),
        metrics: metrics.clone(),
        state: None,
    };
    let drain = Shutdown::new();
    drain.trigger();
    let mut runner = SinkRunner::new(ctx, Box::new(sink), Arc::new(channel), 10, drain);
    runner.members[0].dead_letter = Some(Arc::clone(&dead_letter));
    runner.run().await;
    let letters = dead_letter
        .take(100, Duration::ZERO)
        .await
        .unwrap()
        .events()
        .to_vec();
    let delivered = delivered.lock().unwrap().clone();
    (delivered, letters, metrics)
}

fn bodies_except(refused: &[&str]) -> Vec<String> {
    (0..50)
        .map(|i| format!("e{i}"))
        .filter(|b| !refused.contains(&b.as_str()))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn refused_events_among_pipelined_batches_are_dead_lettered_and_the_rest_delivered_in_order()
{
    let refused = vec!["e7", "e23", "e24", "e49"];
    let (delivered, letters, metrics) = drain_refusing(refused.clone(), vec![]).await;
    assert_eq!(
        delivered,
        bodies_except(&refused),
        "each other event once, in order"
    );
    let dead: Vec<String> = letters
        .iter()
        .map(|e| String::from_utf8_lossy(&e.body).into_owned())
        .collect();
    assert_eq!(dead, refused);
    let first = &letters[0].headers;
    assert_eq!(first.value("ferry.dead_letter.reason"), Some("refused e7"));
    assert_eq!(first.value("ferry.dead_letter.sink"), Some("api"));
    assert_eq!(first.value("ferry.dead_letter.channel"), Some("buffer"));
    assert!(first.contains_key("ferry.dead_letter.time"));
    assert_eq!(metrics.counter("EventDeadLetteredCount").get(), 4);
    assert_eq!(metrics.counter("EventDrainSuccessCount").get(), 46);
}

#[tokio::test(start_paused = true)]
async fn a_transient_failure_while_splitting_rolls_back_and_dead_letters_each_event_once() {
    let refused = vec!["e13"];
    // Flush 0 holds the first four batches and is refused; flush 1 delivers e0..e9
    // (committed), 2 refuses e10..e19, 3 refuses e10..e14, 4 delivers e10 and e11, and the
    // destination is down for 5 (e12..e14): e10 and e11 are sent again after the rollback.
    let (delivered, letters, _) = drain_refusing(refused.clone(), vec![5]).await;
    let mut unique = delivered.clone();
    unique.sort_by_key(|b| b[1..].parse::<u32>().unwrap());
    unique.dedup();
    assert_eq!(unique, bodies_except(&refused), "nothing lost");
    assert!(
        delivered.len() > unique.len(),
        "halves sent again after the rollback"
    );
    assert_eq!(letters.len(), 1, "dead-lettered once");
    assert_eq!(&letters[0].body[..], b"e13");
}

#[tokio::test(start_paused = true)]
async fn a_standby_that_refuses_events_of_a_handed_over_batch_dead_letters_them() {
    let log = Log::default();
    let channel = filled_channel(&log, 20, None).await;
    let dead_letter: Arc<dyn Channel> = Arc::new(MemoryChannel::new(
        "refused",
        &MemoryChannelConfig {
            capacity: 100,
            transaction_capacity: 100,
            byte_capacity: None,
        },
    ));
    let delivered = Arc::new(Mutex::new(Vec::new()));
    let member = |name: &'static str, sink: Box<dyn Sink>| {
        let ctx = SinkContext {
            name: name.into(),
            metrics: ComponentMetrics::new("sink", name),
            state: None,
        };
        Member::new(ctx, sink, 10)
    };
    let primary = member("primary", Box::new(named("primary", &log, 1)));
    let mut standby = member(
        "standby",
        Box::new(RefusingSink {
            refused: vec!["e3"],
            transient: vec![],
            flushes: 0,
            pending: Vec::new(),
            delivered: Arc::clone(&delivered),
        }),
    );
    standby.dead_letter = Some(Arc::clone(&dead_letter));
    let processor = SinkProcessorConfig::Failover {
        priorities: vec![10, 5],
        max_penalty: Duration::from_secs(30),
    };
    let drain = Shutdown::new();
    drain.trigger();
    SinkRunner::with_members(
        Some("group".into()),
        vec![primary, standby],
        &processor,
        Arc::new(channel),
        drain,
    )
    .run()
    .await;
    // The first batch, handed over: all but e3 (the next batch may go to either).
    let delivered = delivered.lock().unwrap().clone();
    assert_eq!(delivered[..9], bodies_except(&["e3"])[..9]);
    let letters = dead_letter.take(10, Duration::ZERO).await.unwrap();
    assert_eq!(letters.events().len(), 1);
    assert_eq!(
        letters.events()[0].headers.value("ferry.dead_letter.sink"),
        Some("standby")
    );
}

#[tokio::test(start_paused = true)]
async fn keeps_several_batches_in_flight_and_commits_them_in_order() {
    let log = Log::default();
    let sink = pipelined(&log, 4);
    let delivered = Arc::clone(&sink.delivered);
    let metrics = drain_through(sink, &log, 95, None).await;
    assert_eq!(
        lines(&log),
        expected(&[
            "send e0, send e10, send e20, send e30, flush",
            "commit e0, commit e10, commit e20, commit e30",
            "send e40, send e50, send e60, send e70, flush",
            "commit e40, commit e50, commit e60, commit e70",
            // The take of e90 comes back short: flushed at once, nothing more taken.
            "send e80, send e90, flush, commit e80, commit e90",
        ])
    );
    let all: Vec<String> = (0..95).map(|i| format!("e{i}")).collect();
    assert_eq!(*delivered.lock().unwrap(), all);
    assert_eq!(metrics.counter("BatchCompleteCount").get(), 9);
    assert_eq!(metrics.counter("BatchUnderflowCount").get(), 1);
    assert_eq!(metrics.counter("BatchEmptyCount").get(), 0);
    assert_eq!(metrics.counter("EventDrainSuccessCount").get(), 95);
}

#[tokio::test(start_paused = true)]
async fn takes_committed_before_a_flush_are_synced_before_it_and_before_stopping() {
    let log = Log::default();
    let mut channel = filled_channel(&log, 40, None).await;
    channel.syncs = true;
    let ctx = SinkContext {
        name: "runner-test".into(),
        metrics: ComponentMetrics::new("sink", "runner-test"),
        state: None,
    };
    let drain = Shutdown::new();
    drain.trigger();
    SinkRunner::new(
        ctx,
        Box::new(pipelined(&log, 2)),
        Arc::new(channel),
        10,
        drain,
    )
    .run()
    .await;
    assert_eq!(
        lines(&log),
        expected(&[
            // Nothing was committed before the first flush: nothing to sync.
            "send e0, send e10, flush, commit e0, commit e10",
            // The sink records only this flush's batches: those before must be durable.
            "send e20, send e30, sync, flush, commit e20, commit e30",
            // And the last ones before the runner stops.
            "sync",
        ])
    );
}

#[tokio::test(start_paused = true)]
async fn flushes_when_the_channel_has_nothing_more_ready() {
    let log = Log::default();
    let metrics = drain_through(pipelined(&log, 4), &log, 60, None).await;
    assert_eq!(
        lines(&log),
        expected(&[
            "send e0, send e10, send e20, send e30, flush",
            "commit e0, commit e10, commit e20, commit e30",
            // A full take, then an empty one: what is in flight is flushed.
            "send e40, send e50, flush, commit e40, commit e50",
        ])
    );
    assert_eq!(metrics.counter("BatchEmptyCount").get(), 1);
}

#[tokio::test(start_paused = true)]
async fn rolls_back_every_batch_in_flight_newest_first_after_a_failed_flush() {
    let log = Log::default();
    let mut sink = pipelined(&log, 3);
    sink.failing_flushes = vec![0];
    let delivered = Arc::clone(&sink.delivered);
    let metrics = drain_through(sink, &log, 40, None).await;
    assert_eq!(
        lines(&log),
        expected(&[
            "send e0, send e10, send e20, flush failed",
            "rollback e20, rollback e10, rollback e0",
            // The same events again, in their order.
            "send e0, send e10, send e20, flush, commit e0, commit e10, commit e20",
            "send e30, flush, commit e30",
        ])
    );
    let all: Vec<String> = (0..40).map(|i| format!("e{i}")).collect();
    assert_eq!(*delivered.lock().unwrap(), all);
    assert_eq!(metrics.counter("EventWriteFail").get(), 30);
    assert_eq!(metrics.counter("EventDrainAttemptCount").get(), 70);
    assert_eq!(metrics.counter("EventDrainSuccessCount").get(), 40);
}

#[tokio::test(start_paused = true)]
async fn flushes_once_the_longest_delay_since_the_first_send_passed() {
    let log = Log::default();
    let mut sink = pipelined(&log, 100);
    sink.pipelining.max_delay = Duration::from_secs(1);
    sink.send_time = Duration::from_millis(300);
    drain_through(sink, &log, 60, None).await;
    assert_eq!(
        lines(&log),
        expected(&[
            // 1.2 s after the first send: a flush.
            "send e0, send e10, send e20, send e30, flush",
            "commit e0, commit e10, commit e20, commit e30",
            "send e40, send e50, flush, commit e40, commit e50",
        ])
    );
}

#[tokio::test(start_paused = true)]
async fn flushes_once_the_most_events_are_in_flight() {
    let log = Log::default();
    let mut sink = pipelined(&log, 100);
    sink.pipelining.max_events = 25;
    drain_through(sink, &log, 40, None).await;
    assert_eq!(
        lines(&log),
        expected(&[
            "send e0, send e10, send e20, flush, commit e0, commit e10, commit e20",
            "send e30, flush, commit e30",
        ])
    );
}

#[tokio::test(start_paused = true)]
async fn flushes_once_the_most_bytes_are_in_flight() {
    let log = Log::default();
    let mut sink = pipelined(&log, 100);
    // Batches of ten events: e0..e9 hold 20 bytes, the others 30 each.
    sink.pipelining.max_bytes = 45;
    drain_through(sink, &log, 40, None).await;
    assert_eq!(
        lines(&log),
        expected(&[
            "send e0, send e10, flush, commit e0, commit e10",
            "send e20, send e30, flush, commit e20, commit e30",
        ])
    );
}

#[tokio::test(start_paused = true)]
async fn a_channel_with_one_open_take_gets_one_batch_in_flight() {
    let log = Log::default();
    drain_through(pipelined(&log, 4), &log, 30, Some(1)).await;
    assert_eq!(
        lines(&log),
        expected(&[
            "send e0, flush, commit e0",
            "send e10, flush, commit e10",
            "send e20, flush, commit e20",
        ])
    );
}

#[tokio::test(start_paused = true)]
async fn a_sink_that_only_delivers_runs_one_batch_at_a_time() {
    let log = Log::default();
    let sink = DeliveringSink {
        log: Arc::clone(&log),
    };
    drain_through(sink, &log, 30, None).await;
    assert_eq!(
        lines(&log),
        expected(&["deliver e0, commit e0, deliver e10, commit e10, deliver e20, commit e20"])
    );
}

/// A file channel whose take commits never end once `crash` is set, as if the agent were
/// killed right after the sink's flush; `reached` is notified there.
struct CrashingChannel {
    inner: Arc<dyn Channel>,
    crash: bool,
    reached: Arc<tokio::sync::Notify>,
}

struct CrashingTake {
    inner: Box<dyn TakeTransaction>,
    crash: bool,
    reached: Arc<tokio::sync::Notify>,
}

#[async_trait]
impl Channel for CrashingChannel {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn start(&self) -> Result<(), ChannelError> {
        self.inner.start().await
    }
    async fn put(&self, batch: PutBatch) -> Result<(), ChannelError> {
        self.inner.put(batch).await
    }
    async fn try_put(&self, batch: PutBatch) -> Result<(), ChannelError> {
        self.inner.try_put(batch).await
    }
    async fn take(
        &self,
        max: usize,
        wait: Duration,
    ) -> Result<Box<dyn TakeTransaction>, ChannelError> {
        Ok(Box::new(CrashingTake {
            inner: self.inner.take(max, wait).await?,
            crash: self.crash,
            reached: Arc::clone(&self.reached),
        }))
    }
    fn transaction_capacity(&self) -> usize {
        self.inner.transaction_capacity()
    }
    async fn sync_takes(&self) -> Result<(), ChannelError> {
        self.inner.sync_takes().await
    }
    fn is_durable(&self) -> bool {
        self.inner.is_durable()
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
}

#[async_trait]
impl TakeTransaction for CrashingTake {
    fn events(&self) -> &[Event] {
        self.inner.events()
    }
    fn sequences(&self) -> Option<&[u64]> {
        self.inner.sequences()
    }
    async fn commit(self: Box<Self>) -> Result<(), ChannelError> {
        if self.crash {
            self.reached.notify_one();
            std::future::pending::<()>().await;
        }
        self.inner.commit().await
    }
    async fn rollback(self: Box<Self>) -> Result<(), ChannelError> {
        self.inner.rollback().await
    }
}

fn file_channel(dir: &std::path::Path, crash: bool) -> (CrashingChannel, Arc<tokio::sync::Notify>) {
    let mut registry = ferry_core::Registry::new();
    ferry_channels::register(&mut registry);
    let yaml = format!(
        "data_dir: {}\ncapacity: 100000\ntransaction_capacity: 1000",
        dir.display()
    );
    let cfg = ferry_core::ComponentConfig::from_yaml(
        ferry_core::ComponentKind::Channel,
        "durable",
        "file",
        &yaml,
    )
    .unwrap();
    let inner = (registry.channel("file").unwrap())(&cfg).unwrap();
    let reached = Arc::new(tokio::sync::Notify::new());
    let channel = CrashingChannel {
        inner,
        crash,
        reached: Arc::clone(&reached),
    };
    (channel, reached)
}

fn kafka_sink(bootstrap: &str) -> Box<dyn Sink> {
    let yaml = format!(
        "bootstrap_servers: {bootstrap}\ntopic: out\ndelivery: exactly_once\n\
             transactional_id: edge\ntransaction_max_events: 3000\ntransaction_max_delay: 1h"
    );
    let cfg = ferry_core::ComponentConfig::from_yaml(
        ferry_core::ComponentKind::Sink,
        "to_kafka",
        "kafka",
        &yaml,
    )
    .unwrap();
    Box::new(ferry_kafka::KafkaSink::build(&cfg).unwrap())
}

fn runner(channel: CrashingChannel, sink: Box<dyn Sink>, drain: Shutdown) -> SinkRunner {
    let ctx = SinkContext {
        name: "to_kafka".into(),
        metrics: ComponentMetrics::new("sink", "to_kafka"),
        state: None,
    };
    SinkRunner::new(ctx, sink, Arc::new(channel), 1000, drain)
}

/// Bodies a read_committed consumer finds in `topic`, and the progress the sink's group
/// committed, once nothing more arrives.
fn read_back(bootstrap: &str, topic: &str) -> (Vec<String>, String) {
    use ferry_kafka::test_support::{committed_bodies, committed_metadata};
    let bodies = committed_bodies(bootstrap, topic);
    (
        bodies,
        committed_metadata(bootstrap, "edge", "ferry-sink-progress"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_a_transaction_of_several_batches_repeats_none_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, bootstrap) =
        ferry_kafka::test_support::start_broker(&dir.path().join("broker"), 1).await;
    let channel_dir = dir.path().join("agent");

    // 5000 events in the channel; the first transaction holds three batches of 1000.
    let (channel, reached) = file_channel(&channel_dir, true);
    channel.start().await.unwrap();
    let events: Vec<Event> = (0..5000)
        .map(|i| Event::from_body(format!("e{i}")))
        .collect();
    for chunk in events.chunks(1000) {
        channel
            .put(PutBatch {
                source: "test".into(),
                events: chunk.to_vec(),
                checkpoint: None,
                ack: None,
                joint: None,
            })
            .await
            .unwrap();
    }
    // The agent dies once that transaction committed, before any take did.
    let first = tokio::spawn(runner(channel, kafka_sink(&bootstrap), Shutdown::new()).run());
    tokio::time::timeout(Duration::from_secs(60), reached.notified())
        .await
        .unwrap();
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    let (bodies, runs) = read_back(&bootstrap, "out");
    assert_eq!(bodies.len(), 3000);
    let (low, high) = runs.split_once('-').unwrap();
    let (low, high): (u64, u64) = (low.parse().unwrap(), high.parse().unwrap());
    assert_eq!(
        high - low + 1,
        3000,
        "the progress names all three batches: {runs}"
    );

    // The next run finds every event in the channel again and delivers each once.
    let (channel, _) = file_channel(&channel_dir, false);
    channel.start().await.unwrap();
    assert_eq!(channel.len(), 5000);
    let drain = Shutdown::new();
    drain.trigger();
    runner(channel, kafka_sink(&bootstrap), drain).run().await;
    let (bodies, _) = read_back(&bootstrap, "out");
    let all: Vec<String> = (0..5000).map(|i| format!("e{i}")).collect();
    assert_eq!(bodies, all);
    broker.shutdown().await;
}

/// A sink that notes, in each delivery, whether its metrics show a delivery in flight, and
/// fails its first `failures` deliveries.
struct WatchedSink {
    metrics: ComponentMetrics,
    seen: Arc<Mutex<Vec<bool>>>,
    failures: usize,
}

#[async_trait]
impl Sink for WatchedSink {
    async fn deliver(&mut self, _batch: SinkBatch<'_>) -> Result<(), SinkError> {
        let in_flight = self.metrics.delivery_in_flight().is_some();
        self.seen.lock().unwrap().push(in_flight);
        if self.failures > 0 {
            self.failures -= 1;
            return Err(SinkError::Delivery("the destination is down".into()));
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_delivery_is_in_flight_for_health_while_the_sink_has_it_and_not_after() {
    let log = Log::default();
    let channel = filled_channel(&log, 30, None).await;
    let metrics = ComponentMetrics::new("sink", "watched");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = WatchedSink {
        metrics: metrics.clone(),
        seen: Arc::clone(&seen),
        failures: 2,
    };
    let ctx = SinkContext {
        name: "watched".into(),
        metrics: metrics.clone(),
        state: None,
    };
    let drain = Shutdown::new();
    drain.trigger();
    SinkRunner::new(ctx, Box::new(sink), Arc::new(channel), 10, drain)
        .run()
        .await;
    let seen = seen.lock().unwrap().clone();
    // Three batches, the first tried three times: each delivery in flight while it runs.
    assert_eq!(seen, vec![true; 5]);
    // Failed or delivered, none is left in flight.
    assert!(metrics.delivery_in_flight().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_failed_flush_leaves_no_delivery_in_flight() {
    let log = Log::default();
    let mut sink = pipelined(&log, 3);
    sink.failing_flushes = vec![0];
    let metrics = drain_through(sink, &log, 30, None).await;
    assert!(lines(&log).contains(&"flush failed".to_owned()));
    assert!(metrics.delivery_in_flight().is_none());
}
