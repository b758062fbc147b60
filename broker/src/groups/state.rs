//! One classic consumer group: its members and the rebalance state machine.
//!
//! ```text
//!            join                      all members rejoined,          leader's SyncGroup
//!   Empty ─────────▶ PreparingRebalance ─── or rebalance timeout ───▶ CompletingRebalance ──▶ Stable
//!     ▲                  ▲     │                                          │                    │
//!     │                  │     └─ nobody left ─▶ Empty                    │                    │
//!     │                  └──── join, leave, session expiry, changed protocols ◀───────────────┘
//!     └ (DeleteGroups / offset expiry of an empty group: Dead, removed)
//! ```
//!
//! Every transition happens under the coordinator's lock; a JoinGroup or SyncGroup that has to
//! wait for the others parks a oneshot sender in its member and is answered when the phase
//! ends. Time comes in as arguments (`now`), so the coordinator's ticker drives the timeouts:
//! the join phase ends when every known member has rejoined or the rebalance timeout passed
//! (members that did not rejoin are removed); a member that neither heartbeats nor waits in a
//! join or sync for its session timeout is removed, which starts a rebalance.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use tokio::sync::oneshot;

/// The states of Kafka's classic group protocol, named as DescribeGroups reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

impl GroupState {
    pub(crate) fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

/// One protocol (assignor) a member supports, with its subscription metadata.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Protocol {
    pub(crate) name: String,
    pub(crate) metadata: Bytes,
}

/// A JoinGroup as the state machine sees it.
#[derive(Debug)]
pub(crate) struct JoinRequest {
    pub(crate) member_id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    pub(crate) session_timeout: Duration,
    pub(crate) rebalance_timeout: Duration,
    pub(crate) protocol_type: String,
    pub(crate) protocols: Vec<Protocol>,
    /// KIP-394 (v4+): a member without an id is given one and asked to join again with it.
    pub(crate) require_known_member_id: bool,
    /// v9+: a static leader rejoining a stable group keeps the assignment (KIP-814).
    pub(crate) supports_skip_assignment: bool,
}

/// A SyncGroup as the state machine sees it.
#[derive(Debug, Default)]
pub(crate) struct SyncRequest<'a> {
    pub(crate) member_id: &'a str,
    pub(crate) instance_id: Option<&'a str>,
    pub(crate) generation: i32,
    /// v5 names the protocol type and name; they must match the group's.
    pub(crate) protocol_type: Option<&'a str>,
    pub(crate) protocol_name: Option<&'a str>,
    /// The leader's assignment, by member id (empty from the other members).
    pub(crate) assignments: Vec<(String, Bytes)>,
}

/// A member in a JoinGroup response.
#[derive(Debug, Clone)]
pub(crate) struct JoinedMember {
    pub(crate) member_id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) metadata: Bytes,
}

/// The answer to a JoinGroup.
#[derive(Debug, Clone)]
pub(crate) struct JoinOutcome {
    pub(crate) error: Option<ResponseError>,
    pub(crate) generation: i32,
    pub(crate) protocol_type: Option<String>,
    pub(crate) protocol_name: Option<String>,
    pub(crate) leader: String,
    pub(crate) member_id: String,
    /// Filled for the leader only.
    pub(crate) members: Vec<JoinedMember>,
    pub(crate) skip_assignment: bool,
}

impl JoinOutcome {
    pub(crate) fn error(error: ResponseError, member_id: &str) -> JoinOutcome {
        JoinOutcome {
            error: Some(error),
            generation: -1,
            protocol_type: None,
            protocol_name: None,
            leader: String::new(),
            member_id: member_id.to_owned(),
            members: Vec::new(),
            skip_assignment: false,
        }
    }
}

/// The answer to a SyncGroup.
#[derive(Debug, Clone, Default)]
pub(crate) struct SyncOutcome {
    pub(crate) error: Option<ResponseError>,
    pub(crate) protocol_type: Option<String>,
    pub(crate) protocol_name: Option<String>,
    pub(crate) assignment: Bytes,
}

impl SyncOutcome {
    pub(crate) fn error(error: ResponseError) -> SyncOutcome {
        SyncOutcome {
            error: Some(error),
            ..SyncOutcome::default()
        }
    }
}

/// An answer now, or one to wait for.
#[derive(Debug)]
pub(crate) enum Reply<T> {
    Now(T),
    Later(oneshot::Receiver<T>),
}

