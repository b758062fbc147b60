//! KIP-848 consumer-protocol groups seen from the wire: librdkafka members with the `range`
//! server assignor, described with ConsumerGroupDescribe, listed next to a classic group.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use tokio::net::TcpStream;

use crate::common::raw::call;
use crate::common::*;

fn member(bootstrap: &str, group: &str) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("group.id", group)
        .set("group.protocol", "consumer")
        .set("group.remote.assignor", "range")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&["ranged"]).unwrap();
    consumer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_assigned_members_are_described_with_epochs_and_listed_as_consumer_groups() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = config(dir.path());
    settings.group_consumer_heartbeat_interval_ms = 300;
    let (broker, bootstrap) = start(settings).await;
    create_topic(&bootstrap, "ranged", 5, &[]).await;
    let b = bootstrap.clone();
    let (a, c) = tokio::task::spawn_blocking(move || {
        let (a, c) = (member(&b, "ranged-group"), member(&b, "ranged-group"));
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            a.poll(Duration::from_millis(100));
            c.poll(Duration::from_millis(100));
            let counts = (
                a.assignment().unwrap().count(),
                c.assignment().unwrap().count(),
            );
            if counts.0 + counts.1 == 5 && counts.0 > 0 && counts.1 > 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no assignment: {counts:?}"
            );
        }
        (a, c)
    })
    .await
    .unwrap();

    let mut stream = TcpStream::connect(&bootstrap).await.unwrap();
    let described: ConsumerGroupDescribeResponse = call(
        &mut stream,
        ApiKey::ConsumerGroupDescribe,
        1,
        &ConsumerGroupDescribeRequest::default().with_group_ids(vec![
            GroupId(StrBytes::from_static_str("ranged-group")),
            GroupId(StrBytes::from_static_str("nothing")),
        ]),
    )
    .await;
    let g = &described.groups[0];
    assert_eq!(g.error_code, 0);
    assert_eq!(g.assignor_name.as_str(), "range");
    assert_eq!(g.members.len(), 2);
    assert_eq!(g.assignment_epoch, g.group_epoch);
    // range: the member first in id order has partitions 0-2, the other 3-4.
    let mut parts: Vec<Vec<i32>> = g
        .members
        .iter()
        .map(|m| {
            assert_eq!(m.subscribed_topic_names[0].0.as_str(), "ranged");
            let t = &m.target_assignment.topic_partitions;
            assert!(t.iter().all(|t| t.topic_name.0.as_str() == "ranged"));
            let mut p: Vec<i32> = t.iter().flat_map(|t| t.partitions.clone()).collect();
            p.sort();
            p
        })
        .collect();
    parts.sort();
    assert_eq!(parts, vec![vec![0, 1, 2], vec![3, 4]]);
    assert_eq!(
        described.groups[1].error_code,
        kafka_protocol::ResponseError::GroupIdNotFound.code()
    );

    // ListGroups v5 names its group type.
    let listed: ListGroupsResponse = call(
        &mut stream,
        ApiKey::ListGroups,
        5,
        &ListGroupsRequest::default(),
    )
    .await;
    let ours = listed
        .groups
        .iter()
        .find(|g| g.group_id.0.as_str() == "ranged-group")
        .unwrap();
    assert_eq!(ours.group_type.as_str(), "consumer");
    assert_eq!(ours.protocol_type.as_str(), "consumer");

    // DescribeGroups (v5) shows it as Kafka does at that version: Dead, without members.
    let classic: DescribeGroupsResponse = call(
        &mut stream,
        ApiKey::DescribeGroups,
        5,
        &DescribeGroupsRequest::default()
            .with_groups(vec![GroupId(StrBytes::from_static_str("ranged-group"))]),
    )
    .await;
    assert_eq!(classic.groups[0].group_state.as_str(), "Dead");
    assert!(classic.groups[0].members.is_empty());

    // A classic JoinGroup to it is refused.
    let join: JoinGroupResponse = call(
        &mut stream,
        ApiKey::JoinGroup,
        5,
        &JoinGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("ranged-group")))
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(10_000)
            .with_protocol_type(StrBytes::from_static_str("consumer"))
            .with_protocols(vec![
                join_group_request::JoinGroupRequestProtocol::default()
                    .with_name(StrBytes::from_static_str("range")),
            ]),
    )
    .await;
    assert_eq!(
        join.error_code,
        kafka_protocol::ResponseError::InconsistentGroupProtocol.code()
    );

    // The broker's stats (and so /metrics and the web console) show it with its members and
    // the partitions each owns.
    let stats = broker.observer().stats();
    let group = stats
        .groups
        .iter()
        .find(|g| g.group == "ranged-group")
        .expect("the consumer group is in the stats");
    assert_eq!(
        (group.protocol_type.as_str(), group.protocol.as_str()),
        ("consumer", "range")
    );
    assert_eq!(group.members.len(), 2);
    let mut owned: Vec<i32> = group
        .members
        .iter()
        .flat_map(|m| m.assignment.iter())
        .map(|tp| {
            assert_eq!(tp.topic, "ranged");
            tp.partition
        })
        .collect();
    owned.sort();
    assert_eq!(owned, vec![0, 1, 2, 3, 4]);
    drop((a, c));
    broker.shutdown().await;
}
