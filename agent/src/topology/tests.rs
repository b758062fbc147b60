//! Pipeline files checked and built with test components: every problem reported with its
//! line, defaults, sink groups.

use super::*;
use ferry_core::{SinkBatch, SinkError, SourceContext, SourceError, async_trait};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GenOptions {
    #[serde(default = "one")]
    batch_size: usize,
}

fn one() -> usize {
    1
}

struct Gen(usize);

#[async_trait]
impl Source for Gen {
    fn max_batch_size(&self) -> Option<usize> {
        Some(self.0)
    }
    async fn run(self: Box<Self>, _ctx: SourceContext) -> Result<(), SourceError> {
        Ok(())
    }
}

struct Discard;

#[async_trait]
impl Sink for Discard {
    async fn deliver(&mut self, _batch: SinkBatch<'_>) -> Result<(), SinkError> {
        Ok(())
    }
}

fn registry() -> Registry {
    let mut registry = Registry::new();
    ferry_channels::register(&mut registry);
    registry.register_source("generator", |cfg| {
        let o: GenOptions = cfg.parse()?;
        Ok(Box::new(Gen(o.batch_size)))
    });
    registry.register_sink("discard", |cfg| {
        cfg.parse::<BTreeMap<String, String>>()?;
        Ok(Box::new(Discard))
    });
    registry
}

#[test]
fn a_channel_listed_twice_by_a_source_is_refused() {
    let got = problems(
        "sources:\n  gen: { type: generator, channels: [c, c] }\nchannels:\n  c: { type: memory }\nsinks:\n  out: { type: discard, channel: c }\n",
    );
    assert_eq!(got, ["2:41: source `gen`: channel `c` is listed twice"]);
}

#[test]
fn flume_spellings_of_type_names_are_taken_and_the_canonical_one_is_suggested() {
    let yaml = "\
sources:
  gen: { type: GENERATOR, channels: [c] }
channels:
  c: { type: Memory }
sinks:
  out: { type: DIS-CARD, channel: c }
";
    let topology = parse(yaml, &registry()).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(topology.channel_types["c"], "memory");
    assert_eq!(
        topology.notes,
        [
            "2:16: source type `GENERATOR` is taken as `generator`; write `generator`",
            "4:14: channel type `Memory` is taken as `memory`; write `memory`",
            "6:16: sink type `DIS-CARD` is taken as `discard`; write `discard`",
        ]
    );
}

fn problems(yaml: &str) -> Vec<String> {
    match parse(yaml, &registry()) {
        Ok(_) => Vec::new(),
        Err(errors) => errors
            .iter()
            .map(|e| {
                format!(
                    "{}: {}{}",
                    e.location.map(|l| l.to_string()).unwrap_or_default(),
                    e.component
                        .as_ref()
                        .map(|c| format!("{c}: "))
                        .unwrap_or_default(),
                    e.message
                )
            })
            .collect(),
    }
}

#[test]
fn a_valid_pipeline_builds() {
    let yaml = "\
sources:
  gen: { type: generator, channels: [a, b], batch_size: 5 }
channels:
  a: { type: memory }
  b: { type: memory, capacity: 10, transaction_capacity: 10 }
sinks:
  out_a: { type: discard, channel: a }
  out_b: { type: discard, channel: b, batch_size: 10 }
";
    let topology = parse(yaml, &registry()).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(topology.sources[0].channels.len(), 2);
    assert_eq!(topology.sinks[1].batch_size, 10);
}

#[test]
fn reports_every_problem_with_its_line() {
    let yaml = "\
sources:
  gen:
    type: generater
    channels: [buffer]
  other:
    type: generator
    channels: [bufer]
    batch_size: 500
channels:
  buffer:
    type: memory
  lonely:
    type: memory
sinks:
  out:
    type: discard
    channel: missing
";
    let got = problems(yaml);
    assert_eq!(
        got,
        [
            "3:11: source `gen`: unknown source type `generater`, did you mean `generator`?",
            "7:16: source `other`: unknown channel `bufer`, did you mean `buffer`?",
            "10:3: channel `buffer`: no sink takes from this channel, so its events would pile up; bind a sink to it with `channel:`",
            "12:3: channel `lonely`: no sink takes from this channel, so its events would pile up; bind a sink to it with `channel:`",
            "17:14: sink `out`: unknown channel `missing`, expected one of `buffer`, `lonely`",
        ],
        "{got:#?}"
    );
}

