//! Running a topology: one task per source and per sink runner, and an orderly shutdown.
//!
//! A sink runner takes a batch, sends it to the sink, and keeps its take open while it takes
//! and sends the next ones, up to the sink's [`Pipelining`] bounds (a sink that only delivers
//! has one batch in flight: today's take, deliver, commit). It flushes the sink when a bound
//! is reached or the channel has nothing more ready (an empty or short take; it never waits
//! for events while batches are in flight), then commits the takes oldest first. A failed send
//! or flush rolls every open take back, newest first, so the events return to the channel in
//! their order, and the runner backs off (100 ms doubling to 5 s) before taking them again.
//!
//! A sink group (`sinkgroups:`, see [`crate::sinkgroup`]) is driven by one runner the same
//! way, a sink alone being a group of one: for each round of takes the group's processor names
//! the sinks to try, in order; the batches go to the first, and when it fails they go on to the
//! next at once, their takes still open. Only when every sink named failed are the takes rolled
//! back. Each sink keeps its own counters, start and stop.
//!
//! Shutdown drains: when the stop signal fires (or every source has ended on its own), the
//! sources stop first, so nothing new enters the channels; then each sink runner keeps taking
//! until its channel is empty, and stops. Every event a source acknowledged to its client is
//! therefore delivered before the process exits.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ferry_broker::Broker;
use ferry_core::state::StateStore;
use ferry_core::{
    Channel, CheckpointStore, ComponentMetrics, Counter, Event, Latency, Pipelining, Shutdown,
    Sink, SinkBatch, SinkContext, SinkError, SourceContext, SourceOptions, TakeTransaction,
};
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::http::{HttpServer, PipelineMetrics};
use crate::lock::DataDirLock;
use crate::pipeline::{Pipeline, Reloads};
use crate::sinkgroup::{SinkProcessor, SinkProcessorConfig};
use crate::topology::{SinkGroupSpec, SinkSpec, SourceSpec, Topology};

/// How long a sink runner waits for events before calling the sink's `idle`.
const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// First wait after a failure; doubled on each further failure.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between retries (Flume's sink runner backs off up to 5 s).
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// While the agent stops, how long a sink may keep failing before it gives up on a durable
/// channel (whose events wait for the next run).
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// Runs `topology` until `stop` fires (or every source ends, when there is no broker), then
/// drains and returns.
pub async fn run(topology: Topology, stop: Shutdown) -> anyhow::Result<()> {
    run_reloading(topology, stop, None).await
}

/// Like [`run`], applying the reloads `reloads` asks for while it runs (see
/// [`crate::pipeline`]).
pub async fn run_reloading(
    topology: Topology,
    stop: Shutdown,
    reloads: Option<Reloads>,
) -> anyhow::Result<()> {
    // Before anything starts: a second agent on this data_dir is refused here.
    let _lock = DataDirLock::acquire(&topology.agent.data_dir)?;
    // The broker comes first, so that Kafka components find it, and goes last.
    let broker = match topology.broker.clone() {
        Some(config) => {
            let broker = Broker::start(config)
                .await
                .context("starting the bundled broker")?;
            info!(listeners = %listeners(&broker), "bundled broker started");
            Some(broker)
        }
        None => None,
    };
    // The HTTP server comes next and also goes after the pipeline, so that the drain can be
    // watched.
    let http_stop = Shutdown::new();
    let metrics = PipelineMetrics::new(&topology);
    let http = match topology.agent.http {
        Some(address) => {
            let mut server = HttpServer::new(metrics.clone());
            if let Some(broker) = &broker {
                server.with_broker(broker.observer());
            }
            Some(server.start(address, http_stop.clone()).await?)
        }
        None => None,
    };
    let serves_until_stopped = broker.is_some() || http.is_some();
    let result = match Pipeline::start(topology, stop.clone(), Some(metrics)).await {
        Ok(pipeline) => pipeline.run(reloads).await,
        Err(e) => Err(e),
    };
    if serves_until_stopped && result.is_ok() {
        // With a broker or an HTTP server the agent serves until it is told to stop, even
        // when every source has ended.
        stop.wait().await;
    }
    if let Some(http) = http {
        http_stop.trigger();
        http.stopped().await;
    }
    if let Some(broker) = broker {
        broker.shutdown().await;
        info!("bundled broker stopped");
    }
    result
}

