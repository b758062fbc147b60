//! The running pipeline: its channels, source tasks and sink runners, started from a topology,
//! stopped in order, and changed in place by a reload.
//!
//! **Reload.** A new version of the pipeline file is validated in full first; a file with any
//! problem is refused (every problem logged) and the running pipeline is not touched. A valid
//! one is applied as a diff, component by component, comparing what each entry of the file
//! says ([`Topology::fingerprints`]):
//!
//! - A component whose entry, and the entries of the channels it uses, are unchanged keeps
//!   running, without a pause: the same task, the same counters.
//! - A changed or removed source is stopped (its last batch is committed with its checkpoint);
//!   a changed one then starts again from that checkpoint.
//! - A changed or removed sink (or sink group) finishes the batches it has in flight and stops;
//!   a changed one starts again on the same channel, so through a durable channel nothing is
//!   lost or repeated. A sink whose memory channel goes away first drains it.
//! - A changed channel is rebuilt after its sources stopped and its sinks stopped (a memory
//!   channel is drained first; a file channel keeps its events on disk for the new one).
//! - Changes to `agent:` or `broker:` are not applied to a running agent: the log says that
//!   they need a restart.
//!
//! Each reload logs one line saying what was added, changed, removed and kept.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ferry_core::state::StateStore;
use ferry_core::{Channel, CheckpointStore, ComponentMetrics, MeteredChannel, Shutdown};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::http::PipelineMetrics;
use crate::runner::{run_sink, run_sink_group, run_source};
use crate::topology::{SinkGroupSpec, SinkSpec, SourceSpec, Topology};

/// Loads the pipeline file again, for a reload; the problems of a refused version as text,
/// one per line.
pub type Loader = Arc<dyn Fn() -> Result<Topology, String> + Send + Sync>;

/// What reloads a running pipeline: how to load the file again, and the requests to do it
/// (a change of the file, a SIGHUP), each with why.
pub struct Reloads {
    /// Loads the new version.
    pub loader: Loader,
    /// One message per request.
    pub requests: mpsc::UnboundedReceiver<String>,
}

/// A source task.
struct RunningSource {
    /// Tells the source to stop (a child of the agent's stop).
    stop: Shutdown,
    task: JoinHandle<()>,
    metrics: ComponentMetrics,
    /// Which start of a source of this name it is, to tell its end from a successor's.
    generation: u64,
}

/// A sink runner: one sink alone, or a sink group.
struct RunningUnit {
    /// Drain the channel, then stop (the agent stops, or the channel goes away).
    drain: Shutdown,
    /// Finish the batches in flight, then stop (a reload changed or removed it).
    retire: Shutdown,
    task: JoinHandle<()>,
    channel: String,
    /// The counters of each sink, by name.
    metrics: BTreeMap<String, ComponentMetrics>,
}

/// The pipeline as it runs.
pub struct Pipeline {
    state: StateStore,
    store: Arc<dyn CheckpointStore>,
    stop: Shutdown,
    full_channel_warning: Duration,
    drain_timeout: Duration,
    fingerprints: BTreeMap<String, String>,
    channels: BTreeMap<String, Arc<MeteredChannel>>,
    sources: BTreeMap<String, RunningSource>,
    /// By unit name: `sink <name>` or `group <name>`.
    units: BTreeMap<String, RunningUnit>,
    /// Sources report here when their task ends: name and generation.
    ended_tx: mpsc::UnboundedSender<(String, u64)>,
    ended_rx: mpsc::UnboundedReceiver<(String, u64)>,
    generation: u64,
    /// What the HTTP endpoints show, updated by reloads.
    metrics: Option<PipelineMetrics>,
}

/// How a channel of a new version compares with the running one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Kept,
    Changed,
    Added,
}