#[test]
fn batch_sizes_above_transaction_capacity_are_refused() {
    let yaml = "\
sources:
  gen: { type: generator, channels: [c], batch_size: 500 }
channels:
  c: { type: memory, capacity: 1000, transaction_capacity: 100 }
sinks:
  out:
    type: discard
    channel: c
    batch_size: 101
";
    let got = problems(yaml);
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(got[0].starts_with("2:42: source `gen`: batch_size 500 is above the transaction_capacity 100 of channel `c`"), "{got:#?}");
    assert!(
        got[1].starts_with("9:5: sink `out`: batch_size 101"),
        "{got:#?}"
    );
}

#[test]
fn unknown_options_and_sections_suggest_names() {
    let yaml = "\
agent:
  data_dri: /tmp
source:
  x: 1
sources:
  gen: { type: generator, channels: [c], bacth_size: 5 }
channels:
  c: { type: memory, capactiy: 10 }
sinks:
  out: { type: discard, channel: c }
";
    let got = problems(yaml);
    assert_eq!(got.len(), 4, "{got:#?}");
    assert!(
        got[0].contains("section `agent`: unknown option `data_dri`, did you mean `data_dir`?"),
        "{got:#?}"
    );
    assert!(
        got[1].starts_with("3:1: unknown section `source`, did you mean `sources`?"),
        "{got:#?}"
    );
    assert!(
        got[2].contains("unknown option `bacth_size`, did you mean `batch_size`?"),
        "{got:#?}"
    );
    assert!(
        got[3].contains("channel `c`: unknown option `capactiy`, did you mean `capacity`?"),
        "{got:#?}"
    );
}

const GROUP_BASE: &str = "\
sources:
  gen: { type: generator, channels: [c] }
channels:
  c: { type: memory }
sinks:
  k1: { type: discard, channel: c }
  k2: { type: discard, channel: c }
  k3: { type: discard, channel: c }
";

#[test]
fn a_sink_group_takes_its_members_out_of_the_sinks() {
    let yaml = format!(
        "{GROUP_BASE}sinkgroups:\n  g1:\n    sinks: k1 k2\n    processor:\n      type: failover\n      priority: {{ k2: 7 }}\n      max_penalty: 5s\n"
    );
    let topology = parse(&yaml, &registry()).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(topology.sinks.len(), 1);
    assert_eq!(topology.sinks[0].name, "k3");
    let group = &topology.sink_groups[0];
    let members: Vec<&str> = group.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(members, ["k1", "k2"]);
    assert_eq!(
        group.processor,
        SinkProcessorConfig::Failover {
            priorities: vec![-1, 7],
            max_penalty: Duration::from_secs(5),
        }
    );
    assert_eq!(topology.all_sinks().count(), 3);
}

#[test]
fn bad_processors_are_refused_with_their_lines() {
    let yaml = format!(
        "{GROUP_BASE}sinkgroups:
  one:
    sinks: [k1, k2]
  lonely:
    sinks: [k3]
    processor: {{ type: load_balance }}
"
    );
    let got = problems(&yaml);
    assert_eq!(
        got,
        [
            "11:5: sink group `one`: the default processor drives one sink; use `type: failover` or `type: load_balance` for several",
            "13:5: sink group `lonely`: a load_balance group needs at least two sinks",
        ],
        "{got:#?}"
    );
    let yaml = format!(
        "{GROUP_BASE}sinkgroups:
  g:
    sinks: [k1, k2]
    processor: {{ type: load_balance, selector: round_robn }}
"
    );
    assert_eq!(
        problems(&yaml),
        [
            "12:48: sink group `g`: option `selector`: unknown selector `round_robn`, did you mean `round_robin`?"
        ]
    );
    let yaml = format!(
        "{GROUP_BASE}sinkgroups:
  g:
    sinks: [k1, k2, k1]
    processor: {{ type: failover, priority: {{ k1: 3, k2: 3 }} }}
"
    );
    let got = problems(&yaml);
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(got[0].contains("sink `k1` is listed twice"), "{got:#?}");
    assert!(
        got[1].contains("sinks `k1` and `k2` have the same priority 3"),
        "{got:#?}"
    );
}

#[test]
fn broken_yaml_is_located() {
    let got = problems("sources:\n  a: [unclosed\n");
    assert_eq!(got.len(), 1);
    assert!(got[0].contains("invalid YAML"), "{got:?}");
    assert!(!got[0].starts_with(':'), "has a location: {got:?}");
}

#[test]
fn duplicate_keys_are_refused() {
    let got = problems("sources: {}\nsinks: {}\nsinks: {}\n");
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].contains("Duplicate key"), "{got:?}");
}
