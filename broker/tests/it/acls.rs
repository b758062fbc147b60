//! ACLs enforced on real clients: librdkafka (through rdkafka), kcat and Python
//! confluent-kafka each get the error Kafka would give them.
//!
//! Every scenario takes the [`Caller`] its clients connect as, so that once connections can
//! authenticate (SASL), the same scenario runs for `User:alice` with her client settings.
//! Today every connection is `User:ANONYMOUS`. kcat is skipped when absent unless
//! `FERRY_REQUIRE_KCAT=1`; Python runs with `$PYTHON` and is skipped when it is unset unless
//! `FERRY_REQUIRE_KCAT=1` (set by `scripts/test`, where both are provisioned).

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::Duration;

use crate::common::*;
use ferry_broker::{
    AclBinding, AclOperation, AclPermissionType, BrokerConfig, ListenerConfig, Password,
    PatternType, ResourceType, SecurityProtocol, UserConfig,
};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

/// Who a scenario's clients are: the principal its ACLs name, and the client settings that
/// make a connection authenticate as it.
#[derive(Clone, Copy)]
struct Caller {
    principal: &'static str,
    settings: &'static [(&'static str, &'static str)],
}

/// A client that does not authenticate.
const ANONYMOUS: Caller = Caller {
    principal: "User:ANONYMOUS",
    settings: &[],
};

/// A client authenticated with SCRAM-SHA-256 as `alice` on a SASL_PLAINTEXT listener.
const ALICE: Caller = Caller {
    principal: "User:alice",
    settings: &[
        ("security.protocol", "sasl_plaintext"),
        ("sasl.mechanism", "SCRAM-SHA-256"),
        ("sasl.username", "alice"),
        ("sasl.password", "alice-secret"),
    ],
};

fn acl(
    resource_type: ResourceType,
    name: &str,
    pattern_type: PatternType,
    principal: &str,
    operation: AclOperation,
) -> AclBinding {
    AclBinding {
        resource_type,
        resource_name: name.into(),
        pattern_type,
        principal: principal.into(),
        host: "*".into(),
        operation,
        permission_type: AclPermissionType::Allow,
    }
}

/// A broker allowing only what its ACLs allow: `caller` may create and write topics
/// starting with `logs-` and use group `readers`, and nothing else.
async fn logs_writer_broker(
    dir: &std::path::Path,
    caller: Caller,
) -> (ferry_broker::BrokerHandle, String) {
    let prefixed = |op| {
        acl(
            ResourceType::Topic,
            "logs-",
            PatternType::Prefixed,
            caller.principal,
            op,
        )
    };
    let config = BrokerConfig {
        allow_everyone_if_no_acl_found: false,
        acls: vec![
            prefixed(AclOperation::Write),
            prefixed(AclOperation::Create),
            acl(
                ResourceType::Group,
                "readers",
                PatternType::Literal,
                caller.principal,
                AclOperation::Read,
            ),
        ],
        ..config(dir)
    };
    // A caller that authenticates gets a SASL listener and its user.
    let config = if caller.principal == ANONYMOUS.principal {
        config
    } else {
        let user = caller.principal.trim_start_matches("User:");
        let password = caller
            .settings
            .iter()
            .find(|(k, _)| *k == "sasl.password")
            .map(|(_, v)| *v)
            .unwrap();
        BrokerConfig {
            listen: BrokerConfig::default().listen,
            listeners: vec![ListenerConfig {
                security_protocol: SecurityProtocol::SaslPlaintext,
                ..ListenerConfig::plaintext("127.0.0.1:0".parse().unwrap())
            }],
            users: vec![UserConfig {
                name: user.into(),
                password: Password::new(password),
            }],
            ..config
        }
    };
    start(config).await
}

fn client(bootstrap: &str, caller: Caller) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("log_level", "3");
    for (k, v) in caller.settings {
        config.set(*k, *v);
    }
    config
}

async fn produce(producer: &FutureProducer, topic: &str) -> Result<(), RDKafkaErrorCode> {
    let record = FutureRecord::<(), str>::to(topic).payload("hello");
    match producer.send(record, Duration::from_secs(20)).await {
        Ok(_) => Ok(()),
        Err((e, _)) => Err(e.rdkafka_error_code().expect("a broker error")),
    }
}

/// The first error a consumer of `topic` partition 0 reports (from the start of the log).
fn first_consume_error(consumer: &BaseConsumer, topic: &str) -> RDKafkaErrorCode {
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&assignment).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Err(e)) => return e.rdkafka_error_code().expect("a broker error"),
            Some(Ok(_)) => panic!("read a record of {topic}"),
            None => {}
        }
    }
    panic!("no error reading {topic}");
}

