//! DescribeLogDirs: the broker's one log directory, the size of each partition in it and the
//! directory's total and usable bytes (`kafka-log-dirs.sh --describe`).

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{
    ApiKey, DescribeLogDirsRequest, DescribeLogDirsResponse, RequestHeader, TopicName,
};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler, text};
use crate::security::{AclOperation, Resource};

pub(super) struct DescribeLogDirs;

/// Total and usable bytes of the file system holding `dir` (-1 each when unknown, as Kafka
/// answers for versions without them).
fn disk_space(dir: &std::path::Path) -> (i64, i64) {
    #[cfg(target_os = "linux")]
    if let Ok(stat) = nix::sys::statvfs::statvfs(dir) {
        let block = stat.fragment_size() as u128;
        let bytes = |blocks: u64| i64::try_from(u128::from(blocks) * block).unwrap_or(i64::MAX);
        return (bytes(stat.blocks()), bytes(stat.blocks_available()));
    }
    let _ = dir;
    (-1, -1)
}

impl Handler for DescribeLogDirs {
    const KEY: ApiKey = ApiKey::DescribeLogDirs;
    const VERSIONS: VersionRange = VersionRange { min: 1, max: 4 };
    const SHAPE: &'static super::shape::Shape = &super::shape::DESCRIBE_LOG_DIRS;
    type Request = DescribeLogDirsRequest;
    type Response = DescribeLogDirsResponse;

    fn error_codes(response: &DescribeLogDirsResponse, count: &mut dyn FnMut(i16)) {
        count(response.error_code);
        for result in &response.results {
            count(result.error_code);
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        _header: &RequestHeader,
        request: DescribeLogDirsRequest,
    ) -> Option<DescribeLogDirsResponse> {
        // Kafka asks Describe on the cluster; without it the answer is an error, not a list.
        if let Err(e) = ctx.check(AclOperation::Describe, Resource::cluster()) {
            return Some(DescribeLogDirsResponse::default().with_error_code(e.code()));
        }
        // Which partitions: every one (a null list), or those asked for that exist.
        let mut wanted: Option<BTreeMap<String, Vec<i32>>> = None;
        if let Some(asked) = request.topics {
            let map = wanted.get_or_insert_with(BTreeMap::new);
            for topic in asked {
                map.entry(topic.topic.0.to_string())
                    .or_default()
                    .extend(topic.partitions);
            }
        }
        let mut topics = ctx.topics.all();
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        let described = topics
            .into_iter()
            .filter_map(|topic| {
                let indexes: Vec<i32> = match &wanted {
                    None => (0..topic.partitions.len() as i32).collect(),
                    Some(map) => map.get(&topic.name)?.clone(),
                };
                let partitions: Vec<DescribeLogDirsPartition> = indexes
                    .into_iter()
                    .filter_map(|index| {
                        let size = topic.partition(index)?.log().size_bytes();
                        Some(
                            DescribeLogDirsPartition::default()
                                .with_partition_index(index)
                                .with_partition_size(i64::try_from(size).unwrap_or(i64::MAX)),
                        )
                    })
                    .collect();
                (!partitions.is_empty()).then(|| {
                    DescribeLogDirsTopic::default()
                        .with_name(TopicName(text(&topic.name)))
                        .with_partitions(partitions)
                })
            })
            .collect();
        let dir = &ctx.topics.broker_config().data_dir;
        let shown = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
        let (total, usable) = disk_space(dir);
        let result = DescribeLogDirsResult::default()
            .with_log_dir(text(&shown.display().to_string()))
            .with_topics(described)
            .with_total_bytes(total)
            .with_usable_bytes(usable);
        Some(DescribeLogDirsResponse::default().with_results(vec![result]))
    }
}
