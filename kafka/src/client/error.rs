//! The one mapping of Kafka client errors into the plugin API's errors (which carry no
//! rdkafka types).

use ferry_core::{ChannelError, SinkError, SourceError};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// A Kafka client call that failed, with what the component was doing.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// librdkafka reported an error.
    #[error("{context}: {source}")]
    Kafka {
        /// What the component was doing, e.g. `committing the transaction`.
        context: String,
        /// librdkafka's error.
        source: KafkaError,
    },
    /// The cluster refused a request (a topic creation, say).
    #[error("{context}: {code}")]
    Refused {
        /// What was asked.
        context: String,
        /// The cluster's error code.
        code: RDKafkaErrorCode,
    },
    /// Anything else: a task that did not finish, a missing piece of client state.
    #[error("{context}: {message}")]
    Other {
        /// What the component was doing.
        context: String,
        /// What went wrong.
        message: String,
    },
}

impl ClientError {
    pub(crate) fn kafka(context: impl Into<String>, source: KafkaError) -> Self {
        Self::Kafka {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn other(context: impl Into<String>, message: impl std::fmt::Display) -> Self {
        Self::Other {
            context: context.into(),
            message: message.to_string(),
        }
    }

    /// The error of channel `channel`.
    pub(crate) fn in_channel(self, channel: &str) -> ChannelError {
        ChannelError::Storage {
            channel: channel.to_owned(),
            message: self.to_string(),
        }
    }
}

impl ClientError {
    /// Whether the cluster refused a record itself, so that sending it again cannot succeed:
    /// a record larger than the topic or the producer accepts (`MessageSizeTooLarge`, Kafka's
    /// `RecordTooLargeException`) or one the broker finds invalid (`InvalidRecord`). Everything
    /// else (connections, timeouts, leadership changes, a full queue) may pass later.
    pub(crate) fn refuses_record(&self) -> bool {
        let code = match self {
            Self::Kafka { source, .. } => source.rdkafka_error_code(),
            Self::Refused { code, .. } => Some(*code),
            Self::Other { .. } => None,
        };
        matches!(
            code,
            Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidRecord)
        )
    }
}

impl From<ClientError> for SinkError {
    fn from(error: ClientError) -> Self {
        if error.refuses_record() {
            SinkError::permanent(error.to_string())
        } else {
            SinkError::Delivery(error.to_string())
        }
    }
}

impl From<ClientError> for SourceError {
    fn from(error: ClientError) -> Self {
        SourceError::Other(error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn produced(code: RDKafkaErrorCode) -> SinkError {
        ClientError::kafka(
            "record not acknowledged",
            KafkaError::MessageProduction(code),
        )
        .into()
    }

    #[test]
    fn a_record_too_large_or_invalid_is_permanent_and_a_lost_connection_is_not() {
        assert!(produced(RDKafkaErrorCode::MessageSizeTooLarge).is_permanent());
        assert!(produced(RDKafkaErrorCode::InvalidRecord).is_permanent());
        assert!(!produced(RDKafkaErrorCode::BrokerTransportFailure).is_permanent());
        assert!(!produced(RDKafkaErrorCode::MessageTimedOut).is_permanent());
        assert!(!produced(RDKafkaErrorCode::NotLeaderForPartition).is_permanent());
    }
}
