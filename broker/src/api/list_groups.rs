//! ListGroups: every group, optionally filtered by state (v4+) and type (v5+; all of ours are
//! "classic").

use std::sync::Arc;

use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    ApiKey, GroupId, ListGroupsRequest, ListGroupsResponse, RequestHeader,
};
use kafka_protocol::protocol::{StrBytes, VersionRange};

use super::{Context, Handler, text};
use crate::security::{AclOperation, Resource};

pub(super) struct ListGroups;

const CLASSIC: &str = "classic";
const CONSUMER: &str = "consumer";

fn matches(filter: &[StrBytes], value: &str) -> bool {
    filter.is_empty() || filter.iter().any(|f| f.eq_ignore_ascii_case(value))
}

impl Handler for ListGroups {
    const KEY: ApiKey = ApiKey::ListGroups;
    const VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };
    const SHAPE: &'static super::shape::Shape = &super::shape::LIST_GROUPS;
    type Request = ListGroupsRequest;
    type Response = ListGroupsResponse;

    async fn handle(
        ctx: &Arc<Context>,
        header: &RequestHeader,
        request: ListGroupsRequest,
    ) -> Option<ListGroupsResponse> {
        let version = header.request_api_version;
        // Describe on the cluster lists every group; otherwise those the caller may describe.
        let everything = ctx.authorize(AclOperation::Describe, Resource::cluster());
        // Classic groups, then consumer-protocol (KIP-848) ones: (id, protocol type, state, type).
        let classic = ctx
            .groups
            .list()
            .into_iter()
            .map(|(id, protocol_type, state)| (id, protocol_type, state.name(), CLASSIC));
        let consumer = ctx.groups.list_consumer().into_iter().map(|(id, state)| {
            let protocol = crate::groups::CONSUMER_PROTOCOL.to_owned();
            (id, protocol, state, CONSUMER)
        });
        let groups = classic
            .chain(consumer)
            .filter(|(id, _, _, _)| {
                everything || ctx.authorize(AclOperation::Describe, Resource::group(id))
            })
            .filter(|(_, _, state, _)| matches(&request.states_filter, state))
            .filter(|(_, _, _, kind)| matches(&request.types_filter, kind))
            .map(|(id, protocol_type, state, kind)| {
                let mut listed = ListedGroup::default()
                    .with_group_id(GroupId(text(&id)))
                    .with_protocol_type(text(&protocol_type));
                if version >= 4 {
                    listed = listed.with_group_state(text(state));
                }
                if version >= 5 {
                    listed = listed.with_group_type(text(kind));
                }
                listed
            })
            .collect();
        Some(ListGroupsResponse::default().with_groups(groups))
    }
}