impl Pipeline {
    /// Starts the channels, sources and sinks of `topology`.
    pub async fn start(
        topology: Topology,
        stop: Shutdown,
        metrics: Option<PipelineMetrics>,
    ) -> anyhow::Result<Self> {
        let data_dir = topology.agent.data_dir.clone();
        let state = tokio::task::spawn_blocking(move || StateStore::open(&data_dir))
            .await?
            .context("opening the agent's state store")?;
        let (ended_tx, ended_rx) = mpsc::unbounded_channel();
        let mut pipeline = Self {
            store: Arc::new(state.clone()),
            state,
            stop,
            full_channel_warning: topology.agent.full_channel_warning,
            drain_timeout: topology.agent.drain_timeout,
            fingerprints: topology.fingerprints.clone(),
            channels: BTreeMap::new(),
            sources: BTreeMap::new(),
            units: BTreeMap::new(),
            ended_tx,
            ended_rx,
            generation: 0,
            metrics,
        };
        let Topology {
            channels,
            sources,
            sinks,
            sink_groups,
            ..
        } = topology;
        for (name, channel) in channels {
            pipeline.start_channel(&name, channel).await?;
        }
        for spec in sources {
            pipeline.start_source(spec);
        }
        for spec in sinks {
            pipeline.start_sink(spec);
        }
        for group in sink_groups {
            pipeline.start_group(group);
        }
        info!(
            sources = pipeline.sources.len(),
            sinks = pipeline.units.len(),
            channels = pipeline.channels.len(),
            "pipeline started"
        );
        Ok(pipeline)
    }

    async fn start_channel(
        &mut self,
        name: &str,
        channel: Arc<MeteredChannel>,
    ) -> anyhow::Result<()> {
        channel
            .start()
            .await
            .with_context(|| format!("starting channel `{name}`"))?;
        channel.metrics().started();
        info!(channel = %name, events = channel.len(), "channel started");
        self.channels.insert(name.to_owned(), channel);
        Ok(())
    }

    fn start_source(&mut self, spec: SourceSpec) {
        self.generation += 1;
        let generation = self.generation;
        let name = spec.name.clone();
        let stop = self.stop.child();
        let ended = self.ended_tx.clone();
        let metrics = spec.metrics.clone();
        let task = tokio::spawn({
            let (stop, store, warning) = (
                stop.clone(),
                Arc::clone(&self.store),
                self.full_channel_warning,
            );
            let name = name.clone();
            async move {
                run_source(spec, stop, store, warning).await;
                let _ = ended.send((name, generation));
            }
        });
        self.sources.insert(
            name,
            RunningSource {
                stop,
                task,
                metrics,
                generation,
            },
        );
    }

    fn start_sink(&mut self, spec: SinkSpec) {
        let (drain, retire) = (Shutdown::new(), Shutdown::new());
        let channel = spec.channel.name().to_owned();
        let metrics = [(spec.name.clone(), spec.metrics.clone())].into();
        let unit = format!("sink {}", spec.name);
        let task = tokio::spawn(run_sink(
            spec,
            drain.clone(),
            retire.clone(),
            self.state.clone(),
        ));
        self.units.insert(
            unit,
            RunningUnit {
                drain,
                retire,
                task,
                channel,
                metrics,
            },
        );
    }

    fn start_group(&mut self, group: SinkGroupSpec) {
        let (drain, retire) = (Shutdown::new(), Shutdown::new());
        let channel = group
            .members
            .first()
            .map(|m| m.channel.name().to_owned())
            .unwrap_or_default();
        let metrics = group
            .members
            .iter()
            .map(|m| (m.name.clone(), m.metrics.clone()))
            .collect();
        let unit = format!("group {}", group.name);
        let task = tokio::spawn(run_sink_group(
            group,
            drain.clone(),
            retire.clone(),
            self.state.clone(),
        ));
        self.units.insert(
            unit,
            RunningUnit {
                drain,
                retire,
                task,
                channel,
                metrics,
            },
        );
    }

