//! kcat (Debian package `kcat`) against the real broker: `-L` metadata, `-P` then `-C -e`
//! round trip of a file of lines. Skipped when kcat is not installed, unless
//! `FERRY_REQUIRE_KCAT=1` makes that a failure (set it where kcat is provisioned).

#![allow(clippy::unwrap_used)]

use std::process::Command;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcat_lists_metadata_and_round_trips_a_file_of_lines() {
    if !kcat_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = start(config(dir.path())).await;
    create_topic(&bootstrap, "kcat", 3, &[]).await;

    let lines: String = (0..5000)
        .map(|i| format!("line {i} {}\n", "z".repeat(i % 50)))
        .collect();
    let input = dir.path().join("lines.txt");
    std::fs::write(&input, &lines).unwrap();
    let kcat = |args: &[&str]| {
        let bootstrap = bootstrap.clone();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        async move {
            tokio::task::spawn_blocking(move || {
                Command::new("kcat")
                    .arg("-b")
                    .arg(&bootstrap)
                    .args(&args)
                    .output()
                    .unwrap()
            })
            .await
            .unwrap()
        }
    };

    let listing = kcat(&["-L"]).await;
    assert!(listing.status.success());
    let listing = String::from_utf8(listing.stdout).unwrap();
    assert!(listing.contains("1 brokers:"), "{listing}");
    assert!(
        listing.contains("topic \"kcat\" with 3 partitions:"),
        "{listing}"
    );
    assert!(
        listing.contains("partition 2, leader 0, replicas: 0, isrs: 0"),
        "{listing}"
    );

    let produced = kcat(&[
        "-P",
        "-t",
        "kcat",
        "-z",
        "zstd",
        "-l",
        input.to_str().unwrap(),
    ])
    .await;
    assert!(
        produced.status.success(),
        "{}",
        String::from_utf8_lossy(&produced.stderr)
    );
    let consumed = kcat(&["-C", "-t", "kcat", "-e", "-q"]).await;
    assert!(
        consumed.status.success(),
        "{}",
        String::from_utf8_lossy(&consumed.stderr)
    );
    // Three partitions interleave on output: compare as sorted sets of lines.
    let mut want: Vec<&str> = lines.lines().collect();
    let got_text = String::from_utf8(consumed.stdout).unwrap();
    let mut got: Vec<&str> = got_text.lines().collect();
    want.sort_unstable();
    got.sort_unstable();
    assert_eq!(got.len(), want.len());
    assert!(got == want, "kcat read back different lines");
    broker.shutdown().await;
}
