//! The group coordinator: Kafka's classic consumer group protocol, KIP-848's consumer
//! protocol ([`consumer`]: the broker assigns, members reconcile on their heartbeats) and
//! committed offsets. A group id belongs to one protocol at a time; an empty group changes
//! protocol when a member of the other one arrives.
//!
//! This single broker coordinates every group (FindCoordinator answers with itself). Group
//! membership lives in memory ([`state`]): after a restart every group is empty and its members
//! find out from their next heartbeat (UNKNOWN_MEMBER_ID) and join again. What must survive a
//! restart is in the catalog: committed offsets, and each group's protocol type and generation.
//!
//! Assignment is the clients' business (range, roundrobin, cooperative-sticky run in the group
//! leader); the coordinator only runs the rounds. A cooperative rebalance is two classic rounds:
//! members that gave up partitions in the first rejoin at once, which starts the second.
//!
//! Offsets expire as in Kafka since 2.1 (KIP-211): those of a group with members never do;
//! once a group is empty they go `offsets.retention.minutes` after it became empty, and those
//! of a group that never had members (offsets committed by a standalone consumer or a tool)
//! each that long after its commit. An empty group left without offsets is removed. The
//! per-request retention time of OffsetCommit v2-v4 is ignored: `offsets.retention.minutes`
//! decides for every version.
//!
//! What clients can make the coordinator hold is bounded: a group's members, member ids handed
//! out with MEMBER_ID_REQUIRED (which live until their session timeout) included, by
//! `group_max_size` (GROUP_MAX_SIZE_REACHED past it, as Kafka's `group.max.size`), and the
//! groups themselves by `max_groups` (POLICY_VIOLATION for a request that would make one more).

pub(crate) mod consumer;
mod state;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;

use crate::catalog::{Catalog, CatalogError, CommittedOffset, GroupRecord};
use crate::config::BrokerConfig;
use crate::limits::{Held, Reached};
use crate::topics::Topics;

use consumer::{ConsumerGroup, Heartbeat, HeartbeatReply, TopicInfo};
use state::{Group, Timing};
pub(crate) use state::{
    GroupState, JoinOutcome, JoinRequest, Protocol, Reply, SyncOutcome, SyncRequest,
};

/// A member as DescribeGroups shows it.
#[derive(Debug, Clone)]
pub(crate) struct MemberDescription {
    pub(crate) member_id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    pub(crate) metadata: Bytes,
    pub(crate) assignment: Bytes,
}

/// A group as DescribeGroups shows it.
#[derive(Debug, Clone)]
pub(crate) struct GroupDescription {
    pub(crate) state: GroupState,
    pub(crate) protocol_type: String,
    pub(crate) protocol: String,
    pub(crate) members: Vec<MemberDescription>,
}

/// One partition of an OffsetCommit.
#[derive(Debug, Clone)]
pub(crate) struct OffsetToCommit {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) leader_epoch: i32,
    pub(crate) metadata: Option<String>,
}

/// Who commits: a member of the current generation, or (generation -1, no member id) a
/// standalone consumer or tool committing for an empty group.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Committer<'a> {
    pub(crate) member_id: &'a str,
    pub(crate) instance_id: Option<&'a str>,
    pub(crate) generation: i32,
}

/// The coordinator of every group on this broker.
pub(crate) struct GroupCoordinator {
    catalog: Arc<Catalog>,
    timing: Timing,
    min_session: i32,
    max_session: i32,
    metadata_max_bytes: usize,
    retention_ms: i64,
    groups: Mutex<HashMap<String, Group>>,
    /// KIP-848 groups; always locked after `groups` when both are.
    consumer: Mutex<HashMap<String, ConsumerGroup>>,
    consumer_session: Duration,
    consumer_heartbeat_interval: i32,
    /// group_max_size
    max_size: usize,
    /// max_groups
    max_groups: usize,
    reached: Arc<Reached>,
}

/// The protocol type ListGroups gives consumer-protocol groups.
pub(crate) const CONSUMER_PROTOCOL: &str = "consumer";
/// What the catalog stores as the protocol type of a consumer-protocol group: classic groups
/// of Kafka consumers have protocol type `consumer` too.
const CONSUMER_GROUP_RECORD: &str = "kip-848 consumer group";