    /// Runs until the agent stops, or every source ended on its own; applies reloads
    /// meanwhile. Then stops the sources, drains the channels and stops the sinks.
    pub async fn run(mut self, mut reloads: Option<Reloads>) -> anyhow::Result<()> {
        loop {
            tokio::select! {
                _ = self.stop.wait() => break,
                Some((name, generation)) = self.ended_rx.recv() => {
                    // A source that ended on its own (its input is done); once none is left,
                    // the pipeline drains and stops. Sources a reload stopped are not here.
                    if self.sources.get(&name).is_some_and(|s| s.generation == generation) {
                        self.sources.remove(&name);
                        if self.sources.is_empty() {
                            break;
                        }
                    }
                }
                Some(why) = next_request(&mut reloads) => {
                    if let Some(reloads) = &reloads {
                        let loader = Arc::clone(&reloads.loader);
                        self.reload(&why, loader).await;
                    }
                }
            }
        }
        for source in self.sources.values() {
            source.stop.trigger();
        }
        for (name, source) in std::mem::take(&mut self.sources) {
            if let Err(e) = source.task.await {
                error!(source = %name, error = %e, "a source task panicked");
            }
        }
        info!("sources stopped; draining channels");
        for unit in self.units.values() {
            unit.drain.trigger();
        }
        let units = std::mem::take(&mut self.units);
        let retire: Vec<Shutdown> = units.values().map(|u| u.retire.clone()).collect();
        let drained = async {
            for (name, unit) in units {
                if let Err(e) = unit.task.await {
                    error!(unit = %name, error = %e, "a sink task panicked");
                }
            }
        };
        tokio::pin!(drained);
        if tokio::time::timeout(self.drain_timeout, &mut drained)
            .await
            .is_err()
        {
            warn!(drain_timeout = ?self.drain_timeout, "the channels did not drain in time; the sinks finish what they have in flight and stop");
            for retire in &retire {
                retire.trigger();
            }
            drained.await;
        }
        let mut lost = Vec::new();
        for (name, channel) in &self.channels {
            channel.metrics().stopped();
            let events = channel.len();
            if events > 0 && !channel.is_durable() {
                error!(channel = %name, events, "memory channel stopped with events no sink delivered: they are lost");
                lost.push(format!("{events} in channel `{name}`"));
            } else {
                info!(channel = %name, events, "channel stopped");
            }
        }
        info!("pipeline stopped");
        if lost.is_empty() {
            Ok(())
        } else {
            anyhow::bail!(
                "stopped with events undelivered in memory channels: {}",
                lost.join(", ")
            )
        }
    }

    /// Loads the file again and applies it, or refuses it and keeps running as it is.
    async fn reload(&mut self, why: &str, loader: Loader) {
        let loaded = tokio::task::spawn_blocking(move || loader()).await;
        let new = match loaded {
            Ok(Ok(topology)) => topology,
            Ok(Err(problems)) => {
                for line in problems.lines() {
                    error!("{line}");
                }
                warn!(reason = %why, "the changed pipeline file has problems; it is not applied and the pipeline runs on unchanged");
                return;
            }
            Err(e) => {
                error!(error = %e, "loading the pipeline file failed");
                return;
            }
        };
        if let Err(e) = self.apply(new).await {
            error!(
                error = format!("{e:#}"),
                "the reload failed part-way; what could not start is not running"
            );
        }
    }

