//! Shared helpers for the end-to-end tests: run the real `agent` binary on a pipeline file in
//! a temp dir, signal it, and wait for conditions without fixed sleeps.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The root of the repository.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The text of a shipped pipeline with `replacements` applied; each pattern must occur.
pub fn pipeline(name: &str, replacements: &[(&str, &str)]) -> String {
    let path = repo_root().join("pipelines").join(name);
    let mut text = fs::read_to_string(&path).unwrap();
    for (from, to) in replacements {
        assert!(text.contains(from), "{name} no longer contains `{from}`");
        text = text.replace(from, to);
    }
    text
}

/// Polls `condition` every 20 ms until it holds; panics with `what` after `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running `agent run` process.
pub struct Agent {
    child: Child,
    pub dir: PathBuf,
    log: PathBuf,
}

impl Agent {
    /// Writes `config` to `dir/pipeline.yaml` and runs the agent on it with `dir` as working
    /// directory; its standard error goes to `dir/agent.log`.
    pub fn start(dir: &Path, config: &str) -> Agent {
        Self::start_with(dir, config, &[])
    }

    /// Like `start`, with extra environment variables.
    pub fn start_with(dir: &Path, config: &str, env: &[(&str, &str)]) -> Agent {
        let file = dir.join("pipeline.yaml");
        fs::write(&file, config).unwrap();
        let log = dir.join("agent.log");
        let child = Command::new(env!("CARGO_BIN_EXE_agent"))
            .arg("run")
            .arg(&file)
            .current_dir(dir)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(fs::File::create(dir.join("agent.out")).unwrap())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Agent {
            child,
            dir: dir.to_owned(),
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the agent logged so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` to the agent.
    pub fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// Waits for the agent to exit, killing it after `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "agent did not exit within {timeout:?}; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Resident memory of the agent in KiB, from /proc.
    pub fn rss_kib(&self) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The concatenated contents of every file in `dir` whose name does not start with `.`,
/// in name order (file_roll names sort in creation order).
pub fn read_dir_concat(dir: &Path) -> Vec<u8> {
    let mut names: Vec<PathBuf> = match fs::read_dir(dir) {
        Ok(entries) => entries.map(|e| e.unwrap().path()).collect(),
        Err(_) => return Vec::new(),
    };
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let file_name = name.file_name().unwrap().to_string_lossy().into_owned();
        if file_name.starts_with('.') || !name.is_file() {
            continue;
        }
        out.extend(fs::read(&name).unwrap());
    }
    out
}
