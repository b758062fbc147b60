//! `agent state`: what an agent's data directory holds, read without changing it.
//!
//! The state database is read as [`ferry_core::state::inspect`] describes (read-only, never
//! the agent's lock, no file created), the file channels' segments as
//! [`ferry_channels::file::inspect`] does. A running agent is not disturbed; a stopped one's
//! files stay byte for byte as they were. The report is a table, or JSON with `--json`; the
//! exit status is 0 when the directory is sound and 1 when SQLite's integrity check fails, a
//! segment file the state names is missing or short, or the directory cannot be read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::Args;
use ferry_core::Registry;
use ferry_core::state::inspect::{StateSnapshot, read_state};
use ferry_sources::inspect::{FileNow, FilePosition, SourceCheckpoint, describe_checkpoint};
use serde::Serialize;

/// `agent state`: where to look and how to print.
#[derive(Args, Debug)]
pub struct StateArgs {
    /// A pipeline file (YAML or Flume): reads its `agent.data_dir` and the `data_dir` of each
    /// of its file channels. Relative paths are taken from the current directory, as `run`
    /// takes them.
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "data_dir",
        conflicts_with = "data_dir"
    )]
    config: Option<PathBuf>,
    /// The agent to take from a Flume file (as flume-ng's `--name`).
    #[arg(short = 'n', long, requires = "config")]
    name: Option<String>,
    /// A data directory to read.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `agent state`.
pub fn run(args: &StateArgs, registry: &Registry) -> ExitCode {
    let (dirs, source_types) = match (&args.config, &args.data_dir) {
        (Some(config), _) => match pipeline_dirs(config, args.name.as_deref(), registry) {
            Ok(found) => found,
            Err(problems) => {
                eprintln!("{problems}");
                return ExitCode::from(crate::EXIT_BAD_CONFIG);
            }
        },
        (None, Some(dir)) => (vec![dir.clone()], BTreeMap::new()),
        // clap requires one of them.
        (None, None) => (Vec::new(), BTreeMap::new()),
    };
    let report = Report::read(&dirs, &source_types);
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("error: encoding the report: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", report.table());
    }
    for problem in report.problems() {
        eprintln!("problem: {problem}");
    }
    if report.healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `agent validate --state`: the integrity of the data directories of a pipeline file that
/// validated, one line each; `false` if any is damaged. A directory without a state database
/// yet, or not made yet (the agent never ran), is sound.
pub(crate) fn check_pipeline(path: &Path, name: Option<&str>, registry: &Registry) -> bool {
    let (dirs, source_types) = match pipeline_dirs(path, name, registry) {
        Ok(found) => found,
        Err(problems) => {
            eprintln!("{problems}");
            return false;
        }
    };
    let mut ok = true;
    for dir in dirs {
        if !dir.join("state.db").exists() {
            println!("{}: no state yet", dir.display());
            continue;
        }
        let report = Report::read(std::slice::from_ref(&dir), &source_types);
        let problems = report.problems();
        if problems.is_empty() {
            println!("{}: state ok", dir.display());
        } else {
            for problem in problems {
                eprintln!("{}: state: {problem}", dir.display());
            }
            ok = false;
        }
    }
    ok
}

/// The data directories of a pipeline file (its `agent.data_dir` first, then the other
/// `data_dir`s of its file channels) and the type of each source, by name.
fn pipeline_dirs(
    path: &Path,
    name: Option<&str>,
    registry: &Registry,
) -> Result<(Vec<PathBuf>, BTreeMap<String, String>), String> {
    let file = super::PipelineFile::of(path, name)?;
    let (topology, _) = file.load(registry)?;
    let yaml = match &file {
        super::PipelineFile::Yaml(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("{}: cannot read: {e}", path.display()))?,
        super::PipelineFile::Flume { path, agent } => {
            let text = crate::flume::read(path).map_err(|p| p.to_string())?;
            crate::flume::convert(path, &text, agent)
                .map_err(|p| p.to_string())?
                .yaml
        }
    };
    // The file loaded above, so it parses; its values are read as `run` reads them.
    let root = marked_yaml::parse_yaml(0, &yaml)
        .map(|root| crate::topology::substitute_env(&root, &mut Vec::new()))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let option = |section: &str, entry: &str, key: &str| -> Option<String> {
        let value = root
            .as_mapping()?
            .get_node(section)?
            .as_mapping()?
            .get_node(entry)?
            .as_mapping()?
            .get_scalar(key)?;
        Some(value.as_str().to_owned())
    };
    let mut dirs = vec![topology.agent.data_dir.clone()];
    for (channel, kind) in &topology.channel_types {
        if kind == "file"
            && let Some(dir) = option("channels", channel, "data_dir").map(PathBuf::from)
            && !dirs.contains(&dir)
        {
            dirs.push(dir);
        }
    }
    let source_types = topology
        .sources
        .iter()
        .filter_map(|s| Some((s.name.clone(), option("sources", &s.name, "type")?)))
        .collect();
    Ok((dirs, source_types))
}

