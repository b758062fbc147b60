use ferry_core::ComponentKind;

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
a1.sinks.k1.type = hive
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
        got[3].starts_with("flume.conf:9: a1.sinks.k1.type: Flume's sink `hive` cannot run here:")
            && got[3].contains("`kafka` sink"),
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

/// A collector: taildir into a file channel, drained into S3 through Flume's `hdfs` sink.
const COLLECTOR: &str = "\
a1.sources = r1
a1.channels = c1
a1.sinks = k1
a1.sources.r1.type = TAILDIR
a1.sources.r1.channels = c1
a1.sources.r1.positionFile = /var/lib/flume/taildir_position.json
a1.sources.r1.filegroups = f1
a1.sources.r1.filegroups.f1 = /var/log/app/.*\\\\.log
a1.channels.c1.type = file
a1.channels.c1.dataDirs = /var/lib/flume/data
a1.sinks.k1.type = hdfs
a1.sinks.k1.channel = c1
a1.sinks.k1.hdfs.path = s3a://logs/flume/%Y-%m-%d
a1.sinks.k1.hdfs.fileType = DataStream
a1.sinks.k1.hdfs.rollInterval = 300
";

/// The options of sink `k1` in converted YAML, as the `s3` sink reads them: without the keys
/// the runner takes (`type`, `channel`, `batch_size`).
fn s3_options(yaml: &str) -> ferry_sinks::s3::S3Config {
    let options: String = yaml
        .lines()
        .skip_while(|l| *l != "  k1:")
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .filter(|l| {
            !["type:", "channel:", "batch_size:"]
                .iter()
                .any(|k| l[4..].starts_with(k))
        })
        .map(|l| format!("{}\n", &l[4..]))
        .collect();
    let config =
        ferry_core::config::ComponentConfig::from_yaml(ComponentKind::Sink, "k1", "s3", &options)
            .unwrap_or_else(|e| panic!("{}: {options}", e.message));
    config
        .parse()
        .unwrap_or_else(|e| panic!("{}: {options}", e.message))
}

