//! The sink runner: drives one sink, or the sinks of a group, on one channel (see the
//! [module above](super) for how batches are pipelined, failed over and drained).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use ferry_core::state::StateStore;
use ferry_core::{
    Channel, ComponentMetrics, Counter, Event, Latency, Pipelining, Shutdown, Sink, SinkBatch,
    SinkContext, SinkError, TakeTransaction,
};
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::{MAX_BACKOFF, MIN_BACKOFF, back_off, backoff_or_stop};
use crate::sinkgroup::{SinkProcessor, SinkProcessorConfig};
use crate::topology::{SinkGroupSpec, SinkSpec};

/// How long a sink runner waits for events before calling the sink's `idle`.
const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// While the agent stops, how long a sink may keep failing before it gives up on a durable
/// channel (whose events wait for the next run).
const DRAIN_GRACE: Duration = Duration::from_secs(10);

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
    /// Bytes of the events, counted only when the pipelining bounds them.
    bytes: usize,
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
            || self.bytes >= pipelining.max_bytes
            || self
                .since
                .is_some_and(|since| since.elapsed() >= pipelining.max_delay)
    }

    fn push(&mut self, take: Box<dyn TakeTransaction>, short: bool, pipelining: &Pipelining) {
        self.events += take.events().len();
        self.bytes += bytes_of(take.as_ref(), pipelining);
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

/// The bytes of `take`'s events when `pipelining` bounds them (else 0: not worth counting).
fn bytes_of(take: &dyn TakeTransaction, pipelining: &Pipelining) -> usize {
    if pipelining.max_bytes == usize::MAX {
        return 0;
    }
    take.events().iter().map(Event::byte_size).sum()
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
            max_bytes: wanted.max_bytes.max(1),
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
        self.ctx.metrics.delivery_ended();
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
        sync_takes(self.channel.as_ref()).await;
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
        // The last flush's takes become durable within a poll interval, not at the next flush.
        sync_takes(self.channel.as_ref()).await;
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
        let short = n < self.members[self.current]
            .batch_size
            .min(self.channel.transaction_capacity());
        let member = &mut self.members[self.current];
        if self.in_flight.since.is_none() {
            // The delivery's one clock read, shared with /health (a stuck delivery fails it).
            let now = Instant::now();
            self.in_flight.since = Some(now);
            member.ctx.metrics.delivery_started(now.into_std());
        }
        member.counters.drain_attempts.add(n as u64);
        let sent = member
            .sink
            .send(SinkBatch {
                events: take.events(),
                sequences: take.sequences(),
            })
            .await;
        let pipelining = member.pipelining;
        self.in_flight.push(take, short, &pipelining);
        match sent {
            Ok(()) => Flow::Continue,
            Err(e) => {
                member.ctx.metrics.delivery_ended();
                self.failed(e).await
            }
        }
    }

    /// Flushes the current member, then commits the takes in flight, oldest first.
    async fn flush(&mut self) -> Flow {
        sync_takes(self.channel.as_ref()).await;
        let flushed = self.member().sink.flush().await;
        self.member().ctx.metrics.delivery_ended();
        match flushed {
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

    /// `member` made `takes` safe: commits them, oldest first, joined into as few commits as
    /// the channel allows ([`TakeTransaction::absorb`]: one transaction for all of them).
    async fn delivered(&mut self, member: usize, takes: Vec<Box<dyn TakeTransaction>>) {
        self.processor.delivered(member);
        let member = &mut self.members[member];
        // Each commit with the (events, bytes) of the batches it holds.
        type Sizes = Vec<(usize, usize)>;
        let mut commits: Vec<(Box<dyn TakeTransaction>, Sizes)> = Vec::new();
        for mut take in takes {
            let size = (
                take.events().len(),
                take.events().iter().map(|e| e.body.len()).sum(),
            );
            if let Some((joined, sizes)) = commits.last_mut()
                && joined.absorb(take.as_mut())
            {
                sizes.push(size);
                continue;
            }
            commits.push((take, vec![size]));
        }
        let mut committed_all = true;
        for (take, sizes) in commits {
            if let Err(e) = take.commit().await {
                // The events were delivered but stay in the channel: they will be delivered
                // again (at-least-once), never lost.
                error!(sink = %member.name(), error = %e, "cannot commit take");
                committed_all = false;
                continue;
            }
            for (n, bytes) in sizes {
                member.counters.drain_successes.add(n as u64);
                member.counters.drained_bytes.add(bytes as u64);
                if n == member.batch_size {
                    member.counters.batches_complete.inc();
                } else {
                    member.counters.batches_underflow.inc();
                }
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
                    let pipelining = self.member().pipelining;
                    for take in rest {
                        self.in_flight.push(take, false, &pipelining);
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
            member
                .ctx
                .metrics
                .delivery_started(Instant::now().into_std());
            let result = match member.sink.send(batch).await {
                Ok(()) => {
                    sync_takes(self.channel.as_ref()).await;
                    member.sink.flush().await
                }
                Err(error) => Err(error),
            };
            member.ctx.metrics.delivery_ended();
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
            self.member().ctx.metrics.delivery_started(since.into_std());
            let mut sent = Vec::new();
            let (mut events, mut bytes) = (0, 0);
            while sent.len() < bounds.max_batches
                && events < bounds.max_events
                && bytes < bounds.max_bytes
            {
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
                bytes += bytes_of(take.as_ref(), &bounds);
                sent.push(take);
                if let Err(e) = result {
                    self.member().ctx.metrics.delivery_ended();
                    self.member_failed(self.current, &e, events);
                    sent.extend(takes);
                    return Err((sent, e));
                }
            }
            if first {
                self.processor.chosen(self.current);
                first = false;
            }
            sync_takes(self.channel.as_ref()).await;
            let flushed = self.member().sink.flush().await;
            self.member().ctx.metrics.delivery_ended();
            if let Err(e) = flushed {
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

/// Makes the takes committed so far survive power loss before a sink's flush
/// ([`Channel::sync_takes`]): an exactly-once sink records only the sequence numbers of its
/// last flush, so a take committed before it and lost would be delivered again. A failure is
/// logged and the flush goes on: as with a take that fails to commit, the worst outcome is
/// that events are delivered again.
async fn sync_takes(channel: &dyn Channel) {
    if let Err(e) = channel.sync_takes().await {
        error!(channel = %channel.name(), error = %e, "cannot sync the committed takes; after a power loss their events may be delivered again");
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
mod tests;