/// What `agent state` prints.
#[derive(Serialize)]
struct Report {
    /// Whether every directory is sound.
    healthy: bool,
    data_dirs: Vec<DirReport>,
}

#[derive(Serialize)]
struct DirReport {
    data_dir: PathBuf,
    /// The directory cannot be read at all (missing, not a state database, newer schema).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    database: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    schema_version: Option<i64>,
    /// `ok`, or what SQLite's `PRAGMA integrity_check` found.
    integrity: Vec<String>,
    notes: Vec<String>,
    channels: Vec<ChannelReport>,
    sources: Vec<SourceReport>,
    sinks: Vec<SinkReport>,
    /// Everything wrong, each naming the file.
    problems: Vec<String>,
}

#[derive(Serialize)]
struct ChannelReport {
    name: String,
    id: u64,
    /// Events stored and not taken for good.
    depth: u64,
    next_seq: u64,
    taken_seq: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    oldest_seq: Option<u64>,
    /// Milliseconds since the oldest event not taken was made (its `timestamp` header) or,
    /// without one, at least since it was stored (its segment file's last write).
    #[serde(skip_serializing_if = "Option::is_none")]
    oldest_age_ms: Option<u64>,
    /// `timestamp_header` or `segment_modified`: where `oldest_age_ms` comes from.
    #[serde(skip_serializing_if = "Option::is_none")]
    oldest_age_from: Option<&'static str>,
    /// Bytes of the channel's segment files.
    size_on_disk: u64,
    segments: usize,
    dir: PathBuf,
}

#[derive(Serialize)]
struct SourceReport {
    name: String,
    checkpoint: CheckpointView,
}

#[derive(Serialize)]
#[serde(untagged)]
enum CheckpointView {
    Decoded(SourceCheckpoint),
    Kafka {
        format: &'static str,
        offsets: Vec<KafkaOffset>,
    },
    Raw(Raw),
}

#[derive(Serialize)]
struct KafkaOffset {
    topic: String,
    partition: i32,
    next_offset: i64,
}

/// Bytes as they are stored: `text` if they are UTF-8 (`json` if that text is JSON), else
/// `hex`.
#[derive(Serialize)]
#[serde(tag = "format", content = "value", rename_all = "snake_case")]
enum Raw {
    Json(serde_json::Value),
    Text(String),
    Hex(String),
}

impl Raw {
    fn of(bytes: &[u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) => match serde_json::from_str(text) {
                Ok(value @ (serde_json::Value::Object(_) | serde_json::Value::Array(_))) => {
                    Raw::Json(value)
                }
                _ => Raw::Text(text.to_owned()),
            },
            Err(_) => Raw::Hex(bytes.iter().map(|b| format!("{b:02x}")).collect()),
        }
    }

    fn show(&self) -> String {
        match self {
            Raw::Json(value) => value.to_string(),
            Raw::Text(text) => format!("{text:?}"),
            Raw::Hex(hex) => format!("hex {hex}"),
        }
    }
}

#[derive(Serialize)]
struct SinkReport {
    name: String,
    progress: Raw,
}

impl Report {
    fn read(dirs: &[PathBuf], source_types: &BTreeMap<String, String>) -> Self {
        let data_dirs: Vec<DirReport> = dirs
            .iter()
            .map(|dir| DirReport::read(dir, source_types))
            .collect();
        Self {
            healthy: data_dirs.iter().all(|d| d.problems.is_empty()),
            data_dirs,
        }
    }

    fn problems(&self) -> Vec<&String> {
        self.data_dirs.iter().flat_map(|d| &d.problems).collect()
    }

    fn table(&self) -> String {
        let mut out = String::new();
        for (i, dir) in self.data_dirs.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            dir.table(&mut out);
        }
        out
    }
}

impl DirReport {
    fn read(data_dir: &Path, source_types: &BTreeMap<String, String>) -> Self {
        let mut report = DirReport {
            data_dir: data_dir.to_owned(),
            error: None,
            database: None,
            schema_version: None,
            integrity: Vec::new(),
            notes: Vec::new(),
            channels: Vec::new(),
            sources: Vec::new(),
            sinks: Vec::new(),
            problems: Vec::new(),
        };
        let snapshot = match read_state(data_dir) {
            Ok(snapshot) => snapshot,
            Err(e) => {
                report.problems.push(e.to_string());
                report.error = Some(e.to_string());
                return report;
            }
        };
        report.fill(data_dir, snapshot, source_types);
        report
    }

