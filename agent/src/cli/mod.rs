//! The `agent` command line: the pipeline commands (`run`, `validate`, `convert`), the broker
//! alone (`broker`), the commands that read a data directory (`state`, `dead-letters`) and
//! the Kafka tools of the `ferry-tools` crate.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use ferry_core::{Registry, Shutdown};
use ferry_tools as tools;

use crate::{EXIT_BAD_CONFIG, flume, http, pipeline, reload, run, topology};

// `agent dead-letters` and `agent state`: they read a pipeline's data directory.
pub mod dead_letters;
pub mod state;

#[derive(Parser)]
#[command(
    name = "agent",
    version,
    about = "Moves events from where they are produced to where they are stored"
)]
struct Cli {
    /// Log format on standard error.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the pipelines of a YAML file, or an agent of a Flume file, until SIGINT/SIGTERM (a
    /// second signal exits at once).
    Run {
        #[command(flatten)]
        file: PipelineArgs,
        /// Do not reload the file when it changes or on SIGHUP.
        #[arg(long)]
        no_watch: bool,
    },
    /// Checks pipeline files (YAML or Flume) and reports every problem; exits 2 if there is
    /// any.
    Validate {
        /// The pipeline files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The agent to take from Flume files (as flume-ng's `--name`); names the files as
        /// Flume files whatever their extension.
        #[arg(short = 'n', long)]
        name: Option<String>,
        /// Also check the state of each file's data directories (as `agent state` does):
        /// SQLite's integrity check and the file channels' segment files; exits 1 if any is
        /// damaged.
        #[arg(long)]
        state: bool,
    },
    /// Prints the pipeline YAML of an agent of a Flume file, checked as `validate` checks it;
    /// exits 2, printing the problems, if the file cannot run.
    Convert {
        #[command(flatten)]
        file: PipelineArgs,
    },
    /// Prints what a data directory holds, read without changing it: channel depths, source
    /// checkpoints, sink progress and the integrity of the state; exits 1 if it is damaged.
    State(state::StateArgs),
    /// Runs the bundled Kafka-compatible broker alone, until SIGINT/SIGTERM.
    Broker {
        /// A YAML file of broker settings: the keys of a pipeline's `broker:` section at the
        /// top, or a pipeline file (its `broker:` section is taken, the rest left alone).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The address of the plaintext listener; overrides the file's `listen`.
        #[arg(long, value_name = "HOST:PORT")]
        listen: Option<std::net::SocketAddr>,
        /// The directory of the partition logs and metadata; overrides the file's
        /// `data_dir`.
        #[arg(long = "data-dir", value_name = "DIR")]
        data_dir: Option<PathBuf>,
    },
    /// Creates, lists, describes, alters and deletes topics (as kafka-topics.sh).
    Topics(tools::topics::TopicsArgs),
    /// Lists, describes (with lag), resets and deletes consumer groups (as
    /// kafka-consumer-groups.sh).
    Groups(tools::groups::GroupsArgs),
    /// Lists transactions and describes one (as kafka-transactions.sh `list` and `describe`).
    Transactions(tools::transactions::TransactionsArgs),
    /// Prints the offsets of topic partitions at a time: latest, earliest or a timestamp (as
    /// kafka-get-offsets.sh).
    GetOffsets(tools::get_offsets::GetOffsetsArgs),
    /// Deletes the records of topic partitions before offsets given in a JSON file, moving
    /// their log start offset (as kafka-delete-records.sh).
    DeleteRecords(tools::delete_records::DeleteRecordsArgs),
    /// Describes and alters topic configs and describes broker settings (as kafka-configs.sh).
    Configs(tools::configs::ConfigsArgs),
    /// Adds, removes and lists ACLs (as kafka-acls.sh).
    Acls(tools::acls::AclsArgs),
    /// Adds, deletes and lists SCRAM users (as kafka-configs.sh --entity-type users).
    Users(tools::users::UsersArgs),
    /// Shows a running agent's rates, channel fill, broker topics and group lag in the
    /// terminal, from its HTTP API (`agent.http`); q quits.
    Top(tools::top::TopArgs),
    /// Writes standard input to a topic, a record per line (as kafka-console-producer.sh).
    ConsoleProducer(tools::console::ProducerArgs),
    /// Prints records of a topic, a value per line (as kafka-console-consumer.sh).
    ConsoleConsumer(tools::console::ConsumerArgs),
    /// Writes records at a given rate and prints the throughput and latencies (as
    /// kafka-producer-perf-test.sh).
    ProducerPerfTest(tools::perf::ProducerPerfArgs),
    /// Reads records and prints the throughput (as kafka-consumer-perf-test.sh).
    ConsumerPerfTest(tools::perf::ConsumerPerfArgs),
    /// Lists the events of a sink's `dead_letter` file channel, or replays a range of them
    /// into another channel. The agent must be stopped.
    DeadLetters(dead_letters::DeadLettersArgs),
    /// Prints the batches (with producer ids, sequences and transaction markers) and records of
    /// broker segment files, and `.index`/`.timeindex`/`.txnindex` entries (as
    /// kafka-dump-log.sh / DumpLogSegments).
    DumpLogSegments(tools::dump::DumpLogSegmentsArgs),
    /// Lists the damaged ranges of a stopped broker's data directory (every CRC checked) and,
    /// with --execute, removes them; the other batches keep their offsets.
    LogRepair(tools::log_repair::LogRepairArgs),
}

