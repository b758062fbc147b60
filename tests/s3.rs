//! The `s3` sink end to end: the real agent writing to a real S3 server (SeaweedFS) on
//! 127.0.0.1, read back with boto3 and pyarrow, with SIGKILLs of the agent during uploads.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::harness::{Agent, Lcg, Tmpfs, crash_seed, http_get, wait_until};
use crate::s3_harness::{Fault, FaultProxy, S3Server};

pub(crate) const BUCKET: &str = "logs";

/// `lines` lines of about 100 bytes, numbered, in `dir/logs/app.log`.
pub(crate) fn write_log(dir: &Path, lines: usize) {
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mut text = String::with_capacity(lines * 101);
    for i in 0..lines {
        text.push_str(&format!("{i:010} {}\n", "x".repeat(89)));
    }
    std::fs::write(logs.join("app.log"), text).unwrap();
}

/// taildir → file channel → s3, with `sink_options` added to the sink.
pub(crate) fn taildir_to_s3(server: &S3Server, sink_options: &str) -> String {
    taildir_to_s3_at(&server.endpoint, sink_options)
}

/// Like [`taildir_to_s3`], the sink reaching the store at `endpoint` (a [`FaultProxy`]'s).
fn taildir_to_s3_at(endpoint: &str, sink_options: &str) -> String {
    format!(
        "\
agent:
  data_dir: ./state
sources:
  app:
    type: taildir
    channels: [durable]
    filegroups:
      app: ./logs/*.log
    batch_size: 1000
channels:
  durable:
    type: file
    transaction_capacity: 2000
sinks:
  archive:
    type: s3
    channel: durable
    batch_size: 2000
    bucket: {BUCKET}
    endpoint: {endpoint}
    access_key_id: ${{S3_KEY}}
    secret_access_key: ${{S3_SECRET}}
{sink_options}"
    )
}

/// `config` with the agent's HTTP server on a free port and `/health` failing a component
/// after 2 s without a success.
fn watched(config: &str) -> String {
    config.replace(
        "agent:\n",
        "agent:\n  http: 127.0.0.1:0\n  unhealthy_after: 2s\n",
    )
}

fn keys(server: &S3Server) -> [(&'static str, String); 2] {
    [
        ("S3_KEY", server.access_key.clone()),
        ("S3_SECRET", server.secret_key.clone()),
    ]
}

pub(crate) fn start(dir: &Path, config: &str, server: &S3Server) -> Agent {
    let env = keys(server);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Agent::start_with(dir, config, &env)
}

/// The numbers of the lines read back, counted.
fn counted(lines: &[(String, String)]) -> HashMap<u64, usize> {
    let mut seen = HashMap::new();
    for (key, line) in lines {
        let number: u64 = line
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("object {key} holds a line that is not ours: {line:?}"));
        *seen.entry(number).or_insert(0) += 1;
    }
    seen
}

#[test]
fn s3_taildir_through_file_channel_is_exactly_once_across_sigkills_during_uploads() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = S3Server::start(dir.path()) else {
        return;
    };
    server.create_bucket(BUCKET);
    let total = 200_000;
    write_log(dir.path(), total);
    // 6 MiB objects go up as two parts of 5 MiB: multipart uploads are in flight when killed.
    let config = taildir_to_s3(
        &server,
        "    path: app/%Y\n    use_local_time: true\n    roll_size: 6MiB\n    roll_interval: 2s\n    part_size: 5MiB\n    parts_in_flight: 2\n",
    );
    let mut rng = Lcg(crash_seed());
    for round in 0..5 {
        let mut agent = start(dir.path(), &config, &server);
        wait_until(Duration::from_secs(60), "the agent to start", || {
            agent.log().contains("pipeline started")
        });
        std::thread::sleep(Duration::from_millis(200 + rng.next_below(1500)));
        agent.signal(Signal::SIGKILL);
        let status = agent.wait(Duration::from_secs(30));
        assert!(
            !status.success(),
            "round {round}: the agent ended before the kill"
        );
    }
    let mut agent = start(dir.path(), &config, &server);
    wait_until(Duration::from_secs(120), "every line in objects", || {
        let listed = server.list_objects(BUCKET);
        listed.iter().map(|(_, size)| size).sum::<u64>() >= (total as u64) * 100
    });
    agent.signal(Signal::SIGTERM);
    assert!(
        agent.wait(Duration::from_secs(60)).success(),
        "{}",
        agent.log()
    );

    let lines = server.read_lines(BUCKET, "app/");
    let seen = counted(&lines);
    let missing: Vec<u64> = (0..total as u64)
        .filter(|n| !seen.contains_key(n))
        .collect();
    let twice: Vec<(&u64, &usize)> = seen.iter().filter(|(_, c)| **c > 1).collect();
    assert!(
        missing.is_empty() && twice.is_empty() && seen.len() == total,
        "{} lines missing (first {:?}), {} more than once (e.g. {:?}); log:\n{}",
        missing.len(),
        missing.first(),
        twice.len(),
        twice.first(),
        agent.log()
    );
    // Each object holds exactly the events its name says: whole, never partial.
    let mut per_object: HashMap<&str, usize> = HashMap::new();
    for (key, _) in &lines {
        *per_object.entry(key.as_str()).or_insert(0) += 1;
    }
    for (key, count) in &per_object {
        let name = key.rsplit('/').next().unwrap();
        let range = name.strip_prefix("archive.").unwrap();
        let (first, last) = range.split_once('-').unwrap();
        let (first, last): (u64, u64) = (first.parse().unwrap(), last.parse().unwrap());
        assert_eq!(
            (last - first + 1) as usize,
            *count,
            "object {key} does not hold the events its name says"
        );
    }
    assert!(
        server.multipart_uploads(BUCKET).is_empty(),
        "multipart uploads left in progress: {:?}",
        server.multipart_uploads(BUCKET)
    );
    println!("{} objects, {} lines", per_object.len(), lines.len());
}

/// POSTs events (headers, body) to the agent's http source.
fn post(port: u16, events: &[(Vec<(&str, String)>, String)]) {
    let array: Vec<serde_json::Value> = events
        .iter()
        .map(|(headers, body)| {
            let headers: serde_json::Map<String, serde_json::Value> = headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(v.as_str())))
                .collect();
            serde_json::json!({"headers": headers, "body": body})
        })
        .collect();
    let body = serde_json::to_vec(&array).unwrap();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    use std::io::{Read, Write};
    write!(
        stream,
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    stream.write_all(&body).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[test]
fn s3_keys_follow_the_path_escapes_and_json_and_parquet_read_back_with_their_headers() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = S3Server::start(dir.path()) else {
        return;
    };
    server.create_bucket(BUCKET);
    let port = crate::harness::free_port();
    let sink = |name: &str, channel: &str, rest: &str| {
        format!(
            "  {name}:\n    type: s3\n    channel: {channel}\n    bucket: {BUCKET}\n    endpoint: {}\n    access_key_id: ${{S3_KEY}}\n    secret_access_key: ${{S3_SECRET}}\n    time_zone: UTC\n    roll_interval: 1s\n{rest}",
            server.endpoint
        )
    };
    let config = format!(
        "agent:\n  data_dir: ./state\nsources:\n  web:\n    type: http\n    port: {port}\n    channels: [a, b]\nchannels:\n  a:\n    type: file\n    data_dir: ./a\n  b:\n    type: file\n    data_dir: ./b\nsinks:\n{}{}",
        sink(
            "as_json",
            "a",
            "    path: json/%Y/%m/%d/%{host}\n    format: json\n    compression: gzip\n"
        ),
        sink(
            "as_parquet",
            "b",
            "    path: parquet/day=%Y-%m-%d\n    format: parquet\n    compression: zstd\n"
        ),
    );
    let agent = start(dir.path(), &config, &server);
    wait_until(Duration::from_secs(60), "the http source", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    // Three days: 2026-03-01, 2026-03-02 and 2026-03-03, 10:00 UTC; two hosts.
    let days = [1_772_359_200_000_i64, 1_772_445_600_000, 1_772_532_000_000];
    let mut events = Vec::new();
    for (d, day) in days.iter().enumerate() {
        for i in 0..20 {
            let host = if i % 2 == 0 { "web-1" } else { "web-2" };
            let mut headers = vec![
                ("timestamp", (day + i).to_string()),
                ("host", host.to_owned()),
            ];
            if i % 5 == 0 {
                headers.push(("level", "warn".to_owned()));
            }
            events.push((headers, format!("day {d} event {i} \"quoted\" é")));
        }
    }
    post(port, &events);
    wait_until(Duration::from_secs(60), "the objects of both sinks", || {
        let listed = server.list_objects(BUCKET);
        listed
            .iter()
            .filter(|(k, _)| k.starts_with("json/"))
            .count()
            == 6
            && listed
                .iter()
                .filter(|(k, _)| k.starts_with("parquet/"))
                .count()
                == 3
    });
    let listed: Vec<String> = server
        .list_objects(BUCKET)
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    for expected in [
        "json/2026/03/01/web-1/as_json.",
        "json/2026/03/02/web-2/as_json.",
        "json/2026/03/03/web-1/as_json.",
        "parquet/day=2026-03-01/as_parquet.",
        "parquet/day=2026-03-03/as_parquet.",
    ] {
        assert!(
            listed.iter().any(|k| k.starts_with(expected)),
            "no object under {expected}: {listed:?}"
        );
    }
    assert!(
        listed
            .iter()
            .filter(|k| k.starts_with("json/"))
            .all(|k| k.ends_with(".jsonl.gz"))
    );
    assert!(
        listed
            .iter()
            .filter(|k| k.starts_with("parquet/"))
            .all(|k| k.ends_with(".parquet"))
    );

    for (prefix, format) in [
        ("json/", crate::s3_harness::RecordFormat::Json),
        ("parquet/", crate::s3_harness::RecordFormat::Parquet),
    ] {
        let records = server.read_records(BUCKET, prefix, format);
        assert_eq!(records.len(), 60, "{prefix}: {records:?}");
        for (key, record) in &records {
            // JSON lines carry headers in an object; Parquet rows a column per header.
            let (headers, body) = match record.get("headers") {
                Some(headers) => (headers.clone(), record["body"].clone()),
                None => (record.clone(), record["body"].clone()),
            };
            let body = body.as_str().unwrap();
            let d: usize = body[4..5].parse().unwrap();
            let day = ["2026-03-01", "2026-03-02", "2026-03-03"][d]
                .replace('-', if prefix == "json/" { "/" } else { "-" });
            assert!(key.contains(&day), "{body} is in {key}");
            let host = headers["host"].as_str().unwrap();
            if prefix == "json/" {
                assert!(key.contains(host), "{body} of {host} is in {key}");
            }
            let i: i64 = body.rsplit(' ').nth(2).unwrap().parse().unwrap();
            assert_eq!(
                headers["timestamp"].as_str().unwrap(),
                (days[d] + i).to_string()
            );
            assert_eq!(
                headers.get("level").and_then(|l| l.as_str()),
                (i % 5 == 0).then_some("warn"),
                "{key}: {record}"
            );
        }
    }
    drop(agent);
}

#[test]
fn s3_a_store_that_is_down_or_refuses_keys_fails_health_and_delivery_resumes_when_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut server) = S3Server::start(dir.path()) else {
        return;
    };
    server.create_bucket(BUCKET);
    write_log(dir.path(), 1000);
    // Wrong keys first: the sink names the bucket and the store's refusal.
    let config = watched(&taildir_to_s3(&server, "    roll_interval: 1s\n"));
    let wrong = config.replace("${S3_SECRET}", "not-the-secret");
    let mut agent = start(dir.path(), &wrong, &server);
    let address = wait_for_http(&agent);
    wait_until(Duration::from_secs(30), "/health to answer 503", || {
        crate::harness::http_get(&address, "/health").0 == 503
    });
    let health = crate::harness::http_get(&address, "/health").1;
    assert!(
        health.contains("archive") && health.contains("s3://logs/"),
        "{health}"
    );
    assert!(server.list_objects(BUCKET).is_empty());
    agent.signal(Signal::SIGTERM);
    agent.wait(Duration::from_secs(60));

    // Right keys, then the store goes down: /health fails, nothing is lost, and delivery
    // resumes by itself when it is back.
    let mut agent = start(dir.path(), &config, &server);
    let address = wait_for_http(&agent);
    wait_until(Duration::from_secs(60), "the first 1000 lines up", || {
        server.read_lines(BUCKET, "").len() == 1000
    });
    server.stop();
    append_log(dir.path(), 1000, 2000);
    wait_until(Duration::from_secs(30), "/health to answer 503", || {
        crate::harness::http_get(&address, "/health").0 == 503
    });
    server.restart();
    wait_until(Duration::from_secs(90), "the next 1000 lines up", || {
        server.read_lines(BUCKET, "").len() >= 2000
    });
    wait_until(Duration::from_secs(30), "/health to answer 200", || {
        crate::harness::http_get(&address, "/health").0 == 200
    });
    assert_each_line_once(&server, 2000, &agent);
    agent.signal(Signal::SIGTERM);
    assert!(agent.wait(Duration::from_secs(60)).success());
}

fn wait_for_http(agent: &Agent) -> String {
    let mut address = None;
    wait_until(Duration::from_secs(60), "the agent's HTTP server", || {
        address = crate::harness::http_address(agent);
        address.is_some()
    });
    address.unwrap()
}

/// Appends lines `from..to` to `dir/logs/app.log`.
fn append_log(dir: &Path, from: usize, to: usize) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("logs/app.log"))
        .unwrap();
    for i in from..to {
        writeln!(file, "{i:010} {}", "x".repeat(89)).unwrap();
    }
}

#[test]
fn s3_a_flume_collector_file_with_an_s3a_hdfs_sink_runs_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = S3Server::start(dir.path()) else {
        return;
    };
    server.create_bucket(BUCKET);
    write_log(dir.path(), 500);
    let file = crate::harness::repo_root().join("tests/flume-conf/taildir-file-hdfs-s3.conf");
    let env = server.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut agent = Agent::run_args(
        dir.path(),
        &[file.as_os_str(), "--name".as_ref(), "a1".as_ref()],
        &env,
    );
    // Flume's default rolls (1024 bytes, 10 events; the file sets none) finish an object
    // after every batch of the source (100 lines: a batch is not split across objects).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while server.list_objects(BUCKET).len() < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "objects from the Flume file: {:?}\n{}",
            server.list_objects(BUCKET),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    agent.signal(Signal::SIGTERM);
    assert!(
        agent.wait(Duration::from_secs(60)).success(),
        "{}",
        agent.log()
    );
    let lines = server.read_lines(BUCKET, "flume/");
    let seen = counted(&lines);
    assert_eq!(seen.len(), 500, "{}", agent.log());
    assert!(seen.values().all(|c| *c == 1));
    let today = jiff_free_today();
    assert!(
        lines
            .iter()
            .all(|(key, _)| key.starts_with(&format!("flume/{today}/FlumeData.k1."))),
        "{:?}",
        lines.first()
    );
}

/// Today's date (local time, as the sink's default time zone) as `YYYY-MM-DD`, by `date`.
fn jiff_free_today() -> String {
    let out = std::process::Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Waits until `/health` fails sink `archive` with an error holding `needle`; that error.
fn wait_for_failure(agent: &Agent, address: &str, needle: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let error = sink_failure(address);
        if let Some(error) = error.as_ref().filter(|e| e.contains(needle)) {
            return error.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "/health did not fail sink `archive` with `{needle}` within 30 s; its last error: {error:?}; log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The error `/health` fails sink `archive` with, if it does.
fn sink_failure(address: &str) -> Option<String> {
    let (status, body) = http_get(address, "/health");
    if status != 503 {
        return None;
    }
    let health: Value = serde_json::from_str(&body).unwrap();
    health["failing"]
        .as_array()?
        .iter()
        .find(|f| f["component"] == "SINK.archive")
        .map(|f| f["error"].as_str().unwrap().to_owned())
}

/// One component of `/metrics.json` (Flume's layout: `SINK.archive`, ...).
fn flume_metrics(address: &str, component: &str) -> Value {
    let (status, body) = http_get(address, "/metrics.json");
    assert_eq!(status, 200, "{body}");
    let all: Value = serde_json::from_str(&body).unwrap();
    all[component].clone()
}

/// A figure of `/metrics.json` as the number its string says.
fn flume_figure(metrics: &Value, key: &str) -> u64 {
    metrics[key]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {metrics}"))
}

/// Checks that the lines `0..total` are in the bucket, each exactly once.
fn assert_each_line_once(server: &S3Server, total: u64, agent: &Agent) {
    let seen = counted(&server.read_lines(BUCKET, ""));
    let missing: Vec<u64> = (0..total).filter(|n| !seen.contains_key(n)).collect();
    let twice: Vec<(&u64, &usize)> = seen.iter().filter(|(_, c)| **c > 1).collect();
    assert!(
        missing.is_empty() && twice.is_empty() && seen.len() as u64 == total,
        "{} lines missing (first {:?}), {} more than once (e.g. {:?}); log:\n{}",
        missing.len(),
        missing.first(),
        twice.len(),
        twice.first(),
        agent.log()
    );
}

/// The store answers 503 SlowDown, then 500 InternalError, to every request (a fault proxy
/// between the sink and it): `/health` fails naming the sink, the bucket, the key and the
/// store's code; the uploads are retried further and further apart; new events wait in the
/// channel; when the store answers again, delivery resumes by itself, every line once.
#[test]
fn s3_slow_down_and_internal_errors_fail_health_and_delivery_resumes_with_backoff_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = S3Server::start(dir.path()) else {
        return;
    };
    server.create_bucket(BUCKET);
    let proxy = FaultProxy::start(&server);
    write_log(dir.path(), 1000);
    let config = watched(&taildir_to_s3_at(
        &proxy.endpoint,
        "    roll_interval: 1s\n",
    ));
    let mut agent = start(dir.path(), &config, &server);
    let address = wait_for_http(&agent);
    wait_until(Duration::from_secs(60), "the first 1000 lines up", || {
        server.read_lines(BUCKET, "").len() == 1000
    });

    proxy.set(Fault::Status(503));
    append_log(dir.path(), 1000, 2000);
    let error = wait_for_failure(&agent, &address, "SlowDown");
    assert!(
        error.contains("sink `archive`") && error.contains("s3://logs/archive."),
        "the error names neither the sink nor the bucket and key: {error}"
    );
    // The sink takes nothing more while its uploads fail: new lines wait in the channel.
    append_log(dir.path(), 2000, 3000);
    wait_until(
        Duration::from_secs(30),
        "lines waiting in the channel",
        || flume_figure(&flume_metrics(&address, "CHANNEL.durable"), "ChannelSize") > 0,
    );

    proxy.set(Fault::Status(500));
    let error = wait_for_failure(&agent, &address, "InternalError");
    assert!(error.contains("s3://logs/archive."), "{error}");
    assert_eq!(server.read_lines(BUCKET, "").len(), 1000);
    let refused = proxy.requests(Fault::Status(503)) + proxy.requests(Fault::Status(500));

    proxy.set(Fault::Pass);
    wait_until(Duration::from_secs(60), "all 3000 lines up", || {
        server.read_lines(BUCKET, "").len() >= 3000
    });
    wait_until(Duration::from_secs(30), "/health to answer 200", || {
        http_get(&address, "/health").0 == 200
    });
    assert_each_line_once(&server, 3000, &agent);

    // Backoff: each failed upload waits longer than the one before before it is tried again.
    let log = agent.log();
    // (An error may span lines: the store's XML answer is in it.)
    let waits: Vec<&str> = log
        .split("upload failed")
        .skip(1)
        .filter_map(|failure| failure.split("retry_in=").nth(1))
        .filter_map(|w| w.split_whitespace().next())
        .collect();
    let seconds: Vec<u64> = waits
        .iter()
        .map(|w| w.trim_end_matches('s').parse().unwrap())
        .collect();
    assert!(
        seconds.len() >= 2 && seconds.windows(2).all(|w| w[1] == (w[0] * 2).min(30)),
        "the waits between failed uploads: {waits:?}; log:\n{log}"
    );
    println!("{refused} requests refused, waits {waits:?}");
    agent.signal(Signal::SIGTERM);
    assert!(agent.wait(Duration::from_secs(60)).success());
}

/// The samples of sink `archive` in the agent's `/metrics` by sample name, with the type of
/// every family (`# TYPE`) by family name.
fn prometheus(address: &str) -> (HashMap<String, f64>, HashMap<String, String>) {
    let (status, text) = http_get(address, "/metrics");
    assert_eq!(status, 200, "{text}");
    let mut samples = HashMap::new();
    let mut types = HashMap::new();
    for line in text.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let (family, kind) = declared.split_once(' ').unwrap();
            types.insert(family.to_owned(), kind.to_owned());
        } else if let Some((sample, rest)) = line.split_once('{')
            && let Some((labels, value)) = rest.rsplit_once("} ")
            && labels.split(',').any(|l| l == "name=\"archive\"")
            && !labels.contains("le=")
        {
            samples.insert(sample.to_owned(), value.parse().unwrap());
        }
    }
    (samples, types)
}

/// The web console as headless Chromium shows it after its script ran (the DOM), by
/// `tests/console_browser.py`; `None` (after saying why) without Chromium, unless the clients
/// are required.
fn console_page(address: &str, dir: &Path, name: &str) -> Option<String> {
    crate::harness::browse_console(address, &dir.join(format!("{name}.png")), 2)
}

/// The box of component `name` in the console's page, its markup and its text.
fn console_box(page: &str, name: &str) -> (String, String) {
    let at = page
        .find(&format!("data-name=\"{name}\""))
        .unwrap_or_else(|| panic!("no component {name} in the console:\n{page}"));
    let start = page[..at].rfind("<div").unwrap();
    // Up to the next box, or the end of the pipeline's section.
    let end = ["<div class=\"box", "</section>"]
        .iter()
        .filter_map(|next| page[at..].find(next))
        .min()
        .map_or(page.len(), |e| at + e);
    let markup = page[start..end].to_owned();
    let mut text = String::new();
    let mut in_tag = false;
    for c in markup.chars() {
        match c {
            '<' => in_tag = true,
            '>' => {
                in_tag = false;
                text.push(' ');
            }
            _ if !in_tag => text.push(c),
            _ => {}
        }
    }
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    (markup, text)
}

/// The agent starts before its bucket exists: `/health` fails naming the sink, the bucket
/// and the key, `/metrics.json` shows the sink's last error and the object waiting, the
/// console's box of the sink the error; the bucket is created and delivery resumes by itself,
/// every line once. Then the sink's figures: objects and bytes written, upload latency, parts
/// in flight and objects waiting in `/metrics` (as counters, a histogram and gauges) and
/// `/metrics.json`, and the objects written on the sink's box in the console.
#[test]
fn s3_a_bucket_made_late_fails_health_naming_it_and_the_sinks_figures_show_in_metrics_and_console()
{
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = S3Server::start(dir.path()) else {
        return;
    };
    write_log(dir.path(), 1000);
    let config = watched(&taildir_to_s3(&server, "    roll_interval: 1s\n"));
    let mut agent = start(dir.path(), &config, &server);
    let address = wait_for_http(&agent);
    let error = wait_for_failure(&agent, &address, "NoSuchBucket");
    assert!(
        error.contains("sink `archive`") && error.contains("s3://logs/archive."),
        "the error names neither the sink nor the bucket and key: {error}"
    );
    let sink = flume_metrics(&address, "SINK.archive");
    assert!(
        sink["LastError"].as_str().unwrap().contains("NoSuchBucket"),
        "{sink}"
    );
    assert_eq!(flume_figure(&sink, "ObjectWrittenCount"), 0, "{sink}");
    assert!(flume_figure(&sink, "ObjectsWaitingCount") >= 1, "{sink}");
    // What the console and /metrics lack is gathered here and reported together at the end.
    let mut missing = Vec::new();
    let failing_page = console_page(&address, dir.path(), "console-failing");
    if let Some(page) = &failing_page {
        let (markup, text) = console_box(page, "archive");
        if !(markup.contains("box failing") && text.contains("NoSuchBucket")) {
            missing.push(format!(
                "the console's sink box shows no failure while the bucket is missing: {markup}"
            ));
        }
    }

    server.create_bucket(BUCKET);
    wait_until(Duration::from_secs(60), "the first 1000 lines up", || {
        server.read_lines(BUCKET, "").len() == 1000
    });
    append_log(dir.path(), 1000, 2000);
    wait_until(Duration::from_secs(60), "all 2000 lines up", || {
        server.read_lines(BUCKET, "").len() >= 2000
    });
    wait_until(Duration::from_secs(30), "/health to answer 200", || {
        http_get(&address, "/health").0 == 200
    });
    assert_each_line_once(&server, 2000, &agent);

    let objects = server.list_objects(BUCKET);
    let (count, bytes) = (
        objects.len() as u64,
        objects.iter().map(|(_, size)| size).sum::<u64>(),
    );
    // Uploads end a moment before the figures are counted.
    wait_until(Duration::from_secs(10), "the objects counted", || {
        flume_figure(
            &flume_metrics(&address, "SINK.archive"),
            "ObjectWrittenCount",
        ) == count
    });
    let sink = flume_metrics(&address, "SINK.archive");
    for (key, expected) in [
        ("ObjectWrittenCount", count),
        ("ObjectWrittenBytes", bytes),
        ("PartsInFlight", 0),
        ("ObjectsWaitingCount", 0),
        ("ObjectsWaitingBytes", 0),
    ] {
        assert_eq!(flume_figure(&sink, key), expected, "{key}: {sink}");
    }
    assert_eq!(sink["LastError"], "", "{sink}");

    let (samples, types) = prometheus(&address);
    let sample = |name: &str| {
        *samples
            .get(name)
            .unwrap_or_else(|| panic!("no {name}{{name=\"archive\"}} in /metrics: {samples:?}"))
    };
    assert_eq!(sample("ferry_sink_object_written_total"), count as f64);
    assert_eq!(
        sample("ferry_sink_object_written_bytes_total"),
        bytes as f64
    );
    assert_eq!(
        sample("ferry_sink_upload_latency_seconds_count"),
        count as f64
    );
    assert!(sample("ferry_sink_upload_latency_seconds_sum") > 0.0);
    for (family, kind) in [
        ("ferry_sink_object_written", "counter"),
        ("ferry_sink_object_written_bytes", "counter"),
        ("ferry_sink_upload_latency_seconds", "histogram"),
        ("ferry_sink_parts_in_flight", "gauge"),
        ("ferry_sink_objects_waiting", "gauge"),
        ("ferry_sink_objects_waiting_bytes", "gauge"),
    ] {
        let declared = types.get(family).map(String::as_str);
        if declared != Some(kind) {
            missing.push(format!(
                "/metrics declares {family} as {declared:?}, not as a {kind}"
            ));
        }
    }
    for gauge in [
        "ferry_sink_parts_in_flight",
        "ferry_sink_objects_waiting",
        "ferry_sink_objects_waiting_bytes",
    ] {
        // A gauge's sample has the family's name; a counter's ends in `_total`.
        let value = samples
            .get(gauge)
            .or_else(|| samples.get(&format!("{gauge}_total")));
        assert_eq!(value, Some(&0.0), "{gauge}: {samples:?}");
    }

    if failing_page.is_some()
        && let Some(page) = console_page(&address, dir.path(), "console-delivered")
    {
        let (markup, text) = console_box(&page, "archive");
        // The number of objects written, a few words from the word.
        let words: Vec<String> = text
            .split_whitespace()
            .map(|w| w.to_lowercase().replace(',', ""))
            .collect();
        let shown = words.iter().enumerate().any(|(at, word)| {
            word.contains("object")
                && words[at.saturating_sub(3)..(at + 4).min(words.len())]
                    .iter()
                    .any(|w| w.trim_matches(|c: char| !c.is_ascii_digit()) == count.to_string())
        });
        if !shown || markup.contains("box failing") {
            missing.push(format!(
                "the console's sink box does not show the {count} objects written (or still fails): {text}"
            ));
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
    agent.signal(Signal::SIGTERM);
    assert!(agent.wait(Duration::from_secs(60)).success());
}

/// Writes `path` until its file system is full.
fn fill(path: &Path) {
    use std::io::Write;
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 << 10];
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    let _ = file.sync_all();
}

/// The sink's staging directory on a small file system of its own, which another file fills:
/// writing the staging file fails, `/health` fails the sink naming the file, the events wait
/// in the channel and nothing goes up; the space freed, delivery resumes by itself, every line
/// once.
#[test]
fn s3_a_full_staging_disk_fails_health_naming_the_file_and_delivery_resumes_once_space_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = S3Server::start(dir.path()) else {
        return;
    };
    server.create_bucket(BUCKET);
    let disk = Tmpfs::mount(2);
    let staging = disk.path.join("staging");
    write_log(dir.path(), 1000);
    let config = watched(&taildir_to_s3(
        &server,
        &format!(
            "    roll_interval: 1s\n    staging_directory: {}\n",
            staging.display()
        ),
    ));
    let mut agent = start(dir.path(), &config, &server);
    let address = wait_for_http(&agent);
    wait_until(Duration::from_secs(60), "the first 1000 lines up", || {
        server.read_lines(BUCKET, "").len() == 1000
    });
    // The uploaded file's staging copy is removed just after the upload: removed after the
    // disk was filled, it would free room for the next lines, which would then go up.
    wait_until(
        Duration::from_secs(30),
        "the uploaded staging file removed",
        || {
            std::fs::read_dir(&staging)
                .map(|entries| entries.count() == 0)
                .unwrap_or(true)
        },
    );

    let filler = disk.path.join("filler");
    fill(&filler);
    append_log(dir.path(), 1000, 2000);
    let error = wait_for_failure(&agent, &address, "No space left on device");
    println!("/health: {error}");
    assert!(
        error.contains(&staging.display().to_string()),
        "the error does not name the staging file: {error}"
    );
    let log = agent.log();
    assert!(
        log.lines()
            .any(|l| l.contains("sink=archive") && l.contains("No space left on device")),
        "no error of the sink's in the log:\n{log}"
    );
    wait_until(
        Duration::from_secs(30),
        "lines waiting in the channel",
        || flume_figure(&flume_metrics(&address, "CHANNEL.durable"), "ChannelSize") > 0,
    );
    assert_eq!(server.read_lines(BUCKET, "").len(), 1000);

    std::fs::remove_file(&filler).unwrap();
    wait_until(Duration::from_secs(60), "all 2000 lines up", || {
        server.read_lines(BUCKET, "").len() >= 2000
    });
    wait_until(Duration::from_secs(30), "/health to answer 200", || {
        http_get(&address, "/health").0 == 200
    });
    assert_each_line_once(&server, 2000, &agent);
    agent.signal(Signal::SIGTERM);
    assert!(agent.wait(Duration::from_secs(60)).success());
}
