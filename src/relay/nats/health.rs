//! The sink's probe ([`Sink::probe`](crate::relay::Sink::probe)): whether JetStream answers
//! for the sink's stream, asked on the connection the last batch used.

use super::{NatsSink, Probe, SendError};

impl NatsSink {
    /// Asks the stream the sink publishes to for its information (the stream named with
    /// `stream`, or the one bound to `"{prefix}.>"`), or JetStream for the account's when no
    /// stream is known (a custom subject): answered within the ack timeout, JetStream serves
    /// this connection. On the connection the last batch used, if it still stands: one that
    /// stopped answering is the sink's fault, never its messages'.
    pub(super) async fn health(&mut self) -> Result<(), SendError> {
        let bound = self.ack_timeout;
        let target = self.probe.clone();
        let connection = self.connect().await?;
        let (client, jetstream) = (connection.client.clone(), connection.jetstream.clone());
        if let Some(lost) = self.lost(&client) {
            return Err(lost);
        }
        let asked = async move {
            let name = match target {
                None => {
                    return jetstream
                        .query_account()
                        .await
                        .map(drop)
                        .map_err(|error| format!("JetStream account information: {error}"));
                }
                Some(Probe::Stream(name)) => name,
                Some(Probe::Subject(subject)) => jetstream
                    .stream_by_subject(subject.as_str())
                    .await
                    .map_err(|error| format!("finding the stream bound to {subject}: {error}"))?,
            };
            jetstream
                .get_stream(name.as_str())
                .await
                .map(drop)
                .map_err(|error| format!("reading stream {}: {error}", crate::relay::quoted(&name)))
        };
        match tokio::time::timeout(bound, asked).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(SendError::transient(why)),
            Err(_) => Err(SendError::transient(format!(
                "JetStream did not answer for the stream within the ack timeout ({bound:?})"
            ))),
        }
    }
}