/// The pipeline file of `run` and `convert`: YAML, or a Flume file (by `--name`, the
/// extension `.properties` or `.conf`, or its content) and the agent to take from it.
#[derive(clap::Args)]
struct PipelineArgs {
    /// The pipeline file.
    #[arg(required_unless_present = "conf_file", conflicts_with = "conf_file")]
    file: Option<PathBuf>,
    /// The pipeline file, in flume-ng's spelling.
    #[arg(short = 'f', long = "conf-file", value_name = "FILE")]
    conf_file: Option<PathBuf>,
    /// The agent to take from a Flume file (as flume-ng's `--name`); needed when the file
    /// holds several.
    #[arg(short = 'n', long)]
    name: Option<String>,
}

impl PipelineArgs {
    fn path(&self) -> &Path {
        match (&self.file, &self.conf_file) {
            (Some(file), _) | (None, Some(file)) => file,
            // clap requires one of them.
            (None, None) => Path::new(""),
        }
    }
}

/// A pipeline file to load: YAML, or a Flume file and its agent.
enum PipelineFile<'a> {
    Yaml(&'a Path),
    Flume { path: &'a Path, agent: String },
}

impl<'a> PipelineFile<'a> {
    /// Decides what `path` is: a Flume file when `name` is given or it looks like one.
    fn of(path: &'a Path, name: Option<&str>) -> Result<Self, String> {
        let looks_flume = name.is_some()
            || std::fs::read_to_string(path).is_ok_and(|text| flume::is_flume_file(path, &text));
        if !looks_flume {
            return Ok(Self::Yaml(path));
        }
        let text = flume::read(path).map_err(|p| p.to_string())?;
        let agent = flume::agent_name(path, &text, name).map_err(|p| p.to_string())?;
        Ok(Self::Flume { path, agent })
    }

    /// The topology and, for a Flume file, the notes about it (each `file:line: ...`).
    fn load(&self, registry: &Registry) -> Result<(topology::Topology, Vec<String>), String> {
        match self {
            Self::Yaml(path) => topology::load(path, registry)
                .map(|t| {
                    let notes = t
                        .notes
                        .iter()
                        .map(|n| format!("{}:{n}", path.display()))
                        .collect();
                    (t, notes)
                })
                .map_err(|p| p.to_string()),
            Self::Flume { path, agent } => flume::load(path, agent, registry)
                .map(|(t, notes)| {
                    let notes = notes.iter().map(|n| n.display(path).to_string()).collect();
                    (t, notes)
                })
                .map_err(|p| p.to_string()),
        }
    }
}

/// Parses the command line and runs the agent with the component types of `registry`.
pub fn main_with(registry: Registry) -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::Validate { files, name, state } => {
            let code = validate(&files, name.as_deref(), &registry);
            if state && code == ExitCode::SUCCESS {
                // Every file is checked, also after a damaged one.
                let damaged = files
                    .iter()
                    .filter(|file| !state::check_pipeline(file, name.as_deref(), &registry))
                    .count();
                if damaged > 0 {
                    return ExitCode::FAILURE;
                }
            }
            code
        }
        Command::State(args) => state::run(&args, &registry),
        Command::Run { file, no_watch } => run_pipeline(&file, registry, !no_watch),
        Command::Convert { file } => convert(&file, &registry),
        Command::Broker {
            config,
            listen,
            data_dir,
        } => broker(config.as_deref(), listen, data_dir),
        Command::Topics(args) => tools::topics::main(args),
        Command::Groups(args) => tool(tools::groups::run(args)),
        Command::Transactions(args) => tool(tools::transactions::run(args)),
        Command::Acls(args) => tool(tools::acls::run(args)),
        Command::Configs(args) => tool(tools::configs::run(args)),
        Command::GetOffsets(args) => tool(tools::get_offsets::run(args)),
        Command::DeleteRecords(args) => tool(tools::delete_records::run(args)),
        Command::Users(args) => tool(tools::users::run(args)),
        Command::Top(args) => tool(tools::top::run(args)),
        Command::ConsoleProducer(args) => tool(tools::console::produce(args)),
        Command::ConsoleConsumer(args) => tool(tools::console::consume(args)),
        Command::ProducerPerfTest(args) => tool(tools::perf::produce(args)),
        Command::ConsumerPerfTest(args) => tool(tools::perf::consume(args)),
        Command::DeadLetters(args) => tool(dead_letters::run(args, &registry)),
        Command::DumpLogSegments(args) => tool(tools::dump::run(&args)),
        Command::LogRepair(args) => tool(tools::log_repair::run(args)),
    }
}

