//! Shared helpers for the end-to-end tests: run the real `agent` binary on a pipeline file in
//! a temp dir, signal it, and wait for conditions without fixed sleeps.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The root of the repository.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A port on 127.0.0.1 that is free, and that nothing running beside this test takes before
/// the test's own process binds it.
///
/// A port that a `bind(0)` got from the kernel and released can go to the next `bind(0)` or
/// outgoing connection of any test running beside, and a broker told to listen on it then
/// fails with "address in use". So the port comes from outside the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`, where `bind(0)` and `connect` take theirs), and is claimed
/// by a lock on a file under the temp dir that this process holds until it exits, so that no
/// other test's `free_port` returns it meanwhile.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    static CLAIMED: Mutex<Vec<fs::File>> = Mutex::new(Vec::new());
    let ephemeral = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| {
            let mut ends = range.split_whitespace().map(|p| p.parse::<u32>().ok());
            Some((ends.next()??, ends.next()??))
        })
        .unwrap_or((32768, 60999));
    let (first, last) = if ephemeral.0 > 11_000 {
        (10_000, ephemeral.0 - 1)
    } else {
        (ephemeral.1 + 1, 65_535)
    };
    let dir = std::env::temp_dir().join("ferry-test-ports");
    fs::create_dir_all(&dir).unwrap();
    let count = last + 1 - first;
    let start = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    for i in 0..u64::from(count) {
        let port =
            u16::try_from(u64::from(first) + (start.wrapping_add(i)) % u64::from(count)).unwrap();
        let claim = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))
            .unwrap();
        // Dropping `claim` releases the lock of a port that turns out taken.
        if claim.try_lock().is_ok() && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            CLAIMED.lock().unwrap().push(claim);
            return port;
        }
    }
    panic!("no free port in {first}..={last} on 127.0.0.1");
}

/// Waits up to 30 s for `address` to accept connections; panics with `log()` when `child`
/// exits first or the time runs out, so that a failed start names its cause.
pub fn wait_listening(child: &mut Child, address: &str, what: &str, log: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(address).is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "{what} exited ({status}) before listening on {address}; log:\n{}",
                log()
            );
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what} to listen on {address}; log:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The text of a shipped pipeline with `replacements` applied; each pattern must occur. The
/// HTTP server a shipped pipeline opens on 127.0.0.1:8048 moves to a free port, so that
/// tests can run side by side.
pub fn pipeline(name: &str, replacements: &[(&str, &str)]) -> String {
    let path = repo_root().join("pipelines").join(name);
    let mut text = fs::read_to_string(&path)
        .unwrap()
        .replace("http: 127.0.0.1:8048", "http: 127.0.0.1:0");
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

/// An agent running only the bundled broker (`num_partitions` per new topic) in `dir`;
/// returns it and the broker's address once it accepts connections.
pub fn broker_agent(dir: &Path, num_partitions: u32) -> (Agent, String) {
    broker_agent_with(dir, num_partitions, &[])
}

/// Like `broker_agent`, with more broker settings (`key: value` lines).
pub fn broker_agent_with(dir: &Path, num_partitions: u32, settings: &[&str]) -> (Agent, String) {
    fs::create_dir_all(dir).unwrap();
    let port = free_port();
    let mut config = format!(
        "broker:\n  listen: 127.0.0.1:{port}\n  data_dir: ./broker\n  num_partitions: {num_partitions}\n"
    );
    for setting in settings {
        config.push_str(&format!("  {setting}\n"));
    }
    let mut agent = Agent::start(dir, &config);
    let bootstrap = format!("127.0.0.1:{port}");
    agent.wait_listening(&bootstrap, "the broker");
    (agent, bootstrap)
}

/// Whether the tests' clients must run rather than skip: `FERRY_REQUIRE_KCAT=1`, set by
/// `scripts/test`, where kcat and the Python clients are provisioned.
pub fn clients_required() -> bool {
    std::env::var("FERRY_REQUIRE_KCAT").is_ok_and(|v| v == "1")
}

/// Whether kcat is installed (a test without it skips, unless the clients are required).
pub fn kcat_available() -> bool {
    let found = Command::new("kcat").arg("-V").output().is_ok();
    assert!(
        found || !clients_required(),
        "kcat is required but not installed"
    );
    found
}

/// `$PYTHON`, the interpreter of the test virtualenv with the Kafka clients (a test without
/// it skips, unless the clients are required).
pub fn python() -> Option<String> {
    let python = std::env::var("PYTHON").ok();
    assert!(
        python.is_some() || !clients_required(),
        "PYTHON (the virtualenv with the Kafka clients) is required but not set"
    );
    python
}

/// Runs `agent ARGS` to its end, its standard input `stdin` (none when `None`); its exit
/// status and output.
pub fn agent_output(args: &[&str], stdin: Option<&[u8]>) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input).unwrap();
    }
    child.wait_with_output().unwrap()
}