    fn fill(
        &mut self,
        data_dir: &Path,
        snapshot: StateSnapshot,
        source_types: &BTreeMap<String, String>,
    ) {
        let database = snapshot.path.display().to_string();
        if snapshot.integrity_problems.is_empty() {
            self.integrity = vec!["ok".into()];
        } else {
            for line in &snapshot.integrity_problems {
                self.problems
                    .push(format!("{database}: integrity check: {line}"));
            }
            self.integrity = snapshot.integrity_problems;
        }
        self.database = Some(snapshot.path);
        self.schema_version = Some(snapshot.schema_version);
        self.notes = snapshot.notes;
        let now = SystemTime::now();
        for (name, index) in snapshot.channels {
            let files = ferry_channels::file::inspect::inspect(data_dir, &index);
            for problem in &files.problems {
                self.problems.push(format!("channel `{name}`: {problem}"));
            }
            let (oldest_age_ms, oldest_age_from) = match &files.oldest {
                Some(oldest) => match (oldest.timestamp_ms, oldest.segment_modified) {
                    // A header is whatever the event carried: a time past the end of the
                    // clock's range gives no age rather than an overflow.
                    (Some(ms), _) => {
                        match SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms)) {
                            Some(made) => (Some(age_ms(now, made)), Some("timestamp_header")),
                            None => (None, None),
                        }
                    }
                    (None, Some(modified)) => {
                        (Some(age_ms(now, modified)), Some("segment_modified"))
                    }
                    (None, None) => (None, None),
                },
                None => (None, None),
            };
            self.channels.push(ChannelReport {
                name,
                id: index.id,
                depth: index.stored,
                next_seq: index.next_seq,
                taken_seq: index.taken_seq,
                oldest_seq: files.oldest.as_ref().map(|o| o.seq),
                oldest_age_ms,
                oldest_age_from,
                size_on_disk: files.size_on_disk,
                segments: index.segments.len(),
                dir: files.dir,
            });
        }
        for (name, bytes) in snapshot.checkpoints {
            let kind = source_types.get(&name).map(String::as_str);
            self.sources.push(SourceReport {
                checkpoint: view_checkpoint(kind, &bytes),
                name,
            });
        }
        for (name, bytes) in snapshot.sink_progress {
            self.sinks.push(SinkReport {
                name,
                progress: Raw::of(&bytes),
            });
        }
    }

    fn table(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = writeln!(out, "data_dir {}", self.data_dir.display());
        if let Some(error) = &self.error {
            let _ = writeln!(out, "  cannot be read: {error}");
            return;
        }
        let integrity = if self.integrity == ["ok"] {
            "ok".to_owned()
        } else {
            format!("FAILED ({} problems)", self.integrity.len())
        };
        let _ = writeln!(
            out,
            "  database {} (schema {}), integrity {integrity}",
            self.database.as_deref().unwrap_or(Path::new("")).display(),
            self.schema_version.unwrap_or(0)
        );
        for note in &self.notes {
            let _ = writeln!(out, "  note: {note}");
        }
        let mut rows = vec![row([
            "CHANNEL", "DEPTH", "OLDEST", "SIZE", "SEGMENTS", "NEXT SEQ",
        ])];
        for c in &self.channels {
            let oldest = match (c.oldest_age_ms, c.oldest_age_from) {
                (Some(ms), Some("timestamp_header")) => age(ms),
                (Some(ms), _) => format!(">= {} (file time)", age(ms)),
                _ => "-".into(),
            };
            rows.push(row([
                c.name.clone(),
                c.depth.to_string(),
                oldest,
                bytes(c.size_on_disk),
                c.segments.to_string(),
                c.next_seq.to_string(),
            ]));
        }
        section(out, "channels", &rows, self.channels.is_empty());
        let mut rows = vec![row(["SOURCE", "CHECKPOINT", "", "", ""])];
        for s in &self.sources {
            for line in s.checkpoint.lines() {
                let mut cells = vec![s.name.clone()];
                cells.extend(line);
                cells.resize(5, String::new());
                rows.push(cells);
            }
        }
        section(out, "sources", &rows, self.sources.is_empty());
        let mut rows = vec![row(["SINK", "PROGRESS"])];
        for s in &self.sinks {
            rows.push(vec![s.name.clone(), s.progress.show()]);
        }
        section(out, "sinks", &rows, self.sinks.is_empty());
        if self.problems.is_empty() {
            let _ = writeln!(out, "  problems: none");
        } else {
            let _ = writeln!(out, "  problems:");
            for problem in &self.problems {
                let _ = writeln!(out, "    {problem}");
            }
        }
    }
}