/// Exit status of a tool: 0 (also when standard output was closed by its reader), or 1 with
/// the error on standard error.
fn tool(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `agent ... | head`: the reader closed the pipe, having read what it wanted.
        Err(e) if tools::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to standard error: `RUST_LOG` filters (default `info`), text or JSON lines, colours
/// only when standard error is a terminal.
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn validate(files: &[PathBuf], name: Option<&str>, registry: &Registry) -> ExitCode {
    let mut ok = true;
    for file in files {
        if name.is_none() && is_broker_settings_file(file) {
            match load_broker_config(file) {
                Ok(_) => println!("{}: ok (broker settings)", file.display()),
                Err(problems) => {
                    eprintln!("{problems}");
                    ok = false;
                }
            }
            continue;
        }
        match PipelineFile::of(file, name).and_then(|p| p.load(registry)) {
            Ok((_, notes)) => {
                for note in notes {
                    eprintln!("warning: {note}");
                }
                println!("{}: ok", file.display());
            }
            Err(problems) => {
                eprintln!("{problems}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_BAD_CONFIG)
    }
}

fn run_pipeline(file: &PipelineArgs, registry: Registry, watch: bool) -> ExitCode {
    let loaded =
        PipelineFile::of(file.path(), file.name.as_deref()).and_then(|p| p.load(&registry));
    let topology = match loaded {
        Ok((topology, notes)) => {
            for note in notes {
                tracing::warn!("{note}");
            }
            topology
        }
        Err(problems) => {
            eprintln!("{problems}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    let registry = std::sync::Arc::new(registry);
    let path = file.path().to_owned();
    let name = file.name.clone();
    until_stopped(|stop| async move {
        let reloads = if watch {
            let watched = path.clone();
            let loader: pipeline::Loader = std::sync::Arc::new(move || {
                let (topology, notes) =
                    PipelineFile::of(&watched, name.as_deref()).and_then(|p| p.load(&registry))?;
                for note in notes {
                    tracing::warn!("{note}");
                }
                Ok(topology)
            });
            Some(reload::watch(&path, loader)?)
        } else {
            None
        };
        run::run_reloading(topology, stop, reloads).await
    })
}

/// Prints the YAML of a Flume file's agent once it validates; the notes go to standard
/// error. A file whose values name environment variables that are not set here is converted
/// without that check (it is made by `validate` and `run` where they are set).
fn convert(file: &PipelineArgs, registry: &Registry) -> ExitCode {
    let path = file.path();
    let mut unset = Vec::new();
    let converted = flume::read(path).and_then(|text| {
        let agent = flume::agent_name(path, &text, file.name.as_deref())?;
        let conversion = flume::convert(path, &text, &agent)?;
        unset = flume::unset_variables(&conversion.yaml);
        if unset.is_empty() {
            flume::load(path, &agent, registry)?;
        }
        Ok(conversion)
    });
    match converted {
        Ok(conversion) => {
            for note in &conversion.notes {
                eprintln!("warning: {}", note.display(path));
            }
            if !unset.is_empty() {
                eprintln!(
                    "warning: {}: not validated, since these environment variables are not set: {}; `agent validate` checks the YAML where they are",
                    path.display(),
                    unset.join(", ")
                );
            }
            print!("{}", conversion.yaml);
            ExitCode::SUCCESS
        }
        Err(problems) => {
            eprintln!("{problems}");
            ExitCode::from(EXIT_BAD_CONFIG)
        }
    }
}

fn broker(
    file: Option<&Path>,
    listen: Option<std::net::SocketAddr>,
    data_dir: Option<PathBuf>,
) -> ExitCode {
    let mut config = match file {
        None => ferry_broker::BrokerConfig::default(),
        Some(file) => match load_broker_config(file) {
            Ok(config) => config,
            Err(problems) => {
                eprintln!("{problems}");
                return ExitCode::from(EXIT_BAD_CONFIG);
            }
        },
    };
    if let Some(listen) = listen {
        if !config.listeners.is_empty() {
            eprintln!(
                "error: --listen cannot be given with a file that has `listeners`: \
                 change the listeners in the file"
            );
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
        config.listen = listen;
    }
    if let Some(data_dir) = data_dir {
        config.data_dir = data_dir;
    }
    until_stopped(|stop| async move {
        let http_address = config.http;
        let broker = ferry_broker::Broker::start(config).await?;
        tracing::info!(listeners = %run::listeners(&broker), "broker started");
        let http_stop = Shutdown::new();
        let http = match http_address {
            Some(address) => {
                let mut server = http::HttpServer::new(http::PipelineMetrics::empty());
                server.with_broker(broker.observer());
                Some(server.start(address, http_stop.clone()).await?)
            }
            None => None,
        };
        stop.wait().await;
        if let Some(http) = http {
            http_stop.trigger();
            http.stopped().await;
        }
        broker.shutdown().await;
        tracing::info!("broker stopped");
        Ok(())
    })
}

/// Runs `work` on a new runtime with a stop signal fired by the first SIGINT/SIGTERM.
fn until_stopped<F, Fut>(work: F) -> ExitCode
where
    F: FnOnce(Shutdown) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let stop = Shutdown::new();
        if let Err(e) = watch_signals(stop.clone()) {
            eprintln!("cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
        match work(stop).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = format!("{e:#}"), "agent failed");
                ExitCode::FAILURE
            }
        }
    })
}

fn load_broker_config(file: &Path) -> Result<ferry_broker::BrokerConfig, topology::Problems> {
    let problems = |error: ferry_core::ConfigError| topology::Problems {
        file: file.to_owned(),
        errors: error.into_all(),
    };
    let text = std::fs::read_to_string(file).map_err(|e| {
        problems(ferry_core::ConfigError::new(
            None,
            format!("cannot read: {e}"),
        ))
    })?;
    let node = marked_yaml::parse_yaml(0, &text).map_err(|e| {
        problems(ferry_core::ConfigError::new(
            None,
            format!("invalid YAML: {e}"),
        ))
    })?;
    let mut errors = Vec::new();
    let node = topology::substitute_env(&node, &mut errors);
    if !errors.is_empty() {
        return Err(topology::Problems {
            file: file.to_owned(),
            errors,
        });
    }
    // A pipeline file: its `broker:` section.
    let section = node
        .as_mapping()
        .and_then(|m| m.get_node("broker"))
        .unwrap_or(&node);
    topology::parse_broker_section(section).map_err(problems)
}

/// The top-level keys of a pipeline file.
const PIPELINE_SECTIONS: [&str; 6] = [
    "agent",
    "broker",
    "sources",
    "channels",
    "sinks",
    "sinkgroups",
];

/// Whether `file` is a YAML file of broker settings alone (as `agent broker --config` takes):
/// a mapping none of whose keys is a pipeline section.
fn is_broker_settings_file(file: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(file) else {
        return false;
    };
    if flume::is_flume_file(file, &text) {
        return false;
    }
    let Ok(node) = marked_yaml::parse_yaml(0, &text) else {
        return false;
    };
    node.as_mapping().is_some_and(|m| {
        !m.is_empty() && m.keys().all(|k| !PIPELINE_SECTIONS.contains(&k.as_str()))
    })
}

/// First SIGINT/SIGTERM: fire `stop` (drain and exit 0). Second: exit at once.
fn watch_signals(stop: Shutdown) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = interrupt.recv() => {},
            _ = terminate.recv() => {},
        }
        tracing::info!("signal received: draining; send another to exit at once");
        stop.trigger();
        tokio::select! {
            _ = interrupt.recv() => {},
            _ = terminate.recv() => {},
        }
        tracing::warn!("second signal: exiting without draining");
        std::process::exit(130);
    });
    Ok(())
}
