//! The bundled broker's security with real clients: listeners of every protocol on one broker
//! run by the `agent` binary, certificates made here (a CA, a server certificate for
//! 127.0.0.1/localhost, a client certificate signed by the CA), users from `${ENV}` in the
//! config and from `agent users`, and kcat, confluent-kafka and kafka-python as the clients.
//!
//! kcat is skipped when absent unless `FERRY_REQUIRE_KCAT=1`; Python runs with `$PYTHON` (the
//! test virtualenv `scripts/test` makes) and is skipped when it is unset unless
//! `FERRY_REQUIRE_KCAT=1` (set by `scripts/test`, where both are provisioned).

#![allow(clippy::unwrap_used)]

use crate::harness;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::harness::{Agent, kcat_available, python, wait_until};

const ALICE_PASSWORD: &str = "alice-pw-7f3a9c";
const BOB_PASSWORD: &str = "bob-pw-e41d27";

/// PEM files of a CA, a server certificate and a client certificate signed by it.
pub(crate) struct Certificates {
    pub(crate) ca: PathBuf,
    pub(crate) server_cert: PathBuf,
    pub(crate) server_key: PathBuf,
    pub(crate) client_cert: PathBuf,
    pub(crate) client_key: PathBuf,
}

pub(crate) fn certificates(dir: &Path) -> Certificates {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "ferry test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();

    let server_key = KeyPair::generate().unwrap();
    let mut server_params = CertificateParams::new(vec!["localhost".into()]).unwrap();
    server_params
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    server_params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let server = server_params.signed_by(&server_key, &ca, &ca_key).unwrap();

    let client_key = KeyPair::generate().unwrap();
    let mut client_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    // Encoded root first: O, OU, CN; Kafka prints the last first.
    client_params.distinguished_name = rcgen::DistinguishedName::new();
    let dn = &mut client_params.distinguished_name;
    dn.push(DnType::OrganizationName, "ferry");
    dn.push(DnType::OrganizationalUnitName, "eng");
    dn.push(DnType::CommonName, "client");
    let client = client_params.signed_by(&client_key, &ca, &ca_key).unwrap();

    let write = |name: &str, pem: String| {
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    Certificates {
        ca: write("ca.pem", ca.pem()),
        server_cert: write("server.pem", server.pem()),
        server_key: write("server.key", server_key.serialize_pem()),
        client_cert: write("client.pem", client.pem()),
        client_key: write("client.key", client_key.serialize_pem()),
    }
}

/// A broker with a plaintext (admin), a SASL_SSL, a SASL_PLAINTEXT and an mTLS listener, all
/// on port 0, and the user alice from `${ALICE_PASSWORD}`.
struct SecureBroker {
    agent: Agent,
    certs: Certificates,
    /// Listener name → `127.0.0.1:port`.
    listeners: BTreeMap<String, String>,
}

impl SecureBroker {
    fn start(dir: &Path) -> SecureBroker {
        let certs = certificates(dir);
        let config = format!(
            "\
broker:
  data_dir: ./broker
  listeners:
    - {{ address: 127.0.0.1:0 }}
    - address: 127.0.0.1:0
      security_protocol: SASL_SSL
      ssl: {{ certificate: {cert}, key: {key} }}
    - address: 127.0.0.1:0
      security_protocol: sasl_plaintext
      sasl_mechanisms: [PLAIN]
    - name: MTLS
      address: 127.0.0.1:0
      security_protocol: ssl
      ssl: {{ certificate: {cert}, key: {key}, client_auth: required, ca: {ca} }}
  users:
    - {{ name: alice, password: \"${{ALICE_PASSWORD}}\" }}
",
            cert = certs.server_cert.display(),
            key = certs.server_key.display(),
            ca = certs.ca.display(),
        );
        let agent = Agent::start_with(
            dir,
            &config,
            &[
                ("ALICE_PASSWORD", ALICE_PASSWORD),
                ("RUST_LOG", "info,ferry_broker=debug"),
                ("NO_COLOR", "1"),
            ],
        );
        let mut listeners = BTreeMap::new();
        wait_until(Duration::from_secs(30), "the broker's listeners", || {
            let log = strip_ansi(&agent.log());
            let Some(line) = log.lines().find(|l| l.contains("bundled broker started")) else {
                return false;
            };
            let list = line.split("listeners=").nth(1).unwrap_or_default();
            for pair in list
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .split(',')
            {
                if let Some((name, addr)) = pair.split_once('=') {
                    listeners.insert(name.to_owned(), addr.to_owned());
                }
            }
            true
        });
        assert_eq!(
            listeners.keys().collect::<Vec<_>>(),
            ["MTLS", "PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL"],
            "{}",
            agent.log()
        );
        SecureBroker {
            agent,
            certs,
            listeners,
        }
    }

    fn addr(&self, listener: &str) -> &str {
        &self.listeners[listener]
    }

    /// kcat on `listener` with `-X` settings, then `args`.
    fn kcat(&self, listener: &str, settings: &[(&str, &str)], args: &[&str]) -> Output {
        let mut command = Command::new("kcat");
        // `cargo test` puts the directory of the workspace's own librdkafka (built without
        // TLS) on the library path; kcat must load its own.
        command.env_remove("LD_LIBRARY_PATH");
        command.arg("-b").arg(self.addr(listener));
        for (k, v) in settings {
            command.arg("-X").arg(format!("{k}={v}"));
        }
        command.args(args).output().unwrap()
    }

    /// kcat settings for SASL over TLS as `user`.
    fn sasl_ssl(&self, mechanism: &str, user: &str, password: &str) -> Vec<(String, String)> {
        vec![
            ("security.protocol".into(), "SASL_SSL".into()),
            ("sasl.mechanisms".into(), mechanism.into()),
            ("sasl.username".into(), user.into()),
            ("sasl.password".into(), password.into()),
            (
                "ssl.ca.location".into(),
                self.certs.ca.display().to_string(),
            ),
        ]
    }
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn pairs(settings: &[(String, String)]) -> Vec<(&str, &str)> {
    settings
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

fn text(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Produces `lines` to `topic` with kcat and reads them back.
fn kcat_round_trip(broker: &SecureBroker, listener: &str, settings: &[(&str, &str)], topic: &str) {
    let lines: Vec<String> = (0..50).map(|i| format!("{topic} line {i}")).collect();
    let file = broker.agent.dir.join(format!("{topic}.txt"));
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let produced = broker.kcat(
        listener,
        settings,
        &["-P", "-t", topic, "-l", file.to_str().unwrap()],
    );
    assert!(produced.status.success(), "{}", text(&produced));
    let consumed = broker.kcat(
        listener,
        settings,
        &["-C", "-t", topic, "-o", "beginning", "-e", "-q"],
    );
    assert!(consumed.status.success(), "{}", text(&consumed));
    let got: Vec<String> = String::from_utf8_lossy(&consumed.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(got, lines);
}

/// kcat -L that must fail authentication.
fn assert_refused(broker: &SecureBroker, listener: &str, settings: &[(&str, &str)]) -> String {
    let out = broker.kcat(listener, settings, &["-L", "-m", "5"]);
    assert!(!out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn kcat_authenticates_with_scram_and_plain_over_tls_and_wrong_passwords_are_refused() {
    if !kcat_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let broker = SecureBroker::start(dir.path());

    for (mechanism, topic) in [
        ("SCRAM-SHA-256", "scram256"),
        ("SCRAM-SHA-512", "scram512"),
        ("PLAIN", "plain"),
    ] {
        let settings = broker.sasl_ssl(mechanism, "alice", ALICE_PASSWORD);
        kcat_round_trip(&broker, "SASL_SSL", &pairs(&settings), topic);
        let wrong = broker.sasl_ssl(mechanism, "alice", "not-the-password");
        let stderr = assert_refused(&broker, "SASL_SSL", &pairs(&wrong));
        assert!(
            stderr.contains(&format!(
                "Authentication failed during authentication due to invalid credentials with \
                 SASL mechanism {mechanism}"
            )),
            "{mechanism}: {stderr}"
        );
        let unknown = broker.sasl_ssl(mechanism, "mallory", ALICE_PASSWORD);
        assert_refused(&broker, "SASL_SSL", &pairs(&unknown));
    }

    // PLAIN on the SASL_PLAINTEXT listener, which enables nothing else.
    let plain = [
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanisms", "PLAIN"),
        ("sasl.username", "alice"),
        ("sasl.password", ALICE_PASSWORD),
    ];
    kcat_round_trip(&broker, "SASL_PLAINTEXT", &plain, "plain-tcp");
    let scram = [
        ("security.protocol", "SASL_PLAINTEXT"),
        ("sasl.mechanisms", "SCRAM-SHA-256"),
        ("sasl.username", "alice"),
        ("sasl.password", ALICE_PASSWORD),
    ];
    let stderr = assert_refused(&broker, "SASL_PLAINTEXT", &scram);
    assert!(
        stderr.contains("PLAIN"),
        "the enabled mechanisms are named: {stderr}"
    );

    // Without SASL on a SASL listener: nothing but the handshake is served.
    assert_refused(&broker, "SASL_PLAINTEXT", &[]);

    let log = broker.agent.log();
    assert!(log.contains("SASL authentication failed"), "{log}");
    assert!(
        !log.contains(ALICE_PASSWORD),
        "the password is in the log:\n{log}"
    );
}

#[test]
fn each_listener_advertises_its_own_port_and_plaintext_clients_are_refused_on_tls() {
    if !kcat_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let broker = SecureBroker::start(dir.path());
    let sasl = broker.sasl_ssl("SCRAM-SHA-256", "alice", ALICE_PASSWORD);
    for (listener, settings) in [("PLAINTEXT", vec![]), ("SASL_SSL", pairs(&sasl))] {
        let out = broker.kcat(listener, &settings, &["-L", "-m", "10"]);
        assert!(
            out.status.success(),
            "{}\n{}",
            text(&out),
            broker.agent.log()
        );
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(
            listing.contains(&format!("broker 0 at {}", broker.addr(listener))),
            "{listener}: {listing}"
        );
    }

    // A plaintext client on the TLS port: its connection is closed, and the broker serves on.
    for _ in 0..3 {
        assert_refused(&broker, "SASL_SSL", &[]);
    }
    let out = broker.kcat("SASL_SSL", &pairs(&sasl), &["-L", "-m", "10"]);
    assert!(out.status.success(), "{}", text(&out));
    let log = broker.agent.log();
    assert!(log.contains("TLS handshake failed"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn client_certificates_name_the_principal_and_are_required_where_configured() {
    if !kcat_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let broker = SecureBroker::start(dir.path());
    let ca = broker.certs.ca.display().to_string();
    let cert = broker.certs.client_cert.display().to_string();
    let key = broker.certs.client_key.display().to_string();
    let mtls = [
        ("security.protocol", "SSL"),
        ("ssl.ca.location", ca.as_str()),
        ("ssl.certificate.location", cert.as_str()),
        ("ssl.key.location", key.as_str()),
    ];
    kcat_round_trip(&broker, "MTLS", &mtls, "mtls");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !strip_ansi(&broker.agent.log()).contains("principal=User:CN=client,OU=eng,O=ferry") {
        assert!(
            std::time::Instant::now() < deadline,
            "no principal in the log:\n{}",
            broker.agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let no_cert = [
        ("security.protocol", "SSL"),
        ("ssl.ca.location", ca.as_str()),
    ];
    assert_refused(&broker, "MTLS", &no_cert);
}

#[test]
fn users_tool_adds_lists_and_deletes_users_that_kcat_then_authenticates_as() {
    if !kcat_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let broker = SecureBroker::start(dir.path());
    let users = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_agent"))
            .arg("users")
            .arg("--bootstrap-server")
            .arg(broker.addr("PLAINTEXT"))
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let bob = broker.sasl_ssl("SCRAM-SHA-512", "bob", BOB_PASSWORD);
    assert_refused(&broker, "SASL_SSL", &pairs(&bob));

    users(
        &[
            "--add",
            "bob",
            "--mechanism",
            "SCRAM-SHA-512",
            "--iterations",
            "8192",
            "--password-env",
            "BOB_PASSWORD",
        ],
        &[("BOB_PASSWORD", BOB_PASSWORD)],
    );
    let listed = users(&["--list"], &[]);
    assert!(
        listed.contains(
            "SCRAM credential configs for user-principal 'alice' are \
             SCRAM-SHA-256=iterations=4096, SCRAM-SHA-512=iterations=4096"
        ),
        "{listed}"
    );
    assert!(
        listed.contains(
            "SCRAM credential configs for user-principal 'bob' are SCRAM-SHA-512=iterations=8192"
        ),
        "{listed}"
    );
    kcat_round_trip(&broker, "SASL_SSL", &pairs(&bob), "bob-topic");
    // PLAIN checks against the same stored credential.
    let bob_plain = broker.sasl_ssl("PLAIN", "bob", BOB_PASSWORD);
    let out = broker.kcat("SASL_SSL", &pairs(&bob_plain), &["-L", "-m", "10"]);
    assert!(out.status.success(), "{}", text(&out));

    // The password is nowhere the broker writes.
    let mut catalog = Vec::new();
    for entry in std::fs::read_dir(dir.path().join("broker")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            catalog.extend(std::fs::read(&path).unwrap());
        }
    }
    assert!(!catalog.is_empty());
    for password in [BOB_PASSWORD, ALICE_PASSWORD] {
        assert!(
            !catalog
                .windows(password.len())
                .any(|w| w == password.as_bytes()),
            "a password is in the broker's files"
        );
        assert!(
            !broker.agent.log().contains(password),
            "a password is in the log"
        );
    }

    users(&["--delete", "bob"], &[]);
    assert!(!users(&["--list"], &[]).contains("'bob'"));
    assert_refused(&broker, "SASL_SSL", &pairs(&bob));

    // Users of the config file are not altered through the API.
    let out = Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(["users", "--bootstrap-server", broker.addr("PLAINTEXT")])
        .args(["--delete", "alice"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("defined in the broker configuration"),
        "{}",
        text(&out)
    );
}

#[test]
fn python_clients_authenticate_with_scram_and_plain_over_tls() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = SecureBroker::start(dir.path());
    let script = r#"
import os, sys, uuid
from confluent_kafka import Consumer, Producer, KafkaException
from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError

bootstrap, ca, password = os.environ["BOOTSTRAP"], os.environ["CA"], os.environ["ALICE"]

def ck_conf(mechanism, pw):
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL",
            "sasl.mechanisms": mechanism, "sasl.username": "alice", "sasl.password": pw,
            "ssl.ca.location": ca}

for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]:
    topic = "ck-" + mechanism.lower()
    p = Producer(ck_conf(mechanism, password))
    for i in range(20):
        p.produce(topic, f"v{i}".encode())
    assert p.flush(30) == 0, "confluent-kafka: not all delivered"
    c = Consumer(dict(ck_conf(mechanism, password), **{"group.id": "g-" + topic,
                 "auto.offset.reset": "earliest"}))
    c.subscribe([topic])
    got = []
    while len(got) < 20:
        m = c.poll(30)
        assert m is not None, "confluent-kafka: timed out consuming"
        assert m.error() is None, m.error()
        got.append(m.value().decode())
    c.close()
    assert got == [f"v{i}" for i in range(20)], got

    # Wrong password: the client reports an authentication failure.
    errors = []
    bad = Producer(dict(ck_conf(mechanism, "wrong"), **{"error_cb": errors.append}))
    for _ in range(30):
        bad.poll(0.5)
        if errors:
            break
    assert any(e.code() == -169 and "invalid credentials" in e.str() for e in errors), errors

def kp_conf(mechanism, pw):
    return dict(bootstrap_servers=bootstrap, security_protocol="SASL_SSL",
                sasl_mechanism=mechanism, sasl_plain_username="alice",
                sasl_plain_password=pw, ssl_cafile=ca, ssl_check_hostname=True)

for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]:
    topic = "kp-" + mechanism.lower()
    p = KafkaProducer(**kp_conf(mechanism, password))
    for i in range(20):
        p.send(topic, f"v{i}".encode())
    p.flush(30)
    p.close()
    c = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=10000,
                      **kp_conf(mechanism, password))
    got = [m.value.decode() for m in c]
    c.close()
    assert got == [f"v{i}" for i in range(20)], got
try:
    # kafka-python reports the failed bootstrap (NoBrokersAvailable) or the authentication
    # error itself, depending on its version and where it fails.
    KafkaProducer(max_block_ms=10000, **kp_conf("SCRAM-SHA-256", "wrong"))
    raise SystemExit("kafka-python: a wrong password was accepted")
except KafkaError as e:
    print("kafka-python refused:", type(e).__name__, e, file=sys.stderr)
print("ok")
"#;
    let out = Command::new(python)
        .env_remove("LD_LIBRARY_PATH")
        .arg("-c")
        .arg(script)
        .env("BOOTSTRAP", broker.addr("SASL_SSL"))
        .env("CA", &broker.certs.ca)
        .env("ALICE", ALICE_PASSWORD)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\nbroker log:\n{}",
        text(&out),
        broker.agent.log()
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(stderr.contains("kafka-python refused"), "{}", text(&out));
    assert!(!broker.agent.log().contains(ALICE_PASSWORD));
}

#[test]
fn listen_and_listeners_together_and_unset_password_variables_are_configuration_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broker.yaml");
    std::fs::write(
        &file,
        "listen: 127.0.0.1:0\nlisteners:\n  - { address: 127.0.0.1:0 }\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agent"))
        .args(["broker", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("`listen` and `listeners` cannot be given together"),
        "{}",
        text(&out)
    );

    let pipeline = dir.path().join("pipeline.yaml");
    std::fs::write(
        &pipeline,
        "broker:\n  users:\n    - { name: a, password: \"${FERRY_TEST_UNSET_PASSWORD}\" }\n    - { name: b, password: literal-secret-123 }\n  num_partitons: 1\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agent"))
        .arg("validate")
        .arg(&pipeline)
        .env_remove("FERRY_TEST_UNSET_PASSWORD")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let printed = text(&out);
    assert!(
        printed.contains("FERRY_TEST_UNSET_PASSWORD") || printed.contains("num_partitons"),
        "{printed}"
    );
    assert!(!printed.contains("literal-secret-123"), "{printed}");
}

/// Lines in the finished (not `.tmp`) files of a file_roll directory.
fn finished_output(out: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(out) else {
        return Vec::new();
    };
    let mut names: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            !name.starts_with('.') && !name.ends_with(".tmp")
        })
        .collect();
    names.sort();
    names
        .iter()
        .flat_map(|p| {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The shipped edge and collector pipelines, pointed at the SASL_SSL listener as alice with
/// SCRAM-SHA-512: taildir → file channel → kafka sink (exactly_once) → broker → kafka source →
/// file channel → file_roll. Every line arrives exactly once; the tools reach the same
/// listener with `--command-config`; alice's password is in no log and no `validate` output.
#[test]
fn the_chain_runs_exactly_once_over_sasl_ssl_and_the_tools_connect_with_command_config() {
    let root = tempfile::tempdir().unwrap();
    let broker_dir = root.path().join("broker");
    std::fs::create_dir_all(&broker_dir).unwrap();
    let broker = SecureBroker::start(&broker_dir);
    let address = broker.addr("SASL_SSL").to_owned();
    let security = format!(
        "bootstrap_servers: {address}\n    security_protocol: sasl_ssl\n    \
         sasl_mechanism: SCRAM-SHA-512\n    sasl_username: alice\n    \
         sasl_password: ${{ALICE_PASSWORD}}\n    ssl_ca_location: {}",
        broker.certs.ca.display()
    );
    let edge_config = harness::pipeline(
        "chain/edge.yaml",
        &[("bootstrap_servers: 127.0.0.1:9092", &security)],
    );
    let collector_config = harness::pipeline(
        "chain/collector.yaml",
        &[
            ("bootstrap_servers: 127.0.0.1:9092", &security),
            ("roll_interval: 1m", "roll_interval: 1s"),
        ],
    );
    let env = [("ALICE_PASSWORD", ALICE_PASSWORD), ("NO_COLOR", "1")];
    let (edge_dir, collector_dir) = (root.path().join("edge"), root.path().join("collector"));
    for dir in [&edge_dir, &collector_dir] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::create_dir_all(edge_dir.join("logs")).unwrap();
    let edge = Agent::start_with(&edge_dir, &edge_config, &env);
    let collector = Agent::start_with(&collector_dir, &collector_config, &env);

    const LINES: usize = 20_000;
    let mut chunk = String::new();
    for n in 0..LINES {
        chunk.push_str(&format!("secure-line-{n:06}\n"));
        if n % 5_000 == 4_999 {
            use std::io::Write as _;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(edge_dir.join("logs/app.log"))
                .unwrap();
            file.write_all(chunk.as_bytes()).unwrap();
            chunk.clear();
        }
    }
    let out = collector_dir.join("var/chain/out");
    wait_until(Duration::from_secs(120), "every line in the output", || {
        finished_output(&out).len() >= LINES
    });
    let lines = finished_output(&out);
    let mut counts = BTreeMap::new();
    for line in &lines {
        *counts.entry(line.as_str()).or_insert(0) += 1;
    }
    assert_eq!(lines.len(), LINES, "duplicates in the output");
    assert_eq!(counts.len(), LINES);
    assert!((0..LINES).all(|n| counts.contains_key(format!("secure-line-{n:06}").as_str())));

    // The tools, with Kafka's client properties file.
    let properties = root.path().join("client.properties");
    std::fs::write(
        &properties,
        format!(
            "# alice over TLS\nsecurity.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n\
             sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
             username=\"alice\" password=\"{ALICE_PASSWORD}\";\nssl.ca.location={}\n",
            broker.certs.ca.display()
        ),
    )
    .unwrap();
    let tool = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_agent"))
            .args(args)
            .args(["--bootstrap-server", &address, "--command-config"])
            .arg(&properties)
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        assert!(output.status.success(), "agent {args:?}: {}", text(&output));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    assert!(tool(&["topics", "--list"]).lines().any(|l| l == "app-logs"));
    assert!(
        tool(&["groups", "--list"])
            .lines()
            .any(|l| l == "collector")
    );
    let consumed = tool(&[
        "console-consumer",
        "--topic",
        "app-logs",
        "--from-beginning",
        "--max-messages",
        "3",
    ]);
    assert_eq!(consumed.lines().count(), 3, "{consumed}");
    assert!(consumed.lines().all(|l| l.starts_with("secure-line-")));
    // The edge's transactional id (`ferry-<host>-to_kafka`), through the tool's own TLS and
    // SCRAM client.
    let transactions = tool(&["transactions", "--list"]);
    assert!(transactions.contains("-to_kafka"), "{transactions}");
    tool(&["acls", "--list"]);

    // The password: nowhere in what the agents logged or `validate` prints.
    let validate = Command::new(env!("CARGO_BIN_EXE_agent"))
        .arg("validate")
        .arg(edge_dir.join("pipeline.yaml"))
        .env("ALICE_PASSWORD", ALICE_PASSWORD)
        .output()
        .unwrap();
    assert!(validate.status.success(), "{}", text(&validate));
    for (what, output) in [
        ("the broker's log", broker.agent.log()),
        ("the edge's log", edge.log()),
        ("the collector's log", collector.log()),
        ("validate", text(&validate)),
    ] {
        assert!(
            !output.contains(ALICE_PASSWORD),
            "{what} shows the password"
        );
    }
}