impl GroupCoordinator {
    /// Loads the groups known to the catalog, all empty; limits reached are counted in
    /// `reached`.
    pub(crate) fn load(
        config: &BrokerConfig,
        catalog: Arc<Catalog>,
        reached: Arc<Reached>,
    ) -> Result<Self, CatalogError> {
        let records = catalog.groups()?;
        let (consumer_records, records): (Vec<_>, Vec<_>) = records
            .into_iter()
            .partition(|r| r.protocol_type == CONSUMER_GROUP_RECORD);
        let consumer = consumer_records
            .into_iter()
            .map(|r| {
                let g = ConsumerGroup::new(r.group_id.clone(), r.generation, r.state_timestamp);
                (r.group_id, g)
            })
            .collect();
        let groups = records
            .into_iter()
            .map(|r| {
                let group = Group::new(
                    r.group_id.clone(),
                    r.protocol_type,
                    r.generation,
                    r.state_timestamp,
                );
                (r.group_id, group)
            })
            .collect();
        Ok(GroupCoordinator {
            catalog,
            timing: Timing {
                // Kafka's setting is an int; a larger one must not overflow deadlines.
                initial_rebalance_delay: Duration::from_millis(
                    config.group_initial_rebalance_delay_ms.min(i32::MAX as u64),
                ),
            },
            min_session: config.group_min_session_timeout_ms,
            max_session: config.group_max_session_timeout_ms,
            metadata_max_bytes: config.offset_metadata_max_bytes,
            retention_ms: i64::try_from(config.offsets_retention_minutes)
                .unwrap_or(i64::MAX)
                .saturating_mul(60_000),
            groups: Mutex::new(groups),
            consumer: Mutex::new(consumer),
            consumer_session: Duration::from_millis(
                config.group_consumer_session_timeout_ms.max(1) as u64,
            ),
            consumer_heartbeat_interval: config.group_consumer_heartbeat_interval_ms.max(1),
            max_size: usize::try_from(config.group_max_size.max(1)).unwrap_or(usize::MAX),
            max_groups: usize::try_from(config.max_groups.max(1)).unwrap_or(usize::MAX),
            reached,
        })
    }

    /// Whether a new group fits beside the `count` there are; counts and logs it when not.
    fn group_fits(&self, count: usize, group_id: &str) -> bool {
        if count < self.max_groups {
            return true;
        }
        self.reached.count(Held::Groups, || {
            format!(
                "group {group_id} refused: the coordinator holds {count} groups, the most \
                 max_groups allows"
            )
        });
        false
    }

    /// Whether a new member fits in a group of `size`; counts and logs it when not.
    fn member_fits(&self, size: usize, group_id: &str) -> bool {
        if size < self.max_size {
            return true;
        }
        self.reached.count(Held::GroupMembers, || {
            format!(
                "a new member of group {group_id} refused with GROUP_MAX_SIZE_REACHED: the group \
                 has {size} members, the most group_max_size allows"
            )
        });
        false
    }

    fn lock_consumer(&self) -> MutexGuard<'_, HashMap<String, ConsumerGroup>> {
        self.consumer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Saves a consumer group's epoch when it moved.
    fn save_consumer_if_dirty(&self, group: &mut ConsumerGroup) {
        if !group.dirty {
            return;
        }
        group.dirty = false;
        let record = GroupRecord {
            group_id: group.id.clone(),
            protocol_type: CONSUMER_GROUP_RECORD.to_owned(),
            generation: group.epoch,
            state_timestamp: group.state_timestamp,
        };
        if let Err(e) = self.catalog.save_group(&record) {
            tracing::error!(group = %group.id, error = %e, "cannot save the group's epoch");
        }
    }

    /// The heartbeat interval members of consumer groups are given, in ms.
    pub(crate) fn consumer_heartbeat_interval(&self) -> i32 {
        self.consumer_heartbeat_interval
    }

