//! `agent acls` against the bundled broker run by `agent run` with ACLs in its `broker:`
//! section: the rules listed in kafka-acls.sh's format, an `--add`/`--remove` round trip, and a
//! refused change reported with Kafka's error and a non-zero exit.
//!
//! The broker allows only what its ACLs allow (`allow_everyone_if_no_acl_found: false`); the
//! tool connects as `User:ANONYMOUS` (no authentication yet), whose rights come from the
//! pipeline file.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use crate::harness::{Agent, free_port};

fn acls(bootstrap: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(["acls", "--bootstrap-server", bootstrap])
        .args(args)
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// An agent running a broker whose ACLs let `User:ANONYMOUS` describe and alter ACLs (Describe
/// and Alter on the cluster) and write topics starting with `logs-`.
fn strict_broker(dir: &std::path::Path) -> (Agent, String) {
    let port = free_port();
    let config = format!(
        "\
broker:
  listen: 127.0.0.1:{port}
  data_dir: ./broker
  allow_everyone_if_no_acl_found: false
  acls:
    - {{ resource_type: cluster, resource_name: kafka-cluster, principal: 'User:ANONYMOUS', operation: describe }}
    - {{ resource_type: cluster, resource_name: kafka-cluster, principal: 'User:ANONYMOUS', operation: alter }}
    - {{ resource_type: topic, resource_name: logs-, pattern_type: prefixed, principal: 'User:ANONYMOUS', operation: write }}
"
    );
    let mut agent = Agent::start(dir, &config);
    let bootstrap = format!("127.0.0.1:{port}");
    agent.wait_listening(&bootstrap, "the broker");
    (agent, bootstrap)
}

const CLUSTER_ACLS: &str = "\
Current ACLs for resource `ResourcePattern(resourceType=CLUSTER, name=kafka-cluster, patternType=LITERAL)`: 
 \t(principal=User:ANONYMOUS, host=*, operation=ALTER, permissionType=ALLOW)
\t(principal=User:ANONYMOUS, host=*, operation=DESCRIBE, permissionType=ALLOW) 

";

const LOGS_ACLS: &str = "\
Current ACLs for resource `ResourcePattern(resourceType=TOPIC, name=logs-, patternType=PREFIXED)`: 
 \t(principal=User:ANONYMOUS, host=*, operation=WRITE, permissionType=ALLOW) 

";

#[test]
fn lists_adds_and_removes_acls_as_kafka_acls_sh() {
    let dir = tempfile::tempdir().unwrap();
    let (_agent, bootstrap) = strict_broker(dir.path());

    let listed = acls(&bootstrap, &["--list"]);
    assert!(listed.status.success());
    assert_eq!(stdout(&listed), format!("{LOGS_ACLS}{CLUSTER_ACLS}"));

    // A consumer's rights for alice: Read and Describe on the topic, Read on the group.
    let added = acls(
        &bootstrap,
        &[
            "--add",
            "--allow-principal",
            "User:alice",
            "--consumer",
            "--topic",
            "events",
            "--group",
            "loaders",
        ],
    );
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let listed = stdout(&acls(
        &bootstrap,
        &["--list", "--topic", "events", "--group", "loaders"],
    ));
    assert_eq!(
        listed,
        "\
Current ACLs for resource `ResourcePattern(resourceType=TOPIC, name=events, patternType=LITERAL)`: 
 \t(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)
\t(principal=User:alice, host=*, operation=DESCRIBE, permissionType=ALLOW) 

Current ACLs for resource `ResourcePattern(resourceType=GROUP, name=loaders, patternType=LITERAL)`: 
 \t(principal=User:alice, host=*, operation=READ, permissionType=ALLOW) 

"
    );
    // `match` finds the prefixed rule that applies to a topic name.
    let matching = stdout(&acls(
        &bootstrap,
        &[
            "--list",
            "--topic",
            "logs-app",
            "--resource-pattern-type",
            "match",
        ],
    ));
    assert_eq!(matching, LOGS_ACLS);

    // --principal is a filter of --list only: with --remove it would read as "this
    // principal's ACLs" where the removal takes every principal's; refused, nothing removed.
    let refused = acls(
        &bootstrap,
        &[
            "--remove",
            "--force",
            "--topic",
            "events",
            "--principal",
            "User:bob",
        ],
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("The --principal option is only available if --list is set"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(stdout(&acls(&bootstrap, &["--list", "--topic", "events"])).contains("User:alice"));

    let removed = acls(
        &bootstrap,
        &[
            "--remove", "--force", "--topic", "events", "--group", "loaders",
        ],
    );
    assert!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    assert_eq!(stdout(&removed), "");
    assert_eq!(
        stdout(&acls(&bootstrap, &["--list"])),
        format!("{LOGS_ACLS}{CLUSTER_ACLS}")
    );
}

#[test]
fn a_change_the_broker_refuses_is_an_error_naming_kafkas_code() {
    let dir = tempfile::tempdir().unwrap();
    let (_agent, bootstrap) = strict_broker(dir.path());
    // Taking Alter on the cluster away from ANONYMOUS, with ANONYMOUS's own Alter.
    let removed = acls(
        &bootstrap,
        &[
            "--remove",
            "--allow-principal",
            "User:ANONYMOUS",
            "--operation",
            "Alter",
            "--cluster",
        ],
    );
    assert!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    let refused = acls(
        &bootstrap,
        &[
            "--add",
            "--allow-principal",
            "User:bob",
            "--operation",
            "Read",
            "--topic",
            "t",
        ],
    );
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(
            "adding ACLs failed: CLUSTER_AUTHORIZATION_FAILED: Cluster authorization failed."
        ),
        "{stderr}"
    );
    let invalid = acls(
        &bootstrap,
        &[
            "--add",
            "--allow-principal",
            "User:bob",
            "--operation",
            "Write",
            "--group",
            "g",
        ],
    );
    assert_eq!(invalid.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&invalid.stderr).contains("does not have operation Write"));
}
