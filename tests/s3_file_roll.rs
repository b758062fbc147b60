//! One writer, two destinations: the same events through `file_roll` and through `s3` with the
//! same rolling options give the same files, byte for byte, under the same names.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use crate::harness::{Agent, wait_until};
use crate::s3_harness::S3Server;

const BUCKET: &str = "same";
const EVENTS: usize = 1000;

/// Every file under `dir` (recursively) but those being written (`*.tmp`): relative path and
/// bytes, sorted.
fn finished_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(at) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&at) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if !path.to_string_lossy().ends_with(".tmp") {
                let name = path.strip_prefix(dir).unwrap().display().to_string();
                found.push((name, std::fs::read(&path).unwrap()));
            }
        }
    }
    found.sort();
    found
}

#[test]
fn file_roll_and_s3_with_the_same_options_write_the_same_files() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = S3Server::start(dir.path()) else {
        return;
    };
    server.create_bucket(BUCKET);
    // The same rolling options for both; batches of 100 (the source's puts, the sinks'
    // takes), so both roll at the same events.
    let options = "path: \"%{host}/%{kind}\"
    format: json
    compression: gzip
    roll_count: 300
    roll_interval: 1s
    batch_size: 100";
    let config = format!(
        "\
agent:
  data_dir: ./state
sources:
  numbers:
    type: seq
    channels: [to_disk, to_bucket]
    batch_size: 100
    total_events: {EVENTS}
    interceptors:
      - {{ type: static, key: host, value: web-1 }}
      - {{ type: static, key: kind, value: 'a{{b}}' }}
channels:
  to_disk: {{ type: file }}
  to_bucket: {{ type: file }}
sinks:
  same:
    type: file_roll
    channel: to_disk
    directory: ./out
    {options}
  twin:
    type: s3
    channel: to_bucket
    bucket: {BUCKET}
    endpoint: {endpoint}
    access_key_id: ${{S3_KEY}}
    secret_access_key: ${{S3_SECRET}}
    {options}
",
        endpoint = server.endpoint,
    );
    let agent = Agent::start_with(
        dir.path(),
        &config,
        &[
            ("S3_KEY", server.access_key.as_str()),
            ("S3_SECRET", server.secret_key.as_str()),
        ],
    );
    let out = dir.path().join("out");
    let events_in = |files: &[(String, Vec<u8>)]| -> usize {
        files
            .iter()
            .map(|(_, bytes)| {
                let mut text = String::new();
                std::io::Read::read_to_string(
                    &mut flate2::read::MultiGzDecoder::new(&bytes[..]),
                    &mut text,
                )
                .unwrap();
                text.lines().count()
            })
            .sum()
    };
    wait_until(
        Duration::from_secs(30),
        "every event in finished files",
        || {
            events_in(&finished_files(&out)) == EVENTS
                && server
                    .list_objects(BUCKET)
                    .len()
                    .eq(&finished_files(&out).len())
        },
    );
    drop(agent);
    let on_disk = finished_files(&out);
    assert_eq!(
        on_disk.len(),
        4,
        "300, 300, 300 and 100 events: {on_disk:?}"
    );
    let mut in_bucket: Vec<(String, Vec<u8>)> = server
        .list_objects(BUCKET)
        .into_iter()
        .map(|(key, _)| {
            let bytes = server.get_object(BUCKET, &key);
            (key.replace("twin.", "same."), bytes)
        })
        .collect();
    in_bucket.sort();
    let names = |files: &[(String, Vec<u8>)]| -> Vec<String> {
        files.iter().map(|(name, _)| name.clone()).collect()
    };
    assert_eq!(
        names(&on_disk),
        names(&in_bucket),
        "the same names, the sink's aside"
    );
    assert!(
        on_disk[0].0.starts_with("web-1/a%7Bb%7D/same."),
        "`{{` and `}}` percent-encoded once, as the store names them: {}",
        on_disk[0].0
    );
    for ((name, disk), (_, bucket)) in on_disk.iter().zip(&in_bucket) {
        assert!(disk == bucket, "{name}: the same bytes in both");
    }
    assert_eq!(events_in(&on_disk), EVENTS);
}