    /// Handles a ConsumerGroupHeartbeat (KIP-848).
    pub(crate) fn consumer_heartbeat(
        &self,
        topics: &Topics,
        group_id: &str,
        hb: Heartbeat,
    ) -> HeartbeatReply {
        let refuse = |e: ResponseError, message: String| HeartbeatReply {
            error: Some((e, message)),
            member_id: hb.member_id.clone(),
            member_epoch: 0,
            assignment: None,
        };
        if group_id.is_empty() {
            return refuse(
                ResponseError::InvalidGroupId,
                "the group id is empty".into(),
            );
        }
        let mut classic = self.lock();
        if let Some(g) = classic.get(group_id) {
            if g.state != GroupState::Empty {
                return refuse(
                    ResponseError::GroupIdNotFound,
                    format!("group {group_id} is a classic group with members"),
                );
            }
            // An empty classic group (offsets only) becomes a consumer group, as in Kafka.
            classic.remove(group_id);
        }
        let mut groups = self.lock_consumer();
        if hb.member_epoch != 0 && !groups.contains_key(group_id) {
            return refuse(
                ResponseError::UnknownMemberId,
                format!("group {group_id} has no member {}", hb.member_id),
            );
        }
        if !groups.contains_key(group_id)
            && !self.group_fits(groups.len() + classic.len(), group_id)
        {
            return refuse(
                ResponseError::PolicyViolation,
                format!(
                    "the broker holds {} groups, the most its max_groups allows",
                    self.max_groups
                ),
            );
        }
        drop(classic);
        let group = groups.entry(group_id.to_owned()).or_insert_with(|| {
            let mut g = ConsumerGroup::new(group_id.to_owned(), 0, crate::log::now_ms());
            g.dirty = true;
            g
        });
        if hb.member_epoch == 0
            && !group.members.contains_key(&hb.member_id)
            && !hb.instance_id.as_ref().is_some_and(|instance| {
                group
                    .members
                    .values()
                    .any(|m| m.instance_id.as_ref() == Some(instance))
            })
            && !self.member_fits(group.members.len(), group_id)
        {
            return refuse(
                ResponseError::GroupMaxSizeReached,
                format!(
                    "group {group_id} has {} members, the most the broker's group_max_size allows",
                    group.members.len()
                ),
            );
        }
        let reply = group.heartbeat(hb, Instant::now(), self.consumer_session, &|names| {
            topic_infos(topics, names)
        });
        self.save_consumer_if_dirty(group);
        reply
    }

    /// Whether `group_id` is a consumer-protocol group.
    #[cfg(test)]
    pub(crate) fn is_consumer_group(&self, group_id: &str) -> bool {
        self.lock_consumer().contains_key(group_id)
    }

    /// The check of an OffsetFetch v9+ of a consumer-protocol group (KIP-848): without a
    /// member id (a tool) it passes; a member must be one, at its current epoch. Classic
    /// groups are not checked.
    pub(crate) fn check_fetcher(
        &self,
        group_id: &str,
        member_id: Option<&str>,
        member_epoch: i32,
    ) -> Option<ResponseError> {
        let member_id = member_id.filter(|m| !m.is_empty())?;
        let groups = self.lock_consumer();
        let group = groups.get(group_id)?;
        match group.member_epoch(member_id) {
            None => Some(ResponseError::UnknownMemberId),
            Some(e) if e != member_epoch => Some(ResponseError::StaleMemberEpoch),
            Some(_) => None,
        }
    }

