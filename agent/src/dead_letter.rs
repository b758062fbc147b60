//! Dead letters: events a sink's destination refused for good, moved to the sink's
//! `dead_letter` channel so that the events behind them are not held up.
//!
//! A dead-lettered event is the refused event with these headers added:
//!
//! | header | value |
//! |---|---|
//! | `ferry.dead_letter.reason` | the destination's answer, e.g. `POST http://...: 400 Bad Request: ...` |
//! | `ferry.dead_letter.sink` | the sink that could not deliver it |
//! | `ferry.dead_letter.channel` | the channel it was taken from |
//! | `ferry.dead_letter.time` | when, RFC 3339 in UTC |
//!
//! # The guarantee
//!
//! The events go from the take of the sink's channel to a put into the dead-letter channel.
//! When both channels commit in one state store (two `file` channels of one `data_dir`), the
//! take commit and the put are one SQLite transaction (a joint put, see
//! [`ferry_core::state::StateStore::begin_joint_put`]): after a crash at any instant each
//! refused event is either still in the sink's channel or in the dead-letter channel, once.
//! Otherwise the put is made first and the take committed after: a crash in between leaves the
//! event in both (it is refused and dead-lettered again), never in neither.
//!
//! The same move, the other way, is how `agent dead-letters replay` puts events back.

use std::sync::Arc;
use std::time::SystemTime;

use ferry_core::{Channel, ChannelError, Event, PutBatch, TakeTransaction};

/// Header: why the destination refused the event.
pub const REASON_HEADER: &str = "ferry.dead_letter.reason";
/// Header: the sink that refused it.
pub const SINK_HEADER: &str = "ferry.dead_letter.sink";
/// Header: the channel it was taken from.
pub const CHANNEL_HEADER: &str = "ferry.dead_letter.channel";
/// Header: when it was dead-lettered (RFC 3339, UTC).
pub const TIME_HEADER: &str = "ferry.dead_letter.time";

/// Longest reason kept in a header: answers can be long, and every dead letter carries one.
const MAX_REASON: usize = 1024;

/// `event` as a dead letter: its headers plus why, by whom, from where and when.
pub fn dead_letter(event: &Event, reason: &str, sink: &str, channel: &str) -> Event {
    let mut letter = event.clone();
    let mut reason = reason.to_owned();
    if reason.len() > MAX_REASON {
        let mut end = MAX_REASON;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
    }
    letter.headers.set(REASON_HEADER, reason);
    letter.headers.insert(SINK_HEADER.into(), sink.into());
    letter.headers.insert(CHANNEL_HEADER.into(), channel.into());
    letter.headers.set(
        TIME_HEADER,
        humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
    );
    letter
}

/// Commits `take` of channel `from` and puts `events` into channel `to`, as one transaction
/// when both commit in one state store, else the put first (see the module docs). On failure
/// the take is rolled back (its events are taken again) and nothing is in `to`, or, when
/// not joint, possibly the events already are (they are put again: at least once).
/// `who` names the mover in the joint put (the sink or the tool).
pub async fn commit_moving(
    take: Box<dyn TakeTransaction>,
    from: &dyn Channel,
    to: &Arc<dyn Channel>,
    events: Vec<Event>,
    who: &str,
) -> Result<(), ChannelError> {
    if events.is_empty() {
        return take.commit().await;
    }
    let store = match (from.joint_store(), to.joint_store()) {
        (Some(a), Some(b)) if a.path() == b.path() => Some(a),
        _ => None,
    };
    let Some(store) = store else {
        // (A plain put waits for room by itself.)
        let batch = PutBatch {
            source: who.to_owned(),
            events,
            checkpoint: None,
            ack: None,
            joint: None,
        };
        if let Err(error) = to.put(batch).await {
            take.rollback().await?;
            return Err(error);
        }
        return take.commit().await;
    };
    wait_for_room(to, events.len()).await;
    let mut parts = store.begin_joint_put(2, who, None).await;
    let (Some(take_part), Some(put_part)) = (parts.pop(), parts.pop()) else {
        take.rollback().await?;
        return Err(ChannelError::Storage {
            channel: to.name().to_owned(),
            message: "the joint put has no parts".into(),
        });
    };
    let batch = PutBatch {
        source: who.to_owned(),
        events,
        checkpoint: None,
        ack: None,
        joint: Some(put_part),
    };
    // Both halves wait for each other: the transaction runs when the second arrives.
    let (put, commit) = tokio::join!(to.put(batch), take.commit_joint(take_part));
    put.and(commit)
}

/// Waits until `channel` has room for `n` more events. A joint put holds its store's turn
/// and the taken channel's commits until its every part arrives: a put that would wait for
/// room is not begun until there is some. (Only a sink or the tool puts into a dead-letter
/// channel, so the room seen stays there.)
async fn wait_for_room(channel: &Arc<dyn Channel>, n: usize) {
    let mut warned = false;
    while channel.capacity().saturating_sub(channel.len()) < n {
        if !warned {
            tracing::warn!(
                channel = %channel.name(),
                events = n,
                "channel full: the move of refused events into it waits for room"
            );
            warned = true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
