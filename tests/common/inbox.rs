//! The inbox tests' handler: it writes one `effects` row per run in the handler's transaction
//! (so a test counts the effects that committed), counts its calls and how many run at once,
//! can hold each call a while, and can fail its first calls.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ordo::HandlerError;
use ordo::inbox::{Inbox, InboxHandler, InboxMessage, Receipt};

use super::eventually;

/// How long a test waits for the inbox to settle a message.
const PATIENCE: Duration = Duration::from_secs(30);
use sqlx::{PgConnection, PgPool};

pub async fn effects_table(pool: &PgPool) {
    sqlx::query("CREATE TABLE effects (message_id TEXT NOT NULL, payload TEXT NOT NULL)")
        .execute(pool)
        .await
        .expect("effects table");
}

/// Effects committed for `id`.
pub async fn effects(pool: &PgPool, id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM effects WHERE message_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("count effects")
}

/// Effects committed in all.
pub async fn all_effects(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(pool)
        .await
        .expect("count effects")
}

/// `ordo.inbox`'s status of `consumer`'s message `id`.
pub async fn status(pool: &PgPool, consumer: &str, id: &str) -> Option<String> {
    sqlx::query_scalar("SELECT status FROM ordo.inbox WHERE consumer = $1 AND message_id = $2")
        .bind(consumer)
        .bind(id)
        .fetch_optional(pool)
        .await
        .expect("read the inbox row")
}

#[derive(Default)]
pub struct Recording {
    /// Calls per message that fail (after writing their effect, which the rollback must undo).
    pub fail_first: u32,
    /// How long each call holds its transaction.
    pub hold: Duration,
    pub calls: AtomicU32,
    /// Per message id: calls so far, and calls running now.
    per_message: Mutex<HashMap<String, (u32, u32)>>,
    most_inside: AtomicU32,
}

impl Recording {
    /// Fails the first `fail_first` calls of each message, and holds every call `hold`.
    pub fn new(fail_first: u32, hold: Duration) -> Self {
        Self {
            fail_first,
            hold,
            ..Self::default()
        }
    }

    pub fn failing(fail_first: u32) -> Self {
        Self {
            fail_first,
            ..Self::default()
        }
    }

    pub fn holding(hold: Duration) -> Self {
        Self {
            hold,
            ..Self::default()
        }
    }

    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    /// The most calls for one message that were ever running at the same time.
    pub fn most_at_once(&self) -> u32 {
        self.most_inside.load(Ordering::SeqCst)
    }

    /// Enters a call for `id`: its number for that message, and how many run for it now.
    fn enter(&self, id: &str) -> (u32, u32) {
        let mut map = self.per_message.lock().expect("not poisoned");
        let entry = map.entry(id.to_owned()).or_default();
        entry.0 += 1;
        entry.1 += 1;
        *entry
    }
}

/// Leaves the count of running calls for a message however the call ends.
struct Inside<'a>(&'a Recording, &'a str);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        if let Ok(mut map) = self.0.per_message.lock()
            && let Some(entry) = map.get_mut(self.1)
        {
            entry.1 -= 1;
        }
    }
}

impl InboxHandler for Recording {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        message: &InboxMessage,
    ) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let (call, now) = self.enter(&message.id);
        let _inside = Inside(self, &message.id);
        self.most_inside.fetch_max(now, Ordering::SeqCst);
        sqlx::query("INSERT INTO effects (message_id, payload) VALUES ($1, $2)")
            .bind(&message.id)
            .bind(&message.payload)
            .execute(&mut *tx)
            .await?;
        if !self.hold.is_zero() {
            tokio::time::sleep(self.hold).await;
        }
        if call <= self.fail_first {
            return Err(format!("planned failure {call}").into());
        }
        Ok(())
    }
}

/// Receives `message` until the inbox settles it (a `Busy` or `Retry` is a redelivery).
pub async fn deliver_until_settled(inbox: &Inbox, message: &InboxMessage, handler: &Recording) {
    let settled = eventually(PATIENCE, || async {
        inbox
            .receive(message, handler)
            .await
            .expect("receive")
            .settled()
    })
    .await;
    assert!(settled, "message {} never settled", message.id);
}

/// Receives `message` until it is not `Busy` (a dropped receiver's connection is closing).
pub async fn receive_when_free(
    inbox: &Inbox,
    message: &InboxMessage,
    handler: &Recording,
) -> Receipt {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let receipt = inbox.receive(message, handler).await.expect("receive");
        if receipt != Receipt::Busy {
            return receipt;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} stayed busy",
            message.id
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
