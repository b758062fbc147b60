//! The `s3` sink's sweep at start: multipart uploads with the shape of the sink's keys that no
//! progress record holds (a crash between CreateMultipartUpload and recording its id) are
//! aborted; other writers' uploads are left alone; a sweep that fails does not stop the sink.
//! The orphans are made by boto3, a client that is not ours.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness::{Agent, python, wait_until};
use crate::s3_harness::S3Server;

use crate::s3::{BUCKET, taildir_to_s3, write_log};

/// Keys the sink `archive` with `path: app/%Y` and `file_suffix: .log` could have written:
/// channel sequence numbers, and the form without them (opened ms, staging id).
const OURS: [&str; 2] = [
    "app/2020/archive.00000000000000000001-00000000000000000010.log",
    "app/2021/archive.1700000000000-0000000042.log",
];

/// Keys that are not the sink's: another sink's name (one that ends like it, too), another
/// suffix, outside the sink's prefix, not its numbering.
const NOT_OURS: [&str; 5] = [
    "app/2020/other.00000000000000000001-00000000000000000010.log",
    "app/2020/my-archive.00000000000000000001-00000000000000000010.log",
    "app/2020/archive.00000000000000000001-00000000000000000010.log.gz",
    "elsewhere/archive.00000000000000000001-00000000000000000010.log",
    "app/2020/archive.final.log",
];

/// Starts a multipart upload of each key with boto3 and sends one part of it, as a writer that
/// crashed before completing or recording it; their upload ids.
fn orphan_uploads(server: &S3Server, keys: &[&str]) -> Vec<String> {
    let script = r#"
import sys
import boto3
import botocore.config

s3 = boto3.client("s3", config=botocore.config.Config(s3={"addressing_style": "path"}))
bucket = sys.argv[1]
for key in sys.argv[2:]:
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"x" * 1024)
    print(upload)
"#;
    let out = Command::new(python().unwrap())
        .arg("-c")
        .arg(script)
        .arg(BUCKET)
        .args(keys)
        .envs(server.env())
        .env("AWS_MAX_ATTEMPTS", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "creating multipart uploads failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn start(dir: &Path, server: &S3Server) -> Agent {
    let config = taildir_to_s3(
        server,
        "    path: app/%Y\n    use_local_time: true\n    file_suffix: .log\n    roll_interval: 1s\n",
    );
    crate::s3::start(dir, &config, server)
}

fn sorted(keys: &[&str]) -> Vec<String> {
    let mut keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
    keys.sort();
    keys
}

/// The keys of the multipart uploads in progress, sorted.
fn in_progress(server: &S3Server) -> Vec<String> {
    let mut keys = server.multipart_uploads(BUCKET);
    keys.sort();
    keys
}

#[test]
fn s3_sweep_aborts_the_sinks_abandoned_multipart_uploads_and_leaves_others_alone() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = S3Server::start(dir.path()) else {
        return;
    };
    server.create_bucket(BUCKET);
    let all: Vec<&str> = OURS.iter().chain(NOT_OURS.iter()).copied().collect();
    assert_eq!(orphan_uploads(&server, &all).len(), all.len());
    assert_eq!(in_progress(&server), sorted(&all));
    write_log(dir.path(), 100);

    let mut agent = start(dir.path(), &server);
    wait_until(
        Duration::from_secs(60),
        "the sink's abandoned uploads aborted",
        || in_progress(&server) == sorted(&NOT_OURS),
    );
    // The sink delivers as usual.
    wait_until(Duration::from_secs(60), "the lines in objects", || {
        server.read_lines(BUCKET, "app/").len() == 100
    });
    agent.signal(Signal::SIGTERM);
    assert!(
        agent.wait(Duration::from_secs(60)).success(),
        "{}",
        agent.log()
    );
    let log = agent.log();
    for key in OURS {
        assert!(
            log.lines().any(|l| l
                .contains("aborted a multipart upload an earlier run left behind")
                && l.contains(key)),
            "no abort of {key} logged:\n{log}"
        );
    }
    assert_eq!(in_progress(&server), sorted(&NOT_OURS), "{log}");
}

#[test]
fn s3_sweep_that_fails_leaves_the_sink_running_and_the_next_start_sweeps_again() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut server) = S3Server::start(dir.path()) else {
        return;
    };
    server.create_bucket(BUCKET);
    orphan_uploads(&server, &OURS[..1]);
    write_log(dir.path(), 100);

    // The store is down at start: the sweep fails with a warning naming the sink and the
    // bucket, the sink runs on and delivers once the store is back.
    server.stop();
    let mut agent = start(dir.path(), &server);
    wait_until(Duration::from_secs(60), "the sweep's warning", || {
        agent.log().lines().any(|l| {
            l.contains("could not list the bucket's multipart uploads")
                && l.contains("archive")
                && l.contains(BUCKET)
        })
    });
    server.restart();
    wait_until(Duration::from_secs(90), "the lines in objects", || {
        server.read_lines(BUCKET, "app/").len() == 100
    });
    assert_eq!(in_progress(&server), sorted(&OURS[..1]));
    agent.signal(Signal::SIGTERM);
    assert!(
        agent.wait(Duration::from_secs(60)).success(),
        "{}",
        agent.log()
    );

    // The next start sweeps again.
    let mut agent = start(dir.path(), &server);
    wait_until(
        Duration::from_secs(60),
        "the sink's abandoned upload aborted",
        || in_progress(&server).is_empty(),
    );
    agent.signal(Signal::SIGTERM);
    assert!(
        agent.wait(Duration::from_secs(60)).success(),
        "{}",
        agent.log()
    );
    assert_eq!(server.read_lines(BUCKET, "app/").len(), 100);
}
