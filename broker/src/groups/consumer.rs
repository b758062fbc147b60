//! KIP-848 consumer-protocol groups: the coordinator assigns partitions itself and every member
//! reconciles on its own through ConsumerGroupHeartbeat, with no group-wide join.
//!
//! Epochs: the group epoch goes up whenever membership or a subscription (or the partitions of
//! a subscribed topic) changes; the target assignment is then recomputed at once, by the
//! `uniform` or `range` assignor, and carries that epoch. Each member has its own epoch, which
//! catches up with the target's by reconciliation:
//!
//! - partitions the member owns but its target does not are revoked first: it is told its
//!   assignment without them and keeps its epoch until a heartbeat reports (TopicPartitions)
//!   that it no longer owns them;
//! - then its epoch becomes the target epoch and it gets the partitions of its target that no
//!   other member still owns or still has to revoke; the others follow in a later heartbeat
//!   once they are released.
//!
//! So a partition never has two owners. Membership is in memory; after a restart members find
//! out from UNKNOWN_MEMBER_ID and join again with epoch 0, as after a Kafka coordinator
//! failover. Committed offsets are stored like those of classic groups.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use uuid::Uuid;

/// A partition by topic id.
pub(crate) type Tp = (Uuid, i32);

/// The assignor used when no member names one.
pub(crate) const DEFAULT_ASSIGNOR: &str = "uniform";
/// The server-side assignors this broker has.
pub(crate) const ASSIGNORS: &[&str] = &["uniform", "range"];

/// A subscribed topic as the assignors see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicInfo {
    pub(crate) name: String,
    pub(crate) id: Uuid,
    pub(crate) partitions: i32,
}

/// One member of a consumer group.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub(crate) id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) rack_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    pub(crate) rebalance_timeout: Duration,
    pub(crate) subscribed: Vec<String>,
    pub(crate) assignor: Option<String>,
    pub(crate) epoch: i32,
    pub(crate) previous_epoch: i32,
    /// What the member has been given and may own.
    pub(crate) assigned: BTreeSet<Tp>,
    /// What it must give up and has not confirmed yet.
    pub(crate) revoking: BTreeSet<Tp>,
    /// The assignment last sent, to send it again only when it changes.
    sent: Option<BTreeSet<Tp>>,
    deadline: Instant,
    revoke_deadline: Option<Instant>,
    /// A static member that left with epoch -2: kept with its assignment until its session
    /// times out, for the same instance to come back.
    away: bool,
}

/// A member's state as ConsumerGroupDescribe names it.
impl Member {
    pub(crate) fn reconciled(&self, target_epoch: i32) -> bool {
        self.revoking.is_empty() && self.epoch == target_epoch
    }
}

/// A heartbeat as the state machine sees it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Heartbeat {
    pub(crate) member_id: String,
    pub(crate) member_epoch: i32,
    pub(crate) instance_id: Option<String>,
    pub(crate) rack_id: Option<String>,
    pub(crate) rebalance_timeout_ms: i32,
    pub(crate) subscribed: Option<Vec<String>>,
    pub(crate) assignor: Option<String>,
    /// The partitions the member owns, when it says (null: unchanged).
    pub(crate) owned: Option<BTreeSet<Tp>>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HeartbeatReply {
    pub(crate) error: Option<(ResponseError, String)>,
    pub(crate) member_id: String,
    pub(crate) member_epoch: i32,
    /// The member's whole assignment when it changed (or it joined).
    pub(crate) assignment: Option<BTreeSet<Tp>>,
}

impl HeartbeatReply {
    fn error(e: ResponseError, message: impl Into<String>, member_id: &str) -> Self {
        HeartbeatReply {
            error: Some((e, message.into())),
            member_id: member_id.to_owned(),
            member_epoch: 0,
            assignment: None,
        }
    }
}

