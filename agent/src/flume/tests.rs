use super::*;

fn yaml(text: &str) -> String {
    let conversion = convert(Path::new("flume.conf"), text, "a1").unwrap_or_else(|p| panic!("{p}"));
    // Past the header comment.
    conversion
        .yaml
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn problems(text: &str) -> Vec<String> {
    match convert(Path::new("flume.conf"), text, "a1") {
        Ok(c) => panic!("converted:\n{}", c.yaml),
        Err(p) => p
            .problems
            .iter()
            .map(|p| p.display(Path::new("flume.conf")).to_string())
            .collect(),
    }
}

fn notes(text: &str) -> Vec<String> {
    convert(Path::new("flume.conf"), text, "a1")
        .unwrap_or_else(|p| panic!("{p}"))
        .notes
        .iter()
        .map(|p| p.display(Path::new("flume.conf")).to_string())
        .collect()
}

#[test]
fn taildir_memory_kafka_becomes_yaml_with_our_names_and_units() {
    let text = r"# The edge agent.
a1.sources = r1
a1.channels = c1
a1.sinks = k1
a2.sources = other

a1.sources.r1.type = TAILDIR
a1.sources.r1.channels = c1
a1.sources.r1.positionFile = /var/lib/flume/taildir_position.json
a1.sources.r1.filegroups = f1 f2
a1.sources.r1.filegroups.f1 = /var/log/app/app\\.log
a1.sources.r1.filegroups.f2 = /var/log/web/.*\\.log
a1.sources.r1.headers.f1.service = app
a1.sources.r1.fileHeader = true
a1.sources.r1.idleTimeout = 60000
a1.sources.r1.interceptors = ts host env
a1.sources.r1.interceptors.ts.type = org.apache.flume.interceptor.TimestampInterceptor$Builder
a1.sources.r1.interceptors.host.type = host
a1.sources.r1.interceptors.host.useIP = false
a1.sources.r1.interceptors.env.type = static
a1.sources.r1.interceptors.env.key = env
a1.sources.r1.interceptors.env.value = prod

a1.channels.c1.type = memory
a1.channels.c1.capacity = 10000
a1.channels.c1.transactionCapacity = 1000
a1.channels.c1.keep-alive = 3

a1.sinks.k1.type = org.apache.flume.sink.kafka.KafkaSink
a1.sinks.k1.channel = c1
a1.sinks.k1.kafka.bootstrap.servers = ${KAFKA_BOOTSTRAP}
a1.sinks.k1.kafka.topic = app-logs
a1.sinks.k1.flumeBatchSize = 500
a1.sinks.k1.kafka.producer.acks = all
a1.sinks.k1.kafka.producer.linger.ms = 20
a1.sinks.k1.kafka.producer.compression.type = LZ4
a1.sinks.k1.kafka.producer.security.protocol = SASL_SSL
a1.sinks.k1.kafka.producer.sasl.mechanism = SCRAM-SHA-512
a1.sinks.k1.kafka.producer.client.id = edge
a1.sinks.k1.kafka.producer.key.serializer = org.apache.kafka.common.serialization.StringSerializer
";
    assert_eq!(
        yaml(text),
        r#"sources:
  r1:
    type: taildir
    channels: [c1]
    flume_position_file: /var/lib/flume/taildir_position.json
    file_header: true
    idle_timeout: 60000ms
    filegroups:
      f1: /var/log/app/app.log
      f2: /var/log/web/*.log
    headers:
      f1:
        service: app
    interceptors:
      - type: timestamp
      - type: host
        use_ip: false
      - type: static
        key: env
        value: prod
channels:
  c1:
    type: memory
    capacity: 10000
    transaction_capacity: 1000
    # Flume `keep-alive = 3` (line 27): no effect here: a put waits for room as long as it takes: a full channel makes the source wait instead of failing its batch
sinks:
  k1:
    type: kafka
    channel: c1
    topic: app-logs
    batch_size: 500
    bootstrap_servers: ${KAFKA_BOOTSTRAP}
    acks: all
    linger: 20ms
    compression: lz4
    security_protocol: SASL_SSL
    sasl_mechanism: SCRAM-SHA-512
    producer:
      client.id: edge
    # Flume `kafka.producer.key.serializer = org.apache.kafka.common.serialization.StringSerializer` (line 40): no effect here: record keys and values are bytes; no serializer to choose
"#
    );
    let notes = notes(text);
    assert_eq!(notes.len(), 2, "{notes:#?}");
    assert!(
        notes[0].starts_with("flume.conf:27: a1.channels.c1.keep-alive: no effect here"),
        "{notes:#?}"
    );
}

#[test]
fn what_cannot_run_is_refused_with_its_line_and_what_to_use() {
    let text = "\
a1.sources = r1 r2
a1.channels = c1
a1.sinks = k1 k2
a1.sources.r1.type = avro
a1.sources.r1.channels = c1
a1.sources.r2.type = org.example.MySource
a1.sources.r2.channels = c1
a1.channels.c1.type = SPILLABLEMEMORY
a1.sinks.k1.type = hdfs
a1.sinks.k1.channel = c1
a1.sinks.k2.type = file_roll
a1.sinks.k2.channel = c1
a1.sinks.k2.sink.directry = /tmp/out
a1.sinks.k2.sink.rollInterval = 30s
a1.sinks.k2.sink.serializer.appendNewline = yes
";
    let got = problems(text);
    assert_eq!(got.len(), 7, "{got:#?}");
    assert!(
        got[0].starts_with("flume.conf:4: a1.sources.r1.type: Flume's source `avro` cannot run here: agents are chained through Kafka"),
        "{got:#?}"
    );
    assert!(got[0].contains("pipelines/chain/"), "{got:#?}");
    assert!(
        got[1].starts_with("flume.conf:6: a1.sources.r2.type: source type `org.example.MySource` is not one of Flume's")
            && got[1].contains("process plugin"),
        "{got:#?}"
    );
    assert!(
        got[2].starts_with("flume.conf:8: a1.channels.c1.type: Flume's channel `SPILLABLEMEMORY` cannot run here: use a `file` channel"),
        "{got:#?}"
    );
    assert!(
        got[3].starts_with("flume.conf:9: a1.sinks.k1.type: Flume's sink `hdfs` cannot run here:")
            && got[3].contains("file_roll"),
        "{got:#?}"
    );
    assert_eq!(
        got[4],
        "flume.conf:13: a1.sinks.k2.sink.directry: `sink.directry` is not a property of Flume's sink `file_roll` that we know, did you mean `sink.directory`?"
    );
    assert_eq!(
        got[5],
        "flume.conf:14: a1.sinks.k2.sink.rollInterval: `30s` is not a whole number of seconds"
    );
    assert!(
        got[6].starts_with("flume.conf:15: a1.sinks.k2.sink.serializer.appendNewline: `yes` is not `true` or `false`"),
        "{got:#?}"
    );
}

#[test]
fn unknown_types_suggest_flume_aliases_and_missing_parts_are_errors() {
    let got = problems(
        "a1.sources = r1 r9\n\
         a1.channels = c1\n\
         a1.sinks = k1\n\
         a1.sources.r1.type = tialdir\n\
         a1.sources.r1.channels = c1\n\
         a1.channels.c1.capacity = 5\n\
         a1.sinks.k1.type = logger\n\
         a1.sinks.k1.channel = c1\n\
         a1.sinkz.k2.type = logger\n\
         a1.configfilters = f1\n",
    );
    assert_eq!(
        got,
        [
            "flume.conf:1: a1.sources: `r9` is listed but has no properties (Flume would drop it and start anyway): give `a1.sources.r9.type`, or take it out of the list",
            "flume.conf:4: a1.sources.r1.type: unknown Flume source type `tialdir`, did you mean `taildir`?",
            "flume.conf:6: a1.channels.c1.capacity: channel `c1` has no `type` (Flume would drop it and start anyway)",
            "flume.conf:9: a1.sinkz.k2.type: unknown part `a1.sinkz` `sinkz`, did you mean `sinks`?",
            "flume.conf:10: a1.configfilters: config filters are not built in: write `${NAME}` in a value to read the environment variable NAME",
        ]
    );
    let got = problems("agent1.sources = r1\nagent2.sinks = k1\n");
    assert_eq!(got.len(), 1);
    assert!(got[0].contains("unknown agent `a1`"), "{got:?}");
    assert!(got[0].contains("agent1"), "{got:?}");
}

#[test]
fn unlisted_components_and_keys_set_twice_are_reported_not_dropped_silently() {
    let text = "\
a1.sources = r1
a1.channels = c1
a1.sinks = k1
a1.sources.r1.type = seq
a1.sources.r1.channels = c1
a1.sources.r1.batchSize = 5
a1.sources.r1.batchSize = 10
a1.sources.old.type = netcat
a1.channels.c1.type = memory
a1.sinks.k1.type = null
a1.sinks.k1.channel = c1
a1.sinks.k2.type = logger
";
    assert_eq!(
        notes(text),
        [
            "flume.conf:7: a1.sources.r1.batchSize: set again (first at line 6); the last value counts, as in Flume",
            "flume.conf:8: a1.sources.old.type: `old` is not listed in `a1.sources`, so it does not run (Flume skips it too)",
            "flume.conf:12: a1.sinks.k2.type: `k2` is not listed in `a1.sinks`, so it does not run (Flume skips it too)",
        ]
    );
    let got = yaml(text);
    assert!(got.contains("batch_size: 10\n"), "{got}");
    assert!(!got.contains("old") && !got.contains("k2"), "{got}");
}

#[test]
fn selectors_sink_groups_and_new_interceptors_follow_the_yaml_contract() {
    let text = "\
a1.sources = r1
a1.channels = c1 c2 c3 c4
a1.sinks = k1 k2 k3 k4
a1.sinkgroups = g1 g2
a1.sources.r1.type = http
a1.sources.r1.port = 5140
a1.sources.r1.channels = c1 c2 c3 c4
a1.sources.r1.selector.type = multiplexing
a1.sources.r1.selector.header = state
a1.sources.r1.selector.mapping.CZ = c1
a1.sources.r1.selector.mapping.US = c2 c3
a1.sources.r1.selector.default = c4
a1.sources.r1.selector.optional.CA = c1
a1.sources.r1.interceptors = rm id ex sr
a1.sources.r1.interceptors.rm.type = org.apache.flume.interceptor.RemoveHeaderInterceptor$Builder
a1.sources.r1.interceptors.rm.fromList = a, b
a1.sources.r1.interceptors.rm.fromListSeparator = \\\\s*,\\\\s*
a1.sources.r1.interceptors.id.type = org.apache.flume.sink.solr.morphline.UUIDInterceptor$Builder
a1.sources.r1.interceptors.id.headerName = id
a1.sources.r1.interceptors.id.preserveExisting = true
a1.sources.r1.interceptors.ex.type = REGEX_EXTRACTOR
a1.sources.r1.interceptors.ex.regex = ^(\\\\d\\\\d\\\\d\\\\d-\\\\d\\\\d-\\\\d\\\\d) (\\\\w+)
a1.sources.r1.interceptors.ex.serializers = s1 s2
a1.sources.r1.interceptors.ex.serializers.s1.type = org.apache.flume.interceptor.RegexExtractorInterceptorMillisSerializer
a1.sources.r1.interceptors.ex.serializers.s1.name = timestamp
a1.sources.r1.interceptors.ex.serializers.s1.pattern = yyyy-MM-dd
a1.sources.r1.interceptors.ex.serializers.s2.name = level
a1.sources.r1.interceptors.sr.type = search_replace
a1.sources.r1.interceptors.sr.searchPattern = secret=\\\\S+
a1.sources.r1.interceptors.sr.replaceString = secret=***
a1.channels.c1.type = memory
a1.channels.c2.type = memory
a1.channels.c3.type = memory
a1.channels.c4.type = memory
a1.sinks.k1.type = logger
a1.sinks.k1.channel = c1
a1.sinks.k2.type = logger
a1.sinks.k2.channel = c1
a1.sinks.k3.type = logger
a1.sinks.k3.channel = c2
a1.sinks.k4.type = logger
a1.sinks.k4.channel = c2
a1.sinkgroups.g1.sinks = k1 k2
a1.sinkgroups.g1.processor.type = failover
a1.sinkgroups.g1.processor.priority.k1 = 5
a1.sinkgroups.g1.processor.priority.k2 = 10
a1.sinkgroups.g1.processor.maxpenalty = 10000
a1.sinkgroups.g2.sinks = k3 k4
a1.sinkgroups.g2.processor.type = load_balance
a1.sinkgroups.g2.processor.backoff = true
a1.sinkgroups.g2.processor.selector = random
a1.sinkgroups.g2.processor.selector.maxTimeOut = 30000
";
    let got = yaml(text);
    let expected = r#"sources:
  r1:
    type: http
    port: 5140
    channels: [c1, c2, c3, c4]
    selector:
      type: multiplexing
      header: state
      default: [c4]
      mapping:
        CZ: [c1]
        US: [c2, c3]
      optional:
        CA: [c1]
    interceptors:
      - type: remove_header
        from_list: "a, b"
        list_separator: "\\s*,\\s*"
      - type: uuid
        header_name: id
        preserve_existing: true
      - type: regex_extractor
        regex: "^(\\d\\d\\d\\d-\\d\\d-\\d\\d) (\\w+)"
        serializers:
          - type: millis
            name: timestamp
            pattern: yyyy-MM-dd
          - name: level
      - type: search_replace
        search_pattern: "secret=\\S+"
        replace_string: secret=***
"#;
    assert!(got.starts_with(expected), "{got}");
    let groups = &got[got.find("sinkgroups:").expect("sinkgroups")..];
    assert_eq!(
        groups,
        "sinkgroups:
  g1:
    sinks: [k1, k2]
    processor:
      type: failover
      max_penalty: 10000ms
      priority:
        k1: 5
        k2: 10
  g2:
    sinks: [k3, k4]
    processor:
      type: load_balance
      backoff: true
      selector: random
      max_timeout: 30000ms
"
    );
}

#[test]
fn a_replicating_selector_without_optional_channels_is_what_a_source_does_anyway() {
    let base = "a1.sources = r1\na1.channels = c1 c2\na1.sinks = k1\n\
                a1.sources.r1.type = seq\na1.sources.r1.channels = c1 c2\n\
                a1.sources.r1.selector.type = replicating\n\
                a1.channels.c1.type = memory\na1.channels.c2.type = memory\n\
                a1.sinks.k1.type = null\na1.sinks.k1.channel = c1\n";
    assert!(!yaml(base).contains("selector"));
    let got = yaml(&format!("{base}a1.sources.r1.selector.optional = c2\n"));
    assert!(
        got.contains("    selector:\n      type: replicating\n      optional: [c2]\n"),
        "{got}"
    );
}

#[test]
fn kafka_source_and_channel_take_flume_kafka_names() {
    let text = "\
a1.sources = r1
a1.channels = c1
a1.sinks = k1
a1.sources.r1.type = org.apache.flume.source.kafka.KafkaSource
a1.sources.r1.channels = c1
a1.sources.r1.kafka.bootstrap.servers = localhost:9092
a1.sources.r1.kafka.topics = a, b
a1.sources.r1.kafka.consumer.group.id = collector
a1.sources.r1.kafka.consumer.auto.offset.reset = EARLIEST
a1.sources.r1.kafka.consumer.max.poll.records = 500
a1.sources.r1.batchDurationMillis = 200
a1.channels.c1.type = org.apache.flume.channel.kafka.KafkaChannel
a1.channels.c1.kafka.bootstrap.servers = localhost:9092
a1.channels.c1.kafka.topic = channel
a1.channels.c1.pollTimeout = 500
a1.channels.c1.kafka.consumer.security.protocol = SSL
a1.channels.c1.kafka.producer.acks = 1
a1.sinks.k1.type = null
a1.sinks.k1.channel = c1
";
    let got = problems(text);
    assert_eq!(
        got,
        [
            "flume.conf:17: a1.channels.c1.kafka.producer.acks: the channel writes in Kafka transactions, which need acks=all (Flume's default for the channel)"
        ]
    );
    let got = yaml(&text.replace("acks = 1", "acks = all"));
    assert!(
        got.starts_with(
            "sources:
  r1:
    type: kafka
    channels: [c1]
    topics: [a, b]
    group_id: collector
    batch_duration: 200ms
    bootstrap_servers: localhost:9092
    auto_offset_reset: earliest
    consumer:
      max.poll.records: 500
channels:
  c1:
    type: kafka
    topic: channel
    poll_timeout: 500ms
    bootstrap_servers: localhost:9092
    security_protocol: SSL
    # note: the topic's records"
        ),
        "{got}"
    );
    // Without `auto.offset.reset`, Flume's default (Kafka's) is kept.
    let got = yaml(
        &text
            .replace(
                "a1.sources.r1.kafka.consumer.auto.offset.reset = EARLIEST\n",
                "",
            )
            .replace("acks = 1", "acks = all"),
    );
    assert!(got.contains("    auto_offset_reset: latest\n"), "{got}");
}

#[test]
fn problems_found_by_validation_point_at_the_flume_line() {
    let text = "\
a1.sources = r1
a1.channels = c1
a1.sinks = k1
a1.sources.r1.type = netcat
a1.sources.r1.channels = c1
a1.sources.r1.port = not-a-port
a1.channels.c1.type = memory
a1.channels.c1.transactionCapacity = 10
a1.sinks.k1.type = logger
a1.sinks.k1.channel = c9
";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flume.conf");
    std::fs::write(&path, text).unwrap();
    let registry = crate::builtin_registry();
    let problems = match load(&path, "a1", &registry) {
        Ok(_) => panic!("loaded"),
        Err(problems) => problems,
    };
    let lines: Vec<Option<usize>> = problems.problems.iter().map(|p| p.line).collect();
    let shown = problems.to_string();
    assert!(lines.contains(&Some(6)), "{shown}");
    assert!(lines.contains(&Some(10)), "{shown}");
    assert!(
        shown.contains(":10: sink `k1`: unknown channel `c9`"),
        "{shown}"
    );
    assert!(
        lines.iter().all(Option::is_some),
        "every problem has a Flume line: {shown}"
    );
}

#[test]
fn flume_files_are_told_from_yaml() {
    let flume = "a1.sources = r1\na1.sources.r1.type = seq\n";
    assert!(is_flume_file(Path::new("agent.txt"), flume));
    assert!(is_flume_file(Path::new("x.conf"), ""));
    assert!(is_flume_file(Path::new("x.properties"), ""));
    assert!(!is_flume_file(
        Path::new("p.yaml"),
        "sources:\n  a1: {type: seq}\n"
    ));
    assert_eq!(
        agent_name(Path::new("f"), flume, None).unwrap(),
        "a1",
        "the only agent"
    );
    let two = "a1.sources = r1\na2.sources = r1\n";
    let err = agent_name(Path::new("f"), two, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("--name") && err.contains("a1, a2"), "{err}");
}