impl CheckpointView {
    /// The checkpoint as table rows of up to four cells.
    fn lines(&self) -> Vec<Vec<String>> {
        match self {
            CheckpointView::Decoded(SourceCheckpoint::Taildir { files }) => {
                if files.is_empty() {
                    return vec![vec!["taildir, no files".into()]];
                }
                files.iter().map(file_cells).collect()
            }
            CheckpointView::Decoded(SourceCheckpoint::Spooldir { current, failed }) => {
                let mut cells = match current {
                    Some(position) => file_cells(position),
                    None => vec!["spooldir, no file being read".into()],
                };
                if *failed > 0 {
                    cells.push(format!("{failed} failed files"));
                }
                vec![cells]
            }
            CheckpointView::Decoded(SourceCheckpoint::Seq { next }) => {
                vec![vec![format!("seq, next {next}")]]
            }
            CheckpointView::Kafka { offsets, .. } => offsets
                .iter()
                .map(|o| {
                    vec![
                        format!("{}-{}", o.topic, o.partition),
                        format!("next offset {}", o.next_offset),
                    ]
                })
                .collect(),
            CheckpointView::Raw(raw) => vec![vec![raw.show()]],
        }
    }
}

fn file_cells(position: &FilePosition) -> Vec<String> {
    let behind = match &position.now {
        FileNow::Present { bytes_behind, .. } => format!("behind {}", bytes(*bytes_behind)),
        FileNow::Replaced { inode } => format!("file replaced (inode {inode} there now)"),
        FileNow::Gone => "file gone".into(),
    };
    vec![
        position.path.display().to_string(),
        format!("inode {}", position.inode),
        format!("offset {}", position.offset),
        behind,
    ]
}

fn view_checkpoint(kind: Option<&str>, bytes: &[u8]) -> CheckpointView {
    if kind.is_none_or(|k| k == "kafka")
        && let Some(offsets) = ferry_kafka::source::checkpoint_offsets(bytes)
        && (kind.is_some() || !offsets.is_empty())
    {
        return CheckpointView::Kafka {
            format: "kafka",
            offsets: offsets
                .into_iter()
                .map(|(topic, partition, next_offset)| KafkaOffset {
                    topic,
                    partition,
                    next_offset,
                })
                .collect(),
        };
    }
    match describe_checkpoint(kind, bytes) {
        Some(decoded) => CheckpointView::Decoded(decoded),
        None => CheckpointView::Raw(Raw::of(bytes)),
    }
}

fn age_ms(now: SystemTime, then: SystemTime) -> u64 {
    now.duration_since(then)
        .unwrap_or_default()
        .as_millis()
        .try_into()
        .unwrap_or(u64::MAX)
}

fn age(ms: u64) -> String {
    humantime::format_duration(Duration::from_secs(ms / 1000)).to_string()
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n}B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1}{}", UNITS[unit])
}

fn row<const N: usize, S: Into<String>>(cells: [S; N]) -> Vec<String> {
    cells.into_iter().map(Into::into).collect()
}

/// Rows as columns padded to their widest cell, indented; `(none)` when `empty`.
fn section(out: &mut String, what: &str, rows: &[Vec<String>], empty: bool) {
    use std::fmt::Write as _;
    if empty {
        let _ = writeln!(out, "  {what}: none");
        return;
    }
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let mut line = String::from(" ");
        for (i, cell) in r.iter().enumerate() {
            let _ = write!(line, " {cell:<width$}", width = widths[i]);
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_are_json_text_or_hex() {
        assert_eq!(Raw::of(br#"{"a":1}"#).show(), r#"{"a":1}"#);
        assert_eq!(Raw::of(b"pos=3").show(), "\"pos=3\"");
        assert_eq!(Raw::of(&[0xff, 0x01]).show(), "hex ff01");
    }

    #[test]
    fn kafka_offsets_are_read_when_the_type_allows() {
        let bytes = br#"[["logs",0,17]]"#;
        assert!(matches!(
            view_checkpoint(None, bytes),
            CheckpointView::Kafka { ref offsets, .. } if offsets[0].next_offset == 17
        ));
        assert!(matches!(
            view_checkpoint(Some("exec"), bytes),
            CheckpointView::Raw(Raw::Json(_))
        ));
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(bytes(512), "512B");
        assert_eq!(bytes(1536), "1.5KiB");
        assert_eq!(bytes(3 << 20), "3.0MiB");
    }
}