/// Every listener of `broker` as `NAME=address`, comma-separated, for the log line that says
/// it started (tests find the ports of listeners on port 0 there).
pub fn listeners(broker: &ferry_broker::BrokerHandle) -> String {
    broker
        .listener_addrs()
        .iter()
        .map(|(name, addr)| format!("{name}={addr}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Sleeps for `backoff`, then doubles it up to [`MAX_BACKOFF`].
async fn back_off(backoff: &mut Duration) {
    let wait = *backoff;
    *backoff = (*backoff * 2).min(MAX_BACKOFF);
    tokio::time::sleep(wait).await;
}

/// Like [`back_off`], unless `stop` fires first; returns whether it fired.
async fn backoff_or_stop(backoff: &mut Duration, stop: &Shutdown) -> bool {
    tokio::select! {
        _ = back_off(backoff) => stop.is_triggered(),
        _ = stop.wait() => true,
    }
}

pub(crate) async fn run_source(
    spec: SourceSpec,
    stop: Shutdown,
    store: Arc<dyn CheckpointStore>,
    full_channel_warning: Duration,
) {
    let metrics = spec.metrics.clone();
    let type_name = spec.config.type_name().to_owned();
    metrics.started();
    info!(source = %spec.name, r#type = %type_name, "source started");
    run_source_until_done(spec, stop, store, full_channel_warning).await;
    metrics.stopped();
    info!(source = %metrics.name(), r#type = %type_name, "source stopped");
}

/// Runs a source, restarting it after a failure, until it finishes or the agent stops.
async fn run_source_until_done(
    spec: SourceSpec,
    stop: Shutdown,
    store: Arc<dyn CheckpointStore>,
    full_channel_warning: Duration,
) {
    let SourceSpec {
        name,
        mut source,
        config,
        factory,
        channels,
        interceptors,
        selector,
        metrics,
    } = spec;
    let options = SourceOptions {
        metrics: metrics.clone(),
        full_channel_warning,
        selector,
    };
    let mut backoff = MIN_BACKOFF;
    loop {
        let ctx = match SourceContext::with_options(
            name.clone(),
            channels.clone(),
            interceptors.clone(),
            stop.clone(),
            Arc::clone(&store),
            options.clone(),
        ) {
            Ok(ctx) => ctx,
            Err(e) => {
                error!(source = %name, error = %e, "cannot load the checkpoint; retrying after backoff");
                metrics.failed(format!("cannot load the checkpoint: {e}"));
                if backoff_or_stop(&mut backoff, &stop).await {
                    return;
                }
                continue;
            }
        };
        let started = Instant::now();
        match source.run(ctx).await {
            Ok(()) => {
                info!(source = %name, "source finished");
                return;
            }
            Err(e) => {
                error!(source = %name, error = %e, "source failed; restarting after backoff");
                metrics.failed(&e);
            }
        }
        // A source that ran a good while before failing starts over with a short backoff.
        if started.elapsed() > MAX_BACKOFF * 12 {
            backoff = MIN_BACKOFF;
        }
        if backoff_or_stop(&mut backoff, &stop).await {
            return;
        }
        source = match factory(&config) {
            Ok(source) => source,
            Err(e) => {
                error!(source = %name, error = %e, "cannot rebuild source");
                metrics.failed(format!("cannot rebuild the source: {e}"));
                return;
            }
        };
    }
}

/// What the runner counts for every sink, with Flume's names. The connection counters are
/// the sink's `start` (created or failed) and `stop` (closed); a sink that reconnects by
/// itself may add its own to them.
struct SinkCounters {
    batches_complete: Counter,
    batches_underflow: Counter,
    batches_empty: Counter,
    drain_attempts: Counter,
    drain_successes: Counter,
    drained_bytes: Counter,
    write_fails: Counter,
    read_fails: Counter,
    connections_created: Counter,
    connections_closed: Counter,
    connections_failed: Counter,
    /// Events the destination refused for good, moved to the sink's `dead_letter` channel.
    dead_lettered: Counter,
    /// From the first send of a flush to the sink's answer that all of it is delivered.
    delivery: Latency,
}

impl SinkCounters {
    fn new(metrics: &ComponentMetrics) -> Self {
        metrics.counter("ConsecutiveFailures");
        Self {
            batches_complete: metrics.counter("BatchCompleteCount"),
            batches_underflow: metrics.counter("BatchUnderflowCount"),
            batches_empty: metrics.counter("BatchEmptyCount"),
            drain_attempts: metrics.counter("EventDrainAttemptCount"),
            drain_successes: metrics.counter("EventDrainSuccessCount"),
            drained_bytes: metrics.counter("EventDrainSuccessBytes"),
            write_fails: metrics.counter("EventWriteFail"),
            read_fails: metrics.counter("ChannelReadFail"),
            connections_created: metrics.counter("ConnectionCreatedCount"),
            connections_closed: metrics.counter("ConnectionClosedCount"),
            connections_failed: metrics.counter("ConnectionFailedCount"),
            dead_lettered: metrics.counter("EventDeadLetteredCount"),
            delivery: metrics.latency("DeliveryLatency"),
        }
    }
}

/// Runs one sink until `drain` (its channel is drained, then it stops) or `retire` (what is in
/// flight is finished, then it stops) fires.
pub(crate) async fn run_sink(spec: SinkSpec, drain: Shutdown, retire: Shutdown, state: StateStore) {
    let channel = Arc::clone(&spec.channel);
    let member = Member::from_spec(spec, state);
    SinkRunner::with_members(
        None,
        vec![member],
        &SinkProcessorConfig::Default,
        channel,
        drain,
    )
    .retiring_on(retire)
    .run()
    .await;
}

/// Runs a sink group as [`run_sink`] runs a sink.
pub(crate) async fn run_sink_group(
    group: SinkGroupSpec,
    drain: Shutdown,
    retire: Shutdown,
    state: StateStore,
) {
    let SinkGroupSpec {
        name,
        members,
        processor,
    } = group;
    let Some(channel) = members.first().map(|m| Arc::clone(&m.channel)) else {
        return;
    };
    let members = members
        .into_iter()
        .map(|spec| Member::from_spec(spec, state.clone()))
        .collect();
    SinkRunner::with_members(Some(name), members, &processor, channel, drain)
        .retiring_on(retire)
        .run()
        .await;
}

/// The takes of the batches sent to the sink and not yet flushed, oldest first.
#[derive(Default)]
struct InFlight {
    takes: Vec<Box<dyn TakeTransaction>>,
    events: usize,
    /// When the first of them was sent.
    since: Option<Instant>,
    /// Whether the last take came back with fewer events than asked for: the channel has
    /// nothing more ready, so taking again would only delay what is in flight.
    caught_up: bool,
}

impl InFlight {
    fn is_empty(&self) -> bool {
        self.takes.is_empty()
    }

    /// Whether any bound of `pipelining` is reached.
    fn reached(&self, pipelining: &Pipelining) -> bool {
        self.takes.len() >= pipelining.max_batches
            || self.events >= pipelining.max_events
            || self
                .since
                .is_some_and(|since| since.elapsed() >= pipelining.max_delay)
    }

    fn push(&mut self, take: Box<dyn TakeTransaction>, short: bool) {
        self.events += take.events().len();
        self.caught_up = short;
        self.takes.push(take);
    }

    /// Every take, oldest first; nothing is in flight afterwards.
    fn take_all(&mut self) -> Vec<Box<dyn TakeTransaction>> {
        let takes = std::mem::take(&mut self.takes);
        *self = Self::default();
        takes
    }
}

/// Whether a sink runner goes on after a step.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

/// Logs a line at most once per [`Self::EVERY`], counting the occurrences in between, so that
/// a flood of refused events does not become a flood of log lines.
#[derive(Default)]
struct Throttle {
    last: Option<Instant>,
    held: u64,
}

impl Throttle {
    const EVERY: Duration = Duration::from_secs(10);

    /// `Some(occurrences since the last line)` when a line is due now; otherwise counts
    /// `n` occurrences for the next line.
    fn due(&mut self, n: u64) -> Option<u64> {
        self.held += n;
        if self.last.is_some_and(|last| last.elapsed() < Self::EVERY) {
            return None;
        }
        self.last = Some(Instant::now());
        Some(std::mem::take(&mut self.held))
    }
}

/// One sink driven by a runner, with its own counters, start and stop.
struct Member {
    ctx: SinkContext,
    sink: Box<dyn Sink>,
    batch_size: usize,
    /// Where events the destination refuses for good go.
    dead_letter: Option<Arc<dyn Channel>>,
    /// Lines about refused events: dead-lettered, or retried for want of a `dead_letter`.
    refusals: Throttle,
    counters: SinkCounters,
    /// Filled in once the sink has started.
    pipelining: Pipelining,
    started: bool,
}

impl Member {
    fn new(ctx: SinkContext, sink: Box<dyn Sink>, batch_size: usize) -> Self {
        Self {
            counters: SinkCounters::new(&ctx.metrics),
            ctx,
            sink,
            batch_size,
            dead_letter: None,
            refusals: Throttle::default(),
            pipelining: Pipelining::ONE_BATCH,
            started: false,
        }
    }

    fn from_spec(spec: SinkSpec, state: StateStore) -> Self {
        let SinkSpec {
            name,
            sink,
            batch_size,
            metrics,
            dead_letter,
            ..
        } = spec;
        let ctx = SinkContext {
            name,
            metrics,
            state: Some(state),
        };
        let mut member = Self::new(ctx, sink, batch_size);
        member.dead_letter = dead_letter;
        member
    }

    fn name(&self) -> &str {
        &self.ctx.name
    }

    /// Starts the sink once; on success its pipelining is bounded by the open takes the
    /// channel allows.
    async fn start(&mut self, channel: &dyn Channel) -> Result<(), SinkError> {
        if let Err(e) = self.sink.start(&self.ctx).await {
            self.counters.connections_failed.inc();
            self.ctx.metrics.failed(&e);
            return Err(e);
        }
        self.counters.connections_created.inc();
        self.ctx.metrics.started();
        self.started = true;
        let wanted = self.sink.pipelining();
        let open_takes = channel.max_open_takes().unwrap_or(usize::MAX);
        self.pipelining = Pipelining {
            max_batches: wanted.max_batches.min(open_takes).max(1),
            max_events: wanted.max_events.max(1),
            max_delay: wanted.max_delay,
        };
        info!(sink = %self.name(), "sink started");
        Ok(())
    }

    /// Stops the sink if it started.
    async fn stop(&mut self) {
        if self.started {
            if let Err(e) = self.sink.stop().await {
                error!(sink = %self.name(), error = %e, "sink did not stop cleanly");
            }
            self.counters.connections_closed.inc();
            info!(sink = %self.name(), "sink stopped");
        }
        self.ctx.metrics.stopped();
    }
}

/// Drives one sink, or the sinks of a group, on one channel: takes batches, sends them to the
/// member the processor chose, keeping as many in flight as that sink's [`Pipelining`] and
/// the channel allow, flushes, and commits the takes in order. When the member fails, the
/// batches in flight go to the next member the processor named for them, their takes still
/// open; when every member failed, they are rolled back.
struct SinkRunner {
    /// The group's name; `None` for a sink outside any group.
    group: Option<String>,
    members: Vec<Member>,
    processor: SinkProcessor,
    channel: Arc<dyn Channel>,
    drain: Shutdown,
    /// Fires when a reload stops this runner: finish what is in flight, take nothing more.
    retire: Shutdown,
    in_flight: InFlight,
    /// The member the batches in flight went to.
    current: usize,
    /// The members to try after it for these batches, in the processor's order.
    next: VecDeque<usize>,
    backoff: Duration,
    /// While the agent stops: since when deliveries keep failing.
    failing_since: Option<Instant>,
}

impl SinkRunner {
    /// A runner for one sink.
    #[cfg(test)]
    fn new(
        ctx: SinkContext,
        sink: Box<dyn Sink>,
        channel: Arc<dyn Channel>,
        batch_size: usize,
        drain: Shutdown,
    ) -> Self {
        let member = Member::new(ctx, sink, batch_size);
        Self::with_members(
            None,
            vec![member],
            &SinkProcessorConfig::Default,
            channel,
            drain,
        )
    }

    fn with_members(
        group: Option<String>,
        members: Vec<Member>,
        processor: &SinkProcessorConfig,
        channel: Arc<dyn Channel>,
        drain: Shutdown,
    ) -> Self {
        Self {
            group,
            processor: SinkProcessor::new(processor, members.len()),
            members,
            channel,
            drain,
            retire: Shutdown::new(),
            in_flight: InFlight::default(),
            current: 0,
            next: VecDeque::new(),
            backoff: MIN_BACKOFF,
            failing_since: None,
        }
    }

    /// Stops the runner when `retire` fires, once the batches in flight are done.
    fn retiring_on(mut self, retire: Shutdown) -> Self {
        self.retire = retire;
        self
    }

    /// The sink the batches in flight go to.
    fn member(&mut self) -> &mut Member {
        &mut self.members[self.current]
    }

    /// Starts the sinks, delivers until the channel is drained, and stops the sinks.
    async fn run(mut self) {
        if self.start().await {
            while self.step().await == Flow::Continue {}
        }
        for member in &mut self.members {
            member.stop().await;
        }
    }

    /// Starts the sinks. A sink alone is retried after a backoff until it starts; `false`
    /// when the agent stops first. A member of a group that does not start is penalised and
    /// started again when the processor next names it.
    async fn start(&mut self) -> bool {
        if let Some(group) = &self.group {
            info!(sink_group = %group, processor = ?self.processor, "sink group started");
            for (i, member) in self.members.iter_mut().enumerate() {
                if let Err(e) = member.start(self.channel.as_ref()).await {
                    error!(sink = %member.name(), error = %e, "sink cannot start; the group goes on without it for now");
                    self.processor.failed(i, Instant::now());
                }
            }
            return true;
        }
        let mut backoff = MIN_BACKOFF;
        let channel = Arc::clone(&self.channel);
        while let Err(e) = self.members[0].start(channel.as_ref()).await {
            let name = self.members[0].name().to_owned();
            if self.drain.is_triggered() {
                // Nothing was taken: what the channel holds stays there (in a durable channel,
                // for the next run).
                error!(sink = %name, error = %e, "sink cannot start; giving up, the agent is stopping");
                return false;
            }
            if self.retire.is_triggered() {
                return false;
            }
            error!(sink = %name, error = %e, "sink cannot start; retrying");
            tokio::select! {
                _ = backoff_or_stop(&mut backoff, &self.drain) => {}
                _ = self.retire.wait() => {}
            }
        }
        true
    }

    /// One step: a flush when one is due, else the next take, sent to the sink.
    async fn step(&mut self) -> Flow {
        if self.retire.is_triggered() {
            // A reload stops this runner: what is in flight is delivered (or rolled back into
            // the channel), nothing more is taken.
            if self.in_flight.is_empty() {
                return Flow::Stop;
            }
            return self.flush().await;
        }
        if self.flush_due() {
            return self.flush().await;
        }
        if self.drain.is_triggered() && self.channel.is_empty() {
            return Flow::Stop;
        }
        if self.in_flight.is_empty() && !self.choose().await {
            return self.none_available().await;
        }
        let Some(take) = self.take().await else {
            return Flow::Continue;
        };
        if take.events().is_empty() {
            drop(take);
            return self.nothing_ready().await;
        }
        self.send(take).await
    }

    /// Chooses the member for the next batches: the first of the processor's order that is
    /// started (or starts now). `false` when none is.
    async fn choose(&mut self) -> bool {
        self.next = self.processor.order(Instant::now()).into();
        match self.next_member().await {
            Some(member) => {
                self.current = member;
                true
            }
            None => false,
        }
    }

    /// The next member of the processor's order for the batches at hand that is started or
    /// starts now.
    async fn next_member(&mut self) -> Option<usize> {
        while let Some(i) = self.next.pop_front() {
            let member = &mut self.members[i];
            if !member.started
                && let Err(e) = member.start(self.channel.as_ref()).await
            {
                error!(sink = %member.name(), error = %e, "sink cannot start");
                self.processor.failed(i, Instant::now());
                continue;
            }
            return Some(i);
        }
        None
    }

    /// No member of the group may take a batch now (each is penalised or does not start):
    /// waits until the first penalty ends, or a backoff.
    async fn none_available(&mut self) -> Flow {
        if self.gives_up_draining() {
            return Flow::Stop;
        }
        let now = Instant::now();
        match self.processor.next_available(now) {
            Some(at) => {
                let at = at.min(now + MAX_BACKOFF);
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = self.drain.wait(), if !self.drain.is_triggered() => {}
                    _ = self.retire.wait(), if !self.retire.is_triggered() => {}
                }
            }
            None => back_off(&mut self.backoff).await,
        }
        Flow::Continue
    }

    /// Whether the batches in flight must be flushed before anything is taken: a bound is
    /// reached, the channel has nothing more right now, or the agent stops and the channel is
    /// empty (a channel that reports no size, such as kafka, is always empty).
    fn flush_due(&self) -> bool {
        !self.in_flight.is_empty()
            && (self.in_flight.caught_up
                || self
                    .in_flight
                    .reached(&self.members[self.current].pipelining)
                || (self.drain.is_triggered() && self.channel.is_empty()))
    }

    /// The next take: waiting up to [`POLL_INTERVAL`] for events when nothing is in flight,
    /// not at all otherwise. `None` when the agent began to stop meanwhile or the take failed.
    async fn take(&mut self) -> Option<Box<dyn TakeTransaction>> {
        let wait = if self.in_flight.is_empty() {
            POLL_INTERVAL
        } else {
            Duration::ZERO
        };
        let batch_size = self.members[self.current].batch_size;
        let take = tokio::select! {
            take = self.channel.take(batch_size, wait) => take,
            // Taking is cancel-safe: nothing leaves the channel until `take` returns.
            _ = self.drain.wait(), if !self.drain.is_triggered() => return None,
            _ = self.retire.wait(), if !self.retire.is_triggered() => return None,
        };
        match take {
            Ok(take) => Some(take),
            Err(e) => {
                let member = &self.members[self.current];
                error!(sink = %member.name(), error = %e, "cannot take from channel");
                member.counters.read_fails.inc();
                if self.in_flight.is_empty() {
                    back_off(&mut self.backoff).await;
                } else {
                    // What is in flight is flushed first; a failure that lasts then backs off.
                    self.in_flight.caught_up = true;
                }
                None
            }
        }
    }

    /// An empty take: flush what is in flight, or let the sinks do their idle work.
    async fn nothing_ready(&mut self) -> Flow {
        self.member().counters.batches_empty.inc();
        if !self.in_flight.is_empty() {
            return self.flush().await;
        }
        for member in self.members.iter_mut().filter(|m| m.started) {
            if let Err(e) = member.sink.idle().await {
                warn!(sink = %member.name(), error = %e, "sink idle work failed");
            }
        }
        Flow::Continue
    }

    /// Sends a batch to the current member; its take stays open until the next flush.
    async fn send(&mut self, take: Box<dyn TakeTransaction>) -> Flow {
        let n = take.events().len();
        if self.in_flight.is_empty() {
            self.processor.chosen(self.current);
        }
        self.in_flight.since.get_or_insert_with(Instant::now);
        let short = n < self.members[self.current]
            .batch_size
            .min(self.channel.transaction_capacity());
        let member = &mut self.members[self.current];
        member.counters.drain_attempts.add(n as u64);
        let sent = member
            .sink
            .send(SinkBatch {
                events: take.events(),
                sequences: take.sequences(),
            })
            .await;
        self.in_flight.push(take, short);
        match sent {
            Ok(()) => Flow::Continue,
            Err(e) => self.failed(e).await,
        }
    }

    /// Flushes the current member, then commits the takes in flight, oldest first.
    async fn flush(&mut self) -> Flow {
        match self.member().sink.flush().await {
            Ok(()) => {
                if let Some(since) = self.in_flight.since {
                    self.member().counters.delivery.observe(since.elapsed());
                }
                let takes = self.in_flight.take_all();
                self.delivered(self.current, takes).await;
                Flow::Continue
            }
            Err(e) => self.failed(e).await,
        }
    }

    /// `member` made `takes` safe: commits them, oldest first.
    async fn delivered(&mut self, member: usize, takes: Vec<Box<dyn TakeTransaction>>) {
        self.processor.delivered(member);
        let member = &mut self.members[member];
        let mut committed_all = true;
        for take in takes {
            let n = take.events().len();
            let bytes: usize = take.events().iter().map(|e| e.body.len()).sum();
            if let Err(e) = take.commit().await {
                // The events were delivered but stay in the channel: they will be delivered
                // again (at-least-once), never lost.
                error!(sink = %member.name(), error = %e, "cannot commit take");
                committed_all = false;
                continue;
            }
            member.counters.drain_successes.add(n as u64);
            member.counters.drained_bytes.add(bytes as u64);
            if n == member.batch_size {
                member.counters.batches_complete.inc();
            } else {
                member.counters.batches_underflow.inc();
            }
        }
        if committed_all {
            self.failing_since = None;
            self.backoff = MIN_BACKOFF;
            member.ctx.metrics.succeeded();
        }
    }

    /// Counts a failure of `member` with `events` events in flight, and penalises it.
    fn member_failed(&mut self, member: usize, error: &SinkError, events: usize) {
        self.processor.failed(member, Instant::now());
        let member = &mut self.members[member];
        member.counters.write_fails.add(events as u64);
        member.ctx.metrics.failed(error);
        error!(sink = %member.name(), error = %error, events, "delivery failed");
    }

    /// After a failed send or flush: hands the batches in flight to the next members of the
    /// processor's order (their takes stay open); when none is left or every one failed,
    /// rolls their takes back, newest first, so that their events return to the front of the
    /// channel in channel order, then backs off.
    async fn failed(&mut self, error: SinkError) -> Flow {
        if error.is_permanent() {
            if self.members[self.current].dead_letter.is_some() {
                return self.sift(error).await;
            }
            let events = self.in_flight.events as u64;
            let member = &mut self.members[self.current];
            if let Some(refused) = member.refusals.due(events) {
                error!(
                    sink = %member.name(), error = %error, events = refused,
                    "the destination refuses these events for good (a permanent failure); they are retried and hold up the events behind them: set `dead_letter` on this sink to move refused events to another channel"
                );
            }
        }
        self.member_failed(self.current, &error, self.in_flight.events);
        let mut takes = self.in_flight.take_all();
        while let Some(next) = self.next_member().await {
            info!(
                sink_group = self.group.as_deref().unwrap_or_default(),
                from = %self.members[self.current].name(),
                to = %self.members[next].name(),
                batches = takes.len(),
                "handing the batches over to the next sink of the group"
            );
            self.current = next;
            match self.hand_over(takes).await {
                Ok(()) => return Flow::Continue,
                Err((rest, error))
                    if error.is_permanent() && self.member().dead_letter.is_some() =>
                {
                    // This member's destination refuses events of them: find those.
                    for take in rest {
                        self.in_flight.push(take, false);
                    }
                    return self.sift(error).await;
                }
                Err((rest, _)) => takes = rest,
            }
        }
        let events: usize = takes.iter().map(|t| t.events().len()).sum();
        error!(
            sink = %self.members[self.current].name(),
            sink_group = self.group.as_deref().unwrap_or_default(),
            events,
            "delivery failed; rolling back and retrying"
        );
        while let Some(take) = takes.pop() {
            if let Err(e) = take.rollback().await {
                error!(sink = %self.members[self.current].name(), error = %e, "cannot roll back take");
            }
        }
        if self.gives_up_draining() {
            return Flow::Stop;
        }
        back_off(&mut self.backoff).await;
        Flow::Continue
    }

    /// After a permanent failure, with a `dead_letter` channel: splits each batch in flight
    /// into halves, and those that fail again into halves, until the events the destination
    /// refuses are single; delivers the rest; commits each take with its refused events moved
    /// to the dead-letter channel ([`crate::dead_letter::commit_moving`]). A transient failure
    /// on the way rolls back what is left, as any failure: the next attempt sends the halves
    /// already delivered again (at least once, or skipped by sinks that track sequences).
    async fn sift(&mut self, error: SinkError) -> Flow {
        // The events are at fault, not the sink: it is not penalised.
        let member = &mut self.members[self.current];
        member
            .counters
            .write_fails
            .add(self.in_flight.events as u64);
        let mut takes: VecDeque<_> = self.in_flight.take_all().into();
        // With one batch in flight, the failure was its own: split it at once.
        let mut known = (takes.len() == 1).then_some(error);
        while let Some(take) = takes.pop_front() {
            let (take, sifted) = self.sift_take(take, known.take()).await;
            let outcome = match sifted {
                Ok(refused) if refused.is_empty() => {
                    self.delivered(self.current, vec![take]).await;
                    continue;
                }
                Ok(refused) => self.dead_letter(take, refused).await,
                Err(error) => {
                    takes.push_front(take);
                    Err(error.to_string())
                }
            };
            if let Err(error) = outcome {
                let member = &self.members[self.current];
                let name = member.name().to_owned();
                error!(sink = %name, %error, "delivery failed while isolating refused events; rolling back and retrying");
                member.ctx.metrics.failed(&error);
                while let Some(take) = takes.pop_back() {
                    if let Err(e) = take.rollback().await {
                        error!(sink = %name, error = %e, "cannot roll back take");
                    }
                }
                if self.gives_up_draining() {
                    return Flow::Stop;
                }
                back_off(&mut self.backoff).await;
                return Flow::Continue;
            }
        }
        Flow::Continue
    }

    /// Sends the events of `take` in halves, recursively, until every event is delivered or
    /// refused alone; returns the refused ones (index in the take, reason). `known`: the
    /// permanent failure of the whole take, when already known. A transient failure ends it.
    async fn sift_take(
        &mut self,
        take: Box<dyn TakeTransaction>,
        known: Option<SinkError>,
    ) -> (
        Box<dyn TakeTransaction>,
        Result<Vec<(usize, String)>, SinkError>,
    ) {
        let result = self
            .sift_events(take.events(), take.sequences(), known)
            .await;
        (take, result)
    }

    /// [`Self::sift_take`] on the events of a take (and their sequence numbers).
    async fn sift_events(
        &mut self,
        events: &[Event],
        sequences: Option<&[u64]>,
        known: Option<SinkError>,
    ) -> Result<Vec<(usize, String)>, SinkError> {
        let mut refused = Vec::new();
        // Ranges still to send, the next one last.
        let mut ranges = vec![(0, events.len())];
        if let Some(error) = known {
            ranges.clear();
            split_or_refuse((0, events.len()), error, &mut ranges, &mut refused);
        }
        while let Some((start, end)) = ranges.pop() {
            let member = &mut self.members[self.current];
            let batch = SinkBatch {
                events: &events[start..end],
                sequences: sequences.and_then(|s| s.get(start..end)),
            };
            member.counters.drain_attempts.add((end - start) as u64);
            let result = match member.sink.send(batch).await {
                Ok(()) => member.sink.flush().await,
                Err(error) => Err(error),
            };
            match result {
                Ok(()) => {}
                Err(error) if error.is_permanent() => {
                    split_or_refuse((start, end), error, &mut ranges, &mut refused);
                }
                Err(error) => return Err(error),
            }
        }
        refused.sort_unstable_by_key(|(i, _)| *i);
        Ok(refused)
    }

    /// Commits `take`, the events at `refused` (index, reason) moved to the current member's
    /// dead-letter channel and the others counted as delivered.
    async fn dead_letter(
        &mut self,
        take: Box<dyn TakeTransaction>,
        refused: Vec<(usize, String)>,
    ) -> Result<(), String> {
        let member = &self.members[self.current];
        let name = member.name().to_owned();
        let Some(dead_letter) = member.dead_letter.clone() else {
            take.rollback().await.map_err(|e| e.to_string())?;
            return Err("the sink has no dead_letter channel".into());
        };
        let events = take.events();
        let letters: Vec<Event> = refused
            .iter()
            .filter_map(|(i, reason)| {
                let event = events.get(*i)?;
                Some(crate::dead_letter::dead_letter(
                    event,
                    reason,
                    &name,
                    self.channel.name(),
                ))
            })
            .collect();
        let n = events.len();
        let delivered = n - letters.len();
        let bytes: usize = events.iter().map(|e| e.body.len()).sum();
        let first_reason = refused.first().map(|(_, r)| r.clone()).unwrap_or_default();
        let moved = crate::dead_letter::commit_moving(
            take,
            self.channel.as_ref(),
            &dead_letter,
            letters,
            &name,
        )
        .await;
        if let Err(error) = moved {
            return Err(format!(
                "cannot move {} refused events to dead-letter channel `{}`: {error}",
                refused.len(),
                dead_letter.name()
            ));
        }
        let member = &mut self.members[self.current];
        member.counters.dead_lettered.add(refused.len() as u64);
        member.counters.drain_successes.add(delivered as u64);
        member.counters.drained_bytes.add(bytes as u64);
        member.counters.batches_underflow.inc();
        if let Some(count) = member.refusals.due(refused.len() as u64) {
            warn!(
                sink = %member.name(), dead_letter = %dead_letter.name(), events = count,
                reason = %first_reason,
                "the destination refused events for good; moved them to the dead-letter channel"
            );
        }
        self.failing_since = None;
        self.backoff = MIN_BACKOFF;
        member.ctx.metrics.succeeded();
        Ok(())
    }

    /// Delivers the batches another member failed to the current member, as many per flush
    /// as its pipelining allows, committing each flush's takes; on failure returns the takes
    /// not delivered, oldest first, and the failure.
    async fn hand_over(
        &mut self,
        takes: Vec<Box<dyn TakeTransaction>>,
    ) -> Result<(), (Vec<Box<dyn TakeTransaction>>, SinkError)> {
        let mut takes: VecDeque<_> = takes.into();
        let mut first = true;
        while !takes.is_empty() {
            let bounds = self.member().pipelining;
            let since = Instant::now();
            let mut sent = Vec::new();
            let mut events = 0;
            while sent.len() < bounds.max_batches && events < bounds.max_events {
                let Some(take) = takes.pop_front() else {
                    break;
                };
                let n = take.events().len();
                let member = &mut self.members[self.current];
                member.counters.drain_attempts.add(n as u64);
                let result = member
                    .sink
                    .send(SinkBatch {
                        events: take.events(),
                        sequences: take.sequences(),
                    })
                    .await;
                events += n;
                sent.push(take);
                if let Err(e) = result {
                    self.member_failed(self.current, &e, events);
                    sent.extend(takes);
                    return Err((sent, e));
                }
            }
            if first {
                self.processor.chosen(self.current);
                first = false;
            }
            if let Err(e) = self.member().sink.flush().await {
                self.member_failed(self.current, &e, events);
                sent.extend(takes);
                return Err((sent, e));
            }
            self.member().counters.delivery.observe(since.elapsed());
            self.delivered(self.current, sent).await;
        }
        Ok(())
    }

    /// While the agent stops, with a durable channel: whether deliveries have failed for
    /// [`DRAIN_GRACE`], so that the runner stops and leaves the rest for the next run.
    fn gives_up_draining(&mut self) -> bool {
        if !(self.drain.is_triggered() && self.channel.is_durable()) {
            return false;
        }
        let failing = *self.failing_since.get_or_insert_with(Instant::now);
        if failing.elapsed() < DRAIN_GRACE {
            return false;
        }
        // The events are safe in the channel for the next run; waiting on a dead destination
        // would keep the agent from stopping.
        let name = match &self.group {
            Some(group) => format!("sink group `{group}`"),
            None => format!("sink `{}`", self.members[self.current].name()),
        };
        warn!(
            "{name} keeps failing while the agent stops; its durable channel keeps the rest for the next run"
        );
        true
    }
}

/// After `error`, a permanent failure of the events `range` (start, end): a single event is
/// refused; more are split into halves, pushed so that the first half is sent next.
fn split_or_refuse(
    (start, end): (usize, usize),
    error: SinkError,
    ranges: &mut Vec<(usize, usize)>,
    refused: &mut Vec<(usize, String)>,
) {
    if end - start <= 1 {
        refused.push((start, error.to_string()));
        return;
    }
    let middle = start + (end - start) / 2;
    ranges.push((middle, end));
    ranges.push((start, middle));
}

#[cfg(test)]
mod tests {
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

    /// A memory channel that notes each take's commit and rollback by its first event.
    struct NotedChannel {
        inner: MemoryChannel,
        log: Log,
        max_open_takes: Option<usize>,
    }

    struct NotedTake {
        inner: Box<dyn TakeTransaction>,
        log: Log,
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
            }))
        }
        fn transaction_capacity(&self) -> usize {
            self.inner.transaction_capacity()
        }
        fn max_open_takes(&self) -> Option<usize> {
            self.max_open_takes
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
    async fn filled_channel(
        log: &Log,
        events: usize,
        max_open_takes: Option<usize>,
    ) -> NotedChannel {
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
        assert_eq!(
            first.get("ferry.dead_letter.reason").map(String::as_str),
            Some("refused e7")
        );
        assert_eq!(
            first.get("ferry.dead_letter.sink").map(String::as_str),
            Some("api")
        );
        assert_eq!(
            first.get("ferry.dead_letter.channel").map(String::as_str),
            Some("buffer")
        );
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
            letters.events()[0]
                .headers
                .get("ferry.dead_letter.sink")
                .map(String::as_str),
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

    fn file_channel(
        dir: &std::path::Path,
        crash: bool,
    ) -> (CrashingChannel, Arc<tokio::sync::Notify>) {
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
}