/// A member of a group.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    pub(crate) protocols: Vec<Protocol>,
    pub(crate) assignment: Bytes,
    awaiting_join: Option<oneshot::Sender<JoinOutcome>>,
    awaiting_sync: Option<oneshot::Sender<SyncOutcome>>,
    /// Removed when this passes without a heartbeat (unless waiting in a join or sync).
    expires: Instant,
    /// Order of arrival: the earliest member still present leads.
    joined_seq: u64,
}

impl Member {
    /// Its subscription metadata for the group's protocol.
    pub(crate) fn metadata(&self, protocol: Option<&str>) -> Bytes {
        self.protocols
            .iter()
            .find(|p| Some(p.name.as_str()) == protocol)
            .map(|p| p.metadata.clone())
            .unwrap_or_default()
    }

    fn answer_join(&mut self, outcome: JoinOutcome) {
        if let Some(tx) = self.awaiting_join.take() {
            let _ = tx.send(outcome);
        }
    }

    fn answer_sync(&mut self, outcome: SyncOutcome) {
        if let Some(tx) = self.awaiting_sync.take() {
            let _ = tx.send(outcome);
        }
    }
}

/// A consumer group.
#[derive(Debug)]
pub(crate) struct Group {
    pub(crate) id: String,
    pub(crate) state: GroupState,
    /// Wall-clock ms when the group entered its state (offset expiry counts from becoming empty).
    pub(crate) state_timestamp: i64,
    pub(crate) generation: i32,
    /// Empty for a group that only holds offsets committed outside the group protocol.
    pub(crate) protocol_type: String,
    pub(crate) protocol: Option<String>,
    pub(crate) leader: Option<String>,
    pub(crate) members: BTreeMap<String, Member>,
    /// group.instance.id → member id.
    statics: HashMap<String, String>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, until they join or their session passes.
    pending: HashMap<String, Instant>,
    /// When the join phase ends at the latest.
    join_deadline: Instant,
    /// During the first rebalance of an empty group: how far the initial delay may stretch.
    initial_limit: Option<Instant>,
    next_seq: u64,
    /// Set when a generation changed and must be saved.
    pub(crate) dirty: bool,
}

/// Settings the state machine needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) initial_rebalance_delay: Duration,
}

impl Group {
    /// Members, and member ids handed out and not joined yet.
    pub(crate) fn size(&self) -> usize {
        self.members.len() + self.pending.len()
    }

    /// Whether a static member with `instance` is in the group (it comes back in its place).
    pub(crate) fn has_instance(&self, instance: Option<&str>) -> bool {
        instance.is_some_and(|i| self.statics.contains_key(i))
    }

    pub(crate) fn new(id: String, protocol_type: String, generation: i32, now_ms: i64) -> Group {
        Group {
            id,
            state: GroupState::Empty,
            state_timestamp: now_ms,
            generation,
            protocol_type,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            statics: HashMap::new(),
            pending: HashMap::new(),
            join_deadline: Instant::now(),
            initial_limit: None,
            next_seq: 0,
            dirty: false,
        }
    }

    fn set_state(&mut self, state: GroupState) {
        self.state = state;
        self.state_timestamp = crate::log::now_ms();
    }

    fn current(&self, member_id: &str) -> JoinOutcome {
        JoinOutcome {
            error: None,
            generation: self.generation,
            protocol_type: Some(self.protocol_type.clone()),
            protocol_name: self.protocol.clone(),
            leader: self.leader.clone().unwrap_or_default(),
            member_id: member_id.to_owned(),
            members: Vec::new(),
            skip_assignment: false,
        }
    }

    fn member_list(&self) -> Vec<JoinedMember> {
        let protocol = self.protocol.as_deref();
        self.members
            .values()
            .map(|m| JoinedMember {
                member_id: m.id.clone(),
                instance_id: m.instance_id.clone(),
                metadata: m.metadata(protocol),
            })
            .collect()
    }

    /// Whether a member with these protocols can be in the group: same protocol type, and at
    /// least one protocol every other member supports too.
    fn supports(&self, joining: &str, protocol_type: &str, protocols: &[Protocol]) -> bool {
        if protocol_type.is_empty() || protocols.is_empty() {
            return false;
        }
        let others: Vec<&Member> = self.members.values().filter(|m| m.id != joining).collect();
        if others.is_empty() {
            return true;
        }
        if protocol_type != self.protocol_type {
            return false;
        }
        protocols.iter().any(|p| {
            others
                .iter()
                .all(|m| m.protocols.iter().any(|q| q.name == p.name))
        })
    }

