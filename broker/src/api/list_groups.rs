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
        let groups = ctx
            .groups
            .list()
            .into_iter()
            .filter(|(id, _, _)| {
                everything || ctx.authorize(AclOperation::Describe, Resource::group(id))
            })
            .filter(|(_, _, state)| matches(&request.states_filter, state.name()))
            .filter(|_| matches(&request.types_filter, CLASSIC))
            .map(|(id, protocol_type, state)| {
                let mut listed = ListedGroup::default()
                    .with_group_id(GroupId(text(&id)))
                    .with_protocol_type(text(&protocol_type));
                if version >= 4 {
                    listed = listed.with_group_state(text(state.name()));
                }
                if version >= 5 {
                    listed = listed.with_group_type(text(CLASSIC));
                }
                listed
            })
            .collect();
        Some(ListGroupsResponse::default().with_groups(groups))
    }
}