/// A consumer-protocol group.
#[derive(Debug)]
pub(crate) struct ConsumerGroup {
    pub(crate) id: String,
    pub(crate) epoch: i32,
    pub(crate) target_epoch: i32,
    pub(crate) members: BTreeMap<String, Member>,
    pub(crate) target: BTreeMap<String, BTreeSet<Tp>>,
    /// The subscribed topics the target was computed from.
    topics: Vec<TopicInfo>,
    /// Set when the epoch changed and the catalog should hear of it.
    pub(crate) dirty: bool,
    pub(crate) state_timestamp: i64,
}

impl ConsumerGroup {
    pub(crate) fn new(id: String, epoch: i32, state_timestamp: i64) -> Self {
        ConsumerGroup {
            id,
            epoch,
            target_epoch: epoch,
            members: BTreeMap::new(),
            target: BTreeMap::new(),
            topics: Vec::new(),
            dirty: false,
            state_timestamp,
        }
    }

    /// Kafka's consumer group state names.
    pub(crate) fn state_name(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.target_epoch != self.epoch {
            "Assigning"
        } else if self
            .members
            .values()
            .all(|m| m.reconciled(self.target_epoch))
        {
            "Stable"
        } else {
            "Reconciling"
        }
    }

    /// The assignor the group uses: the one most members name, else the default.
    pub(crate) fn assignor(&self) -> &str {
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(a) = &m.assignor {
                *votes.entry(a.as_str()).or_default() += 1;
            }
        }
        votes
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
            .map_or(DEFAULT_ASSIGNOR, |(a, _)| a)
    }

    /// Every topic name some member subscribes to.
    pub(crate) fn subscribed_names(&self) -> BTreeSet<String> {
        self.members
            .values()
            .flat_map(|m| m.subscribed.iter().cloned())
            .collect()
    }

    fn bump(&mut self) {
        self.epoch = self.epoch.saturating_add(1);
        self.dirty = true;
        self.state_timestamp = crate::log::now_ms();
    }

    /// Recomputes the target assignment if the epoch moved or `topics` (the subscribed
    /// topics as they are now) differ from those it was computed from.
    pub(crate) fn refresh_target(&mut self, topics: Vec<TopicInfo>) {
        if topics != self.topics {
            if self.target_epoch == self.epoch && !self.members.is_empty() {
                self.bump();
            }
            self.topics = topics;
        }
        if self.target_epoch == self.epoch {
            return;
        }
        let subs: BTreeMap<String, Vec<String>> = self
            .members
            .iter()
            .map(|(id, m)| (id.clone(), m.subscribed.clone()))
            .collect();
        self.target = if self.assignor() == "range" {
            assign_range(&subs, &self.topics)
        } else {
            assign_uniform(&subs, &self.topics, &self.target)
        };
        self.target_epoch = self.epoch;
    }

    /// Whether some member other than `except` owns or still has to revoke `tp`.
    fn held_by_other(&self, tp: &Tp, except: &str) -> bool {
        self.members
            .values()
            .any(|m| m.id != except && (m.assigned.contains(tp) || m.revoking.contains(tp)))
    }

    /// Handles one heartbeat. `topics_of` gives the subscribed topics as they are now, for the
    /// names subscribed after this heartbeat.
    pub(crate) fn heartbeat(
        &mut self,
        hb: Heartbeat,
        now: Instant,
        session: Duration,
        topics_of: &dyn Fn(&BTreeSet<String>) -> Vec<TopicInfo>,
    ) -> HeartbeatReply {
        if let Some(a) = &hb.assignor
            && !ASSIGNORS.contains(&a.as_str())
        {
            return HeartbeatReply::error(
                ResponseError::UnsupportedAssignor,
                format!("assignor {a:?} is not one of {ASSIGNORS:?}"),
                &hb.member_id,
            );
        }
        let member_id = match hb.member_epoch {
            0 => match self.join(&hb, now, session) {
                Ok(id) => id,
                Err(reply) => return reply,
            },
            -1 | -2 => {
                let Some(m) = self.members.get_mut(&hb.member_id) else {
                    return HeartbeatReply::error(
                        ResponseError::UnknownMemberId,
                        "no such member",
                        &hb.member_id,
                    );
                };
                if hb.member_epoch == -2 && m.instance_id.is_some() {
                    m.away = true;
                    m.deadline = now + session;
                } else {
                    self.members.remove(&hb.member_id);
                    self.bump();
                    let topics = topics_of(&self.subscribed_names());
                    self.refresh_target(topics);
                }
                return HeartbeatReply {
                    error: None,
                    member_id: hb.member_id,
                    member_epoch: hb.member_epoch,
                    assignment: None,
                };
            }
            epoch => {
                let Some(m) = self.members.get(&hb.member_id) else {
                    return HeartbeatReply::error(
                        ResponseError::UnknownMemberId,
                        "no such member",
                        &hb.member_id,
                    );
                };
                let previous_ok = epoch == m.previous_epoch
                    && hb.owned.as_ref().is_some_and(|o| o.is_subset(&m.assigned));
                if epoch != m.epoch && !previous_ok {
                    let current = m.epoch;
                    // Fenced: the member must give up everything and join again.
                    self.members.remove(&hb.member_id);
                    self.bump();
                    let topics = topics_of(&self.subscribed_names());
                    self.refresh_target(topics);
                    return HeartbeatReply::error(
                        ResponseError::FencedMemberEpoch,
                        format!("member epoch {epoch} is fenced: the member's epoch is {current}"),
                        &hb.member_id,
                    );
                }
                hb.member_id.clone()
            }
        };
        // Subscription changes.
        let mut changed = false;
        if let Some(m) = self.members.get_mut(&member_id) {
            m.deadline = now + session;
            m.away = false;
            if let Some(mut subs) = hb.subscribed.clone() {
                subs.sort();
                subs.dedup();
                if subs != m.subscribed {
                    m.subscribed = subs;
                    changed = true;
                }
            }
            if hb.assignor.is_some() && hb.assignor != m.assignor {
                m.assignor = hb.assignor.clone();
                changed = true;
            }
            if hb.rebalance_timeout_ms > 0 {
                m.rebalance_timeout = Duration::from_millis(hb.rebalance_timeout_ms as u64);
            }
        }
        if changed {
            self.bump();
        }
        let topics = topics_of(&self.subscribed_names());
        self.refresh_target(topics);
        self.reconcile(&member_id, hb.owned.as_ref(), now);
        let Some(m) = self.members.get_mut(&member_id) else {
            return HeartbeatReply::error(ResponseError::UnknownMemberId, "no such member", "");
        };
        let full = hb.member_epoch == 0;
        let assignment = if full || m.sent.as_ref() != Some(&m.assigned) {
            m.sent = Some(m.assigned.clone());
            Some(m.assigned.clone())
        } else {
            None
        };
        HeartbeatReply {
            error: None,
            member_id,
            member_epoch: m.epoch,
            assignment,
        }
    }

    /// A member joining with epoch 0: its id (generated when empty), or the error answer.
    fn join(
        &mut self,
        hb: &Heartbeat,
        now: Instant,
        session: Duration,
    ) -> Result<String, HeartbeatReply> {
        let Some(mut subscribed) = hb.subscribed.clone() else {
            return Err(HeartbeatReply::error(
                ResponseError::InvalidRequest,
                "SubscribedTopicNames must be set when joining",
                &hb.member_id,
            ));
        };
        subscribed.sort();
        subscribed.dedup();
        let id = if hb.member_id.is_empty() {
            Uuid::new_v4().to_string()
        } else {
            hb.member_id.clone()
        };
        let mut inherited = None;
        if let Some(instance) = &hb.instance_id
            && let Some(old) = self
                .members
                .values()
                .find(|m| m.instance_id.as_ref() == Some(instance) && m.id != id)
        {
            if !old.away {
                return Err(HeartbeatReply::error(
                    ResponseError::UnreleasedInstanceId,
                    format!("instance {instance} is still used by member {}", old.id),
                    &hb.member_id,
                ));
            }
            let old_id = old.id.clone();
            inherited = self.members.remove(&old_id);
            if let Some(t) = self.target.remove(&old_id) {
                self.target.insert(id.clone(), t);
            }
        }
        let mut member = Member {
            id: id.clone(),
            instance_id: hb.instance_id.clone(),
            rack_id: hb.rack_id.clone(),
            client_id: hb.client_id.clone(),
            client_host: hb.client_host.clone(),
            rebalance_timeout: Duration::from_millis(hb.rebalance_timeout_ms.max(0) as u64),
            subscribed,
            assignor: hb.assignor.clone(),
            epoch: 0,
            previous_epoch: -1,
            assigned: BTreeSet::new(),
            revoking: BTreeSet::new(),
            sent: None,
            deadline: now + session,
            revoke_deadline: None,
            away: false,
        };
        if let Some(old) = inherited {
            // The static member comes back as it left: same partitions, same epoch.
            member.epoch = old.epoch;
            member.previous_epoch = old.previous_epoch;
            member.assigned = old.assigned;
            member.revoking = old.revoking;
            member.subscribed = old.subscribed;
        } else if let Some(old) = self.members.remove(&id) {
            // Joining again under the same id: whatever it owned is gone.
            member.subscribed = old.subscribed;
        } else {
            self.bump();
        }
        self.members.insert(id.clone(), member);
        Ok(id)
    }

    /// Moves member `id` towards its target (see the module docs).
    fn reconcile(&mut self, id: &str, owned: Option<&BTreeSet<Tp>>, now: Instant) {
        let target = self.target.get(id).cloned().unwrap_or_default();
        let target_epoch = self.target_epoch;
        let Some(m) = self.members.get_mut(id) else {
            return;
        };
        if !m.revoking.is_empty()
            && let Some(owned) = owned
            && owned.is_disjoint(&m.revoking)
        {
            m.revoking.clear();
            m.revoke_deadline = None;
        }
        if !m.revoking.is_empty() {
            return;
        }
        if m.epoch != target_epoch {
            let revoke: BTreeSet<Tp> = m.assigned.difference(&target).copied().collect();
            if !revoke.is_empty() {
                m.assigned.retain(|tp| !revoke.contains(tp));
                m.revoking = revoke;
                m.revoke_deadline = Some(now + m.rebalance_timeout);
                return;
            }
            m.previous_epoch = m.epoch;
            m.epoch = target_epoch;
        }
        let wanted: Vec<Tp> = target
            .iter()
            .filter(|tp| !self.members[id].assigned.contains(tp))
            .copied()
            .collect();
        let free: Vec<Tp> = wanted
            .into_iter()
            .filter(|tp| !self.held_by_other(tp, id))
            .collect();
        if let Some(m) = self.members.get_mut(id) {
            m.assigned.extend(free);
        }
    }

    /// Removes the members whose session (or revocation) timed out; whether any was.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<String> {
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| m.deadline <= now || m.revoke_deadline.is_some_and(|d| d <= now))
            .map(|m| m.id.clone())
            .collect();
        if gone.is_empty() {
            return gone;
        }
        for id in &gone {
            self.members.remove(id);
        }
        self.bump();
        // The topics as last seen, less those nobody subscribes to any more; the next
        // heartbeat brings them up to date.
        let names = self.subscribed_names();
        let topics = self
            .topics
            .iter()
            .filter(|t| names.contains(&t.name))
            .cloned()
            .collect();
        self.refresh_target(topics);
        gone
    }

    /// The current epoch of member `id`, if it is one.
    pub(crate) fn member_epoch(&self, id: &str) -> Option<i32> {
        self.members.get(id).map(|m| m.epoch)
    }
}

