//! Crash safety of the file sources end to end: while a writer appends to log files, rotates
//! them (by rename and by copytruncate) or drops files into a spooling directory, the real
//! agent is killed with SIGKILL at random moments and restarted; at the end every line must be
//! in the output exactly once through a file channel, and at least once through a memory
//! channel, in the order of the file it was written to.
//!
//! The kill delays and the writer's choices come from a seed printed as `CRASH_SEED=...`; run
//! again with that variable set to replay them (thread timing still varies).

#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::harness::{Agent, Lcg, crash_seed, read_dir_concat, wait_until};

/// How many times each test at least kills the agent.
const KILLS: usize = 15;

/// A line of stream `stream`, number `n`: `f<stream>-<n>` and some letters, so that lines
/// differ in length and a file's first bytes change when it is truncated and written again.
fn numbered_line(stream: usize, n: usize) -> String {
    let padding: String = (0..(n * 7 + stream * 13) % 40)
        .map(|i| char::from(b'a' + ((n + i) % 26) as u8))
        .collect();
    format!("f{stream}-{n:06} {padding}")
}

/// The lines of the files `file_roll` has finished in a directory, read as they appear.
///
/// While the agent runs only finished files are read: a `.tmp` file may still lose an
/// unacknowledged tail when the agent is killed (it is cut back on restart) and is renamed
/// under a reader, whereas a finished file never changes and holds only delivered events.
/// Once the agent has exited, `read_dir_concat` reads everything.
struct FinishedOutput {
    dir: PathBuf,
    read: HashSet<OsString>,
    lines: usize,
    distinct: HashSet<String>,
}

impl FinishedOutput {
    fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            read: HashSet::new(),
            lines: 0,
            distinct: HashSet::new(),
        }
    }

    /// Reads the files finished since the last call.
    fn refresh(&mut self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let text = name.to_string_lossy();
            if text.starts_with('.') || text.ends_with(".tmp") || self.read.contains(&name) {
                continue;
            }
            let Ok(bytes) = fs::read(entry.path()) else {
                continue;
            };
            for line in String::from_utf8_lossy(&bytes).lines() {
                self.lines += 1;
                self.distinct.insert(line.to_owned());
            }
            self.read.insert(name);
        }
    }

    fn contains(&mut self, line: &str) -> bool {
        self.refresh();
        self.distinct.contains(line)
    }

    /// How many of `expected` were delivered.
    fn delivered_of(&mut self, expected: &HashSet<String>) -> usize {
        self.refresh();
        expected
            .iter()
            .filter(|line| self.distinct.contains(*line))
            .count()
    }
}

