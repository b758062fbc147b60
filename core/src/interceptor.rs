//! Interceptors: modify or drop events between a source and its channels, batch by batch.

use crate::event::Event;

/// Rewrites a batch before it is put into the channels.
///
/// ```
/// use ferry_core::{Event, Interceptor};
/// struct Upper;
/// impl Interceptor for Upper {
///     fn intercept(&self, mut events: Vec<Event>) -> Vec<Event> {
///         for e in &mut events {
///             e.body = e.body.to_ascii_uppercase().into();
///         }
///         events
///     }
/// }
/// let out = Upper.intercept(vec![Event::from_body("a")]);
/// assert_eq!(&out[0].body[..], b"A");
/// ```
pub trait Interceptor: Send + Sync + 'static {
    /// Returns the batch to put: the same events changed, fewer, or more.
    fn intercept(&self, events: Vec<Event>) -> Vec<Event>;

    /// The header in which this interceptor asks the source to write each event's position
    /// (a stable id of where it was read), or `None` (the default). Only the `position`
    /// interceptor asks; the source then finds the name in
    /// [`SourceContext::position_header`](crate::SourceContext::position_header).
    fn position_header(&self) -> Option<&str> {
        None
    }
}