/// The `range` assignor: per topic, the members subscribed to it in id order each get a
/// contiguous range, the first ones one more when the partitions do not divide evenly.
pub(crate) fn assign_range(
    subs: &BTreeMap<String, Vec<String>>,
    topics: &[TopicInfo],
) -> BTreeMap<String, BTreeSet<Tp>> {
    let mut out: BTreeMap<String, BTreeSet<Tp>> =
        subs.keys().map(|m| (m.clone(), BTreeSet::new())).collect();
    for t in topics {
        let members: Vec<&String> = subs
            .iter()
            .filter(|(_, s)| s.contains(&t.name))
            .map(|(m, _)| m)
            .collect();
        if members.is_empty() || t.partitions <= 0 {
            continue;
        }
        let n = members.len() as i32;
        let (each, extra) = (t.partitions / n, t.partitions % n);
        let mut next = 0;
        for (i, m) in members.iter().enumerate() {
            let count = each + i32::from((i as i32) < extra);
            let set = out.entry((*m).clone()).or_default();
            for p in next..next + count {
                set.insert((t.id, p));
            }
            next += count;
        }
    }
    out
}

/// The `uniform` assignor: every partition of a subscribed topic goes to a member subscribed
/// to it, members' counts as even as their subscriptions allow, and a partition stays with
/// the member of the previous target while that keeps the balance.
pub(crate) fn assign_uniform(
    subs: &BTreeMap<String, Vec<String>>,
    topics: &[TopicInfo],
    previous: &BTreeMap<String, BTreeSet<Tp>>,
) -> BTreeMap<String, BTreeSet<Tp>> {
    let subscribers = |tp: &Tp| -> Vec<&String> {
        let Some(t) = topics.iter().find(|t| t.id == tp.0) else {
            return Vec::new();
        };
        subs.iter()
            .filter(|(_, s)| s.contains(&t.name))
            .map(|(m, _)| m)
            .collect()
    };
    let all: Vec<Tp> = topics
        .iter()
        .flat_map(|t| (0..t.partitions.max(0)).map(move |p| (t.id, p)))
        .collect();
    let mut out: BTreeMap<String, BTreeSet<Tp>> =
        subs.keys().map(|m| (m.clone(), BTreeSet::new())).collect();
    let mut placed = BTreeSet::new();
    // Sticky: previous owners keep what they may still have.
    for (m, set) in previous {
        if let Some(mine) = out.get_mut(m) {
            for tp in set {
                if all.contains(tp) && subscribers(tp).contains(&m) && placed.insert(*tp) {
                    mine.insert(*tp);
                }
            }
        }
    }
    // The rest to the least loaded eligible member.
    for tp in &all {
        if placed.contains(tp) {
            continue;
        }
        let eligible = subscribers(tp);
        if let Some(m) = eligible
            .into_iter()
            .min_by_key(|m| (out.get(*m).map_or(0, BTreeSet::len), (*m).clone()))
        {
            out.entry(m.clone()).or_default().insert(*tp);
        }
    }
    // Balance: move partitions from the most to the least loaded while that helps.
    loop {
        let mut moved = false;
        let order: Vec<String> = {
            let mut v: Vec<_> = out.iter().map(|(m, s)| (s.len(), m.clone())).collect();
            v.sort();
            v.into_iter().map(|(_, m)| m).collect()
        };
        'outer: for rich in order.iter().rev() {
            for poor in &order {
                let (r, p) = (out[rich].len(), out[poor].len());
                if r <= p + 1 {
                    continue;
                }
                let candidate = out[rich]
                    .iter()
                    .rev()
                    .find(|tp| subscribers(tp).contains(&poor))
                    .copied();
                if let Some(tp) = candidate {
                    if let Some(s) = out.get_mut(rich) {
                        s.remove(&tp);
                    }
                    if let Some(s) = out.get_mut(poor) {
                        s.insert(tp);
                    }
                    moved = true;
                    break 'outer;
                }
            }
        }
        if !moved {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION: Duration = Duration::from_secs(45);

    fn topic(name: &str, partitions: i32) -> TopicInfo {
        TopicInfo {
            name: name.into(),
            id: Uuid::from_u128(name.len() as u128 + 7),
            partitions,
        }
    }

    fn subs(list: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        list.iter()
            .map(|(m, t)| (m.to_string(), t.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    #[test]
    fn range_gives_contiguous_ranges_first_members_one_more() {
        let t = topic("t", 7);
        let out = assign_range(
            &subs(&[("a", &["t"]), ("b", &["t"]), ("c", &["t"])]),
            std::slice::from_ref(&t),
        );
        let parts = |m: &str| out[m].iter().map(|tp| tp.1).collect::<Vec<_>>();
        assert_eq!(parts("a"), vec![0, 1, 2]);
        assert_eq!(parts("b"), vec![3, 4]);
        assert_eq!(parts("c"), vec![5, 6]);
    }

    #[test]
    fn uniform_balances_and_is_sticky() {
        let t = topic("t", 6);
        let s3 = subs(&[("a", &["t"]), ("b", &["t"]), ("c", &["t"])]);
        let first = assign_uniform(&s3, std::slice::from_ref(&t), &BTreeMap::new());
        assert!(first.values().all(|s| s.len() == 2), "{first:?}");
        let all: BTreeSet<Tp> = first.values().flatten().copied().collect();
        assert_eq!(all.len(), 6);
        // c leaves: a and b keep theirs and split c's.
        let s2 = subs(&[("a", &["t"]), ("b", &["t"])]);
        let second = assign_uniform(&s2, std::slice::from_ref(&t), &first);
        assert_eq!(second["a"].len(), 3);
        assert_eq!(second["b"].len(), 3);
        assert!(first["a"].is_subset(&second["a"]));
        assert!(first["b"].is_subset(&second["b"]));
    }

    #[test]
    fn uniform_respects_heterogeneous_subscriptions() {
        let (x, y) = (topic("x", 4), topic("yy", 2));
        let s = subs(&[("a", &["x"]), ("b", &["x", "yy"])]);
        let out = assign_uniform(&s, &[x.clone(), y.clone()], &BTreeMap::new());
        assert!(out["a"].iter().all(|tp| tp.0 == x.id));
        assert_eq!(out["a"].len() + out["b"].len(), 6);
        assert_eq!(out["a"].len(), 3);
    }

    fn hb(member: &str, epoch: i32, owned: Option<&[Tp]>) -> Heartbeat {
        Heartbeat {
            member_id: member.into(),
            member_epoch: epoch,
            subscribed: (epoch == 0).then(|| vec!["t".to_string()]),
            owned: owned.map(|o| o.iter().copied().collect()),
            rebalance_timeout_ms: 60_000,
            ..Default::default()
        }
    }

    fn t6() -> impl Fn(&BTreeSet<String>) -> Vec<TopicInfo> {
        |names: &BTreeSet<String>| {
            if names.contains("t") {
                vec![topic("t", 6)]
            } else {
                vec![]
            }
        }
    }

    #[test]
    fn a_partition_is_revoked_before_it_is_given_to_another_member() {
        let now = Instant::now();
        let topics = t6();
        let mut g = ConsumerGroup::new("g".into(), 0, 0);
        let a = g.heartbeat(hb("a", 0, None), now, SESSION, &topics);
        assert_eq!(a.member_epoch, 1);
        let a_owned: Vec<Tp> = a.assignment.clone().unwrap().into_iter().collect();
        assert_eq!(a_owned.len(), 6);
        // b joins: the group epoch moves to 2, b gets nothing a still owns.
        let b = g.heartbeat(hb("b", 0, None), now, SESSION, &topics);
        assert_eq!(b.member_epoch, 2);
        assert_eq!(b.assignment.as_ref().unwrap().len(), 0);
        // a is told to give up three, keeping its epoch until it confirms.
        let a2 = g.heartbeat(hb("a", 1, Some(&a_owned)), now, SESSION, &topics);
        assert_eq!(a2.member_epoch, 1);
        let kept = a2.assignment.clone().unwrap();
        assert_eq!(kept.len(), 3);
        // b still gets none of them while a has not confirmed.
        let b2 = g.heartbeat(hb("b", 2, None), now, SESSION, &topics);
        assert_eq!(b2.assignment, None);
        assert!(g.members["b"].assigned.is_empty());
        // a still reporting the old partitions stays where it is.
        let a3 = g.heartbeat(hb("a", 1, Some(&a_owned)), now, SESSION, &topics);
        assert_eq!(a3.member_epoch, 1);
        // a confirms: it moves to epoch 2, and b then gets the released three.
        let kept_v: Vec<Tp> = kept.iter().copied().collect();
        let a4 = g.heartbeat(hb("a", 1, Some(&kept_v)), now, SESSION, &topics);
        assert_eq!(a4.member_epoch, 2);
        let b3 = g.heartbeat(hb("b", 2, Some(&[])), now, SESSION, &topics);
        let got = b3.assignment.unwrap();
        assert_eq!(got.len(), 3);
        assert!(got.is_disjoint(&kept));
        assert_eq!(g.state_name(), "Stable");
    }

    #[test]
    fn fencing_unknown_members_leaving_and_session_expiry() {
        let now = Instant::now();
        let topics = t6();
        let mut g = ConsumerGroup::new("g".into(), 0, 0);
        let unknown = g.heartbeat(hb("zz", 3, None), now, SESSION, &topics);
        assert_eq!(unknown.error.unwrap().0, ResponseError::UnknownMemberId);
        g.heartbeat(hb("a", 0, None), now, SESSION, &topics);
        let fenced = g.heartbeat(hb("a", 7, None), now, SESSION, &topics);
        assert_eq!(fenced.error.unwrap().0, ResponseError::FencedMemberEpoch);
        assert!(g.members.is_empty());
        // Join two, one leaves with -1: the other gets everything.
        g.heartbeat(hb("a", 0, None), now, SESSION, &topics);
        let b = g.heartbeat(hb("b", 0, None), now, SESSION, &topics);
        let left = g.heartbeat(hb("b", -1, None), now, SESSION, &topics);
        assert_eq!(left.member_epoch, -1);
        assert!(!g.members.contains_key("b"));
        let _ = b;
        let e = g.epoch;
        let a = g.heartbeat(
            hb("a", g.members["a"].epoch, Some(&[])),
            now,
            SESSION,
            &topics,
        );
        assert_eq!(a.member_epoch, e);
        assert_eq!(g.members["a"].assigned.len(), 6);
        // A session that runs out removes the member.
        let later = now + SESSION + Duration::from_secs(1);
        assert_eq!(g.expire(later), vec!["a".to_string()]);
        assert_eq!(g.state_name(), "Empty");
    }

    #[test]
    fn a_static_member_comes_back_with_its_partitions() {
        let now = Instant::now();
        let topics = t6();
        let mut g = ConsumerGroup::new("g".into(), 0, 0);
        let mut j = hb("a", 0, None);
        j.instance_id = Some("i1".into());
        let a = g.heartbeat(j.clone(), now, SESSION, &topics);
        let owned = a.assignment.unwrap();
        // Another member with the same instance while it is there is refused.
        let mut j2 = hb("a2", 0, None);
        j2.instance_id = Some("i1".into());
        let refused = g.heartbeat(j2.clone(), now, SESSION, &topics);
        assert_eq!(
            refused.error.unwrap().0,
            ResponseError::UnreleasedInstanceId
        );
        let mut away = hb("a", -2, None);
        away.instance_id = Some("i1".into());
        g.heartbeat(away, now, SESSION, &topics);
        let back = g.heartbeat(j2, now, SESSION, &topics);
        assert_eq!(back.error, None);
        assert_eq!(back.assignment.unwrap(), owned);
        assert_eq!(back.member_epoch, a.member_epoch);
    }

    #[test]
    fn unknown_assignors_are_refused_and_range_is_chosen_by_members() {
        let now = Instant::now();
        let topics = t6();
        let mut g = ConsumerGroup::new("g".into(), 0, 0);
        let mut j = hb("a", 0, None);
        j.assignor = Some("sticky".into());
        let r = g.heartbeat(j, now, SESSION, &topics);
        assert_eq!(r.error.unwrap().0, ResponseError::UnsupportedAssignor);
        let mut j = hb("a", 0, None);
        j.assignor = Some("range".into());
        g.heartbeat(j.clone(), now, SESSION, &topics);
        j.member_id = "b".into();
        g.heartbeat(j, now, SESSION, &topics);
        assert_eq!(g.assignor(), "range");
        let b: Vec<i32> = g.target["b"].iter().map(|tp| tp.1).collect();
        assert_eq!(b, vec![3, 4, 5]);
    }
}
