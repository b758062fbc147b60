//! What each Flume component type becomes: its aliases and class names, our type, and for
//! every Flume property the option it sets (with the unit of its value), or why it has no
//! effect here, or why it is refused and what to use instead. These tables are the mapping
//! `docs/flume-migration.md` lists.

use ferry_core::ComponentKind;
use ferry_kafka::client::Role;

/// A Flume component type.
pub(crate) struct Component {
    pub(crate) kind: ComponentKind,
    /// Flume's short name, matched without regard to case as Flume does (`TAILDIR`).
    pub(crate) alias: Option<&'static str>,
    /// Flume's class names (an interceptor's is its `$Builder`).
    pub(crate) classes: &'static [&'static str],
    pub(crate) ours: Ours,
}

pub(crate) enum Ours {
    /// Runs as our type `name`.
    Type {
        name: &'static str,
        properties: &'static [Property],
        /// Options we set that Flume implies, with why.
        implied: &'static [(&'static str, &'static str, &'static str)],
        /// A note for every use of the type (a difference worth knowing).
        note: Option<&'static str>,
    },
    /// Runs as `then` when the value of property `key` is an object-storage URL (`s3a://`,
    /// `s3n://` or `s3://`), and is refused with `otherwise` when it is anything else or
    /// missing: Flume's `hdfs` sink runs as our `s3` sink with an `s3a://bucket/...` path.
    InObjectStorage {
        key: &'static str,
        then: &'static Ours,
        otherwise: &'static str,
    },
    /// Cannot run here: what to use instead.
    Refused(&'static str),
}

/// A Flume property of a component type (`name.*`: every property under `name.`).
#[derive(Clone, Copy)]
pub(crate) struct Property {
    pub(crate) flume: &'static str,
    pub(crate) to: To,
}