    /// Kafka's choice: among the protocols every member supports, the one most members prefer
    /// (each votes for its first supported one); ties go to the earliest member's preference.
    fn select_protocol(&self) -> Option<String> {
        let mut by_arrival: Vec<&Member> = self.members.values().collect();
        by_arrival.sort_by_key(|m| m.joined_seq);
        let first = by_arrival.first()?;
        let candidates: Vec<&str> = first
            .protocols
            .iter()
            .map(|p| p.name.as_str())
            .filter(|name| {
                by_arrival
                    .iter()
                    .all(|m| m.protocols.iter().any(|p| p.name == *name))
            })
            .collect();
        let mut votes: Vec<(usize, &str)> = candidates.iter().map(|c| (0, *c)).collect();
        for m in &by_arrival {
            if let Some(choice) = m
                .protocols
                .iter()
                .find(|p| candidates.contains(&p.name.as_str()))
                && let Some(vote) = votes.iter_mut().find(|(_, c)| *c == choice.name)
            {
                vote.0 += 1;
            }
        }
        // max_by_key keeps the last maximum: reverse so the earliest preference wins ties.
        votes
            .into_iter()
            .rev()
            .max_by_key(|(n, _)| *n)
            .map(|(_, c)| c.to_owned())
    }

    /// Handles a JoinGroup.
    pub(crate) fn join(
        &mut self,
        req: JoinRequest,
        now: Instant,
        timing: Timing,
    ) -> Reply<JoinOutcome> {
        if self.state == GroupState::Dead {
            return Reply::Now(JoinOutcome::error(
                ResponseError::CoordinatorNotAvailable,
                &req.member_id,
            ));
        }
        if !self.supports(&req.member_id, &req.protocol_type, &req.protocols) {
            return Reply::Now(JoinOutcome::error(
                ResponseError::InconsistentGroupProtocol,
                &req.member_id,
            ));
        }
        if req.member_id.is_empty() {
            self.join_unknown(req, now, timing)
        } else {
            self.join_known(req, now, timing)
        }
    }

    fn join_unknown(
        &mut self,
        req: JoinRequest,
        now: Instant,
        timing: Timing,
    ) -> Reply<JoinOutcome> {
        let prefix = req.instance_id.as_deref().unwrap_or(&req.client_id);
        let new_id = format!("{prefix}-{}", uuid::Uuid::new_v4());
        if let Some(instance) = &req.instance_id
            && let Some(old_id) = self.statics.get(instance).cloned()
        {
            return self.replace_static(old_id, new_id, req, now, timing);
        }
        if req.require_known_member_id && req.instance_id.is_none() {
            self.pending
                .insert(new_id.clone(), now + req.session_timeout);
            return Reply::Now(JoinOutcome::error(ResponseError::MemberIdRequired, &new_id));
        }
        self.add_member(new_id, req, now, timing)
    }

    fn add_member(
        &mut self,
        id: String,
        req: JoinRequest,
        now: Instant,
        timing: Timing,
    ) -> Reply<JoinOutcome> {
        let (tx, rx) = oneshot::channel();
        if self.members.is_empty() {
            self.protocol_type = req.protocol_type.clone();
        }
        if let Some(instance) = &req.instance_id {
            self.statics.insert(instance.clone(), id.clone());
        }
        self.next_seq += 1;
        let member = Member {
            id: id.clone(),
            instance_id: req.instance_id,
            client_id: req.client_id,
            client_host: req.client_host,
            session_timeout: req.session_timeout,
            rebalance_timeout: req.rebalance_timeout,
            protocols: req.protocols,
            assignment: Bytes::new(),
            awaiting_join: Some(tx),
            awaiting_sync: None,
            expires: now + req.session_timeout,
            joined_seq: self.next_seq,
        };
        self.members.insert(id, member);
        if self.state == GroupState::PreparingRebalance
            && let Some(limit) = self.initial_limit
        {
            // Another member arrived during the initial delay: wait a little longer for more.
            self.join_deadline = (now + timing.initial_rebalance_delay).min(limit);
        }
        self.prepare_rebalance(now, timing);
        self.maybe_complete_join(now);
        Reply::Later(rx)
    }

