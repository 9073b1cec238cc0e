//! `ordo tail`: events as JSON lines, one object per event.

use std::io::{self, Write};

use futures::StreamExt;
use ordo::{
    CommitOrderedEnvelope, CommitSequence, Envelope, EventSequence, Ordering, Outbox, OutboxConfig,
    Start,
};
use serde::Serialize;
use serde_json::value::RawValue;
use sqlx::PgPool;

use crate::output::emit;
use crate::parse::{lane_parser, parse_position};
use crate::{CliResult, interrupted};

#[derive(clap::Args)]
pub(crate) struct TailArgs {
    /// Which lane to read.
    #[arg(long, default_value = "insert", value_parser = lane_parser())]
    lane: Ordering,
    /// Start after this position (an insert sequence or a commit sequence, by lane); default
    /// the beginning.
    #[arg(long, value_parser = parse_position)]
    after: Option<u64>,
    /// Exit after this many events.
    #[arg(long)]
    limit: Option<u64>,
    /// Keep waiting for new events instead of exiting once caught up.
    #[arg(long)]
    follow: bool,
}

pub(crate) async fn run(pool: PgPool, args: TailArgs) -> CliResult {
    // A tail only reads; folding is left to the application's processes or `ordo fold`.
    let config = OutboxConfig::default().sequencer(false);
    // Payloads as stored, never parsed into a tree: PostgreSQL takes JSON nested deeper than
    // serde_json's recursion limit of 128, and a tail must print whatever a relay delivers.
    let outbox = Outbox::<Payload>::new(pool, config).await?;
    let printed = match args.lane {
        Ordering::Commit => {
            let end = outbox.commit_head().get();
            let start = args.after.map_or(Start::Beginning, |after| {
                Start::After(CommitSequence::new(after))
            });
            print_lane(outbox.listen_committed(start), end, &args).await
        }
        _ => {
            let end = outbox.insert_frontier().get();
            let start = args.after.map_or(Start::Beginning, |after| {
                Start::After(EventSequence::new(after))
            });
            print_lane(outbox.listen_inserted(start), end, &args).await
        }
    };
    outbox.shutdown().await;
    printed
}

/// Prints a lane's events as JSON lines, up to `--limit`, and without `--follow` up to `end`
/// (the lane's position when the tail started).
async fn print_lane<S, T>(mut events: S, end: u64, args: &TailArgs) -> CliResult
where
    S: futures::Stream<Item = Result<T, ordo::Error>> + Unpin,
    T: TailItem,
{
    let limit = args.limit.unwrap_or(u64::MAX);
    let mut printed = 0u64;
    let mut out = io::BufWriter::new(io::stdout().lock());
    while printed < limit {
        if !args.follow && args.after.unwrap_or(0) >= end {
            break;
        }
        let Some(item) = next_or_interrupt(&mut events).await else {
            break;
        };
        let item = item?;
        if !emit(&mut out, &item.line(), args.follow)? {
            break;
        }
        printed += 1;
        if !args.follow && item.position() >= end {
            break;
        }
    }
    let _ = out.flush();
    Ok(())
}

/// A payload as stored.
type Payload = Box<RawValue>;

/// An item of either lane, as `tail` prints it.
trait TailItem {
    /// Its position in its lane.
    fn position(&self) -> u64;
    fn line(&self) -> TailLine<'_>;
}

impl TailItem for std::sync::Arc<Envelope<Payload>> {
    fn position(&self) -> u64 {
        self.sequence.get()
    }

    fn line(&self) -> TailLine<'_> {
        TailLine::Insert(InsertLine {
            lane: Ordering::Insert.as_str(),
            sequence: self.sequence,
            id: self.id,
            commit_xid: self.commit_xid,
            recorded_at: self.recorded_at,
            event_type: self.event_type.as_deref(),
            payload: &self.payload,
        })
    }
}

impl TailItem for CommitOrderedEnvelope<Payload> {
    fn position(&self) -> u64 {
        self.commit_sequence.get()
    }

    fn line(&self) -> TailLine<'_> {
        TailLine::Commit(CommitLine {
            lane: Ordering::Commit.as_str(),
            commit_sequence: self.commit_sequence,
            sequence: self.event.sequence,
            boundary: self.boundary,
            id: self.event.id,
            commit_xid: self.event.commit_xid,
            recorded_at: self.event.recorded_at,
            event_type: self.event.event_type.as_deref(),
            payload: &self.event.payload,
        })
    }
}

/// One line of `tail`, its fields those of its lane.
#[derive(Serialize)]
#[serde(untagged)]
enum TailLine<'a> {
    Insert(InsertLine<'a>),
    Commit(CommitLine<'a>),
}

/// The next stream item, or `None` on end of stream, SIGINT or SIGTERM.
async fn next_or_interrupt<S: futures::Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    tokio::select! {
        item = stream.next() => item,
        _ = interrupted() => None,
    }
}

/// One `tail --lane insert` line; fields in this order.
#[derive(Serialize)]
struct InsertLine<'a> {
    lane: &'static str,
    sequence: EventSequence,
    id: uuid::Uuid,
    commit_xid: i64,
    recorded_at: chrono::DateTime<chrono::Utc>,
    /// `null` when untyped.
    event_type: Option<&'a str>,
    payload: &'a RawValue,
}

/// One `tail --lane commit` line; fields in this order, the insert lane's with the commit
/// lane's position and boundary.
#[derive(Serialize)]
struct CommitLine<'a> {
    lane: &'static str,
    commit_sequence: CommitSequence,
    sequence: EventSequence,
    boundary: bool,
    id: uuid::Uuid,
    commit_xid: i64,
    recorded_at: chrono::DateTime<chrono::Utc>,
    /// `null` when untyped.
    event_type: Option<&'a str>,
    payload: &'a RawValue,
}
