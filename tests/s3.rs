//! The `s3` sink end to end: the real agent writing to a real S3 server (SeaweedFS) on
//! 127.0.0.1, read back with boto3 and pyarrow, with SIGKILLs of the agent during uploads.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness::{Agent, Lcg, crash_seed, wait_until};
use crate::s3_harness::S3Server;

const BUCKET: &str = "logs";

/// `lines` lines of about 100 bytes, numbered, in `dir/logs/app.log`.
fn write_log(dir: &Path, lines: usize) {
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mut text = String::with_capacity(lines * 101);
    for i in 0..lines {
        text.push_str(&format!("{i:010} {}\n", "x".repeat(89)));
    }
    std::fs::write(logs.join("app.log"), text).unwrap();
}

/// taildir → file channel → s3, with `sink_options` added to the sink.
fn taildir_to_s3(server: &S3Server, sink_options: &str) -> String {
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
{sink_options}",
        endpoint = server.endpoint
    )
}

fn keys(server: &S3Server) -> [(&'static str, String); 2] {
    [
        ("S3_KEY", server.access_key.clone()),
        ("S3_SECRET", server.secret_key.clone()),
    ]
}

fn start(dir: &Path, config: &str, server: &S3Server) -> Agent {
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