    /// Applies a validated new version as a diff (see the module's documentation).
    async fn apply(&mut self, mut new: Topology) -> anyhow::Result<()> {
        if new.fingerprints == self.fingerprints {
            info!("the pipeline file says what it said before; nothing to change");
            return Ok(());
        }
        let old = std::mem::take(&mut self.fingerprints);
        let fingerprint = |fps: &BTreeMap<String, String>, key: &str| fps.get(key).cloned();
        for section in ["agent", "broker"] {
            if fingerprint(&old, section) != fingerprint(&new.fingerprints, section) {
                warn!(
                    "the `{section}` section changed; that needs a restart of the agent and is not applied"
                );
            }
        }
        // Channels.
        let mut change: BTreeMap<String, Change> = BTreeMap::new();
        for name in new.channels.keys() {
            let key = format!("channels.{name}");
            let state = if !self.channels.contains_key(name) {
                Change::Added
            } else if fingerprint(&old, &key) == fingerprint(&new.fingerprints, &key) {
                Change::Kept
            } else {
                Change::Changed
            };
            change.insert(name.clone(), state);
        }
        let removed_channels: Vec<String> = self
            .channels
            .keys()
            .filter(|name| !new.channels.contains_key(*name))
            .cloned()
            .collect();
        let kept_channel = |name: &str| change.get(name) == Some(&Change::Kept);

        // Sources: kept when their entry and every channel they use are.
        let mut kept_sources = BTreeSet::new();
        for spec in &new.sources {
            let key = format!("sources.{}", spec.name);
            if self.sources.contains_key(&spec.name)
                && fingerprint(&old, &key) == fingerprint(&new.fingerprints, &key)
                && spec.channels.iter().all(|c| kept_channel(c.name()))
            {
                kept_sources.insert(spec.name.clone());
            }
        }
        // Sink runners: a sink alone, or a group with its members.
        let unit_fingerprint = |fps: &BTreeMap<String, String>, unit: &str| -> Option<String> {
            let (kind, name) = unit.split_once(' ')?;
            let section = if kind == "sink" {
                "sinks"
            } else {
                "sinkgroups"
            };
            fingerprint(fps, &format!("{section}.{name}"))
        };
        let mut new_units: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
        for spec in &new.sinks {
            new_units.insert(
                format!("sink {}", spec.name),
                (spec.channel.name().to_owned(), vec![spec.name.clone()]),
            );
        }
        for group in &new.sink_groups {
            let channel = group
                .members
                .first()
                .map(|m| m.channel.name().to_owned())
                .unwrap_or_default();
            let members = group.members.iter().map(|m| m.name.clone()).collect();
            new_units.insert(format!("group {}", group.name), (channel, members));
        }
        let mut kept_units = BTreeSet::new();
        for (unit, (channel, members)) in &new_units {
            let Some(running) = self.units.get(unit) else {
                continue;
            };
            let same_members = members.iter().all(|m| {
                let key = format!("sinks.{m}");
                running.metrics.contains_key(m)
                    && fingerprint(&old, &key) == fingerprint(&new.fingerprints, &key)
            }) && running.metrics.len() == members.len();
            // A sink keeps the dead-letter channel it was started with: it must be kept too.
            let dead_letters_kept = new
                .all_sinks()
                .filter(|spec| members.contains(&spec.name))
                .filter_map(|spec| spec.dead_letter.as_ref())
                .all(|c| kept_channel(c.name()));
            if same_members
                && unit_fingerprint(&old, unit) == unit_fingerprint(&new.fingerprints, unit)
                && running.channel == *channel
                && kept_channel(channel)
                && dead_letters_kept
            {
                kept_units.insert(unit.clone());
            }
        }

        // Stop what goes: sources first, so that nothing new enters a channel that changes.
        let stopping: Vec<String> = self
            .sources
            .keys()
            .filter(|name| !kept_sources.contains(*name))
            .cloned()
            .collect();
        for name in &stopping {
            if let Some(source) = self.sources.get(name) {
                source.stop.trigger();
            }
        }
        for name in &stopping {
            if let Some(source) = self.sources.remove(name) {
                let _ = source.task.await;
            }
        }
        let retiring: Vec<String> = self
            .units
            .keys()
            .filter(|unit| !kept_units.contains(*unit))
            .cloned()
            .collect();
        for unit in &retiring {
            let Some(running) = self.units.get(unit) else {
                continue;
            };
            let channel_goes = !kept_channel(&running.channel);
            let volatile = self
                .channels
                .get(&running.channel)
                .is_some_and(|c| !c.is_durable());
            if channel_goes && volatile {
                // Its events would go with the channel: deliver them first.
                running.drain.trigger();
            } else {
                running.retire.trigger();
            }
        }
        for unit in &retiring {
            if let Some(running) = self.units.remove(unit) {
                let _ = running.task.await;
            }
        }

        // Wire the new version to what keeps running: the kept channels' objects and the kept
        // components' counters.
        for (name, state) in &change {
            if *state == Change::Kept
                && let Some(running) = self.channels.get(name)
            {
                new.channels.insert(name.clone(), Arc::clone(running));
            }
        }
        let resolve = |channels: &BTreeMap<String, Arc<MeteredChannel>>, c: &Arc<dyn Channel>| {
            channels
                .get(c.name())
                .map(|m| Arc::clone(m) as Arc<dyn Channel>)
                .unwrap_or_else(|| Arc::clone(c))
        };
        for spec in &mut new.sources {
            spec.channels = spec
                .channels
                .iter()
                .map(|c| resolve(&new.channels, c))
                .collect();
            if let Some(running) = self.sources.get(&spec.name) {
                spec.metrics = running.metrics.clone();
            }
        }
        let unit_metrics: BTreeMap<String, ComponentMetrics> = self
            .units
            .values()
            .flat_map(|u| u.metrics.iter().map(|(n, m)| (n.clone(), m.clone())))
            .collect();
        for spec in new.sinks.iter_mut().chain(
            new.sink_groups
                .iter_mut()
                .flat_map(|g| g.members.iter_mut()),
        ) {
            spec.channel = resolve(&new.channels, &spec.channel);
            spec.dead_letter = spec.dead_letter.as_ref().map(|c| resolve(&new.channels, c));
            if let Some(metrics) = unit_metrics.get(&spec.name) {
                spec.metrics = metrics.clone();
            }
        }
        if let Some(metrics) = &self.metrics {
            metrics.replace(&PipelineMetrics::new(&new));
        }

        // Channels that go or change are closed (their sources and sinks have stopped), then
        // the new ones start.
        for name in removed_channels.iter().chain(
            change
                .iter()
                .filter(|(_, s)| **s == Change::Changed)
                .map(|(n, _)| n),
        ) {
            if let Some(channel) = self.channels.remove(name) {
                channel.metrics().stopped();
                info!(channel = %name, events = channel.len(), "channel stopped");
            }
        }
        let Topology {
            channels,
            sources,
            sinks,
            sink_groups,
            fingerprints,
            ..
        } = new;
        self.fingerprints = fingerprints;
        for (name, channel) in channels {
            if change.get(&name) != Some(&Change::Kept) {
                self.start_channel(&name, channel).await?;
            }
        }
        let mut started = Vec::new();
        for spec in sources {
            if !kept_sources.contains(&spec.name) {
                started.push(format!("source {}", spec.name));
                self.start_source(spec);
            }
        }
        for spec in sinks {
            let unit = format!("sink {}", spec.name);
            if !kept_units.contains(&unit) {
                started.push(unit);
                self.start_sink(spec);
            }
        }
        for group in sink_groups {
            let unit = format!("group {}", group.name);
            if !kept_units.contains(&unit) {
                started.push(unit);
                self.start_group(group);
            }
        }
        for (name, state) in &change {
            if *state != Change::Kept {
                started.push(format!("channel {name}"));
            }
        }
        let gone: Vec<String> = stopping
            .iter()
            .map(|s| format!("source {s}"))
            .chain(retiring.iter().cloned())
            .chain(removed_channels.iter().map(|c| format!("channel {c}")))
            .filter(|c| !started.contains(c))
            .collect();
        let restarted: Vec<&String> = started
            .iter()
            .filter(|c| {
                stopping.iter().any(|s| **c == format!("source {s}"))
                    || retiring.contains(c)
                    || change
                        .iter()
                        .any(|(n, s)| *s == Change::Changed && **c == format!("channel {n}"))
            })
            .collect();
        let added: Vec<&String> = started.iter().filter(|c| !restarted.contains(c)).collect();
        info!(
            added = ?added,
            changed = ?restarted,
            removed = ?gone,
            kept = kept_sources.len() + kept_units.len() + change.values().filter(|s| **s == Change::Kept).count(),
            "pipeline reloaded"
        );
        Ok(())
    }
}

/// The next reload request, or never when there are none.
async fn next_request(reloads: &mut Option<Reloads>) -> Option<String> {
    match reloads {
        Some(reloads) => reloads.requests.recv().await,
        None => std::future::pending().await,
    }
}