    /// A static member came back with a new member id: it takes the old member's place, and
    /// keeps its assignment without a rebalance when nothing it subscribes to changed.
    fn replace_static(
        &mut self,
        old_id: String,
        new_id: String,
        req: JoinRequest,
        now: Instant,
        timing: Timing,
    ) -> Reply<JoinOutcome> {
        let Some(mut member) = self.members.remove(&old_id) else {
            return self.add_member(new_id, req, now, timing);
        };
        member.answer_join(JoinOutcome::error(ResponseError::FencedInstanceId, &old_id));
        member.answer_sync(SyncOutcome::error(ResponseError::FencedInstanceId));
        let unchanged = member.protocols == req.protocols;
        member.id = new_id.clone();
        member.protocols = req.protocols;
        member.client_id = req.client_id;
        member.client_host = req.client_host;
        member.session_timeout = req.session_timeout;
        member.rebalance_timeout = req.rebalance_timeout;
        member.expires = now + req.session_timeout;
        if let Some(instance) = &member.instance_id {
            self.statics.insert(instance.clone(), new_id.clone());
        }
        let was_leader = self.leader.as_deref() == Some(old_id.as_str());
        if was_leader {
            self.leader = Some(new_id.clone());
        }
        self.members.insert(new_id.clone(), member);
        match self.state {
            GroupState::Stable if unchanged => {
                let mut outcome = self.current(&new_id);
                if was_leader && req.supports_skip_assignment {
                    outcome.members = self.member_list();
                    outcome.skip_assignment = true;
                }
                Reply::Now(outcome)
            }
            _ => self.await_join(&new_id, now, timing),
        }
    }

    fn join_known(&mut self, req: JoinRequest, now: Instant, timing: Timing) -> Reply<JoinOutcome> {
        let id = req.member_id.clone();
        if self.pending.remove(&id).is_some() {
            return self.add_member(id, req, now, timing);
        }
        let Some(member) = self.members.get(&id) else {
            return Reply::Now(JoinOutcome::error(ResponseError::UnknownMemberId, &id));
        };
        if let Some(instance) = &req.instance_id
            && self.statics.get(instance) != Some(&id)
        {
            return Reply::Now(JoinOutcome::error(ResponseError::FencedInstanceId, &id));
        }
        let unchanged = member.protocols == req.protocols;
        let is_leader = self.leader.as_deref() == Some(id.as_str());
        match self.state {
            GroupState::CompletingRebalance if unchanged => {
                // The join response was lost: send it again.
                let mut outcome = self.current(&id);
                if is_leader {
                    outcome.members = self.member_list();
                }
                Reply::Now(outcome)
            }
            GroupState::Stable if unchanged && !is_leader => Reply::Now(self.current(&id)),
            GroupState::Empty | GroupState::Dead => {
                Reply::Now(JoinOutcome::error(ResponseError::UnknownMemberId, &id))
            }
            _ => {
                // Updating protocols (a rejoin after revoking partitions, in the cooperative
                // protocol, or a changed subscription) or a leader asking for a new round.
                if let Some(member) = self.members.get_mut(&id) {
                    member.protocols = req.protocols;
                    member.session_timeout = req.session_timeout;
                    member.rebalance_timeout = req.rebalance_timeout;
                    member.client_id = req.client_id;
                    member.client_host = req.client_host;
                }
                self.await_join(&id, now, timing)
            }
        }
    }

    fn await_join(&mut self, id: &str, now: Instant, timing: Timing) -> Reply<JoinOutcome> {
        let (tx, rx) = oneshot::channel();
        if let Some(member) = self.members.get_mut(id) {
            // A join still parked from before (the client gave up on it) is answered first.
            member.answer_join(JoinOutcome::error(ResponseError::RebalanceInProgress, id));
            member.awaiting_join = Some(tx);
            member.expires = now + member.session_timeout;
        }
        self.prepare_rebalance(now, timing);
        self.maybe_complete_join(now);
        Reply::Later(rx)
    }

    /// Starts a join phase unless one is running.
    fn prepare_rebalance(&mut self, now: Instant, timing: Timing) {
        match self.state {
            GroupState::PreparingRebalance | GroupState::Dead => return,
            GroupState::CompletingRebalance => {
                for member in self.members.values_mut() {
                    member.assignment = Bytes::new();
                    member.answer_sync(SyncOutcome::error(ResponseError::RebalanceInProgress));
                }
            }
            GroupState::Stable => {}
            GroupState::Empty => {
                let limit = now + self.max_rebalance_timeout();
                self.initial_limit = Some(limit);
                self.join_deadline = (now + timing.initial_rebalance_delay).min(limit);
                self.set_state(GroupState::PreparingRebalance);
                return;
            }
        }
        self.initial_limit = None;
        self.join_deadline = now + self.max_rebalance_timeout();
        self.set_state(GroupState::PreparingRebalance);
    }

    fn max_rebalance_timeout(&self) -> Duration {
        self.members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or_default()
    }