#[test]
fn an_hdfs_sink_writing_to_s3a_becomes_the_s3_sink_with_flumes_names_and_defaults() {
    let got = yaml(COLLECTOR);
    assert_eq!(
        got,
        "sources:
  r1:
    type: taildir
    channels: [c1]
    flume_position_file: /var/lib/flume/taildir_position.json
    filegroups:
      f1: /var/log/app/*.log
channels:
  c1:
    type: file
    data_dir: /var/lib/flume/data
sinks:
  k1:
    type: s3
    channel: c1
    roll_interval: 300s
    bucket: logs
    path: flume/%Y-%m-%d
    format: text
    # Flume's defaults are kept where the file does not set them, `hdfs.rollSize = 1024`, `hdfs.rollCount = 10`: they make small objects, slow and costly to store and to read; set larger ones, e.g. `hdfs.rollSize = 134217728`, `hdfs.rollCount = 0`
    roll_size: 1024
    roll_count: 10
    # as in Flume: Flume's default hdfs.filePrefix, FlumeData, and the dot Flume writes after it
    file_prefix: FlumeData.
    # note: credentials are not in the Flume file (Hadoop's fs.s3a.* settings are in core-site.xml): the s3 sink takes them from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), the profile file (~/.aws/credentials) or the instance's or container's role; add `endpoint:` (an S3-compatible store) and `region:` to the converted YAML where needed
"
    );
    let notes = notes(COLLECTOR);
    assert_eq!(notes.len(), 2, "{notes:#?}");
    assert!(
        notes[0].starts_with("flume.conf:11: a1.sinks.k1.type: Flume's defaults are kept where the file does not set them, `hdfs.rollSize = 1024`, `hdfs.rollCount = 10`: they make small objects"),
        "{notes:#?}"
    );
    assert!(
        notes[1]
            .starts_with("flume.conf:11: a1.sinks.k1.type: credentials are not in the Flume file")
            && notes[1].contains("`endpoint:`")
            && notes[1].contains("`region:`"),
        "{notes:#?}"
    );
    let s3 = s3_options(&got);
    assert_eq!(
        (
            s3.bucket.as_str(),
            s3.path.as_str(),
            s3.file_prefix.as_str()
        ),
        ("logs", "flume/%Y-%m-%d", "FlumeData.")
    );
    assert_eq!(s3.roll_interval, std::time::Duration::from_secs(300));
    assert_eq!((s3.roll_size.bytes(), s3.roll_count), (1024, 10));
}

#[test]
fn every_hdfs_property_that_applies_sets_its_s3_option() {
    let text = COLLECTOR.replace(
        "a1.sinks.k1.hdfs.rollInterval = 300\n",
        "\
a1.sinks.k1.hdfs.path = s3n://archive/
a1.sinks.k1.hdfs.filePrefix = events-%{host}
a1.sinks.k1.hdfs.fileSuffix = .log
a1.sinks.k1.hdfs.inUsePrefix = _
a1.sinks.k1.hdfs.inUseSuffix = .tmp
a1.sinks.k1.hdfs.rollInterval = 0
a1.sinks.k1.hdfs.rollSize = 134217728
a1.sinks.k1.hdfs.rollCount = 0
a1.sinks.k1.hdfs.idleTimeout = 60
a1.sinks.k1.hdfs.batchSize = 1000
a1.sinks.k1.hdfs.maxOpenFiles = 50
a1.sinks.k1.hdfs.useLocalTimeStamp = true
a1.sinks.k1.hdfs.timeZone = Europe/Paris
a1.sinks.k1.hdfs.callTimeout = 10000
a1.sinks.k1.hdfs.writeFormat = Text
a1.sinks.k1.hdfs.threadsPoolSize = 20
a1.sinks.k1.hdfs.closeTries = 3
a1.sinks.k1.hdfs.retryInterval = 60
a1.sinks.k1.serializer = HEADER_AND_TEXT
a1.sinks.k1.serializer.appendNewline = false
",
    );
    let got = yaml(&text);
    for line in [
        "    bucket: archive\n",
        "    file_prefix: events-%{host}.\n",
        "    file_suffix: .log\n",
        "    roll_interval: 0s\n",
        "    roll_size: 134217728\n",
        "    roll_count: 0\n",
        "    idle_timeout: 60s\n",
        "    batch_size: 1000\n",
        "    max_open_files: 50\n",
        "    use_local_time: true\n",
        "    time_zone: Europe/Paris\n",
        "    request_timeout: 10000ms\n",
        "    format: header_and_text\n",
        "    append_newline: false\n",
    ] {
        assert!(got.contains(line), "{line}in\n{got}");
    }
    // The bucket's root: no path; Flume's defaults all replaced, so no note about them.
    assert!(
        !got.contains("path:") && !got.contains("FlumeData"),
        "{got}"
    );
    let notes = notes(&text);
    assert!(
        !notes.iter().any(|n| n.contains("small objects")),
        "{notes:#?}"
    );
    for key in [
        "inUsePrefix",
        "inUseSuffix",
        "writeFormat",
        "threadsPoolSize",
        "closeTries",
        "retryInterval",
    ] {
        assert!(
            notes
                .iter()
                .any(|n| n.contains(&format!("a1.sinks.k1.hdfs.{key}: no effect here"))),
            "{key}: {notes:#?}"
        );
    }
    let s3 = s3_options(&got);
    assert_eq!(s3.file_prefix, "events-%{host}.");
    assert_eq!(s3.time_zone.as_deref(), Some("Europe/Paris"));
    assert_eq!(s3.request_timeout, std::time::Duration::from_secs(10));
    assert!(s3.use_local_time && !s3.append_newline);
}

#[test]
fn a_compressed_stream_becomes_compression_with_flumes_codec_extension() {
    let compressed = COLLECTOR.replace(
        "hdfs.fileType = DataStream",
        "hdfs.fileType = CompressedStream\na1.sinks.k1.hdfs.codeC = gzip",
    );
    let got = yaml(&compressed);
    assert!(
        got.contains(
            "    format: text
    compression: gzip
    # as in Flume: without hdfs.fileSuffix, the names end with the codec's extension
    file_suffix: .gz
"
        ),
        "{got}"
    );
    assert_eq!(
        s3_options(&got).compression,
        ferry_sinks::roll::Compression::Gzip
    );
    for (codec, compression) in [
        ("gz", "gzip"),
        ("org.apache.hadoop.io.compress.GzipCodec", "gzip"),
        ("zstd", "zstd"),
        ("ZStandardCodec", "zstd"),
    ] {
        let got = yaml(&compressed.replace("codeC = gzip", &format!("codeC = {codec}")));
        assert!(
            got.contains(&format!("    compression: {compression}\n")),
            "{codec}: {got}"
        );
    }
    // A suffix of the file's own is kept: Flume adds the codec's extension only without one.
    let got = yaml(&format!(
        "{compressed}a1.sinks.k1.hdfs.fileSuffix = .log.gz\n"
    ));
    assert!(
        got.contains("    file_suffix: .log.gz\n") && !got.contains("file_suffix: .gz"),
        "{got}"
    );
}

#[test]
fn hdfs_round_becomes_round_in_the_unit_of_round_unit() {
    let round = |extra: &str| {
        yaml(&format!(
            "{COLLECTOR}a1.sinks.k1.hdfs.round = true\n{extra}"
        ))
    };
    assert!(
        round("").contains("    round: 1s\n"),
        "Flume's defaults: 1 second"
    );
    let got = round("a1.sinks.k1.hdfs.roundValue = 10\na1.sinks.k1.hdfs.roundUnit = minute\n");
    assert!(got.contains("    round: 10m\n"), "{got}");
    assert_eq!(
        s3_options(&got).round,
        Some(std::time::Duration::from_secs(600))
    );
    let got = round("a1.sinks.k1.hdfs.roundUnit = HOUR\n");
    assert!(got.contains("    round: 1h\n"), "{got}");
    // Without `hdfs.round = true` Flume does not round: neither do we, and says so.
    let text = format!("{COLLECTOR}a1.sinks.k1.hdfs.roundValue = 10\n");
    assert!(!yaml(&text).contains("round:"));
    assert!(
        notes(&text).contains(
            &"flume.conf:16: a1.sinks.k1.hdfs.roundValue: no effect here: `hdfs.round` is not `true` (Flume ignores it too)"
                .to_owned()
        ),
        "{:#?}",
        notes(&text)
    );
    assert_eq!(
        problems(&format!(
            "{COLLECTOR}a1.sinks.k1.hdfs.round = true\na1.sinks.k1.hdfs.roundValue = 30\na1.sinks.k1.hdfs.roundUnit = hour\n"
        )),
        [
            "flume.conf:17: a1.sinks.k1.hdfs.roundValue: `30` is not a whole number from 1 to 24 (Flume refuses it too)"
        ]
    );
    assert_eq!(
        problems(&format!(
            "{COLLECTOR}a1.sinks.k1.hdfs.round = true\na1.sinks.k1.hdfs.roundUnit = day\n"
        )),
        [
            "flume.conf:17: a1.sinks.k1.hdfs.roundUnit: `day` is not `second`, `minute` or `hour` (Flume would turn rounding off with a warning)"
        ]
    );
}

#[test]
fn what_an_hdfs_sink_cannot_do_in_object_storage_is_refused_by_name() {
    // Flume's default file type is SequenceFile.
    assert_eq!(
        problems(&COLLECTOR.replace("a1.sinks.k1.hdfs.fileType = DataStream\n", "")),
        [
            "flume.conf:11: a1.sinks.k1.type: `hdfs.fileType` is not set and Flume's default is SequenceFile, which is not written here (Hadoop SequenceFiles): write `hdfs.fileType = DataStream` (the bodies as text), or `CompressedStream` with `hdfs.codeC = gzip` or `zstd`"
        ]
    );
    assert_eq!(
        problems(&COLLECTOR.replace("= DataStream", "= SequenceFile")),
        [
            "flume.conf:14: a1.sinks.k1.hdfs.fileType: Hadoop SequenceFiles are not written here: write `hdfs.fileType = DataStream` (the bodies as text), or `CompressedStream` with `hdfs.codeC = gzip` or `zstd`"
        ]
    );
    let compressed = |codec: &str| {
        COLLECTOR.replace(
            "hdfs.fileType = DataStream",
            &format!("hdfs.fileType = CompressedStream\na1.sinks.k1.hdfs.codeC = {codec}"),
        )
    };
    for codec in ["snappy", "bzip2", "lzo", "lzop", "DefaultCodec", "brotli"] {
        assert_eq!(
            problems(&compressed(codec)),
            [format!(
                "flume.conf:15: a1.sinks.k1.hdfs.codeC: the codec `{codec}` is not supported: `gzip` or `zstd` (Hadoop's GzipCodec and ZStandardCodec); bzip2, lzo, lzop, snappy, lz4 and deflate are not written"
            )]
        );
    }
    assert_eq!(
        problems(&COLLECTOR.replace("= DataStream", "= CompressedStream")),
        [
            "flume.conf:14: a1.sinks.k1.hdfs.fileType: `CompressedStream` needs `hdfs.codeC` (`gzip` or `zstd`), as in Flume"
        ]
    );
    assert_eq!(
        problems(&format!("{COLLECTOR}a1.sinks.k1.hdfs.codeC = gzip\n")),
        [
            "flume.conf:16: a1.sinks.k1.hdfs.codeC: Flume refuses a codec with `hdfs.fileType = DataStream` too: write `hdfs.fileType = CompressedStream` to compress"
        ]
    );
    let got = problems(&format!(
        "{COLLECTOR}\
a1.sinks.k1.hdfs.kerberosPrincipal = flume/_HOST@EXAMPLE.COM
a1.sinks.k1.hdfs.kerberosKeytab = /etc/flume.keytab
a1.sinks.k1.hdfs.proxyUser = etl
a1.sinks.k1.hdfs.minBlockReplicas = 1
a1.sinks.k1.hdfs.rollIntervall = 60
a1.sinks.k1.serializer = avro_event
"
    ));
    let not_hdfs = "the objects are written to object storage with the s3 sink's credentials (the environment, the profile file or the instance's role), not to HDFS: remove it";
    assert_eq!(
        got,
        [
            format!("flume.conf:16: a1.sinks.k1.hdfs.kerberosPrincipal: {not_hdfs}"),
            format!("flume.conf:17: a1.sinks.k1.hdfs.kerberosKeytab: {not_hdfs}"),
            format!("flume.conf:18: a1.sinks.k1.hdfs.proxyUser: {not_hdfs}"),
            "flume.conf:19: a1.sinks.k1.hdfs.minBlockReplicas: HDFS block replication has no counterpart in object storage, which keeps its own redundancy: remove it".to_owned(),
            "flume.conf:20: a1.sinks.k1.hdfs.rollIntervall: `hdfs.rollIntervall` is not a property of Flume's sink `hdfs` that we know, did you mean `hdfs.rollInterval`?".to_owned(),
            "flume.conf:21: a1.sinks.k1.serializer: `avro_event` is not supported: one of `text`, `header_and_text` (any case)".to_owned(),
        ]
    );
    for (bucket, problem) in [
        ("s3a:///flume", "no bucket"),
        (
            "s3a://logs-%{env}/flume",
            "the bucket cannot come from an escape",
        ),
        (
            "s3a://KEY:SECRET@logs/flume",
            "credentials in the URL are not read",
        ),
    ] {
        let got = problems(&COLLECTOR.replace("s3a://logs/flume/%Y-%m-%d", bucket));
        assert!(
            got.len() == 1
                && got[0].starts_with(&format!("flume.conf:13: a1.sinks.k1.hdfs.path: {problem}")),
            "{bucket}: {got:#?}"
        );
    }
}

#[test]
fn an_hdfs_sink_writing_to_hdfs_is_refused_with_what_to_write_instead() {
    let refusal = "HDFS is not written; point the sink at object storage (`hdfs.path = s3a://bucket/...` converts to the `s3` sink) or write local files with `file_roll`";
    for path in [
        "hdfs://namenode:8020/flume/%Y-%m-%d",
        "/flume/events",
        "file:///var/flume",
    ] {
        // Only the path is reported: the rest does not matter for a sink that cannot run.
        let text = COLLECTOR
            .replace("s3a://logs/flume/%Y-%m-%d", path)
            .replace(
                "a1.sinks.k1.hdfs.fileType = DataStream\n",
                "a1.sinks.k1.hdfs.kerberosKeytab = /k\n",
            );
        assert_eq!(
            problems(&text),
            [format!("flume.conf:13: a1.sinks.k1.hdfs.path: {refusal}")],
            "{path}"
        );
    }
    let got = problems(&COLLECTOR.replace("s3a://logs/flume/%Y-%m-%d", "${ARCHIVE_URL}"));
    assert!(
        got.len() == 1
            && got[0].starts_with(
                "flume.conf:13: a1.sinks.k1.hdfs.path: the scheme and the bucket are written out"
            ),
        "{got:#?}"
    );
    assert_eq!(
        problems(&COLLECTOR.replace("a1.sinks.k1.hdfs.path = s3a://logs/flume/%Y-%m-%d\n", "")),
        [format!(
            "flume.conf:11: a1.sinks.k1.type: `hdfs.path` is missing (Flume requires it too): {refusal}"
        )]
    );
    // In YAML, `type: hdfs` is not taken as `s3`: its options are Flume's until converted.
    assert_eq!(components::our_type(ComponentKind::Sink, "hdfs"), None);
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