    /// Runs `f` on consumer group `group_id`, if there is one.
    pub(crate) fn with_consumer_group<T>(
        &self,
        group_id: &str,
        f: impl FnOnce(&ConsumerGroup) -> T,
    ) -> Option<T> {
        self.lock_consumer().get(group_id).map(f)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Group>> {
        // Every transition leaves the group consistent before anything that could panic.
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Saves the generation of a group whose join phase just ended.
    fn save_if_dirty(&self, group: &mut Group) {
        if !group.dirty {
            return;
        }
        group.dirty = false;
        let record = GroupRecord {
            group_id: group.id.clone(),
            protocol_type: group.protocol_type.clone(),
            generation: group.generation,
            state_timestamp: group.state_timestamp,
        };
        if let Err(e) = self.catalog.save_group(&record) {
            tracing::error!(group = %group.id, error = %e, "cannot save the group's generation");
        }
    }

    /// Handles a JoinGroup.
    pub(crate) fn join(&self, group_id: &str, request: JoinRequest) -> Reply<JoinOutcome> {
        if group_id.is_empty() {
            return Reply::Now(JoinOutcome::error(
                ResponseError::InvalidGroupId,
                &request.member_id,
            ));
        }
        let session = i32::try_from(request.session_timeout.as_millis()).unwrap_or(i32::MAX);
        if session < self.min_session || session > self.max_session {
            return Reply::Now(JoinOutcome::error(
                ResponseError::InvalidSessionTimeout,
                &request.member_id,
            ));
        }
        let now = Instant::now();
        let mut groups = self.lock();
        {
            // An empty consumer-protocol group becomes a classic one, as in Kafka.
            let mut consumer = self.lock_consumer();
            match consumer.get(group_id) {
                Some(g) if !g.members.is_empty() => {
                    return Reply::Now(JoinOutcome::error(
                        ResponseError::InconsistentGroupProtocol,
                        &request.member_id,
                    ));
                }
                Some(_) => {
                    consumer.remove(group_id);
                }
                None if !groups.contains_key(group_id)
                    && !self.group_fits(groups.len() + consumer.len(), group_id) =>
                {
                    return Reply::Now(JoinOutcome::error(
                        ResponseError::PolicyViolation,
                        &request.member_id,
                    ));
                }
                None => {}
            }
        }
        if let Some(group) = groups.get(group_id)
            && request.member_id.is_empty()
            && !group.has_instance(request.instance_id.as_deref())
            && !self.member_fits(group.size(), group_id)
        {
            return Reply::Now(JoinOutcome::error(
                ResponseError::GroupMaxSizeReached,
                &request.member_id,
            ));
        }
        let group = groups.entry(group_id.to_owned()).or_insert_with(|| {
            Group::new(group_id.to_owned(), String::new(), 0, crate::log::now_ms())
        });
        let reply = group.join(request, now, self.timing);
        self.save_if_dirty(group);
        reply
    }

    /// Handles a SyncGroup.
    pub(crate) fn sync(&self, group_id: &str, request: SyncRequest<'_>) -> Reply<SyncOutcome> {
        let mut groups = self.lock();
        let Some(group) = groups.get_mut(group_id) else {
            return Reply::Now(SyncOutcome::error(ResponseError::UnknownMemberId));
        };
        group.sync(request, Instant::now())
    }

    /// Handles a Heartbeat; `None` is success.
    pub(crate) fn heartbeat(
        &self,
        group_id: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
    ) -> Option<ResponseError> {
        let mut groups = self.lock();
        let Some(group) = groups.get_mut(group_id) else {
            return Some(ResponseError::UnknownMemberId);
        };
        group.heartbeat(member_id, instance_id, generation, Instant::now())
    }

    /// Handles a LeaveGroup: one answer per leaving member.
    pub(crate) fn leave(
        &self,
        group_id: &str,
        members: &[(String, Option<String>)],
    ) -> Vec<Option<ResponseError>> {
        let mut groups = self.lock();
        let Some(group) = groups.get_mut(group_id) else {
            return vec![Some(ResponseError::UnknownMemberId); members.len()];
        };
        let now = Instant::now();
        let answers = members
            .iter()
            .map(|(member, instance)| group.leave(member, instance.as_deref(), now, self.timing))
            .collect();
        self.save_if_dirty(group);
        answers
    }

    /// Runs the timeouts due now (called a few times a second).
    pub(crate) fn tick(&self) {
        let now = Instant::now();
        let mut groups = self.lock();
        for group in groups.values_mut() {
            group.tick(now, self.timing);
            self.save_if_dirty(group);
        }
        drop(groups);
        let mut consumer = self.lock_consumer();
        for group in consumer.values_mut() {
            for member in group.expire(now) {
                tracing::info!(group = %group.id, member, "consumer group member left: session timed out");
            }
            self.save_consumer_if_dirty(group);
        }
    }

    /// Handles an OffsetCommit: an error for the whole request, or one per partition.
    pub(crate) fn commit(
        &self,
        topics: &Topics,
        group_id: &str,
        committer: Committer<'_>,
        offsets: Vec<OffsetToCommit>,
    ) -> Vec<Option<ResponseError>> {
        let whole = |e: ResponseError| vec![Some(e); offsets.len()];
        if group_id.is_empty() {
            return whole(ResponseError::InvalidGroupId);
        }
        let mut groups = self.lock();
        let consumer = self.lock_consumer();
        // Kafka lets any commit with a negative generation into an empty group.
        let standalone = committer.generation < 0;
        if let Some(group) = consumer.get(group_id) {
            if let Some(e) = check_consumer_committer(group, committer) {
                return whole(e);
            }
        } else {
            match groups.get(group_id) {
                None if standalone => {
                    if !self.group_fits(groups.len() + consumer.len(), group_id) {
                        return whole(ResponseError::PolicyViolation);
                    }
                    groups.insert(
                        group_id.to_owned(),
                        Group::new(group_id.to_owned(), String::new(), 0, crate::log::now_ms()),
                    );
                }
                None => return whole(ResponseError::IllegalGeneration),
                Some(group) => {
                    let refused = match group.state {
                        GroupState::Dead => Some(ResponseError::CoordinatorNotAvailable),
                        GroupState::Empty if standalone => None,
                        // Kafka refuses commits between the join and the assignment: the member's
                        // partitions are about to change.
                        GroupState::CompletingRebalance => Some(ResponseError::RebalanceInProgress),
                        _ => check_committer(group, committer),
                    };
                    if let Some(e) = refused {
                        return whole(e);
                    }
                }
            }
        }
        // The lock is held until the offsets are stored: a rebalance must not complete between
        // checking the generation and storing, or the partition's next owner could read the
        // offsets from before this commit.
        let (mut answers, rows) = self.check_offsets(topics, offsets);
        if let Err(e) = self.catalog.commit_offsets(group_id, &rows) {
            // A topic deleted in between fails its foreign key, or the disk failed.
            tracing::error!(group = group_id, error = %e, "cannot store committed offsets");
            for answer in answers.iter_mut().filter(|a| a.is_none()) {
                *answer = Some(e.response_error());
            }
        }
        drop(consumer);
        drop(groups);
        answers
    }

    /// Checks each offset to commit: one answer per offset, and the rows to store.
    fn check_offsets(
        &self,
        topics: &Topics,
        offsets: Vec<OffsetToCommit>,
    ) -> (Vec<Option<ResponseError>>, Vec<CommittedOffset>) {
        let now = crate::log::now_ms();
        let mut answers = Vec::with_capacity(offsets.len());
        let mut rows = Vec::with_capacity(offsets.len());
        for o in offsets {
            let exists = topics
                .get(&o.topic)
                .is_some_and(|t| t.partition(o.partition).is_some());
            if !exists {
                answers.push(Some(ResponseError::UnknownTopicOrPartition));
            } else if o
                .metadata
                .as_ref()
                .is_some_and(|m| m.len() > self.metadata_max_bytes)
            {
                answers.push(Some(ResponseError::OffsetMetadataTooLarge));
            } else {
                answers.push(None);
                rows.push(CommittedOffset {
                    topic: o.topic,
                    partition: o.partition,
                    offset: o.offset,
                    leader_epoch: o.leader_epoch,
                    metadata: o.metadata,
                    commit_timestamp: now,
                });
            }
        }
        (answers, rows)
    }

    /// Checks a TxnOffsetCommit's committer as Kafka does (an unknown group is created empty;
    /// an empty member id and generation -1 skip the member and generation checks) and its
    /// offsets: an error for the whole request, or one answer per offset and the rows to stage.
    pub(crate) fn check_txn_commit(
        &self,
        topics: &Topics,
        group_id: &str,
        committer: Committer<'_>,
        offsets: Vec<OffsetToCommit>,
    ) -> Result<(Vec<Option<ResponseError>>, Vec<CommittedOffset>), ResponseError> {
        if group_id.is_empty() {
            return Err(ResponseError::InvalidGroupId);
        }
        let mut groups = self.lock();
        let group = groups.entry(group_id.to_owned()).or_insert_with(|| {
            Group::new(group_id.to_owned(), String::new(), 0, crate::log::now_ms())
        });
        if group.state == GroupState::Dead {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        if let Some(instance) = committer.instance_id
            && let Some(m) = group.members.get(committer.member_id)
            && m.instance_id.as_deref() != Some(instance)
        {
            return Err(ResponseError::FencedInstanceId);
        }
        if !committer.member_id.is_empty() && !group.members.contains_key(committer.member_id) {
            return Err(ResponseError::UnknownMemberId);
        }
        if committer.generation >= 0 && committer.generation != group.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        drop(groups);
        Ok(self.check_offsets(topics, offsets))
    }

    /// A group's committed offsets, by topic and partition.
    pub(crate) fn committed(
        &self,
        group_id: &str,
    ) -> Result<BTreeMap<(String, i32), CommittedOffset>, CatalogError> {
        Ok(self
            .catalog
            .offsets(group_id)?
            .into_iter()
            .map(|o| ((o.topic.clone(), o.partition), o))
            .collect())
    }

    /// Every group of the consumer protocol: id, state name.
    pub(crate) fn list_consumer(&self) -> Vec<(String, &'static str)> {
        let mut all: Vec<_> = self
            .lock_consumer()
            .values()
            .map(|g| (g.id.clone(), g.state_name()))
            .collect();
        all.sort();
        all
    }

    /// Every group: id, protocol type, state.
    pub(crate) fn list(&self) -> Vec<(String, String, GroupState)> {
        let mut all: Vec<_> = self
            .lock()
            .values()
            .map(|g| (g.id.clone(), g.protocol_type.clone(), g.state))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// A group's state and members; `None` when there is no such group.
    pub(crate) fn describe(&self, group_id: &str) -> Option<GroupDescription> {
        let groups = self.lock();
        let group = groups.get(group_id)?;
        let protocol = group.protocol.as_deref();
        Some(GroupDescription {
            state: group.state,
            protocol_type: group.protocol_type.clone(),
            protocol: protocol.unwrap_or_default().to_owned(),
            members: group
                .members
                .values()
                .map(|m| MemberDescription {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: m.metadata(protocol),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        })
    }

    /// Deletes an empty group and its offsets.
    pub(crate) fn delete_group(&self, group_id: &str) -> Option<ResponseError> {
        let mut groups = self.lock();
        let mut consumer = self.lock_consumer();
        if let Some(group) = consumer.get(group_id) {
            if !group.members.is_empty() {
                return Some(ResponseError::NonEmptyGroup);
            }
            if let Err(e) = self.catalog.delete_group(group_id) {
                tracing::error!(group = group_id, error = %e, "cannot delete the group");
                return Some(e.response_error());
            }
            consumer.remove(group_id);
            tracing::info!(group = group_id, "deleted consumer group");
            return None;
        }
        drop(consumer);
        let Some(group) = groups.get_mut(group_id) else {
            return Some(ResponseError::GroupIdNotFound);
        };
        match group.state {
            GroupState::Empty => {}
            GroupState::Dead => return Some(ResponseError::GroupIdNotFound),
            _ => return Some(ResponseError::NonEmptyGroup),
        }
        if let Err(e) = self.catalog.delete_group(group_id) {
            tracing::error!(group = group_id, error = %e, "cannot delete the group");
            return Some(e.response_error());
        }
        group.kill();
        groups.remove(group_id);
        tracing::info!(group = group_id, "deleted group");
        None
    }

    /// Handles an OffsetDelete: an error for the whole group, or one per partition.
    pub(crate) fn delete_offsets(
        &self,
        group_id: &str,
        partitions: &[(String, i32)],
    ) -> Result<Vec<Option<ResponseError>>, ResponseError> {
        let groups = self.lock();
        let consumer_subscribed =
            self.with_consumer_group(group_id, |g| g.subscribed_names().into_iter().collect());
        let subscribed: Vec<String> = if let Some(subscribed) = consumer_subscribed {
            subscribed
        } else {
            let Some(group) = groups.get(group_id) else {
                return Err(ResponseError::GroupIdNotFound);
            };
            match group.state {
                GroupState::Dead => return Err(ResponseError::GroupIdNotFound),
                GroupState::Empty => Vec::new(),
                _ => match group.subscribed_topics() {
                    Some(topics) => topics,
                    None => return Err(ResponseError::NonEmptyGroup),
                },
            }
        };
        let mut answers = Vec::with_capacity(partitions.len());
        let mut deletable = Vec::new();
        for (topic, partition) in partitions {
            if subscribed.contains(topic) {
                answers.push(Some(ResponseError::GroupSubscribedToTopic));
            } else {
                answers.push(None);
                deletable.push((topic.clone(), *partition));
            }
        }
        if let Err(e) = self.catalog.delete_offsets(group_id, &deletable) {
            tracing::error!(group = group_id, error = %e, "cannot delete offsets");
            return Err(e.response_error());
        }
        Ok(answers)
    }

    /// Deletes the offsets past retention of the empty groups, and the empty groups left with
    /// none (see the module docs).
    pub(crate) fn expire_offsets(&self) {
        let now = crate::log::now_ms();
        let mut groups = self.lock();
        let mut gone = Vec::new();
        for group in groups.values() {
            if group.state != GroupState::Empty {
                continue;
            }
            let result = (|| -> Result<bool, CatalogError> {
                let cutoff = now.saturating_sub(self.retention_ms);
                let expired = if group.protocol_type.is_empty() {
                    self.catalog.delete_offsets_before(&group.id, cutoff)?
                } else if group.state_timestamp < cutoff {
                    self.catalog.delete_offsets_before(&group.id, i64::MAX)?
                } else {
                    0
                };
                if expired > 0 {
                    tracing::info!(group = %group.id, expired, "expired committed offsets");
                }
                Ok(self.catalog.offsets(&group.id)?.is_empty())
            })();
            match result {
                Ok(true) => gone.push(group.id.clone()),
                Ok(false) => {}
                Err(e) => tracing::error!(group = %group.id, error = %e, "offset expiry failed"),
            }
        }
        let mut consumer = self.lock_consumer();
        let cutoff = now.saturating_sub(self.retention_ms);
        let mut consumer_gone = Vec::new();
        for group in consumer.values() {
            if !group.members.is_empty() || group.state_timestamp >= cutoff {
                continue;
            }
            match self.catalog.delete_offsets_before(&group.id, i64::MAX) {
                Ok(expired) => {
                    if expired > 0 {
                        tracing::info!(group = %group.id, expired, "expired committed offsets");
                    }
                    consumer_gone.push(group.id.clone());
                }
                Err(e) => tracing::error!(group = %group.id, error = %e, "offset expiry failed"),
            }
        }
        for id in consumer_gone {
            if let Err(e) = self.catalog.delete_group(&id) {
                tracing::error!(group = %id, error = %e, "cannot remove an expired group");
                continue;
            }
            consumer.remove(&id);
            tracing::info!(group = %id, "removed empty consumer group without offsets");
        }
        drop(consumer);
        for id in gone {
            if let Err(e) = self.catalog.delete_group(&id) {
                tracing::error!(group = %id, error = %e, "cannot remove an expired group");
                continue;
            }
            if let Some(mut group) = groups.remove(&id) {
                group.kill();
            }
            tracing::info!(group = %id, "removed empty group without offsets");
        }
    }
}

/// The checks of a commit to a consumer-protocol group (KIP-848): a member's epoch must be
/// its current one; a commit without member and epoch only while the group is empty.
fn check_consumer_committer(group: &ConsumerGroup, c: Committer<'_>) -> Option<ResponseError> {
    if c.generation < 0 && c.member_id.is_empty() && group.members.is_empty() {
        return None;
    }
    match group.member_epoch(c.member_id) {
        None => Some(ResponseError::UnknownMemberId),
        Some(e) if c.generation > e => Some(ResponseError::FencedMemberEpoch),
        Some(e) if c.generation < e => Some(ResponseError::StaleMemberEpoch),
        Some(_) => None,
    }
}

fn check_committer(group: &Group, c: Committer<'_>) -> Option<ResponseError> {
    if let Some(instance) = c.instance_id
        && let Some(m) = group.members.get(c.member_id)
        && m.instance_id.as_deref() != Some(instance)
    {
        return Some(ResponseError::FencedInstanceId);
    }
    if !group.members.contains_key(c.member_id) {
        return Some(ResponseError::UnknownMemberId);
    }
    (c.generation != group.generation).then_some(ResponseError::IllegalGeneration)
}

/// The topics among `names` that exist, as the assignors see them.
fn topic_infos(topics: &Topics, names: &std::collections::BTreeSet<String>) -> Vec<TopicInfo> {
    names
        .iter()
        .filter_map(|n| topics.get(n))
        .map(|t| TopicInfo {
            name: t.name.clone(),
            id: t.id,
            partitions: i32::try_from(t.partitions.len()).unwrap_or(i32::MAX),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap as Map;

    fn join_request() -> JoinRequest {
        JoinRequest {
            member_id: String::new(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout: Duration::from_secs(10),
            rebalance_timeout: Duration::from_secs(10),
            protocol_type: "consumer".into(),
            protocols: vec![Protocol {
                name: "range".into(),
                metadata: Bytes::new(),
            }],
            require_known_member_id: false,
            supports_skip_assignment: false,
        }
    }

    fn joining(member: &str) -> Heartbeat {
        Heartbeat {
            member_id: member.into(),
            member_epoch: 0,
            subscribed: Some(vec!["t".into()]),
            rebalance_timeout_ms: 10_000,
            ..Default::default()
        }
    }

    fn offset(partition: i32, offset: i64) -> OffsetToCommit {
        OffsetToCommit {
            topic: "t".into(),
            partition,
            offset,
            leader_epoch: -1,
            metadata: None,
        }
    }

    #[test]
    fn classic_and_consumer_groups_do_not_mix_and_commits_check_member_epochs() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = crate::api::tests::context(dir.path());
        ctx.topics.create("t", 4, 1, Map::new(), false).unwrap();
        let groups = &ctx.groups;

        // A consumer group refuses classic joins.
        let a = groups.consumer_heartbeat(&ctx.topics, "g", joining("a"));
        assert_eq!(a.error, None);
        assert_eq!(a.member_epoch, 1);
        assert_eq!(a.assignment.as_ref().unwrap().len(), 4);
        let Reply::Now(refused) = groups.join("g", join_request()) else {
            panic!("a join to a consumer group must be answered at once");
        };
        assert_eq!(
            refused.error,
            Some(ResponseError::InconsistentGroupProtocol)
        );

        // A classic group with members refuses consumer heartbeats.
        drop(groups.join("classic", join_request()));
        let r = groups.consumer_heartbeat(&ctx.topics, "classic", joining("x"));
        assert_eq!(r.error.unwrap().0, ResponseError::GroupIdNotFound);

        // Commits: the member's epoch, else STALE (older) or FENCED (newer); unknown members.
        let commit = |member: &str, epoch: i32| {
            let c = Committer {
                member_id: member,
                instance_id: None,
                generation: epoch,
            };
            groups.commit(&ctx.topics, "g", c, vec![offset(0, 5)])[0]
        };
        assert_eq!(commit("a", 1), None);
        assert_eq!(commit("a", 0), Some(ResponseError::StaleMemberEpoch));
        assert_eq!(commit("a", 2), Some(ResponseError::FencedMemberEpoch));
        assert_eq!(commit("b", 1), Some(ResponseError::UnknownMemberId));
        assert_eq!(commit("", -1), Some(ResponseError::UnknownMemberId));

        assert_eq!(groups.check_fetcher("g", Some("a"), 1), None);
        assert_eq!(groups.check_fetcher("g", None, -1), None);
        assert_eq!(
            groups.check_fetcher("g", Some("a"), 0),
            Some(ResponseError::StaleMemberEpoch)
        );
        assert_eq!(
            groups.check_fetcher("g", Some("b"), 1),
            Some(ResponseError::UnknownMemberId)
        );
        assert_eq!(groups.check_fetcher("classic", Some("b"), 1), None);

        let listed = groups.list_consumer();
        assert_eq!(listed, vec![("g".to_string(), "Stable")]);
        assert_eq!(groups.delete_group("g"), Some(ResponseError::NonEmptyGroup));
        // The member leaves; the group is empty and takes tool commits.
        let mut leave = joining("a");
        leave.member_epoch = -1;
        groups.consumer_heartbeat(&ctx.topics, "g", leave);
        assert_eq!(commit("", -1), None);
        assert_eq!(
            groups.committed("g").unwrap()[&("t".to_string(), 0)].offset,
            5
        );
    }

    #[test]
    fn consumer_protocol_members_and_groups_past_their_bounds_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = crate::api::Context::standalone(BrokerConfig {
            data_dir: dir.path().to_path_buf(),
            group_max_size: 2,
            max_groups: 2,
            ..Default::default()
        });
        ctx.topics.create("t", 4, 1, Map::new(), false).unwrap();
        let groups = &ctx.groups;
        for member in ["a", "b"] {
            let joined = groups.consumer_heartbeat(&ctx.topics, "g", joining(member));
            assert_eq!(joined.error, None, "{member}");
        }
        let full = groups.consumer_heartbeat(&ctx.topics, "g", joining("c"));
        let (error, message) = full.error.unwrap();
        assert_eq!(error, ResponseError::GroupMaxSizeReached);
        assert!(message.contains("group_max_size"), "{message}");
        // A member already in joins again (epoch 0) without being refused.
        let again = groups.consumer_heartbeat(&ctx.topics, "g", joining("a"));
        assert_eq!(again.error, None);
        // One more group fits (a classic one), then none.
        drop(groups.join("classic", join_request()));
        let refused = groups.consumer_heartbeat(&ctx.topics, "third", joining("x"));
        assert_eq!(refused.error.unwrap().0, ResponseError::PolicyViolation);
        let Reply::Now(refused) = groups.join("fourth", join_request()) else {
            panic!("a join past max_groups must be answered at once");
        };
        assert_eq!(refused.error, Some(ResponseError::PolicyViolation));
        assert_eq!(ctx.limits.reached.get(Held::GroupMembers), 1);
        assert_eq!(ctx.limits.reached.get(Held::Groups), 2);
    }

    #[test]
    fn a_consumer_group_stays_one_across_a_restart_with_its_offsets() {
        let dir = tempfile::tempdir().unwrap();
        {
            let ctx = crate::api::tests::context(dir.path());
            ctx.topics.create("t", 2, 1, Map::new(), false).unwrap();
            let a = ctx
                .groups
                .consumer_heartbeat(&ctx.topics, "g", joining("a"));
            let c = Committer {
                member_id: "a",
                instance_id: None,
                generation: a.member_epoch,
            };
            assert_eq!(
                ctx.groups.commit(&ctx.topics, "g", c, vec![offset(1, 9)])[0],
                None
            );
        }
        let ctx = crate::api::tests::context(dir.path());
        assert!(ctx.groups.is_consumer_group("g"));
        assert_eq!(
            ctx.groups.committed("g").unwrap()[&("t".to_string(), 1)].offset,
            9
        );
        // The old member is unknown now and joins again, at a later epoch than before.
        let mut hb = joining("a");
        hb.member_epoch = 1;
        let r = ctx.groups.consumer_heartbeat(&ctx.topics, "g", hb);
        assert_eq!(r.error.unwrap().0, ResponseError::UnknownMemberId);
        let again = ctx
            .groups
            .consumer_heartbeat(&ctx.topics, "g", joining("a"));
        assert_eq!(again.member_epoch, 2);
    }
}
