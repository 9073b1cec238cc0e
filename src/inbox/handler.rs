//! The trait an inbox consumer's handler implements.

use std::future::Future;

use sqlx::PgConnection;

use super::message::InboxMessage;
use crate::handler_error::HandlerError;

/// An inbox consumer's handler.
///
/// `tx` is the transaction that also records the message as handled (its `ordo.inbox` row, or
/// its source's watermark): write your effects through it and they commit with that record,
/// or not at all. Do not commit or roll it back yourself (savepoints through `sqlx` are fine).
/// An `Err` (or a panic) rolls everything back and counts a failed attempt.
///
/// ```
/// use ordo::HandlerError;
/// use ordo::inbox::{InboxHandler, InboxMessage};
///
/// #[derive(serde::Deserialize)]
/// struct Shipped { order_id: i64 }
///
/// struct MarkShipped;
///
/// impl InboxHandler for MarkShipped {
///     async fn handle(
///         &self,
///         tx: &mut sqlx::PgConnection,
///         message: &InboxMessage,
///     ) -> Result<(), HandlerError> {
///         let shipped: Shipped = message.payload_as()?;
///         sqlx::query("UPDATE orders SET shipped = true WHERE id = $1")
///             .bind(shipped.order_id)
///             .execute(&mut *tx)
///             .await?;
///         Ok(())
///     }
/// }
/// ```
pub trait InboxHandler: Send + Sync {
    /// Handles one message inside `tx`.
    fn handle(
        &self,
        tx: &mut PgConnection,
        message: &InboxMessage,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}