#[derive(Clone, Copy)]
pub(crate) enum To {
    /// Sets our option, the value converted.
    Option(&'static str, Conv),
    /// Has no effect here, and why (reported, written as a comment).
    Ignored(&'static str),
    /// Cannot be honoured: why, and what to do.
    Refused(&'static str),
    /// Accepted only with this value (case aside), which is what we do anyway; another value
    /// is refused with the reason.
    Only(&'static str, &'static str),
    /// Handled by the converter's code for the type.
    Special(Special),
}

/// How a Flume value becomes ours.
#[derive(Clone, Copy)]
pub(crate) enum Conv {
    /// As written.
    Text,
    /// `true` or `false` (Flume reads anything else as false: refused).
    Bool,
    /// A whole number of milliseconds, written as a duration.
    Millis,
    /// A whole number of seconds, written as a duration.
    Seconds,
    /// Words separated by blanks, as a list.
    Words,
    /// Items separated by commas, as a list.
    Commas,
    /// Lower case (Flume's enum names: `NEVER`, `OLDEST`).
    Lower,
    /// One of these Flume values (case aside), written as ours.
    Values(&'static [(&'static str, &'static str)]),
    /// A file extension without its dot (`log`), written as a suffix (`.log`).
    Extension,
    /// A file name prefix, written with the dot Flume puts after it (`FlumeData` becomes
    /// `FlumeData.`: Flume's `hdfs` sink names its files `<prefix>.<counter>`).
    Prefix,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Special {
    /// `kafka.*`, `kafka.producer.*`, `kafka.consumer.*` of a Kafka component.
    Kafka(Role),
    /// Taildir's `filegroups`, `filegroups.<g>` (a regex in the file name) and
    /// `headers.<g>.<key>`.
    Taildir,
    /// The file channel's `dataDirs` (a list; we have one directory).
    DataDirs,
    /// The regex extractor's `serializers`, `serializers.<s>.{name,type,pattern}`.
    Serializers,
    /// The `hdfs` sink's properties that are read together: `hdfs.path` (the bucket and the
    /// path), `hdfs.fileType` with `hdfs.codeC` (the format and the compression) and
    /// `hdfs.round` with `hdfs.roundValue` and `hdfs.roundUnit` (`round`).
    Hdfs,
}

const fn option(flume: &'static str, ours: &'static str, conv: Conv) -> Property {
    Property {
        flume,
        to: To::Option(ours, conv),
    }
}

const fn text(flume: &'static str, ours: &'static str) -> Property {
    option(flume, ours, Conv::Text)
}

const fn boolean(flume: &'static str, ours: &'static str) -> Property {
    option(flume, ours, Conv::Bool)
}

const fn ignored(flume: &'static str, why: &'static str) -> Property {
    Property {
        flume,
        to: To::Ignored(why),
    }
}

const fn refused(flume: &'static str, why: &'static str) -> Property {
    Property {
        flume,
        to: To::Refused(why),
    }
}

const fn only(flume: &'static str, value: &'static str, why: &'static str) -> Property {
    Property {
        flume,
        to: To::Only(value, why),
    }
}

const fn special(flume: &'static str, special: Special) -> Property {
    Property {
        flume,
        to: To::Special(special),
    }
}

const fn runs(
    kind: ComponentKind,
    alias: Option<&'static str>,
    classes: &'static [&'static str],
    name: &'static str,
    properties: &'static [Property],
) -> Component {
    Component {
        kind,
        alias,
        classes,
        ours: Ours::Type {
            name,
            properties,
            implied: &[],
            note: None,
        },
    }
}

const fn refuses(
    kind: ComponentKind,
    alias: Option<&'static str>,
    classes: &'static [&'static str],
    instead: &'static str,
) -> Component {
    Component {
        kind,
        alias,
        classes,
        ours: Ours::Refused(instead),
    }
}

use ComponentKind::{Channel, Interceptor, Sink, Source};

const BETWEEN_AGENTS: &str = "agents are chained through Kafka here: a `kafka` sink \
     (org.apache.flume.sink.kafka.KafkaSink) into a topic of the bundled broker (`agent broker`) \
     or any Kafka cluster, and a `kafka` source (org.apache.flume.source.kafka.KafkaSource) in \
     the next agent; see pipelines/chain/";
const JAVA_PLUGIN: &str = "it is Java code, which does not run here: write it as a process \
     plugin (`type: process`, docs/plugins.md)";
const NO_TLS_SOURCE: &str = "TLS on this source is not built in: put a TLS-terminating proxy in \
     front of it";
const CHARSET: &str = "bodies are passed through as bytes, not decoded; only UTF-8 gives the \
     same events as Flume";
const NO_BACKOFF: &str = "a source waits on a full channel and is woken when there is room; \
     there is no backoff to tune";

const TAILDIR: &[Property] = &[
    special("filegroups", Special::Taildir),
    special("filegroups.*", Special::Taildir),
    special("headers.*", Special::Taildir),
    text("positionFile", "flume_position_file"),
    text("batchSize", "batch_size"),
    boolean("skipToEnd", "skip_to_end"),
    option("idleTimeout", "idle_timeout", Conv::Millis),
    ignored(
        "writePosInterval",
        "positions are saved with every batch (file channel) or as soon as its events are delivered (memory channel), in the agent's state database",
    ),
    boolean("byteOffsetHeader", "byte_offset_header"),
    boolean("fileHeader", "file_header"),
    text("fileHeaderKey", "file_header_key"),
    ignored(
        "cachePatternMatching",
        "the globs are expanded again on every change inotify reports and every poll_interval",
    ),
    ignored(
        "maxBatchCount",
        "files are read in turn, a batch at a time, so that none starves the others",
    ),
    ignored(
        "backoffSleepIncrement",
        "new and grown files are seen at once through inotify; `poll_interval` (1s) is the fallback",
    ),
    ignored(
        "maxBackoffSleep",
        "new and grown files are seen at once through inotify; `poll_interval` (1s) is the fallback",
    ),
];

const SPOOLDIR: &[Property] = &[
    text("spoolDir", "spool_dir"),
    text("fileSuffix", "file_suffix"),
    option("deletePolicy", "delete_policy", Conv::Lower),
    boolean("fileHeader", "file_header"),
    text("fileHeaderKey", "file_header_key"),
    boolean("basenameHeader", "basename_header"),
    text("basenameHeaderKey", "basename_header_key"),
    text("ignorePattern", "ignore_pattern"),
    text("includePattern", "include_pattern"),
    option("consumeOrder", "consume_order", Conv::Lower),
    option("pollDelay", "poll_delay", Conv::Millis),
    text("batchSize", "batch_size"),
    text("deserializer.maxLineLength", "max_line_length"),
    ignored(
        "trackerDir",
        "which files are done, and how far the current one was read, is kept in the agent's state database",
    ),
    only(
        "trackingPolicy",
        "rename",
        "a completed file is renamed with `fileSuffix` or deleted; `tracker_dir` is not built in",
    ),
    only(
        "recursiveDirectorySearch",
        "false",
        "only the files directly in `spoolDir` are read",
    ),
    ignored("maxBackoff", NO_BACKOFF),
    only("inputCharset", "UTF-8", CHARSET),
    ignored(
        "decodeErrorPolicy",
        "bodies are passed through as bytes, so no decoding can fail",
    ),
    only(
        "deserializer",
        "LINE",
        "files are read line by line (Flume's LINE deserializer); AVRO and BLOB are not built in",
    ),
    only("deserializer.outputCharset", "UTF-8", CHARSET),
    ignored(
        "bufferMaxLines",
        "an old Flume setting that Flume itself ignores",
    ),
    ignored(
        "bufferMaxLineLength",
        "an old Flume setting; `deserializer.maxLineLength` is the one used",
    ),
];

const EXEC: &[Property] = &[
    text("command", "command"),
    text("shell", "shell"),
    boolean("restart", "restart"),
    option("restartThrottle", "restart_throttle", Conv::Millis),
    boolean("logStdErr", "log_stderr"),
    text("batchSize", "batch_size"),
    option("batchTimeout", "batch_timeout", Conv::Millis),
    only("charset", "UTF-8", CHARSET),
];

const NETCAT: &[Property] = &[
    text("bind", "bind"),
    text("port", "port"),
    text("max-line-length", "max_line_length"),
    boolean("ack-every-event", "ack_every_event"),
];

const NETCAT_UDP: &[Property] = &[
    text("bind", "bind"),
    text("port", "port"),
    text("remoteAddressHeader", "remote_address_header"),
];

const HTTP_SOURCE: &[Property] = &[
    text("bind", "bind"),
    text("port", "port"),
    only(
        "handler",
        "org.apache.flume.source.http.JSONHandler",
        "only Flume's JSON format (an array of `{\"headers\": {...}, \"body\": \"...\"}`) is built in; write other formats as a process source (docs/plugins.md)",
    ),
    refused(
        "handler.*",
        "only Flume's JSONHandler is built in and it has no options",
    ),
    only("enableSSL", "false", NO_TLS_SOURCE),
    only("ssl", "false", NO_TLS_SOURCE),
    refused("keystore", NO_TLS_SOURCE),
    refused("keystorePassword", NO_TLS_SOURCE),
    refused("keystore-password", NO_TLS_SOURCE),
    refused("keystoreType", NO_TLS_SOURCE),
    refused("keystore-type", NO_TLS_SOURCE),
    refused("exclude-protocols", NO_TLS_SOURCE),
    refused("include-protocols", NO_TLS_SOURCE),
    refused("exclude-cipher-suites", NO_TLS_SOURCE),
    refused("include-cipher-suites", NO_TLS_SOURCE),
];

const SYSLOG_TLS: [Property; 6] = [
    only("ssl", "false", NO_TLS_SOURCE),
    refused("keystore", NO_TLS_SOURCE),
    refused("keystore-password", NO_TLS_SOURCE),
    refused("keystore-type", NO_TLS_SOURCE),
    refused("exclude-protocols", NO_TLS_SOURCE),
    refused("include-protocols", NO_TLS_SOURCE),
];

const NO_HOSTNAME_HEADER: &str =
    "not supported (it needs a reverse DNS lookup per connection); use `clientIPHeader`";

const SYSLOG_TCP: &[Property] = &[
    text("host", "host"),
    text("port", "port"),
    text("eventSize", "event_size"),
    text("keepFields", "keep_fields"),
    text("clientIPHeader", "client_ip_header"),
    refused("clientHostnameHeader", NO_HOSTNAME_HEADER),
    SYSLOG_TLS[0],
    SYSLOG_TLS[1],
    SYSLOG_TLS[2],
    SYSLOG_TLS[3],
    SYSLOG_TLS[4],
    SYSLOG_TLS[5],
];

const SYSLOG_UDP: &[Property] = &[
    text("host", "host"),
    text("port", "port"),
    text("keepFields", "keep_fields"),
    text("clientIPHeader", "client_ip_header"),
    refused("clientHostnameHeader", NO_HOSTNAME_HEADER),
];

const MULTIPORT_SYSLOG_TCP: &[Property] = &[
    text("host", "host"),
    option("ports", "ports", Conv::Words),
    text("eventSize", "event_size"),
    text("keepFields", "keep_fields"),
    text("portHeader", "port_header"),
    text("batchSize", "batch_size"),
    text("clientIPHeader", "client_ip_header"),
    refused("clientHostnameHeader", NO_HOSTNAME_HEADER),
    ignored(
        "numProcessors",
        "connections are served by the agent's runtime threads",
    ),
    ignored(
        "readBufferBytes",
        "reads are buffered per connection as needed",
    ),
    only("charset.default", "UTF-8", CHARSET),
    refused("charset.port.*", CHARSET),
    SYSLOG_TLS[0],
    SYSLOG_TLS[1],
    SYSLOG_TLS[2],
    SYSLOG_TLS[3],
    SYSLOG_TLS[4],
    SYSLOG_TLS[5],
];

const AVRO_EVENTS: &str = "records are written and read as the body with the headers as Kafka \
     record headers; Flume's Avro-wrapped events are not built in";

const KAFKA_SOURCE: &[Property] = &[
    special("kafka.*", Special::Kafka(Role::Source)),
    option("kafka.topics", "topics", Conv::Commas),
    text("kafka.topics.regex", "topics_regex"),
    text("kafka.consumer.group.id", "group_id"),
    text("batchSize", "batch_size"),
    option("batchDurationMillis", "batch_duration", Conv::Millis),
    ignored("backoffStepMillis", NO_BACKOFF),
    ignored("maxBackoffMillis", NO_BACKOFF),
    only("useFlumeEventFormat", "false", AVRO_EVENTS),
    only(
        "setTopicHeader",
        "true",
        "the header `topic` is always set; remove it with a `remove_header` interceptor",
    ),
    only(
        "topicHeader",
        "topic",
        "the topic is always in the header `topic`",
    ),
    only(
        "migrateZookeeperOffsets",
        "false",
        "offsets are read from Kafka only; migrate ZooKeeper offsets with Flume first",
    ),
    refused(
        "zookeeperConnect",
        "offsets are read from Kafka only; give `kafka.bootstrap.servers`",
    ),
];

const MEMORY: &[Property] = &[
    text("capacity", "capacity"),
    text("transactionCapacity", "transaction_capacity"),
    text("byteCapacity", "byte_capacity"),
    ignored(
        "byteCapacityBufferPercentage",
        "headers are counted exactly in `byte_capacity`, so no allowance for them is kept",
    ),
    ignored(
        "keep-alive",
        "a put waits for room as long as it takes: a full channel makes the source wait instead of failing its batch",
    ),
];

const NO_CHECKPOINT: &str = "the channel's index is committed in the state database \
     (`state.db`) of its `data_dir` with every put and take, so there is no separate checkpoint";

const FILE: &[Property] = &[
    text("capacity", "capacity"),
    text("transactionCapacity", "transaction_capacity"),
    special("dataDirs", Special::DataDirs),
    ignored("checkpointDir", NO_CHECKPOINT),
    ignored("backupCheckpointDir", NO_CHECKPOINT),
    ignored("useDualCheckpoints", NO_CHECKPOINT),
    ignored("checkpointInterval", NO_CHECKPOINT),
    ignored("checkpointOnClose", NO_CHECKPOINT),
    ignored(
        "use-log-replay-v1",
        "there is no log replay: the index is read from the state database at start",
    ),
    ignored(
        "use-fast-replay",
        "there is no log replay: the index is read from the state database at start",
    ),
    text("maxFileSize", "max_file_size"),
    text("minimumRequiredSpace", "minimum_free_space"),
    ignored(
        "keep-alive",
        "a put waits for room as long as it takes: a full channel makes the source wait instead of failing its batch",
    ),
    option(
        "fsyncPerTransaction",
        "durability",
        Conv::Values(&[("true", "full"), ("false", "normal")]),
    ),
    ignored(
        "fsyncInterval",
        "with `fsyncPerTransaction = false` (`durability: normal`) writes are left to the operating system",
    ),
    refused(
        "encryption.*",
        "encryption of the channel files is not built in: keep `dataDirs` on an encrypted filesystem",
    ),
];

const KAFKA_CHANNEL: &[Property] = &[
    special("kafka.*", Special::Kafka(Role::Channel)),
    text("kafka.topic", "topic"),
    text("kafka.consumer.group.id", "group_id"),
    boolean("parseAsFlumeEvent", "parse_as_flume_event"),
    option("pollTimeout", "poll_timeout", Conv::Millis),
    text("transactionCapacity", "transaction_capacity"),
    only(
        "migrateZookeeperOffsets",
        "false",
        "offsets are read from Kafka only; migrate ZooKeeper offsets with Flume first",
    ),
    refused(
        "zookeeperConnect",
        "offsets are read from Kafka only; give `kafka.bootstrap.servers`",
    ),
    refused(
        "defaultPartitionId",
        "the channel chooses partitions itself (`partitions`, default 1, keeps the order of events)",
    ),
    refused(
        "partitionIdHeader",
        "the channel chooses partitions itself (`partitions`, default 1, keeps the order of events)",
    ),
];

const NULL: &[Property] = &[text("batchSize", "batch_size")];

const LOGGER: &[Property] = &[text("maxBytesToLog", "max_bytes_to_log")];

/// Flume's serializers that write text, as ours.
const TEXT_SERIALIZERS: Conv =
    Conv::Values(&[("text", "text"), ("header_and_text", "header_and_text")]);

const FILE_ROLL: &[Property] = &[
    text("sink.directory", "directory"),
    option("sink.rollInterval", "roll_interval", Conv::Seconds),
    option("sink.serializer", "serializer", TEXT_SERIALIZERS),
    boolean("sink.serializer.appendNewline", "append_newline"),
    only(
        "sink.pathManager",
        "DEFAULT",
        "files are named `<prefix><start millis>-<index><suffix>`; the ROLLTIME path manager is not built in",
    ),
    option("sink.pathManager.extension", "suffix", Conv::Extension),
    text("sink.pathManager.prefix", "prefix"),
    text("sink.batchSize", "batch_size"),
    text("batchSize", "batch_size"),
];

const NOT_IN_PROGRESS: &str = "an object is visible only once it is whole: nothing in \
     progress is ever listed, so it needs no in-use name";
const UPLOADS_RETRIED: &str = "a failed upload is retried with a backoff (1s doubling to 30s) \
     until it succeeds, and an object is visible only whole, so nothing is left half-closed";
const NOT_HDFS: &str = "the objects are written to object storage with the s3 sink's \
     credentials (the environment, the profile file or the instance's role), not to HDFS: \
     remove it";

/// Flume's `hdfs` sink, as our `s3` sink (`hdfs.path = s3a://bucket/path`).
const HDFS: &[Property] = &[
    special("hdfs.path", Special::Hdfs),
    option("hdfs.filePrefix", "file_prefix", Conv::Prefix),
    text("hdfs.fileSuffix", "file_suffix"),
    ignored("hdfs.inUsePrefix", NOT_IN_PROGRESS),
    ignored("hdfs.inUseSuffix", NOT_IN_PROGRESS),
    ignored("hdfs.emptyInUseSuffix", NOT_IN_PROGRESS),
    option("hdfs.rollInterval", "roll_interval", Conv::Seconds),
    text("hdfs.rollSize", "roll_size"),
    text("hdfs.rollCount", "roll_count"),
    option("hdfs.idleTimeout", "idle_timeout", Conv::Seconds),
    text("hdfs.batchSize", "batch_size"),
    special("hdfs.fileType", Special::Hdfs),
    special("hdfs.codeC", Special::Hdfs),
    option("serializer", "format", TEXT_SERIALIZERS),
    boolean("serializer.appendNewline", "append_newline"),
    text("hdfs.maxOpenFiles", "max_open_files"),
    boolean("hdfs.useLocalTimeStamp", "use_local_time"),
    special("hdfs.round", Special::Hdfs),
    special("hdfs.roundValue", Special::Hdfs),
    special("hdfs.roundUnit", Special::Hdfs),
    text("hdfs.timeZone", "time_zone"),
    option("hdfs.callTimeout", "request_timeout", Conv::Millis),
    ignored(
        "hdfs.writeFormat",
        "it is the record format of SequenceFiles, which are not written (Flume ignores it with DataStream and CompressedStream too)",
    ),
    ignored(
        "hdfs.threadsPoolSize",
        "uploads run on the agent's runtime; `parts_in_flight` bounds the parts of one object sent at once",
    ),
    ignored(
        "hdfs.rollTimerPoolSize",
        "objects are finished by the sink's own timer",
    ),
    ignored("hdfs.closeTries", UPLOADS_RETRIED),
    ignored("hdfs.retryInterval", UPLOADS_RETRIED),
    refused("hdfs.kerberosPrincipal", NOT_HDFS),
    refused("hdfs.kerberosKeytab", NOT_HDFS),
    refused("hdfs.proxyUser", NOT_HDFS),
    refused(
        "hdfs.minBlockReplicas",
        "HDFS block replication has no counterpart in object storage, which keeps its own redundancy: remove it",
    ),
];

/// A roll setting of the `hdfs` sink that Flume applies when the file leaves it out.
pub(crate) struct RollDefault {
    pub(crate) flume: &'static str,
    pub(crate) option: &'static str,
    /// Flume's default, as Flume writes it and as we do.
    pub(crate) flume_value: &'static str,
    pub(crate) ours: &'static str,
    /// A value to suggest instead: Flume's defaults make objects of 10 events or 1 KiB.
    pub(crate) larger: &'static str,
}

pub(crate) const HDFS_ROLL_DEFAULTS: [RollDefault; 3] = [
    RollDefault {
        flume: "hdfs.rollInterval",
        option: "roll_interval",
        flume_value: "30",
        ours: "30s",
        larger: "300",
    },
    RollDefault {
        flume: "hdfs.rollSize",
        option: "roll_size",
        flume_value: "1024",
        ours: "1024",
        larger: "134217728",
    },
    RollDefault {
        flume: "hdfs.rollCount",
        option: "roll_count",
        flume_value: "10",
        ours: "10",
        larger: "0",
    },
];

/// Flume's `hdfs` sink with an object-storage path.
const HDFS_AS_S3: Ours = Ours::Type {
    name: "s3",
    properties: HDFS,
    implied: &[(
        "file_prefix",
        "FlumeData.",
        "Flume's default hdfs.filePrefix, FlumeData, and the dot Flume writes after it",
    )],
    note: Some(
        "credentials are not in the Flume file (Hadoop's fs.s3a.* settings are in core-site.xml): the s3 sink takes them from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), the profile file (~/.aws/credentials) or the instance's or container's role; add `endpoint:` (an S3-compatible store) and `region:` to the converted YAML where needed",
    ),
};

const RETRIED: &str = "every answer other than 2xx rolls the batch back to be sent again, so \
     nothing is dropped or counted as sent when it was not";

const HTTP_SINK: &[Property] = &[
    text("endpoint", "endpoint"),
    option("connectTimeout", "connect_timeout", Conv::Millis),
    option("requestTimeout", "request_timeout", Conv::Millis),
    text("contentTypeHeader", "content_type"),
    ignored("acceptHeader", "the answer's body is not read"),
    ignored("defaultBackoff", RETRIED),
    ignored("defaultRollback", RETRIED),
    ignored("defaultIncrementMetrics", RETRIED),
    ignored("backoff.*", RETRIED),
    ignored("rollback.*", RETRIED),
    ignored("incrementMetrics.*", RETRIED),
];

const KAFKA_SINK: &[Property] = &[
    special("kafka.*", Special::Kafka(Role::Sink)),
    text("kafka.topic", "topic"),
    text("topic", "topic"),
    text("brokerList", "bootstrap_servers"),
    text("flumeBatchSize", "batch_size"),
    text("batchSize", "batch_size"),
    text("requiredAcks", "acks"),
    text("topicHeader", "topic_header"),
    boolean("allowTopicOverride", "allow_topic_override"),
    text("defaultPartitionId", "default_partition_id"),
    text("partitionIdHeader", "partition_id_header"),
    only("useFlumeEventFormat", "false", AVRO_EVENTS),
    refused(
        "timestampHeader",
        "a record's timestamp is the time it is sent; setting it from a header is not built in",
    ),
];

const HEADER_NAME_PRESERVE: [Property; 2] = [
    text("headerName", "header_name"),
    boolean("preserveExisting", "preserve_existing"),
];

const TIMESTAMP: &[Property] = &[HEADER_NAME_PRESERVE[0], HEADER_NAME_PRESERVE[1]];

const HOST: &[Property] = &[
    text("hostHeader", "host_header"),
    boolean("useIP", "use_ip"),
    boolean("preserveExisting", "preserve_existing"),
];

const STATIC: &[Property] = &[
    text("key", "key"),
    text("value", "value"),
    boolean("preserveExisting", "preserve_existing"),
];

const REGEX_FILTER: &[Property] = &[
    text("regex", "regex"),
    boolean("excludeEvents", "exclude_events"),
];

const REGEX_EXTRACTOR: &[Property] = &[
    text("regex", "regex"),
    special("serializers", Special::Serializers),
    special("serializers.*", Special::Serializers),
];

const REMOVE_HEADER: &[Property] = &[
    text("withName", "with_name"),
    text("fromList", "from_list"),
    text("fromListSeparator", "list_separator"),
    text("matching", "matching"),
];

const SEARCH_REPLACE: &[Property] = &[
    text("searchPattern", "search_pattern"),
    text("replaceString", "replace_string"),
    text("charset", "charset"),
];

const UUID: &[Property] = &[
    HEADER_NAME_PRESERVE[0],
    HEADER_NAME_PRESERVE[1],
    text("prefix", "prefix"),
];

/// Every Flume component type we know, runnable or not.
pub(crate) const COMPONENTS: &[Component] = &[
    // Sources.
    runs(
        Source,
        Some("seq"),
        &["org.apache.flume.source.SequenceGeneratorSource"],
        "seq",
        &[
            text("batchSize", "batch_size"),
            text("totalEvents", "total_events"),
        ],
    ),
    runs(
        Source,
        Some("netcat"),
        &["org.apache.flume.source.NetcatSource"],
        "netcat",
        NETCAT,
    ),
    runs(
        Source,
        Some("netcatudp"),
        &["org.apache.flume.source.NetcatUdpSource"],
        "netcat_udp",
        NETCAT_UDP,
    ),
    runs(
        Source,
        Some("exec"),
        &["org.apache.flume.source.ExecSource"],
        "exec",
        EXEC,
    ),
    runs(
        Source,
        Some("http"),
        &["org.apache.flume.source.http.HTTPSource"],
        "http",
        HTTP_SOURCE,
    ),
    runs(
        Source,
        Some("spooldir"),
        &["org.apache.flume.source.SpoolDirectorySource"],
        "spooldir",
        SPOOLDIR,
    ),
    runs(
        Source,
        Some("taildir"),
        &["org.apache.flume.source.taildir.TaildirSource"],
        "taildir",
        TAILDIR,
    ),
    runs(
        Source,
        Some("syslogtcp"),
        &["org.apache.flume.source.SyslogTcpSource"],
        "syslog_tcp",
        SYSLOG_TCP,
    ),
    runs(
        Source,
        Some("syslogudp"),
        &["org.apache.flume.source.SyslogUDPSource"],
        "syslog_udp",
        SYSLOG_UDP,
    ),
    runs(
        Source,
        Some("multiport_syslogtcp"),
        &["org.apache.flume.source.MultiportSyslogTCPSource"],
        "multiport_syslog_tcp",
        MULTIPORT_SYSLOG_TCP,
    ),
    Component {
        kind: Source,
        alias: None,
        classes: &["org.apache.flume.source.kafka.KafkaSource"],
        ours: Ours::Type {
            name: "kafka",
            properties: KAFKA_SOURCE,
            // Flume's KafkaSource leaves `auto.offset.reset` at the Kafka consumer's default.
            implied: &[(
                "auto_offset_reset",
                "latest",
                "Flume's KafkaSource leaves auto.offset.reset at Kafka's default, latest (ours is earliest)",
            )],
            note: None,
        },
    },
    refuses(
        Source,
        Some("avro"),
        &["org.apache.flume.source.AvroSource"],
        BETWEEN_AGENTS,
    ),
    refuses(
        Source,
        Some("thrift"),
        &["org.apache.flume.source.ThriftSource"],
        BETWEEN_AGENTS,
    ),
    refuses(
        Source,
        Some("jms"),
        &["org.apache.flume.source.jms.JMSSource"],
        "JMS is not built in: bridge the queue to Kafka, or read it with a process source (docs/plugins.md)",
    ),
    refuses(
        Source,
        None,
        &["org.apache.flume.source.scribe.ScribeSource"],
        "Scribe is not built in: send to the `http` or `syslog_tcp` source, or to Kafka",
    ),
    refuses(
        Source,
        None,
        &["org.apache.flume.source.twitter.TwitterSource"],
        "the Twitter source is not built in: read the API with a process source (docs/plugins.md)",
    ),
    refuses(
        Source,
        None,
        &["org.apache.flume.source.StressSource"],
        "use the `seq` source (org.apache.flume.source.SequenceGeneratorSource) to generate events",
    ),
    // Channels.
    runs(
        Channel,
        Some("memory"),
        &["org.apache.flume.channel.MemoryChannel"],
        "memory",
        MEMORY,
    ),
    runs(
        Channel,
        Some("file"),
        &["org.apache.flume.channel.file.FileChannel"],
        "file",
        FILE,
    ),
    Component {
        kind: Channel,
        alias: None,
        classes: &["org.apache.flume.channel.kafka.KafkaChannel"],
        ours: Ours::Type {
            name: "kafka",
            properties: KAFKA_CHANNEL,
            implied: &[],
            note: Some(
                "the topic's records are the body with the headers as Kafka record headers, not Flume's Avro events: drain a topic that Flume's KafkaChannel wrote before this channel reads it",
            ),
        },
    },
    refuses(
        Channel,
        Some("spillablememory"),
        &["org.apache.flume.channel.SpillableMemoryChannel"],
        "use a `file` channel (durable, with group commit) or a `memory` channel",
    ),
    refuses(
        Channel,
        Some("jdbc"),
        &["org.apache.flume.channel.jdbc.JdbcChannel"],
        "use a `file` channel: durable, indexed in SQLite",
    ),
    refuses(
        Channel,
        None,
        &["org.apache.flume.channel.PseudoTxnMemoryChannel"],
        "use a `memory` channel",
    ),
    // Sinks.
    runs(
        Sink,
        Some("null"),
        &["org.apache.flume.sink.NullSink"],
        "null",
        NULL,
    ),
    runs(
        Sink,
        Some("logger"),
        &["org.apache.flume.sink.LoggerSink"],
        "logger",
        LOGGER,
    ),
    runs(
        Sink,
        Some("file_roll"),
        &["org.apache.flume.sink.RollingFileSink"],
        "file_roll",
        FILE_ROLL,
    ),
    Component {
        kind: Sink,
        alias: Some("http"),
        classes: &["org.apache.flume.sink.http.HttpSink"],
        ours: Ours::Type {
            name: "http",
            properties: HTTP_SINK,
            implied: &[("format", "lines", "Flume posts event bodies, not JSON")],
            note: Some(
                "Flume posts one event per request; this posts a batch per request, the bodies one per line: set `batch_size: 1` for one event per request",
            ),
        },
    },
    Component {
        kind: Sink,
        alias: None,
        classes: &["org.apache.flume.sink.kafka.KafkaSink"],
        ours: Ours::Type {
            name: "kafka",
            properties: KAFKA_SINK,
            implied: &[],
            note: None,
        },
    },
    Component {
        kind: Sink,
        alias: Some("hdfs"),
        classes: &["org.apache.flume.sink.hdfs.HDFSEventSink"],
        ours: Ours::InObjectStorage {
            key: "hdfs.path",
            then: &HDFS_AS_S3,
            otherwise: "HDFS is not written; point the sink at object storage (`hdfs.path = s3a://bucket/...` converts to the `s3` sink) or write local files with `file_roll`",
        },
    },
    refuses(
        Sink,
        Some("hive"),
        &["org.apache.flume.sink.hive.HiveSink"],
        "Hive is not built in: write to Kafka with the `kafka` sink and load Hive from the topic",
    ),
    refuses(
        Sink,
        Some("hbase"),
        &["org.apache.flume.sink.hbase.HBaseSink"],
        "HBase is not built in: write to Kafka with the `kafka` sink and load HBase from the topic",
    ),
    refuses(
        Sink,
        Some("hbase2"),
        &["org.apache.flume.sink.hbase2.HBase2Sink"],
        "HBase is not built in: write to Kafka with the `kafka` sink and load HBase from the topic",
    ),
    refuses(
        Sink,
        Some("asynchbase"),
        &["org.apache.flume.sink.hbase.AsyncHBaseSink"],
        "HBase is not built in: write to Kafka with the `kafka` sink and load HBase from the topic",
    ),
    refuses(
        Sink,
        Some("avro"),
        &["org.apache.flume.sink.AvroSink"],
        BETWEEN_AGENTS,
    ),
    refuses(
        Sink,
        Some("thrift"),
        &["org.apache.flume.sink.ThriftSink"],
        BETWEEN_AGENTS,
    ),
    refuses(
        Sink,
        Some("irc"),
        &["org.apache.flume.sink.irc.IRCSink"],
        "IRC is not built in: write a process sink (docs/plugins.md)",
    ),
    refuses(
        Sink,
        Some("elasticsearch"),
        &["org.apache.flume.sink.elasticsearch.ElasticSearchSink"],
        "Elasticsearch is not built in: write to Kafka with the `kafka` sink and index the topic with a Kafka connector, or write a process sink (docs/plugins.md)",
    ),
    refuses(
        Sink,
        Some("morphline_solr"),
        &["org.apache.flume.sink.solr.morphline.MorphlineSolrSink"],
        "Solr and morphlines are not built in: write to Kafka with the `kafka` sink and index the topic from there, or write a process sink (docs/plugins.md)",
    ),
    // Interceptors.
    runs(
        Interceptor,
        Some("timestamp"),
        &["org.apache.flume.interceptor.TimestampInterceptor$Builder"],
        "timestamp",
        TIMESTAMP,
    ),
    runs(
        Interceptor,
        Some("host"),
        &["org.apache.flume.interceptor.HostInterceptor$Builder"],
        "host",
        HOST,
    ),
    runs(
        Interceptor,
        Some("static"),
        &["org.apache.flume.interceptor.StaticInterceptor$Builder"],
        "static",
        STATIC,
    ),
    runs(
        Interceptor,
        Some("regex_filter"),
        &["org.apache.flume.interceptor.RegexFilteringInterceptor$Builder"],
        "regex_filter",
        REGEX_FILTER,
    ),
    runs(
        Interceptor,
        Some("regex_extractor"),
        &["org.apache.flume.interceptor.RegexExtractorInterceptor$Builder"],
        "regex_extractor",
        REGEX_EXTRACTOR,
    ),
    runs(
        Interceptor,
        Some("remove_header"),
        &["org.apache.flume.interceptor.RemoveHeaderInterceptor$Builder"],
        "remove_header",
        REMOVE_HEADER,
    ),
    runs(
        Interceptor,
        Some("search_replace"),
        &["org.apache.flume.interceptor.SearchAndReplaceInterceptor$Builder"],
        "search_replace",
        SEARCH_REPLACE,
    ),
    runs(
        Interceptor,
        None,
        &["org.apache.flume.sink.solr.morphline.UUIDInterceptor$Builder"],
        "uuid",
        UUID,
    ),
    refuses(
        Interceptor,
        None,
        &["org.apache.flume.sink.solr.morphline.MorphlineInterceptor$Builder"],
        "morphlines are not built in: write the transformation as a process interceptor (docs/plugins.md)",
    ),
];

/// The component of `kind` Flume's `type` value names: an alias (any case) or a class name
/// (an interceptor's `Builder` written with `$` or `.`). Otherwise the message to show.
pub(crate) fn find(kind: ComponentKind, type_name: &str) -> Result<&'static Component, String> {
    let class = type_name.replace(".Builder", "$Builder");
    let of_kind = || COMPONENTS.iter().filter(move |c| c.kind == kind);
    if let Some(found) = of_kind().find(|c| {
        c.alias.is_some_and(|a| a.eq_ignore_ascii_case(type_name))
            || c.classes.contains(&class.as_str())
    }) {
        return Ok(found);
    }
    if type_name.contains('.') {
        return Err(format!(
            "{kind} type `{type_name}` is not one of Flume's that we know: {JAVA_PLUGIN}"
        ));
    }
    let aliases: Vec<&str> = of_kind().filter_map(|c| c.alias).collect();
    let lower = type_name.to_ascii_lowercase();
    Err(ferry_core::config::unknown_name_message(
        &format!("Flume {kind} type"),
        &lower,
        aliases,
    ))
}

impl Component {
    /// How Flume names this type in messages: its alias, or its class.
    pub(crate) fn flume_name(&self) -> &'static str {
        self.alias.unwrap_or(self.classes[0])
    }
}

/// The property of `properties` that `key` names (`name.*` entries match every key under
/// `name.`; an exact entry wins over a prefix).
pub(crate) fn property<'p>(properties: &'p [Property], key: &str) -> Option<&'p Property> {
    properties.iter().find(|p| p.flume == key).or_else(|| {
        properties.iter().find(|p| {
            p.flume
                .strip_suffix('*')
                .is_some_and(|prefix| key.starts_with(prefix))
        })
    })
}

/// Our type of `kind` that Flume's type name `flume` (an alias such as `syslogtcp`, or a class
/// name such as `org.apache.flume.sink.kafka.KafkaSink`) runs as, if it runs here. Not for a
/// type that runs as ours only once a property is converted (`hdfs`: its `hdfs.path`).
pub(crate) fn our_type(kind: ferry_core::ComponentKind, flume: &str) -> Option<&'static str> {
    match find(kind, flume).ok()?.ours {
        Ours::Type { name, .. } => Some(name),
        Ours::InObjectStorage { .. } | Ours::Refused(_) => None,
    }
}