/// Runs the agent on `config` in `dir` and kills it with SIGKILL at a random moment after it
/// started, again and again: at least `KILLS` times, and until `done()` holds. Returns how
/// many times it was killed.
fn kill_repeatedly(dir: &Path, config: &str, rng: &mut Lcg, done: impl Fn() -> bool) -> usize {
    let mut kills = 0;
    while kills < KILLS || !done() {
        let mut agent = Agent::start(dir, config);
        wait_until(Duration::from_secs(60), "the agent to start", || {
            let log = agent.log();
            log.contains("pipeline started") || log.contains("Error")
        });
        assert!(
            agent.log().contains("pipeline started"),
            "round {kills}: the agent did not start:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100 + rng.next_below(900)));
        agent.signal(Signal::SIGKILL);
        let status = agent.wait(Duration::from_secs(30));
        assert_eq!(
            status.signal(),
            Some(Signal::SIGKILL as i32),
            "round {kills}: the agent exited by itself ({status:?}):\n{}",
            agent.log()
        );
        kills += 1;
    }
    kills
}

/// Lets the last run of the agent go on until the finished output holds every line of
/// `expected` (or stops growing for 15 s: the checks then say what is missing), stops it
/// with SIGTERM and returns every output line.
fn run_to_completion(mut agent: Agent, dir: &Path, expected: &HashSet<String>) -> Vec<String> {
    let mut output = FinishedOutput::new(&dir.join("out"));
    let mut last = (0, Instant::now());
    wait_until(
        Duration::from_secs(300),
        "the output to hold every line",
        || {
            let delivered = output.delivered_of(expected);
            if delivered != last.0 {
                last = (delivered, Instant::now());
            }
            delivered == expected.len() || last.1.elapsed() > Duration::from_secs(15)
        },
    );
    agent.signal(Signal::SIGTERM);
    let status = agent.wait(Duration::from_secs(60));
    assert!(status.success(), "{status:?}\n{}", agent.log());
    let text = String::from_utf8(read_dir_concat(&dir.join("out"))).unwrap();
    text.lines().map(str::to_owned).collect()
}

/// What a writer wrote: per stream of numbered lines, every line in order, and the index of
/// the first line of each physical file the stream was written to (a rename rotation starts a
/// new one).
struct Written {
    lines: Vec<Vec<String>>,
    file_starts: Vec<Vec<usize>>,
}

impl Written {
    fn all(&self) -> HashSet<String> {
        self.lines.iter().flatten().cloned().collect()
    }
}

/// Checks `output` against what was written: every line there (`exactly_once`: once, else at
/// least once), nothing else, and the lines of each physical file in the order written
/// (first occurrences, when duplicates are allowed). Returns the number of duplicates.
fn check_output(written: &Written, output: &[String], exactly_once: bool, seed: u64) -> usize {
    // line -> (stream, physical file, number in the stream)
    let mut origin: HashMap<&str, (usize, usize, usize)> = HashMap::new();
    for (stream, lines) in written.lines.iter().enumerate() {
        let starts = &written.file_starts[stream];
        for (n, line) in lines.iter().enumerate() {
            let file = starts.partition_point(|&start| start <= n) - 1;
            origin.insert(line, (stream, file, n));
        }
    }
    let mut counts: HashMap<&str, usize> = HashMap::new();
    let mut last_in_file: HashMap<(usize, usize), usize> = HashMap::new();
    for (at, line) in output.iter().enumerate() {
        let Some(&(stream, file, n)) = origin.get(line.as_str()) else {
            panic!("CRASH_SEED={seed}: output line {at} {line:?} was never written");
        };
        let count = counts.entry(line).or_default();
        *count += 1;
        if *count > 1 {
            continue;
        }
        if let Some(previous) = last_in_file.insert((stream, file), n) {
            assert!(
                previous < n,
                "CRASH_SEED={seed}: output line {at} {line:?} comes after line {previous} of \
                 stream {stream} (file {file}): the order of the file was not kept"
            );
        }
    }
    let mut missing: Vec<&str> = origin
        .keys()
        .filter(|line| !counts.contains_key(*line))
        .copied()
        .collect();
    missing.sort_unstable();
    assert!(
        missing.is_empty(),
        "CRASH_SEED={seed}: {} of {} lines lost, e.g. {:?}",
        missing.len(),
        origin.len(),
        &missing[..missing.len().min(10)]
    );
    let duplicates: usize = counts.values().map(|c| c - 1).sum();
    if exactly_once {
        let mut repeated: Vec<&str> = counts
            .iter()
            .filter(|(_, c)| **c > 1)
            .map(|(l, _)| *l)
            .collect();
        repeated.sort_unstable();
        assert_eq!(
            duplicates,
            0,
            "CRASH_SEED={seed}: {} lines delivered more than once, e.g. {:?}",
            repeated.len(),
            &repeated[..repeated.len().min(10)]
        );
        // The sorted outputs, compared whole.
        let mut sorted_output: Vec<&str> = output.iter().map(String::as_str).collect();
        sorted_output.sort_unstable();
        let mut sorted_written: Vec<&str> =
            written.lines.iter().flatten().map(String::as_str).collect();
        sorted_written.sort_unstable();
        assert!(sorted_output == sorted_written, "CRASH_SEED={seed}");
    }
    duplicates
}

/// The application writing the logs of the taildir tests, in `dir`:
///
/// - stream 0, `rename.log`, rotated the way logrotate does by default: `rename.log.k` →
///   `rename.log.k+1`, ..., `rename.log` → `rename.log.1`; the application writes a few more
///   lines through its open handle, then opens a new `rename.log`;
/// - stream 1, `copy.log`, rotated by copytruncate: copied to `copy-<k>.old` (which the glob
///   does not match), then truncated;
/// - stream 2, `plain.log`, never rotated.
///
/// Each chunk of lines goes in with two writes split at a random byte, so the agent sees half
/// lines.
struct LogWriter {
    dir: PathBuf,
    rng: Lcg,
    files: Vec<File>,
    written: Written,
    renames: usize,
    copies: usize,
}

impl LogWriter {
    const RENAMED: usize = 0;
    const COPIED: usize = 1;
    const NAMES: [&str; 3] = ["rename.log", "copy.log", "plain.log"];

    fn new(dir: &Path, seed: u64) -> Self {
        fs::create_dir_all(dir).unwrap();
        Self {
            dir: dir.to_owned(),
            rng: Lcg(seed ^ 0x5eed),
            files: Self::NAMES
                .iter()
                .map(|name| open_append(&dir.join(name)))
                .collect(),
            written: Written {
                lines: vec![Vec::new(); 3],
                file_starts: vec![vec![0]; 3],
            },
            renames: 0,
            copies: 0,
        }
    }

    fn total(&self) -> usize {
        self.written.lines.iter().map(Vec::len).sum()
    }

    /// Appends `count` lines to each of `streams`.
    fn append(&mut self, streams: &[usize], count: usize) {
        if count == 0 {
            return;
        }
        let mut chunks = Vec::new();
        for &stream in streams {
            let mut chunk = Vec::new();
            for _ in 0..count {
                let line = numbered_line(stream, self.written.lines[stream].len());
                writeln!(chunk, "{line}").unwrap();
                self.written.lines[stream].push(line);
            }
            let split = self.rng.next_below(chunk.len() as u64) as usize;
            chunks.push((stream, chunk, split));
        }
        for (stream, chunk, split) in &chunks {
            self.files[*stream].write_all(&chunk[..*split]).unwrap();
        }
        for (stream, chunk, split) in &chunks {
            self.files[*stream].write_all(&chunk[*split..]).unwrap();
        }
    }

    fn rotate_by_rename(&mut self) {
        let path = |k: usize| self.dir.join(format!("{}.{k}", Self::NAMES[Self::RENAMED]));
        for k in (1..=self.renames).rev() {
            fs::rename(path(k), path(k + 1)).unwrap();
        }
        fs::rename(self.dir.join(Self::NAMES[Self::RENAMED]), path(1)).unwrap();
        self.renames += 1;
        // Still written through the handle opened before the rename, so into `rename.log.1`.
        let late = self.rng.next_below(50) as usize;
        self.append(&[Self::RENAMED], late);
        self.files[Self::RENAMED] = open_append(&self.dir.join(Self::NAMES[Self::RENAMED]));
        let next = self.written.lines[Self::RENAMED].len();
        self.written.file_starts[Self::RENAMED].push(next);
    }

    /// copytruncate loses, for every tailer, the lines written between the copy and the
    /// truncation and the lines not read yet when the file is truncated: they survive only in
    /// the copy, which no glob matches. (Letting the glob match the copy instead would tail
    /// it as a new file and deliver all its lines a second time.) So the writer stops
    /// appending to `copy.log`, waits until its last line was delivered (a finished output
    /// file holds it), and only then copies and truncates it. Nothing unread is lost then:
    /// an agent restarted from an older saved position (through a memory channel the
    /// position is saved after delivery) finds the file truncated and reads its new content
    /// from the start.
    fn rotate_by_copytruncate(&mut self, output: &mut FinishedOutput) {
        let path = self.dir.join(Self::NAMES[Self::COPIED]);
        if let Some(last) = self.written.lines[Self::COPIED].last().cloned() {
            wait_until(
                Duration::from_secs(120),
                "the last line of copy.log to be delivered before truncating it",
                || output.contains(&last),
            );
        }
        self.copies += 1;
        fs::copy(&path, self.dir.join(format!("copy-{}.old", self.copies))).unwrap();
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
    }

    /// Writes `rounds` chunks to every stream, rotating `rename.log` every 8 rounds and
    /// `copy.log` every 10, and keeps at most `ahead` lines ahead of the finished output so
    /// that rotations happen while the agent is reading (and being killed). Counts the
    /// rounds done in `done`.
    fn run(mut self, rounds: usize, ahead: usize, out: &Path, done: &AtomicUsize) -> Written {
        let mut output = FinishedOutput::new(out);
        for round in 0..rounds {
            let count = 50 + self.rng.next_below(250) as usize;
            self.append(&[0, 1, 2], count);
            if round % 8 == 4 {
                self.rotate_by_rename();
            }
            if round % 10 == 7 {
                self.rotate_by_copytruncate(&mut output);
            }
            let total = self.total();
            wait_until(
                Duration::from_secs(120),
                "the agent to keep up with the writer",
                || {
                    output.refresh();
                    output.lines + ahead >= total
                },
            );
            done.store(round + 1, Ordering::SeqCst);
        }
        assert!(self.renames >= 3 && self.copies >= 3);
        self.written
    }
}

fn open_append(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
}

/// A pipeline: `source` (YAML of one source, indented by 4) → `channel` → `file_roll` into
/// `./out`, rolling often so that finished files show progress.
fn pipeline(source: &str, channel: &str) -> String {
    format!(
        "\
agent:
  data_dir: ./state
sources:
  input:
{source}
    channels: [buffer]
channels:
  buffer:
    type: {channel}
    capacity: 100000
    transaction_capacity: 1000
sinks:
  files:
    type: file_roll
    channel: buffer
    batch_size: 100
    directory: ./out
    roll_size: 32KiB
    roll_interval: 1s
"
    )
}

/// Taildir on the three logs of `LogWriter`, through `channel`, killed at least `KILLS`
/// times while they are written and rotated; returns what was written and the output.
fn tail_rotating_logs_across_sigkills(channel: &str, seed: u64) -> (Written, Vec<String>) {
    const ROUNDS: usize = 150;
    let mut rng = Lcg(seed);
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    // The glob matches the live files and the renamed ones (`rename.log.1`, ...), not the
    // copies of copytruncate (`copy-1.old`, ...). A renamed file stays in the glob, so it is
    // tailed as a file of its own: order is kept per file, not across a rotation.
    let source = format!(
        "    type: taildir
    filegroups:
      app: '{}/*.log*'
    batch_size: 100
    idle_timeout: 1s
    poll_interval: 250ms",
        logs.display()
    );
    let config = pipeline(&source, channel);
    let writer = LogWriter::new(&logs, seed);
    let out = dir.path().join("out");
    let rounds = Arc::new(AtomicUsize::new(0));
    let done = Arc::clone(&rounds);
    let writing = std::thread::spawn(move || writer.run(ROUNDS, 10_000, &out, &done));
    // Killed during the first three quarters of the writing; the last run sees the rest
    // live, so that rotation and truncation are also followed without a restart.
    let kills = kill_repeatedly(dir.path(), &config, &mut rng, || {
        rounds.load(Ordering::SeqCst) >= ROUNDS * 3 / 4 || writing.is_finished()
    });
    let agent = Agent::start(dir.path(), &config);
    let written = writing
        .join()
        .expect("the writer failed: see its panic above");
    let output = run_to_completion(agent, dir.path(), &written.all());
    println!(
        "{} lines written to 3 files ({} files after rename rotations), {} output lines, {kills} SIGKILLs",
        written.lines.iter().map(Vec::len).sum::<usize>(),
        written.file_starts.iter().map(Vec::len).sum::<usize>(),
        output.len()
    );
    (written, output)
}

#[test]
fn taildir_through_file_channel_is_exactly_once_across_sigkills_and_rotations() {
    let seed = crash_seed();
    let (written, output) = tail_rotating_logs_across_sigkills("file", seed);
    check_output(&written, &output, true, seed);
}

#[test]
fn taildir_through_memory_channel_loses_nothing_across_sigkills() {
    let seed = crash_seed();
    let (written, output) = tail_rotating_logs_across_sigkills("memory", seed);
    let duplicates = check_output(&written, &output, false, seed);
    println!("{duplicates} duplicates (allowed with a memory channel)");
}

#[test]
fn spooldir_through_file_channel_is_exactly_once_across_sigkills() {
    const FILES: usize = 60;
    let seed = crash_seed();
    let mut rng = Lcg(seed);
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let staging = dir.path().join("staging");
    fs::create_dir_all(&spool).unwrap();
    fs::create_dir_all(&staging).unwrap();
    let source = format!(
        "    type: spooldir
    spool_dir: '{}'
    batch_size: 200
    poll_delay: 100ms",
        spool.display()
    );
    let config = pipeline(&source, "file");
    let out = dir.path().join("out");
    // Each file is a stream of numbered lines, written in the staging directory and renamed
    // into the spool directory complete, as Flume requires; files keep coming while the
    // agent is killed, at most 10000 lines ahead of the finished output.
    let mut dropper_rng = Lcg(seed ^ 0xd209);
    let dropped = Arc::new(AtomicUsize::new(0));
    let dropping = {
        let spool = spool.clone();
        let dropped = Arc::clone(&dropped);
        std::thread::spawn(move || {
            let mut output = FinishedOutput::new(&out);
            let mut written = Written {
                lines: Vec::new(),
                file_starts: Vec::new(),
            };
            for file in 0..FILES {
                let count = 500 + dropper_rng.next_below(2000) as usize;
                let lines: Vec<String> = (0..count).map(|n| numbered_line(file, n)).collect();
                let name = format!("f{file:03}.log");
                let mut text = lines.join("\n");
                text.push('\n');
                fs::write(staging.join(&name), text).unwrap();
                fs::rename(staging.join(&name), spool.join(&name)).unwrap();
                written.lines.push(lines);
                written.file_starts.push(vec![0]);
                dropped.store(file + 1, Ordering::SeqCst);
                let total: usize = written.lines.iter().map(Vec::len).sum();
                wait_until(
                    Duration::from_secs(120),
                    "the agent to keep up with the files",
                    || {
                        output.refresh();
                        output.lines + 10_000 >= total
                    },
                );
            }
            written
        })
    };
    // The last run sees the last quarter of the files arrive.
    let kills = kill_repeatedly(dir.path(), &config, &mut rng, || {
        dropped.load(Ordering::SeqCst) >= FILES * 3 / 4 || dropping.is_finished()
    });
    let agent = Agent::start(dir.path(), &config);
    let written = dropping
        .join()
        .expect("the file dropper failed: see its panic above");
    let output = run_to_completion(agent, dir.path(), &written.all());
    println!(
        "{} lines in {FILES} files, {} output lines, {kills} SIGKILLs",
        written.lines.iter().map(Vec::len).sum::<usize>(),
        output.len()
    );
    check_output(&written, &output, true, seed);
    let mut names: Vec<String> = fs::read_dir(&spool)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let completed: Vec<String> = (0..FILES)
        .map(|f| format!("f{f:03}.log.COMPLETED"))
        .collect();
    assert_eq!(names, completed, "CRASH_SEED={seed}: the spool directory");
}