/// Runs `agent ARGS`, expects exit status 0 and gives its standard output.
pub fn agent_ok(args: &[&str]) -> String {
    let out = agent_output(args, None);
    assert!(
        out.status.success(),
        "agent {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
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
        Self::start_full(dir, config, env, &[])
    }

    /// Like `start`, with extra arguments after `run FILE`.
    pub fn start_args(dir: &Path, config: &str, args: &[&str]) -> Agent {
        Self::start_full(dir, config, &[], args)
    }

    fn start_full(dir: &Path, config: &str, env: &[(&str, &str)], args: &[&str]) -> Agent {
        let file = dir.join("pipeline.yaml");
        fs::write(&file, config).unwrap();
        let mut all = vec![file.as_os_str()];
        all.extend(args.iter().map(std::ffi::OsStr::new));
        Self::run_args(dir, &all, env)
    }

    /// Runs `agent run ARGS...` with `dir` as working directory and extra environment
    /// variables; its standard error goes to `dir/agent.log`.
    pub fn run_args(dir: &Path, args: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> Agent {
        let log = dir.join("agent.log");
        let child = Command::new(env!("CARGO_BIN_EXE_agent"))
            .arg("run")
            .args(args)
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

    /// Waits for `address` to accept connections; panics with the agent's log when it exits
    /// first or after 30 s.
    pub fn wait_listening(&mut self, address: &str, what: &str) {
        let log = self.log.clone();
        wait_listening(&mut self.child, address, what, || {
            fs::read_to_string(&log).unwrap_or_default()
        });
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
        // A file being written may be renamed or cut back between the listing and the read
        // while an agent runs: skip it (callers poll again).
        match fs::read(&name) {
            Ok(bytes) => out.extend(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("reading {}: {e}", name.display()),
        }
    }
    out
}

/// What a test HTTP server received: the event bodies of every accepted request, in order.
#[derive(Default)]
pub struct Received {
    pub bodies: Mutex<Vec<String>>,
    pub requests: AtomicUsize,
    pub refused: AtomicUsize,
}

/// A minimal HTTP/1.1 server (keep-alive, Content-Length bodies) that decodes the http sink's
/// JSON batches. `respond(n)` gives the status for the n-th request (from 0); `delay` slows
/// every request down.
pub fn http_server(
    respond: impl Fn(usize) -> u16 + Send + Sync + 'static,
    delay: Duration,
) -> (u16, Arc<Received>) {
    http_server_reading(move |n, _| respond(n), delay)
}

/// Like [`http_server`], with `respond(n, body)` seeing the request body too (to refuse the
/// requests that carry a marked event, say).
pub fn http_server_reading(
    respond: impl Fn(usize, &str) -> u16 + Send + Sync + 'static,
    delay: Duration,
) -> (u16, Arc<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let received = Arc::new(Received::default());
    let respond = Arc::new(respond);
    let state = Arc::clone(&received);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let state = Arc::clone(&state);
            let respond = Arc::clone(&respond);
            std::thread::spawn(move || serve(stream, &state, &*respond, delay));
        }
    });
    (port, received)
}

fn serve(
    stream: TcpStream,
    state: &Received,
    respond: &dyn Fn(usize, &str) -> u16,
    delay: Duration,
) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0;
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        std::thread::sleep(delay);
        let n = state.requests.fetch_add(1, Ordering::SeqCst);
        let status = respond(n, &String::from_utf8_lossy(&body));
        if status == 200 {
            let events: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
            let mut bodies = state.bodies.lock().unwrap();
            for event in events {
                bodies.push(event["body"].as_str().unwrap().to_owned());
            }
        } else {
            state.refused.fetch_add(1, Ordering::SeqCst);
        }
        let reply = format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n");
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// A tmpfs of `megabytes` mounted on a fresh directory, unmounted on drop (needs root, which
/// the test machines and CI have).
pub struct Tmpfs {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(megabytes: u32) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "mounting a tmpfs needs root");
        Tmpfs {
            path: dir.path().to_owned(),
            _dir: dir,
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// A small deterministic generator for kill delays and writers' choices in crash tests.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// `CRASH_SEED` from the environment, or a fresh one; printed so a failure can be replayed.
pub fn crash_seed() -> u64 {
    let seed = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("CRASH_SEED={seed}");
    seed
}

/// A GET on the agent's HTTP server: the status code and body.
pub fn http_get(address: &str, path: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    // Bodies are small: axum sends them with a Content-Length, or chunked in one chunk.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let (_, rest) = body.split_once("\r\n").unwrap();
        rest.rsplit_once("\r\n0\r\n")
            .map_or(rest, |(b, _)| b)
            .to_owned()
    } else {
        body.to_owned()
    };
    (status, body)
}

/// The address of the agent's HTTP server, from its log (`http: 127.0.0.1:0` picks a port).
pub fn http_address(agent: &Agent) -> Option<String> {
    agent
        .log()
        .lines()
        .find(|l| l.contains("HTTP server listening"))
        .and_then(|l| l.split("address=").nth(1))
        .and_then(|a| a.split_whitespace().next().map(str::to_owned))
}

/// Debian's headless Chromium, if installed (required with `FERRY_REQUIRE_KCAT=1`).
pub fn chromium() -> Option<&'static str> {
    let found = ["chromium", "chromium-browser"].into_iter().find(|c| {
        std::process::Command::new(c)
            .arg("--version")
            .output()
            .is_ok()
    });
    assert!(
        found.is_some() || !clients_required(),
        "chromium is required but not installed"
    );
    found
}

/// The console's page at `address` as Chromium renders it after `seconds` (its DOM), with a
/// screenshot at `screenshot`: `None` (after saying why) without Chromium or the test
/// virtualenv.
pub fn browse_console(address: &str, screenshot: &Path, seconds: u32) -> Option<String> {
    let Some(chromium) = chromium() else {
        println!("chromium is not installed: the console is not checked");
        return None;
    };
    let browsed = std::process::Command::new(python()?)
        .arg(repo_root().join("tests/console_browser.py"))
        .arg(chromium)
        .arg(format!("http://{address}/"))
        .arg(screenshot)
        .arg(seconds.to_string())
        .output()
        .unwrap();
    assert!(browsed.status.success(), "the browser: {browsed:?}");
    Some(String::from_utf8_lossy(&browsed.stdout).into_owned())
}
