//! Rewinds: the database went back in time under an outbox (a restore, a storage snapshot, a
//! promoted standby whose commit log is behind what this process saw, commits lost with
//! `synchronous_commit = off`). Its lanes hold positions the server gives again to other
//! events, and going on with them would deliver those as if they had been delivered. The
//! lifecycle, in order:
//!
//! 1. **Found**, by the part that sees it: the insert lane's frontier (the events sequence
//!    below what it passed), or the commit lane's checks of positions its log went back below
//!    ([`went_back`]). Either reports the [`Rewind`] of the running lanes, which sits beside
//!    the first (`insert_lane::rewind`).
//! 2. **Watched**: one task per outbox ([`watcher`], supervised as `commit_lane.rewind.watcher`)
//!    waits for the report on whichever [`Generation`] runs.
//! 3. **Ended**: that generation's tasks stop, and every listener of its lanes ends with
//!    [`Error::ServerRewound`](crate::Error::ServerRewound).
//! 4. **A new server history** begins where positions were given again ([`new_history`]),
//!    before anything is appended at them.
//! 5. **Resumed** ([`resume`]): the next generation starts from what the server holds and is
//!    installed ([`Generations::install`]), the runners claiming again onto it; or, under
//!    [`OnRewind::Stop`], the outbox stops.
//!
//! The outbox ([`Hub`]) keeps its wiring: which parts a generation starts, who reads its
//! lanes, and the ordered shutdown.

mod generation;
pub(crate) mod new_history;
mod resume;
mod watcher;
pub(crate) mod went_back;

use std::future::Future;

use sqlx::PgPool;

use crate::config::OnRewind;
use crate::error::Result;
use crate::insert_lane::Rewind;
pub(crate) use generation::{Generation, Generations};
pub(crate) use watcher::spawn;

/// What the rewind lifecycle asks of the hub that starts every part (the outbox), of payload
/// type `P`.
pub(crate) trait Hub<P>: Send + Sync + 'static {
    /// Its running generation and the slot for the next.
    fn generations(&self) -> &Generations<P>;

    /// The pool its background parts run on: where the new history begins.
    fn background_pool(&self) -> &PgPool;

    /// What it does after a rewind.
    fn on_rewind(&self) -> OnRewind;

    /// Starts a generation from what the server holds now: reads the lanes' positions and
    /// spawns the tasks that run them.
    fn start(&self) -> impl Future<Output = Result<Generation<P>>> + Send;

    /// Hands the lanes of `next`, as it is installed, to whoever reads them at each claim.
    fn hand_over(&self, next: &Generation<P>);

    /// Stops the hub for good: its readers, then the running generation.
    fn stop(&self) -> impl Future<Output = ()> + Send;
}
