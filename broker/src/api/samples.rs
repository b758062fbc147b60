//! Requests of every served API, encoded by the codec, for tests.

use bytes::BytesMut;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};

fn encode<T: Encodable>(message: T, version: i16) -> Vec<u8> {
    let mut buf = BytesMut::new();
    message.encode(&mut buf, version).unwrap();
    buf.to_vec()
}

/// A request of this API with every array holding an element, encoded by the codec.
pub(crate) fn sample(key: ApiKey, version: i16) -> Vec<u8> {
    let s = || StrBytes::from_static_str("x");
    match key {
        ApiKey::Produce => encode(
            ProduceRequest::default().with_topic_data(vec![
                produce_request::TopicProduceData::default()
                    .with_name(TopicName(s()))
                    .with_partition_data(vec![
                        produce_request::PartitionProduceData::default().with_records(Some(
                            crate::log::batch::tests::make_batch(0, 2, 1).into(),
                        )),
                    ]),
            ]),
            version,
        ),
        ApiKey::Fetch => encode(
            FetchRequest::default()
                .with_topics(vec![
                    fetch_request::FetchTopic::default()
                        .with_topic(TopicName(s()))
                        .with_partitions(vec![Default::default()]),
                ])
                .with_forgotten_topics_data(if version >= 7 {
                    vec![fetch_request::ForgottenTopic::default().with_partitions(vec![1, 2])]
                } else {
                    vec![]
                }),
            version,
        ),
        ApiKey::ListOffsets => encode(
            ListOffsetsRequest::default().with_topics(vec![
                list_offsets_request::ListOffsetsTopic::default()
                    .with_name(TopicName(s()))
                    .with_partitions(vec![Default::default()]),
            ]),
            version,
        ),
        ApiKey::Metadata => encode(
            MetadataRequest::default().with_topics(Some(vec![
                metadata_request::MetadataRequestTopic::default().with_name(Some(TopicName(s()))),
            ])),
            version,
        ),
        ApiKey::FindCoordinator => encode(
            if version >= 4 {
                FindCoordinatorRequest::default().with_coordinator_keys(vec![s(), s()])
            } else {
                FindCoordinatorRequest::default().with_key(s())
            },
            version,
        ),
        ApiKey::ApiVersions => encode(
            ApiVersionsRequest::default()
                .with_client_software_name(s())
                .with_client_software_version(s()),
            version,
        ),
        ApiKey::CreateTopics => encode(
            CreateTopicsRequest::default().with_topics(vec![
                create_topics_request::CreatableTopic::default()
                    .with_assignments(vec![
                        create_topics_request::CreatableReplicaAssignment::default()
                            .with_broker_ids(vec![BrokerId(0)]),
                    ])
                    .with_configs(vec![
                        create_topics_request::CreatableTopicConfig::default()
                            .with_value(Some(s())),
                    ]),
            ]),
            version,
        ),
        ApiKey::DeleteTopics => encode(
            if version >= 6 {
                DeleteTopicsRequest::default().with_topics(vec![Default::default()])
            } else {
                DeleteTopicsRequest::default().with_topic_names(vec![TopicName(s())])
            },
            version,
        ),
        ApiKey::CreatePartitions => encode(
            CreatePartitionsRequest::default().with_topics(vec![
                create_partitions_request::CreatePartitionsTopic::default().with_assignments(Some(
                    vec![
                        create_partitions_request::CreatePartitionsAssignment::default()
                            .with_broker_ids(vec![BrokerId(0)]),
                    ],
                )),
            ]),
            version,
        ),
        ApiKey::DescribeConfigs => encode(
            DescribeConfigsRequest::default().with_resources(vec![
                describe_configs_request::DescribeConfigsResource::default()
                    .with_configuration_keys(Some(vec![s()])),
            ]),
            version,
        ),
        ApiKey::IncrementalAlterConfigs => encode(
            IncrementalAlterConfigsRequest::default().with_resources(vec![
                incremental_alter_configs_request::AlterConfigsResource::default()
                    .with_configs(vec![Default::default()]),
            ]),
            version,
        ),
        ApiKey::AlterConfigs => encode(
            AlterConfigsRequest::default().with_resources(vec![
                alter_configs_request::AlterConfigsResource::default()
                    .with_configs(vec![Default::default()]),
            ]),
            version,
        ),
        ApiKey::DescribeCluster => encode(DescribeClusterRequest::default(), version),
        other => panic!("no sample for {other:?}"),
    }
}