    /// Ends the join phase when it is due: when every member rejoined (not during the initial
    /// delay) or at the deadline, removing those that did not rejoin.
    pub(crate) fn maybe_complete_join(&mut self, now: Instant) {
        if self.state != GroupState::PreparingRebalance {
            return;
        }
        let all_joined =
            self.pending.is_empty() && self.members.values().all(|m| m.awaiting_join.is_some());
        let due = now >= self.join_deadline || (all_joined && self.initial_limit.is_none());
        if !due {
            return;
        }
        let missing: Vec<String> = self
            .members
            .values()
            .filter(|m| m.awaiting_join.is_none())
            .map(|m| m.id.clone())
            .collect();
        for id in missing {
            tracing::info!(group = %self.id, member = %id, "member did not rejoin in time, removed");
            self.remove(&id);
        }
        self.initial_limit = None;
        self.generation = self.generation.wrapping_add(1).max(1);
        self.dirty = true;
        if self.members.is_empty() {
            self.protocol = None;
            self.leader = None;
            self.set_state(GroupState::Empty);
            tracing::info!(group = %self.id, generation = self.generation, "group is empty");
            return;
        }
        self.protocol = self.select_protocol();
        let leader_present = self
            .leader
            .as_ref()
            .is_some_and(|l| self.members.contains_key(l));
        if !leader_present {
            self.leader = self
                .members
                .values()
                .min_by_key(|m| m.joined_seq)
                .map(|m| m.id.clone());
        }
        self.set_state(GroupState::CompletingRebalance);
        // The leader's SyncGroup is due within a rebalance timeout.
        self.join_deadline = now + self.max_rebalance_timeout();
        let members = self.member_list();
        let leader = self.leader.clone().unwrap_or_default();
        let base = self.current("");
        for member in self.members.values_mut() {
            member.assignment = Bytes::new();
            member.expires = now + member.session_timeout;
            let mut outcome = base.clone();
            outcome.member_id = member.id.clone();
            if member.id == leader {
                outcome.members = members.clone();
            }
            member.answer_join(outcome);
        }
        tracing::info!(
            group = %self.id,
            generation = self.generation,
            members = self.members.len(),
            protocol = ?self.protocol,
            "join phase complete"
        );
    }

    /// Removes a member, answering anything it still waits for.
    fn remove(&mut self, id: &str) {
        if let Some(mut member) = self.members.remove(id) {
            member.answer_join(JoinOutcome::error(ResponseError::UnknownMemberId, id));
            member.answer_sync(SyncOutcome::error(ResponseError::UnknownMemberId));
            if let Some(instance) = &member.instance_id
                && self.statics.get(instance).map(String::as_str) == Some(id)
            {
                self.statics.remove(instance);
            }
        }
    }