async fn prefixed_write_acl_limits_what_a_caller_may_do(caller: Caller) {
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = logs_writer_broker(dir.path(), caller).await;

    // Write on `logs-` also allows an idempotent producer (KIP-679) and auto-creation
    // (Create on `logs-`).
    let producer: FutureProducer = client(&bootstrap, caller)
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    produce(&producer, "logs-x").await.expect("writes logs-x");
    assert_eq!(
        produce(&producer, "other").await,
        Err(RDKafkaErrorCode::TopicAuthorizationFailed),
        "writing `other`"
    );

    // The caller may use group `readers` but not read the topic.
    let reader: BaseConsumer = client(&bootstrap, caller)
        .set("group.id", "readers")
        .create()
        .unwrap();
    assert_eq!(
        first_consume_error(&reader, "logs-x"),
        RDKafkaErrorCode::TopicAuthorizationFailed,
        "reading logs-x"
    );
    // Group `others` is not the caller's: its coordinator is not even found.
    let other_group: BaseConsumer = client(&bootstrap, caller)
        .set("group.id", "others")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    assert_eq!(
        first_consume_error(&other_group, "logs-x"),
        RDKafkaErrorCode::GroupAuthorizationFailed,
        "using group `others`"
    );

    let transactional: BaseProducer = client(&bootstrap, caller)
        .set("transactional.id", "logs-writer")
        .create()
        .unwrap();
    let init = tokio::task::spawn_blocking(move || {
        transactional.init_transactions(Duration::from_secs(20))
    })
    .await
    .unwrap();
    let code = init.as_ref().err().and_then(KafkaError::rdkafka_error_code);
    assert_eq!(
        code,
        Some(RDKafkaErrorCode::TransactionalIdAuthorizationFailed),
        "init_transactions: {init:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixed_write_acl_limits_what_an_anonymous_client_may_do() {
    prefixed_write_acl_limits_what_a_caller_may_do(ANONYMOUS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixed_write_acl_limits_what_an_authenticated_user_may_do() {
    prefixed_write_acl_limits_what_a_caller_may_do(ALICE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_for_everyone_hides_topics_from_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, bootstrap) = start(config(dir.path())).await;
    create_topic(&bootstrap, "hidden", 1, &[]).await;
    broker.shutdown().await;
    // The same data directory, now with a deny for everyone on every topic.
    let deny_all = AclBinding {
        permission_type: AclPermissionType::Deny,
        ..acl(
            ResourceType::Topic,
            "*",
            PatternType::Literal,
            "User:*",
            AclOperation::All,
        )
    };
    let config = BrokerConfig {
        acls: vec![deny_all],
        ..config(dir.path())
    };
    let (_broker, bootstrap) = start(config).await;
    let admin = admin(&bootstrap);
    let metadata = admin
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))
        .unwrap();
    assert!(
        metadata.topics().iter().all(|t| t.name() != "hidden"),
        "a list of all topics leaves out those the caller may not describe"
    );
    let named = admin
        .inner()
        .fetch_metadata(Some("hidden"), Duration::from_secs(10))
        .unwrap();
    assert_eq!(
        named.topics()[0].error().map(RDKafkaErrorCode::from),
        Some(RDKafkaErrorCode::TopicAuthorizationFailed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcat_reports_topic_authorization_failures() {
    if !kcat_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = logs_writer_broker(dir.path(), ANONYMOUS).await;
    let kcat = |args: &'static [&'static str], input: &'static str| {
        let bootstrap = bootstrap.clone();
        tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let mut child = Command::new("kcat")
                .arg("-b")
                .arg(&bootstrap)
                .args(args)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
            child.wait_with_output().unwrap()
        })
    };
    let written = kcat(&["-P", "-t", "logs-kcat"], "one\ntwo\n")
        .await
        .unwrap();
    assert!(
        written.status.success(),
        "{}",
        String::from_utf8_lossy(&written.stderr)
    );
    let refused = kcat(&["-P", "-t", "other"], "one\n").await.unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("Broker: Topic authorization failed"),
        "{stderr}"
    );
    let read = kcat(&["-C", "-t", "logs-kcat", "-o", "beginning", "-e"], "")
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&read.stderr);
    assert!(stderr.contains("Topic authorization failed"), "{stderr}");
    assert!(read.stdout.is_empty(), "read records it may not read");
}

fn python() -> Option<String> {
    let python = std::env::var("PYTHON").ok();
    assert!(
        python.is_some() || std::env::var("FERRY_REQUIRE_KCAT").is_err(),
        "PYTHON (with confluent-kafka) is required but not set"
    );
    python
}

/// confluent-kafka: a refused write and a refused transactional id, each with Kafka's error
/// name; prints one line per outcome.
const PYTHON_CLIENT: &str = r#"
import sys
from confluent_kafka import KafkaException, Producer
bootstrap = sys.argv[1]
outcomes = []
p = Producer({"bootstrap.servers": bootstrap})
for topic in ("logs-py", "other"):
    p.produce(topic, b"hello", on_delivery=lambda err, msg: outcomes.append(
        "%s %s" % (msg.topic(), err.name() if err else "OK")))
p.flush(20)
t = Producer({"bootstrap.servers": bootstrap, "transactional.id": "py-writer"})
try:
    t.init_transactions(20)
    outcomes.append("init_transactions OK")
except KafkaException as e:
    outcomes.append("init_transactions %s" % e.args[0].name())
print("\n".join(sorted(outcomes)))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confluent_kafka_reports_topic_and_transactional_id_authorization_failures() {
    let Some(python) = python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_broker, bootstrap) = logs_writer_broker(dir.path(), ANONYMOUS).await;
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args(["-c", PYTHON_CLIENT, &bootstrap])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "init_transactions TRANSACTIONAL_ID_AUTHORIZATION_FAILED\n\
         logs-py OK\n\
         other TOPIC_AUTHORIZATION_FAILED\n"
    );
}
