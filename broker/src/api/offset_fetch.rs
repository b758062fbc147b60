//! OffsetFetch: a group's committed offsets, for the partitions asked or all of them (null
//! topics, v2+); several groups at once from v8. Offsets staged by an open transaction
//! (TxnOffsetCommit) are not visible; with `require_stable` (v7+) a partition that has some gets
//! UNSTABLE_OFFSET_COMMIT, which consumers retry until the transaction ends (KIP-447).

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    ApiKey, GroupId, OffsetFetchRequest, OffsetFetchResponse, RequestHeader, TopicName,
};
use kafka_protocol::protocol::VersionRange;

use super::{Context, Handler, text};
use crate::security::{AclOperation, Resource};

pub(super) struct OffsetFetch;

/// v8 looks up several groups at once.
const GROUPS_FROM: i16 = 8;
/// Leader epochs are returned from v5 on.
const LEADER_EPOCH_FROM: i16 = 5;
/// `require_stable` is sent from v7 on.
const REQUIRE_STABLE_FROM: i16 = 7;

/// One partition's answer, before it is put in the version's shape.
struct Found {
    partition: i32,
    offset: i64,
    leader_epoch: i32,
    metadata: Option<String>,
    error: Option<ResponseError>,
}

impl Found {
    /// A partition answered with `error` instead of its offset.
    fn failed(partition: i32, error: ResponseError) -> Found {
        Found {
            partition,
            offset: -1,
            leader_epoch: -1,
            metadata: Some(String::new()),
            error: Some(error),
        }
    }
}

/// The offsets of `group` for `wanted` (topic → partitions), or all of them for `None`;
/// `require_stable` refuses those with offsets pending in an open transaction. The caller
/// must be allowed to describe the group and each topic: a topic asked for that it may not
/// describe gets TOPIC_AUTHORIZATION_FAILED, one it did not ask for is left out.
fn lookup(
    ctx: &Context,
    group: &str,
    wanted: Option<Vec<(TopicName, Vec<i32>)>>,
    require_stable: bool,
) -> Result<Vec<(TopicName, Vec<Found>)>, ResponseError> {
    ctx.check(AclOperation::Describe, Resource::group(group))?;
    let committed = ctx.groups.committed(group).map_err(|e| {
        tracing::error!(group, error = %e, "cannot read committed offsets");
        ResponseError::UnknownServerError
    })?;
    let pending = if require_stable {
        ctx.txns.pending_offsets(group).map_err(|e| {
            tracing::error!(group, error = %e, "cannot read pending transactional offsets");
            ResponseError::UnknownServerError
        })?
    } else {
        Default::default()
    };
    let found = |(topic, partition): (String, i32)| {
        if pending.contains(&(topic.clone(), partition)) {
            return Found::failed(partition, ResponseError::UnstableOffsetCommit);
        }
        let stored = committed.get(&(topic, partition));
        Found {
            partition,
            offset: stored.map_or(-1, |o| o.offset),
            leader_epoch: stored.map_or(-1, |o| o.leader_epoch),
            metadata: Some(stored.and_then(|o| o.metadata.clone()).unwrap_or_default()),
            error: None,
        }
    };
    Ok(match wanted {
        Some(topics) => topics
            .into_iter()
            .map(|(name, partitions)| {
                let refused = ctx
                    .check(AclOperation::Describe, Resource::topic(&name.0))
                    .err();
                let rows = partitions
                    .into_iter()
                    .map(|p| match refused {
                        Some(error) => Found::failed(p, error),
                        None => found((name.0.to_string(), p)),
                    })
                    .collect();
                (name, rows)
            })
            .collect(),
        None => {
            let mut by_topic: BTreeMap<String, Vec<Found>> = BTreeMap::new();
            for (topic, partition) in committed.keys() {
                by_topic
                    .entry(topic.clone())
                    .or_default()
                    .push(found((topic.clone(), *partition)));
            }
            by_topic
                .into_iter()
                .filter(|(topic, _)| ctx.authorize(AclOperation::Describe, Resource::topic(topic)))
                .map(|(topic, rows)| (TopicName(text(&topic)), rows))
                .collect()
        }
    })
}