    /// Removes a member and rebalances the others.
    fn remove_and_rebalance(&mut self, id: &str, now: Instant, timing: Timing) {
        self.remove(id);
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                self.prepare_rebalance(now, timing)
            }
            _ => {}
        }
        self.maybe_complete_join(now);
    }

    /// Checks a member's id, instance id and generation as Heartbeat, SyncGroup and OffsetCommit
    /// do.
    fn check_member(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
    ) -> Result<(), ResponseError> {
        if let Some(instance) = instance_id
            && let Some(current) = self.statics.get(instance)
            && current != member_id
        {
            return Err(ResponseError::FencedInstanceId);
        }
        if !self.members.contains_key(member_id) {
            return Err(ResponseError::UnknownMemberId);
        }
        if generation != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        Ok(())
    }

    /// Handles a SyncGroup.
    pub(crate) fn sync(&mut self, req: SyncRequest<'_>, now: Instant) -> Reply<SyncOutcome> {
        let SyncRequest {
            member_id,
            instance_id,
            generation,
            protocol_type,
            protocol_name,
            assignments,
        } = req;
        if self.state == GroupState::Dead {
            return Reply::Now(SyncOutcome::error(ResponseError::CoordinatorNotAvailable));
        }
        if let Err(e) = self.check_member(member_id, instance_id, generation) {
            return Reply::Now(SyncOutcome::error(e));
        }
        if protocol_type.is_some_and(|t| t != self.protocol_type)
            || protocol_name.is_some_and(|n| Some(n) != self.protocol.as_deref())
        {
            return Reply::Now(SyncOutcome::error(ResponseError::InconsistentGroupProtocol));
        }
        let ok = |group: &Group, assignment: Bytes| SyncOutcome {
            error: None,
            protocol_type: Some(group.protocol_type.clone()),
            protocol_name: group.protocol.clone(),
            assignment,
        };
        match self.state {
            GroupState::Empty | GroupState::Dead => {
                Reply::Now(SyncOutcome::error(ResponseError::UnknownMemberId))
            }
            GroupState::PreparingRebalance => {
                Reply::Now(SyncOutcome::error(ResponseError::RebalanceInProgress))
            }
            GroupState::Stable => {
                let assignment = self
                    .members
                    .get_mut(member_id)
                    .map(|m| {
                        m.expires = now + m.session_timeout;
                        m.assignment.clone()
                    })
                    .unwrap_or_default();
                Reply::Now(ok(self, assignment))
            }
            GroupState::CompletingRebalance => {
                let (tx, rx) = oneshot::channel();
                if let Some(member) = self.members.get_mut(member_id) {
                    member.answer_sync(SyncOutcome::error(ResponseError::RebalanceInProgress));
                    member.awaiting_sync = Some(tx);
                    member.expires = now + member.session_timeout;
                }
                if self.leader.as_deref() == Some(member_id) {
                    let mut assignments: HashMap<String, Bytes> = assignments.into_iter().collect();
                    for member in self.members.values_mut() {
                        member.assignment = assignments.remove(&member.id).unwrap_or_default();
                    }
                    self.set_state(GroupState::Stable);
                    let protocol_type = Some(self.protocol_type.clone());
                    let protocol_name = self.protocol.clone();
                    for member in self.members.values_mut() {
                        let outcome = SyncOutcome {
                            error: None,
                            protocol_type: protocol_type.clone(),
                            protocol_name: protocol_name.clone(),
                            assignment: member.assignment.clone(),
                        };
                        member.answer_sync(outcome);
                    }
                    tracing::info!(group = %self.id, generation = self.generation, "group is stable");
                }
                Reply::Later(rx)
            }
        }
    }

    /// Handles a Heartbeat.
    pub(crate) fn heartbeat(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        now: Instant,
    ) -> Option<ResponseError> {
        match self.state {
            GroupState::Dead => return Some(ResponseError::CoordinatorNotAvailable),
            GroupState::Empty => return Some(ResponseError::UnknownMemberId),
            _ => {}
        }
        if let Err(e) = self.check_member(member_id, instance_id, generation) {
            return Some(e);
        }
        if let Some(member) = self.members.get_mut(member_id) {
            member.expires = now + member.session_timeout;
        }
        (self.state == GroupState::PreparingRebalance).then_some(ResponseError::RebalanceInProgress)
    }

    /// Handles one member of a LeaveGroup: by member id, or by instance id alone (v3+).
    pub(crate) fn leave(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        now: Instant,
        timing: Timing,
    ) -> Option<ResponseError> {
        if self.state == GroupState::Dead {
            return Some(ResponseError::CoordinatorNotAvailable);
        }
        let id = match instance_id {
            Some(instance) => match self.statics.get(instance) {
                Some(current) if member_id.is_empty() || current == member_id => current.clone(),
                Some(_) => return Some(ResponseError::FencedInstanceId),
                None => return Some(ResponseError::UnknownMemberId),
            },
            None => member_id.to_owned(),
        };
        if self.pending.remove(&id).is_some() {
            self.maybe_complete_join(now);
            return None;
        }
        if !self.members.contains_key(&id) {
            return Some(ResponseError::UnknownMemberId);
        }
        tracing::info!(group = %self.id, member = %id, "member left");
        self.remove_and_rebalance(&id, now, timing);
        None
    }

    /// Applies the timeouts due at `now`: expired sessions and pending member ids, the end of
    /// a join phase.
    pub(crate) fn tick(&mut self, now: Instant, timing: Timing) {
        self.pending.retain(|_, expires| *expires > now);
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| m.awaiting_join.is_none() && m.awaiting_sync.is_none() && m.expires <= now)
            .map(|m| m.id.clone())
            .collect();
        for id in expired {
            tracing::info!(group = %self.id, member = %id, "session timed out, member removed");
            self.remove_and_rebalance(&id, now, timing);
        }
        if self.state == GroupState::CompletingRebalance && now >= self.join_deadline {
            // Whoever has not sent its SyncGroup (above all a leader that never assigns) is
            // removed, so the others are not kept waiting forever.
            let unsynced: Vec<String> = self
                .members
                .values()
                .filter(|m| m.awaiting_sync.is_none())
                .map(|m| m.id.clone())
                .collect();
            for id in unsynced {
                tracing::info!(group = %self.id, member = %id, "no SyncGroup in time, member removed");
                self.remove_and_rebalance(&id, now, timing);
            }
        }
        self.maybe_complete_join(now);
    }

    /// Marks the group deleted, answering whoever still waits.
    pub(crate) fn kill(&mut self) {
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            self.remove(&id);
        }
        self.set_state(GroupState::Dead);
    }

    /// The topics the members subscribe to, read from the consumer protocol's subscription
    /// (version i16, then an array of topic names); `None` when not a consumer group.
    pub(crate) fn subscribed_topics(&self) -> Option<Vec<String>> {
        if self.protocol_type != "consumer" {
            return None;
        }
        let mut topics = Vec::new();
        for member in self.members.values() {
            topics.extend(subscription_topics(
                &member.metadata(self.protocol.as_deref()),
            ));
        }
        Some(topics)
    }
}

