//! Topics the components create for themselves (the channel's topic, the sink's progress
//! topic).

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::error::RDKafkaErrorCode;

use super::security::TokenContext;
use super::{CALL_TIMEOUT, ClientError, Connection};

/// Creates `topic` with `partitions` partitions unless it exists. A [`ClientError::Refused`]
/// means the cluster answered and refused; any other error that it could not be asked.
pub(crate) async fn create_topic(
    connection: &Connection,
    topic: &str,
    partitions: i32,
) -> Result<(), ClientError> {
    let context = || format!("creating the topic {topic}");
    let admin: AdminClient<TokenContext> = connection
        .client_config()
        .create_with_context(connection.context())
        .map_err(|e| ClientError::kafka("creating an admin client", e))?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
    let options = AdminOptions::new().request_timeout(Some(CALL_TIMEOUT));
    let results = admin.create_topics([&new], &options).await;
    // Dropping an admin client joins its polling thread, which polls in steps of 100 ms: that
    // wait is for a blocking thread, not for the caller (whose start it delayed by 100 ms) nor
    // an async worker.
    tokio::task::spawn_blocking(move || drop(admin));
    let results = results.map_err(|e| ClientError::kafka(context(), e))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => {
                return Err(ClientError::Refused {
                    context: context(),
                    code,
                });
            }
        }
    }
    Ok(())
}