impl Handler for OffsetFetch {
    const KEY: ApiKey = ApiKey::OffsetFetch;
    // v9 carries the member id and epoch of consumer-protocol groups (KIP-848): a member's
    // must be its current one (UNKNOWN_MEMBER_ID, STALE_MEMBER_EPOCH).
    const VERSIONS: VersionRange = VersionRange { min: 1, max: 9 };
    const SHAPE: &'static super::shape::Shape = &super::shape::OFFSET_FETCH;
    type Request = OffsetFetchRequest;
    type Response = OffsetFetchResponse;

    fn error_codes(response: &OffsetFetchResponse, count: &mut dyn FnMut(i16)) {
        count(response.error_code);
        for topic in &response.topics {
            for p in &topic.partitions {
                count(p.error_code);
            }
        }
        for group in &response.groups {
            count(group.error_code);
            for topic in &group.topics {
                for p in &topic.partitions {
                    count(p.error_code);
                }
            }
        }
    }

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: OffsetFetchRequest,
    ) -> Option<OffsetFetchResponse> {
        let version = header.request_api_version;
        let epoch = |e: i32| if version >= LEADER_EPOCH_FROM { e } else { -1 };
        let require_stable = version >= REQUIRE_STABLE_FROM && request.require_stable;
        if version >= GROUPS_FROM {
            let groups = request
                .groups
                .into_iter()
                .map(|g| {
                    let wanted = g.topics.map(|topics| {
                        topics
                            .into_iter()
                            .map(|t| (t.name, t.partition_indexes))
                            .collect()
                    });
                    let answer =
                        OffsetFetchResponseGroup::default().with_group_id(g.group_id.clone());
                    if let Some(e) = ctx.groups.check_fetcher(
                        &g.group_id.0,
                        g.member_id.as_deref(),
                        g.member_epoch,
                    ) {
                        return answer.with_error_code(e.code());
                    }
                    match lookup(ctx, &g.group_id.0, wanted, require_stable) {
                        Ok(topics) => answer.with_topics(
                            topics
                                .into_iter()
                                .map(|(name, rows)| {
                                    OffsetFetchResponseTopics::default()
                                        .with_name(name)
                                        .with_partitions(
                                            rows.into_iter()
                                                .map(|f| {
                                                    OffsetFetchResponsePartitions::default()
                                                        .with_partition_index(f.partition)
                                                        .with_committed_offset(f.offset)
                                                        .with_committed_leader_epoch(f.leader_epoch)
                                                        .with_metadata(
                                                            f.metadata.as_deref().map(text),
                                                        )
                                                        .with_error_code(
                                                            f.error.map_or(0, |e| e.code()),
                                                        )
                                                })
                                                .collect(),
                                        )
                                })
                                .collect(),
                        ),
                        Err(e) => answer.with_error_code(e.code()),
                    }
                })
                .collect();
            return Some(OffsetFetchResponse::default().with_groups(groups));
        }
        let GroupId(group) = request.group_id;
        let wanted = request.topics.map(|topics| {
            topics
                .into_iter()
                .map(|t| (t.name, t.partition_indexes))
                .collect()
        });
        let response = OffsetFetchResponse::default();
        Some(match lookup(ctx, &group, wanted, require_stable) {
            Ok(topics) => response.with_topics(
                topics
                    .into_iter()
                    .map(|(name, rows)| {
                        OffsetFetchResponseTopic::default()
                            .with_name(name)
                            .with_partitions(
                                rows.into_iter()
                                    .map(|f| {
                                        OffsetFetchResponsePartition::default()
                                            .with_partition_index(f.partition)
                                            .with_committed_offset(f.offset)
                                            .with_committed_leader_epoch(epoch(f.leader_epoch))
                                            .with_metadata(f.metadata.as_deref().map(text))
                                            .with_error_code(f.error.map_or(0, |e| e.code()))
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            ),
            // v1 has no top-level error code: an error rides on no partition at all then.
            Err(e) if version >= 2 => response.with_error_code(e.code()),
            Err(_) => response,
        })
    }
}