/// Topic names in a ConsumerProtocolSubscription; stops quietly at anything malformed.
fn subscription_topics(metadata: &[u8]) -> Vec<String> {
    let mut topics = Vec::new();
    let read_i16 = |at: usize| {
        metadata
            .get(at..at + 2)
            .map(|b| i16::from_be_bytes([b[0], b[1]]))
    };
    let Some(count) = metadata
        .get(2..6)
        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    else {
        return topics;
    };
    let mut at = 6;
    for _ in 0..count.max(0) {
        let Some(len) = read_i16(at).and_then(|l| usize::try_from(l).ok()) else {
            break;
        };
        let Some(name) = metadata.get(at + 2..at + 2 + len) else {
            break;
        };
        topics.push(String::from_utf8_lossy(name).into_owned());
        at += 2 + len;
    }
    topics
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMING: Timing = Timing {
        initial_rebalance_delay: Duration::ZERO,
    };

    fn request(member_id: &str, protocols: &[&str]) -> JoinRequest {
        JoinRequest {
            member_id: member_id.to_owned(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout: Duration::from_secs(10),
            rebalance_timeout: Duration::from_secs(30),
            protocol_type: "consumer".into(),
            protocols: protocols
                .iter()
                .map(|p| Protocol {
                    name: (*p).to_owned(),
                    metadata: Bytes::from_static(b"m"),
                })
                .collect(),
            require_known_member_id: true,
            supports_skip_assignment: false,
        }
    }

    fn sync_req<'a>(
        member_id: &'a str,
        instance_id: Option<&'a str>,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    ) -> SyncRequest<'a> {
        SyncRequest {
            member_id,
            instance_id,
            generation,
            assignments,
            ..SyncRequest::default()
        }
    }

    fn now_outcome<T>(reply: Reply<T>) -> T {
        match reply {
            Reply::Now(t) => t,
            Reply::Later(_) => panic!("expected an immediate answer"),
        }
    }

    fn later<T>(reply: Reply<T>) -> oneshot::Receiver<T> {
        match reply {
            Reply::Later(rx) => rx,
            Reply::Now(_) => panic!("expected to wait"),
        }
    }

    /// Joins a member through MEMBER_ID_REQUIRED; returns its id and its parked join.
    fn join_new(
        group: &mut Group,
        protocols: &[&str],
        now: Instant,
    ) -> (String, oneshot::Receiver<JoinOutcome>) {
        let first = now_outcome(group.join(request("", protocols), now, TIMING));
        assert_eq!(first.error, Some(ResponseError::MemberIdRequired));
        let id = first.member_id;
        let rx = later(group.join(request(&id, protocols), now, TIMING));
        (id, rx)
    }

    #[test]
    fn a_second_member_triggers_a_round_that_ends_when_the_first_rejoins() {
        let now = Instant::now();
        let mut group = Group::new("g".into(), String::new(), 0, 0);
        let (a, mut a_join) = join_new(&mut group, &["range", "roundrobin"], now);
        let joined = a_join.try_recv().unwrap();
        assert_eq!((joined.generation, joined.leader.as_str()), (1, a.as_str()));
        assert_eq!(joined.protocol_name.as_deref(), Some("range"));
        let mut a_sync = later(group.sync(
            sync_req(&a, None, 1, vec![(a.clone(), Bytes::from_static(b"all"))]),
            now,
        ));
        assert_eq!(
            a_sync.try_recv().unwrap().assignment,
            Bytes::from_static(b"all")
        );
        assert_eq!(group.state, GroupState::Stable);

        let (b, mut b_join) = join_new(&mut group, &["roundrobin"], now);
        assert_eq!(group.state, GroupState::PreparingRebalance);
        assert!(b_join.try_recv().is_err(), "waits for the first member");
        assert_eq!(
            group.heartbeat(&a, None, 1, now),
            Some(ResponseError::RebalanceInProgress)
        );
        let mut a_join = later(group.join(request(&a, &["range", "roundrobin"]), now, TIMING));
        let leader_view = a_join.try_recv().unwrap();
        let follower_view = b_join.try_recv().unwrap();
        assert_eq!(leader_view.generation, 2);
        assert_eq!(
            leader_view.protocol_name.as_deref(),
            Some("roundrobin"),
            "the only common one"
        );
        assert_eq!(leader_view.members.len(), 2);
        assert!(follower_view.members.is_empty());
        assert_eq!(follower_view.leader, a);
        assert_eq!(
            group.heartbeat(&b, None, 1, now),
            Some(ResponseError::IllegalGeneration)
        );
        assert_eq!(group.heartbeat(&b, None, 2, now), None);
        assert_eq!(
            group.heartbeat("nobody", None, 2, now),
            Some(ResponseError::UnknownMemberId)
        );
    }

    #[test]
    fn members_that_do_not_rejoin_are_removed_at_the_rebalance_timeout() {
        let now = Instant::now();
        let mut group = Group::new("g".into(), String::new(), 0, 0);
        let (a, _) = join_new(&mut group, &["range"], now);
        let _ = group.sync(sync_req(&a, None, 1, vec![]), now);
        let (_b, mut b_join) = join_new(&mut group, &["range"], now);
        // `a` keeps heartbeating but never rejoins.
        let later_on = now + Duration::from_secs(31);
        assert_eq!(
            group.heartbeat(&a, None, 1, now + Duration::from_secs(25)),
            Some(ResponseError::RebalanceInProgress)
        );
        group.tick(later_on, TIMING);
        let outcome = b_join.try_recv().unwrap();
        assert_eq!(outcome.members.len(), 1, "b leads alone");
        assert!(!group.members.contains_key(&a));
    }

    #[test]
    fn a_silent_member_is_removed_after_its_session_timeout_and_the_last_leaving_empties_the_group()
    {
        let now = Instant::now();
        let mut group = Group::new("g".into(), String::new(), 0, 0);
        let (a, _) = join_new(&mut group, &["range"], now);
        let _ = group.sync(sync_req(&a, None, 1, vec![]), now);
        group.tick(now + Duration::from_secs(9), TIMING);
        assert_eq!(group.state, GroupState::Stable);
        group.tick(now + Duration::from_secs(11), TIMING);
        assert_eq!(group.state, GroupState::Empty);
        assert_eq!(group.generation, 2);
    }

    #[test]
    fn a_static_member_rejoining_with_the_same_protocols_keeps_its_assignment_without_a_rebalance()
    {
        let now = Instant::now();
        let mut group = Group::new("g".into(), String::new(), 0, 0);
        let mut req = request("", &["range"]);
        req.instance_id = Some("i1".into());
        let mut joined = later(group.join(req, now, TIMING));
        let first = joined.try_recv().unwrap();
        let _ = group.sync(
            sync_req(
                &first.member_id,
                Some("i1"),
                1,
                vec![(first.member_id.clone(), Bytes::from_static(b"p0"))],
            ),
            now,
        );
        let mut again = request("", &["range"]);
        again.instance_id = Some("i1".into());
        let second = now_outcome(group.join(again, now, TIMING));
        assert_eq!(second.error, None);
        assert_ne!(second.member_id, first.member_id);
        assert_eq!(second.generation, 1);
        assert_eq!(group.state, GroupState::Stable);
        assert_eq!(
            group.heartbeat(&first.member_id, Some("i1"), 1, now),
            Some(ResponseError::FencedInstanceId)
        );
        let synced =
            now_outcome(group.sync(sync_req(&second.member_id, Some("i1"), 1, vec![]), now));
        assert_eq!(synced.assignment, Bytes::from_static(b"p0"));
    }

    #[test]
    fn a_member_with_no_protocol_in_common_is_refused() {
        let now = Instant::now();
        let mut group = Group::new("g".into(), String::new(), 0, 0);
        let _ = join_new(&mut group, &["range"], now);
        let refused = now_outcome(group.join(request("", &["cooperative-sticky"]), now, TIMING));
        assert_eq!(
            refused.error,
            Some(ResponseError::InconsistentGroupProtocol)
        );
    }

    #[test]
    fn subscription_topics_are_read_from_consumer_metadata_and_garbage_is_ignored() {
        let mut m = vec![0, 1, 0, 0, 0, 2, 0, 1, b'a', 0, 2, b'b', b'c'];
        assert_eq!(subscription_topics(&m), vec!["a", "bc"]);
        m.truncate(10);
        assert_eq!(subscription_topics(&m), vec!["a"]);
        assert!(subscription_topics(&[0xff; 3]).is_empty());
    }
}
