//! The trait a durable subscription's handler implements.

use sqlx::PgConnection;
use std::future::Future;

use super::delivery::Delivery;
use crate::consumer::{Keys, SERIAL_KEY};
use crate::envelope::Envelope;
use crate::handler_error::HandlerError;

/// A durable subscription's handler.
///
/// `tx` is the transaction that will also advance the subscription's position: write your
/// projection through it and the write and the checkpoint commit together, or not at all.
/// Do not commit or roll it back yourself (savepoints through `sqlx` are fine).
/// Do not keep `tx` idle (awaiting something other than the database) longer than the job's
/// lease: the server ends such a session (`idle_in_transaction_session_timeout`), so that a
/// stalled runner never keeps the subscription's row locked past its lease.
///
/// Each event arrives as a [`Delivery`]: the event (it dereferences to the
/// [`Envelope`](crate::Envelope); [`Delivery::event`] is the `Arc` the lanes share, to keep past
/// the call: payloads need not be `Clone`), its position on the subscription's lane (on the
/// commit lane, its [`CommitSequence`](crate::CommitSequence) and whether it ends its source
/// transaction), and the attempt number. [`Delivery::new`] builds one for a unit test.
///
/// ```
/// use ordo::{Delivery, HandlerError, Subscriber};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Deposited { account: i64, cents: i64 }
///
/// struct Balances;
///
/// impl Subscriber<Deposited> for Balances {
///     async fn handle(
///         &self,
///         tx: &mut sqlx::PgConnection,
///         event: &Delivery<Deposited>,
///     ) -> Result<(), HandlerError> {
///         if event.attempt() > 1 {
///             tracing::info!(position = event.position().get(), "trying again");
///         }
///         sqlx::query("UPDATE balances SET cents = cents + $2 WHERE account = $1")
///             .bind(event.payload.account)
///             .bind(event.payload.cents)
///             .execute(&mut *tx)
///             .await?;
///         Ok(())
///     }
/// }
/// ```
pub trait Subscriber<P>: Send + Sync + 'static
where
    P: Send + Sync + 'static,
{
    /// Handles one event inside `tx`.
    fn handle(
        &self,
        tx: &mut PgConnection,
        event: &Delivery<P>,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// Handles one whole source transaction inside `tx`; called instead of
    /// [`handle`](Self::handle) when the job uses [`Batch::Groups`](crate::Batch::Groups) on the
    /// commit lane. The default calls `handle` for each event in order.
    fn handle_group(
        &self,
        tx: &mut PgConnection,
        events: &[Delivery<P>],
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        async move {
            for event in events {
                self.handle(tx, event).await?;
            }
            Ok(())
        }
    }

    /// The keys of `event`, for a [keyed](crate::JobConfig::keyed) subscription (never called
    /// for another): events sharing a key are handled in lane order, one at a time; events with
    /// no key in common run concurrently. Called once per event as it is read, before its
    /// handler runs; it should be cheap and must not fail (an event whose payload does not
    /// decode never reaches it: it waits for every event before it and holds every one after).
    ///
    /// The default puts every event on one key ([`SERIAL_KEY`]): in order, one at a time.
    ///
    /// ```
    /// use ordo::{Delivery, Envelope, HandlerError, Keys, Subscriber};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Transfer { from: i64, to: i64, cents: i64 }
    ///
    /// struct Ledger;
    ///
    /// impl Subscriber<Transfer> for Ledger {
    ///     async fn handle(&self, tx: &mut sqlx::PgConnection, event: &Delivery<Transfer>)
    ///         -> Result<(), HandlerError> { Ok(()) }
    ///
    ///     // A transfer waits for both accounts' earlier events, and holds both.
    ///     fn keys(&self, event: &Envelope<Transfer>) -> Keys {
    ///         [event.payload.from, event.payload.to].iter().map(i64::to_string).collect()
    ///     }
    /// }
    /// ```
    fn keys(&self, event: &Envelope<P>) -> Keys {
        let _ = event;
        Keys::one(SERIAL_KEY)
    }
}
