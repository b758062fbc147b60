//! Channel selectors: which of a source's channels get which events (Flume's
//! `ChannelSelector`).
//!
//! - **Replicating** (the default): every event goes to every channel. Channels listed as
//!   optional get the events too, but a failed or full optional channel does not fail the put.
//! - **Multiplexing**: the value of one header picks the channels of each event: those of the
//!   `mapping` entry for the value, or the `default` ones when no entry matches; `optional`
//!   entries add channels whose failure does not fail the put.
//!
//! A channel that is required for some events of a batch and optional for others takes its
//! whole part of the batch as required: a failure there fails the put.

use std::collections::HashMap;

use crate::event::Event;

/// Where the events of one source go. Channels are indexes into the source's channel list.
#[derive(Clone, Debug)]
pub enum ChannelSelector {
    /// Every event to every channel; failures of `optional` are ignored.
    Replicating {
        /// Channels whose failure does not fail the put.
        optional: Vec<usize>,
    },
    /// The value of `header` picks each event's channels.
    Multiplexing {
        /// The header whose value routes an event.
        header: String,
        /// Channels by header value.
        mapping: HashMap<String, Route>,
        /// The channels of an event whose value has no `mapping` entry (or no header).
        default: Route,
    },
}

impl Default for ChannelSelector {
    /// Replicating, with no optional channel: every channel must take every event.
    fn default() -> Self {
        Self::Replicating {
            optional: Vec::new(),
        }
    }
}

/// The channels an event goes to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Route {
    /// Channels that must take the event for the put to succeed.
    pub required: Vec<usize>,
    /// Channels that get it if they can.
    pub optional: Vec<usize>,
}

/// One channel's share of a batch.
#[derive(Debug, Default)]
pub struct Part {
    /// The events, in batch order.
    pub events: Vec<Event>,
    /// Whether a failure to put them fails the put.
    pub required: bool,
}

impl ChannelSelector {
    /// Whether channel `index` is required for some event (so it can keep the source's
    /// checkpoint).
    pub fn can_require(&self, index: usize) -> bool {
        match self {
            Self::Replicating { optional } => !optional.contains(&index),
            Self::Multiplexing {
                mapping, default, ..
            } => {
                default.required.contains(&index)
                    || mapping.values().any(|r| r.required.contains(&index))
            }
        }
    }

    /// Splits `events` into one part per channel (`channels` of them). Also returns the number
    /// of events no channel takes (a multiplexing selector without a route for them).
    pub fn split(&self, events: Vec<Event>, channels: usize) -> (Vec<Part>, usize) {
        let mut parts: Vec<Part> = (0..channels).map(|_| Part::default()).collect();
        match self {
            Self::Replicating { optional } => {
                let last = channels.saturating_sub(1);
                let mut events = Some(events);
                for (i, part) in parts.iter_mut().enumerate() {
                    part.required = !optional.contains(&i);
                    part.events = if i == last {
                        events.take().unwrap_or_default()
                    } else {
                        events.clone().unwrap_or_default()
                    };
                }
                (parts, 0)
            }
            Self::Multiplexing {
                header,
                mapping,
                default,
            } => {
                let mut unrouted = 0;
                for event in events {
                    let route = event
                        .headers
                        .get(header.as_str())
                        .and_then(|value| mapping.get(value.as_str()))
                        .unwrap_or(default);
                    let targets: Vec<(usize, bool)> = route
                        .required
                        .iter()
                        .map(|&c| (c, true))
                        .chain(
                            route
                                .optional
                                .iter()
                                .filter(|c| !route.required.contains(c))
                                .map(|&c| (c, false)),
                        )
                        .filter(|&(c, _)| c < channels)
                        .collect();
                    let Some((&(last, last_required), rest)) = targets.split_last() else {
                        unrouted += 1;
                        continue;
                    };
                    for &(c, required) in rest {
                        parts[c].required |= required;
                        parts[c].events.push(event.clone());
                    }
                    parts[last].required |= last_required;
                    parts[last].events.push(event);
                }
                (parts, unrouted)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(state: Option<&str>, body: &str) -> Event {
        let mut e = Event::from_body(body.to_owned());
        if let Some(state) = state {
            e.headers.insert("state".into(), state.into());
        }
        e
    }

    fn bodies(part: &Part) -> Vec<&[u8]> {
        part.events.iter().map(|e| e.body.as_ref()).collect()
    }

    #[test]
    fn replicating_gives_every_channel_every_event_and_marks_optional_ones() {
        let selector = ChannelSelector::Replicating { optional: vec![1] };
        let (parts, unrouted) = selector.split(vec![event(None, "a"), event(None, "b")], 3);
        assert_eq!(unrouted, 0);
        for part in &parts {
            assert_eq!(bodies(part), [b"a", b"b"]);
        }
        let required: Vec<bool> = parts.iter().map(|p| p.required).collect();
        assert_eq!(required, [true, false, true]);
        assert!(selector.can_require(0) && !selector.can_require(1));
    }

    #[test]
    fn multiplexing_routes_by_header_falls_back_to_default_and_counts_the_unrouted() {
        let mut mapping = HashMap::new();
        mapping.insert(
            "CZ".to_owned(),
            Route {
                required: vec![0],
                optional: vec![],
            },
        );
        mapping.insert(
            "US".to_owned(),
            Route {
                required: vec![1],
                optional: vec![0, 1],
            },
        );
        let selector = ChannelSelector::Multiplexing {
            header: "state".into(),
            mapping,
            default: Route {
                required: vec![],
                optional: vec![2],
            },
        };
        let events = vec![
            event(Some("CZ"), "1"),
            event(Some("US"), "2"),
            event(None, "3"),
            event(Some("XX"), "4"),
        ];
        let (parts, unrouted) = selector.split(events, 3);
        assert_eq!(unrouted, 0);
        assert_eq!(bodies(&parts[0]), [b"1", b"2"]);
        assert_eq!(
            bodies(&parts[1]),
            [b"2"],
            "a channel both required and optional gets one copy"
        );
        assert_eq!(bodies(&parts[2]), [b"3", b"4"]);
        assert!(parts[0].required && parts[1].required && !parts[2].required);
        assert!(selector.can_require(0) && selector.can_require(1) && !selector.can_require(2));

        let bare = ChannelSelector::Multiplexing {
            header: "state".into(),
            mapping: HashMap::new(),
            default: Route::default(),
        };
        let (parts, unrouted) = bare.split(vec![event(Some("CZ"), "1")], 2);
        assert_eq!(unrouted, 1);
        assert!(parts.iter().all(|p| p.events.is_empty()));
    }
}
