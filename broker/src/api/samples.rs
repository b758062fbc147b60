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
                    .with_resource_type(2)
                    .with_resource_name(s())
                    .with_configuration_keys(Some(vec![s()])),
            ]),
            version,
        ),
        ApiKey::IncrementalAlterConfigs => encode(
            IncrementalAlterConfigsRequest::default().with_resources(vec![
                incremental_alter_configs_request::AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s())
                    .with_configs(vec![Default::default()]),
            ]),
            version,
        ),
        ApiKey::AlterConfigs => encode(
            AlterConfigsRequest::default().with_resources(vec![
                alter_configs_request::AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s())
                    .with_configs(vec![Default::default()]),
            ]),
            version,
        ),
        ApiKey::DescribeCluster => encode(DescribeClusterRequest::default(), version),
        ApiKey::JoinGroup => encode(
            JoinGroupRequest::default()
                .with_group_id(GroupId(s()))
                .with_session_timeout_ms(10_000)
                .with_rebalance_timeout_ms(10_000)
                .with_member_id(s())
                .with_protocol_type(s())
                .with_protocols(vec![
                    join_group_request::JoinGroupRequestProtocol::default().with_name(s()),
                ]),
            version,
        ),
        ApiKey::SyncGroup => encode(
            SyncGroupRequest::default()
                .with_group_id(GroupId(s()))
                .with_assignments(vec![Default::default()]),
            version,
        ),
        ApiKey::ConsumerGroupHeartbeat => encode(
            ConsumerGroupHeartbeatRequest::default()
                .with_group_id(GroupId(s()))
                .with_subscribed_topic_names(Some(vec![TopicName(s())]))
                .with_topic_partitions(Some(vec![
                    consumer_group_heartbeat_request::TopicPartitions::default()
                        .with_partitions(vec![0]),
                ])),
            version,
        ),
        ApiKey::ConsumerGroupDescribe => encode(
            ConsumerGroupDescribeRequest::default().with_group_ids(vec![GroupId(s())]),
            version,
        ),
        ApiKey::Heartbeat => encode(
            HeartbeatRequest::default().with_group_id(GroupId(s())),
            version,
        ),
        ApiKey::LeaveGroup => encode(
            if version >= 3 {
                LeaveGroupRequest::default().with_members(vec![Default::default()])
            } else {
                LeaveGroupRequest::default().with_member_id(s())
            },
            version,
        ),
        ApiKey::OffsetCommit => encode(
            OffsetCommitRequest::default()
                .with_group_id(GroupId(s()))
                .with_generation_id_or_member_epoch(-1)
                .with_topics(vec![
                    offset_commit_request::OffsetCommitRequestTopic::default()
                        .with_name(TopicName(s()))
                        .with_partitions(vec![
                            offset_commit_request::OffsetCommitRequestPartition::default()
                                .with_committed_offset(1)
                                .with_committed_metadata(Some(s())),
                        ]),
                ]),
            version,
        ),
        ApiKey::OffsetFetch => encode(
            if version >= 8 {
                OffsetFetchRequest::default().with_groups(vec![
                    offset_fetch_request::OffsetFetchRequestGroup::default()
                        .with_group_id(GroupId(s()))
                        .with_topics(Some(vec![
                            offset_fetch_request::OffsetFetchRequestTopics::default()
                                .with_name(TopicName(s()))
                                .with_partition_indexes(vec![0]),
                        ])),
                ])
            } else {
                OffsetFetchRequest::default()
                    .with_group_id(GroupId(s()))
                    .with_topics(Some(vec![
                        offset_fetch_request::OffsetFetchRequestTopic::default()
                            .with_name(TopicName(s()))
                            .with_partition_indexes(vec![0]),
                    ]))
            },
            version,
        ),
        ApiKey::ListGroups => encode(
            ListGroupsRequest::default()
                .with_states_filter(if version >= 4 { vec![s()] } else { vec![] })
                .with_types_filter(if version >= 5 { vec![s()] } else { vec![] }),
            version,
        ),
        ApiKey::DescribeGroups => encode(
            DescribeGroupsRequest::default().with_groups(vec![GroupId(s())]),
            version,
        ),
        ApiKey::DeleteGroups => encode(
            DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s())]),
            version,
        ),
        ApiKey::DeleteRecords => encode(
            DeleteRecordsRequest::default()
                .with_topics(vec![
                    delete_records_request::DeleteRecordsTopic::default()
                        .with_name(TopicName(s()))
                        .with_partitions(vec![
                            delete_records_request::DeleteRecordsPartition::default()
                                .with_offset(-1),
                        ]),
                ])
                .with_timeout_ms(30_000),
            version,
        ),
        ApiKey::OffsetDelete => encode(
            OffsetDeleteRequest::default()
                .with_group_id(GroupId(s()))
                .with_topics(vec![
                    offset_delete_request::OffsetDeleteRequestTopic::default()
                        .with_name(TopicName(s()))
                        .with_partitions(vec![Default::default()]),
                ]),
            version,
        ),
        ApiKey::InitProducerId => encode(
            InitProducerIdRequest::default()
                .with_transactional_id(Some(TransactionalId(s())))
                .with_transaction_timeout_ms(60_000),
            version,
        ),
        ApiKey::AddPartitionsToTxn => encode(
            if version >= 4 {
                AddPartitionsToTxnRequest::default().with_transactions(vec![
                    add_partitions_to_txn_request::AddPartitionsToTxnTransaction::default()
                        .with_transactional_id(TransactionalId(s()))
                        .with_topics(vec![txn_topic()]),
                ])
            } else {
                AddPartitionsToTxnRequest::default()
                    .with_v3_and_below_transactional_id(TransactionalId(s()))
                    .with_v3_and_below_topics(vec![txn_topic()])
            },
            version,
        ),
        ApiKey::AddOffsetsToTxn => encode(
            AddOffsetsToTxnRequest::default()
                .with_transactional_id(TransactionalId(s()))
                .with_group_id(GroupId(s())),
            version,
        ),
        ApiKey::EndTxn => encode(
            EndTxnRequest::default()
                .with_transactional_id(TransactionalId(s()))
                .with_committed(true),
            version,
        ),
        ApiKey::TxnOffsetCommit => encode(
            TxnOffsetCommitRequest::default()
                .with_transactional_id(TransactionalId(s()))
                .with_group_id(GroupId(s()))
                .with_member_id(if version >= 3 {
                    s()
                } else {
                    StrBytes::default()
                })
                .with_group_instance_id(if version >= 3 { Some(s()) } else { None })
                .with_topics(vec![
                    txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
                        .with_name(TopicName(s()))
                        .with_partitions(vec![
                            txn_offset_commit_request::TxnOffsetCommitRequestPartition::default()
                                .with_committed_offset(1)
                                .with_committed_metadata(Some(s())),
                        ]),
                ]),
            version,
        ),
        ApiKey::DescribeTransactions => encode(
            DescribeTransactionsRequest::default()
                .with_transactional_ids(vec![TransactionalId(s())]),
            version,
        ),
        ApiKey::ListTransactions => encode(
            ListTransactionsRequest::default()
                .with_state_filters(vec![s()])
                .with_producer_id_filters(vec![ProducerId(1)])
                .with_transactional_id_pattern(if version >= 2 { Some(s()) } else { None }),
            version,
        ),
        ApiKey::DescribeProducers => encode(
            DescribeProducersRequest::default().with_topics(vec![
                describe_producers_request::TopicRequest::default()
                    .with_name(TopicName(s()))
                    .with_partition_indexes(vec![0, 1]),
            ]),
            version,
        ),
        ApiKey::WriteTxnMarkers => encode(
            WriteTxnMarkersRequest::default().with_markers(vec![
                write_txn_markers_request::WritableTxnMarker::default()
                    .with_producer_id(ProducerId(1))
                    .with_topics(vec![
                        write_txn_markers_request::WritableTxnMarkerTopic::default()
                            .with_name(TopicName(s()))
                            .with_partition_indexes(vec![0]),
                    ]),
            ]),
            version,
        ),
        ApiKey::DescribeLogDirs => encode(
            DescribeLogDirsRequest::default().with_topics(Some(vec![
                describe_log_dirs_request::DescribableLogDirTopic::default()
                    .with_topic(TopicName(s()))
                    .with_partitions(vec![0]),
            ])),
            version,
        ),
        ApiKey::CreateAcls => encode(
            CreateAclsRequest::default().with_creations(vec![
                create_acls_request::AclCreation::default()
                    .with_resource_type(2)
                    .with_resource_name(s())
                    .with_resource_pattern_type(3)
                    .with_principal(StrBytes::from_static_str("User:ANONYMOUS"))
                    .with_host(StrBytes::from_static_str("*"))
                    .with_operation(2)
                    .with_permission_type(3),
            ]),
            version,
        ),
        ApiKey::DescribeAcls => encode(
            DescribeAclsRequest::default()
                .with_resource_type_filter(1)
                .with_resource_name_filter(Some(s()))
                .with_pattern_type_filter(2)
                .with_principal_filter(Some(s()))
                .with_host_filter(Some(s()))
                .with_operation(1)
                .with_permission_type(1),
            version,
        ),
        ApiKey::DeleteAcls => encode(
            DeleteAclsRequest::default().with_filters(vec![
                delete_acls_request::DeleteAclsFilter::default()
                    .with_resource_type_filter(1)
                    .with_resource_name_filter(Some(s()))
                    .with_pattern_type_filter(1)
                    .with_operation(1)
                    .with_permission_type(1),
            ]),
            version,
        ),
        ApiKey::SaslHandshake => encode(
            SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
            version,
        ),
        ApiKey::SaslAuthenticate => encode(
            SaslAuthenticateRequest::default()
                .with_auth_bytes(bytes::Bytes::from_static(b"\0a\0b")),
            version,
        ),
        ApiKey::DescribeUserScramCredentials => encode(
            DescribeUserScramCredentialsRequest::default().with_users(Some(vec![
                describe_user_scram_credentials_request::UserName::default().with_name(s()),
            ])),
            version,
        ),
        ApiKey::AlterUserScramCredentials => encode(
            AlterUserScramCredentialsRequest::default()
                .with_deletions(vec![
                    alter_user_scram_credentials_request::ScramCredentialDeletion::default()
                        .with_name(s())
                        .with_mechanism(1),
                ])
                .with_upsertions(vec![
                    alter_user_scram_credentials_request::ScramCredentialUpsertion::default()
                        .with_name(StrBytes::from_static_str("y"))
                        .with_mechanism(2)
                        .with_iterations(4096)
                        .with_salt(bytes::Bytes::from_static(b"salt"))
                        .with_salted_password(bytes::Bytes::from(vec![7u8; 64])),
                ]),
            version,
        ),
        other => panic!("no sample for {other:?}"),
    }
}

/// Topic `x`, partition 0, of AddPartitionsToTxn.
fn txn_topic() -> add_partitions_to_txn_request::AddPartitionsToTxnTopic {
    add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
        .with_name(TopicName(StrBytes::from_static_str("x")))
        .with_partitions(vec![0])
}
