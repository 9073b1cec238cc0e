//! Route chains: each message says which position came before it on its route, so a receiver
//! tells a position the relay never sent there (another type, another route, an operator's
//! skip) from one that was sent and lost.
//!
//! A **route** is where the sink sends a message ([`Sink::router`](super::Sink::router): a
//! subject, an exchange and routing key, a URL), or the relay's one route when the sink names
//! none. The relay reads its lane in order and links each event it will send to the last one
//! read on the same route: [`Message::previous`](super::Message::previous), `0` for the first.
//! The links depend only on the lane and the routing, never on delivery order or timing, so a
//! message sent again carries the same link.
//!
//! A claim starts the chains from `ordo.relay_routes` (per route, the last position at or
//! below the stored watermark), and every move of the watermark stores the routes it passed,
//! in the same statement ([`FLUSH_ROUTES`]). An operator's reset forgets the routes above the
//! new position: the first message of such a route then says `0` (nothing is claimed about
//! what came before it), which a receiver takes without a wait.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use sqlx::PgPool;

use super::Message;
use super::sink::Router;
use crate::telemetry::HotStatement;

/// [`FLUSH_ROUTES`]: the stored status after moving the watermark from `from` to `to` with the
/// routes passed; `None` when the fence refused.
pub(crate) async fn flush(
    pool: &PgPool,
    name: &str,
    owner: uuid::Uuid,
    from: crate::position::Position,
    to: crate::position::Position,
    lease: std::time::Duration,
    (routes, positions): (Vec<String>, Vec<i64>),
) -> Result<Option<crate::consumer::RunStatus>, sqlx::Error> {
    sqlx::query_scalar(FLUSH_ROUTES)
        .bind(name)
        .bind(owner)
        .bind(to)
        .bind(from)
        .bind(lease.as_secs_f64() * 1000.0)
        .bind(routes)
        .bind(positions)
        .fetch_one(pool)
        .await
}

/// Route names longer than this, or with characters outside printable ASCII, are sent as a
/// hash: they travel in headers, and are part of a receiving inbox's key.
const MAX_ROUTE_NAME: usize = 200;

/// A relay's routes and where each stands, loaded at the claim.
pub(crate) const ROUTES: &str =
    "SELECT route, position FROM ordo.relay_routes WHERE relay = $1 AND position <= $2";

/// The watermark moved from `$4` to `$3` (as `consumer::progress::FLUSH` does, lease extended
/// by `$5` ms), with the last position of each route `$6` it passed, `$7`, stored in the same
/// statement, under the same fence.
pub(crate) const FLUSH_ROUTES: &str = r#"
WITH moved AS (
    UPDATE ordo.subscriptions
    SET position = $3,
        lease_expires_at = now() + make_interval(secs => $5::float8 / 1000),
        updated_at = now()
    WHERE name = $1 AND lease_owner = $2 AND position = $4
    RETURNING status
), pruned AS (
    DELETE FROM ordo.subscription_progress AS p
    WHERE p.subscription = $1 AND p.position <= $3 AND EXISTS (SELECT 1 FROM moved)
      AND (p.state = 'done'
           OR (p.retry_requested_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM ordo.key_backlogs AS b
                               WHERE b.subscription = $1 AND b.position = p.position)))
), routed AS (
    INSERT INTO ordo.relay_routes (relay, route, position)
    SELECT $1, r.route, r.position
    FROM unnest($6::text[], $7::bigint[]) AS r(route, position)
    WHERE EXISTS (SELECT 1 FROM moved)
    ON CONFLICT (relay, route) DO UPDATE SET position = excluded.position
)
SELECT (SELECT status FROM moved) AS status
"#;

/// Where one event stands in its route's chain.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    /// `None`: the relay's one route (the sink names none).
    pub(crate) route: Option<Arc<str>>,
    /// The position sent before it on the route (0: none).
    pub(crate) previous: u64,
}

/// The chains of one claim.
pub(crate) struct Chains {
    router: Option<Router>,
    /// Per route (`""`: the relay's one route), the last position read on it.
    last: HashMap<Arc<str>, u64>,
    /// Events read above the stored watermark, in lane order, with their routes.
    above: VecDeque<(u64, Arc<str>)>,
    /// Each such event's link, for every send of it.
    links: HashMap<u64, Link>,
    /// Routes passed by the watermark and not stored yet, with their last position.
    unsaved: HashMap<Arc<str>, u64>,
}

impl Chains {
    /// The chains from what `ordo.relay_routes` holds for `relay` at or below `watermark`.
    pub(crate) async fn load(
        pool: &PgPool,
        relay: &str,
        watermark: u64,
        router: Option<Router>,
    ) -> Result<Self, sqlx::Error> {
        let rows: Vec<(String, i64)> = sqlx::query_as(ROUTES)
            .bind(relay)
            .bind(i64::try_from(watermark).unwrap_or(i64::MAX))
            .fetch_all(pool)
            .await?;
        let last = rows
            .into_iter()
            .filter_map(|(route, position)| Some((Arc::from(route), u64::try_from(position).ok()?)))
            .collect();
        Ok(Self {
            router,
            last,
            above: VecDeque::new(),
            links: HashMap::new(),
            unsaved: HashMap::new(),
        })
    }

    /// Whether routes are computed from each message (else the relay has one route).
    pub(crate) fn routed(&self) -> bool {
        self.router.is_some()
    }

    /// Links the event at `position` (read in lane order, each once per claim), whose message
    /// is `message` (needed only when routed), into its route's chain. A routing function
    /// that panics leaves the event out of every chain: its message cannot be sent either.
    pub(crate) fn link(&mut self, position: u64, message: Option<&Message>) {
        let route: Arc<str> = match (&self.router, message) {
            (None, _) => Arc::from(""),
            (Some(router), Some(message)) => match super::guarded("route", || router(message)) {
                Ok(raw) => Arc::from(route_name(&raw)),
                Err(_) => return,
            },
            (Some(_), None) => return,
        };
        let previous = self.last.insert(Arc::clone(&route), position).unwrap_or(0);
        let link = Link {
            route: (!route.is_empty()).then(|| Arc::clone(&route)),
            previous,
        };
        self.links.insert(position, link);
        self.above.push_back((position, route));
    }

    /// The link of the event at `position`, if it has one.
    pub(crate) fn link_of(&self, position: u64) -> Option<&Link> {
        self.links.get(&position)
    }

    /// The link of an event taken back from a stuck key's backlog, as stored with its copy
    /// (the watermark passed it long ago): its sends carry the link every earlier send did.
    pub(crate) fn restore(&mut self, position: u64, link: Link) {
        self.links.insert(position, link);
    }

    /// An event taken back from a backlog was delivered: its link is not needed again.
    pub(crate) fn forget(&mut self, position: u64) {
        self.links.remove(&position);
    }

    /// The watermark is about to move to `watermark`: the routes it passes, with the last
    /// position of each, to store with it. Taken again after a flush that failed.
    pub(crate) fn passed(&mut self, watermark: u64) -> (Vec<String>, Vec<i64>) {
        while let Some((position, _)) = self.above.front()
            && *position <= watermark
        {
            if let Some((position, route)) = self.above.pop_front() {
                self.links.remove(&position);
                self.unsaved.insert(route, position);
            }
        }
        self.unsaved
            .iter()
            .map(|(route, position)| {
                (
                    route.to_string(),
                    i64::try_from(*position).unwrap_or(i64::MAX),
                )
            })
            .unzip()
    }

    /// The routes [`passed`](Self::passed) returned are stored.
    pub(crate) fn stored(&mut self) {
        self.unsaved.clear();
    }
}

/// A route as it travels (`Ordo-Route`): the sink's name for it when that is printable ASCII of
/// at most 200 bytes, else `~` and a 64-bit hash of it (the same name every time).
pub(crate) fn route_name(raw: &str) -> String {
    let plain = raw.len() <= MAX_ROUTE_NAME && raw.bytes().all(|b| b.is_ascii_graphic());
    if plain && !raw.starts_with('~') {
        return raw.to_owned();
    }
    format!("~{:016x}", fnv1a(raw.as_bytes()))
}

/// FNV-1a, 64 bits: stable across builds and platforms (the standard library's hasher is not).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// This file's statements on ordo's hot paths, with sample arguments, for `ops::plans`
/// (`tests/ops/plans.rs` fails if PostgreSQL would JIT-compile any).
pub(crate) const HOT_PATH: &[HotStatement] = &[HotStatement {
    name: "relay: watermark and route chains",
    sql: FLUSH_ROUTES,
    types: "text, uuid, bigint, bigint, float8, text[], bigint[]",
    args: "'s', '0190c9d2-0000-7000-8000-000000000001'::uuid, 10, 9, 30000, ARRAY['a'], ARRAY[10]::bigint[]",
    session: &[],
}];

#[cfg(test)]
mod tests {
    use super::*;

    fn chains(router: Option<Router>) -> Chains {
        Chains {
            router,
            last: HashMap::new(),
            above: VecDeque::new(),
            links: HashMap::new(),
            unsaved: HashMap::new(),
        }
    }

    #[test]
    fn each_route_links_to_the_last_position_read_on_it() {
        let by_type: Router = Arc::new(|message: &Message| message.type_or_untyped().to_owned());
        let mut chains = chains(Some(by_type));
        let of = |kind| Message::new(&b"{}"[..]).with_event_type(Some(kind));
        chains.link(3, Some(&of("a")));
        chains.link(5, Some(&of("b")));
        chains.link(6, Some(&of("a")));
        chains.link(9, Some(&of("a")));
        let link = |chains: &Chains, p| {
            chains
                .link_of(p)
                .map(|l| (l.route.as_deref().map(str::to_owned), l.previous))
        };
        assert_eq!(link(&chains, 3), Some((Some("a".into()), 0)));
        assert_eq!(link(&chains, 5), Some((Some("b".into()), 0)));
        assert_eq!(link(&chains, 6), Some((Some("a".into()), 3)));
        assert_eq!(link(&chains, 9), Some((Some("a".into()), 6)));
        // The watermark passes 6: route a's last stored position is 6, b's 5.
        let (routes, positions) = chains.passed(6);
        let mut stored: Vec<_> = routes.into_iter().zip(positions).collect();
        stored.sort();
        assert_eq!(stored, vec![("a".to_owned(), 6), ("b".to_owned(), 5)]);
        assert!(chains.link_of(6).is_none() && chains.link_of(9).is_some());
        // Not stored yet: offered again, with what passed since.
        let (routes, _) = chains.passed(9);
        assert_eq!(routes.len(), 2);
        chains.stored();
        assert_eq!(chains.passed(9).0.len(), 0);
    }

    #[test]
    fn without_a_router_the_relay_is_one_chain_and_a_panicking_router_links_nothing() {
        let mut one = chains(None);
        one.link(2, None);
        one.link(7, None);
        let previous = one.link_of(7).map(|l| (l.route.is_none(), l.previous));
        assert_eq!(previous, Some((true, 2)));
        let panics: Router = Arc::new(|_: &Message| panic!("no route"));
        let mut broken = chains(Some(panics));
        broken.link(1, Some(&Message::new(&b"{}"[..])));
        assert!(broken.link_of(1).is_none());
    }

    #[test]
    fn route_names_that_cannot_travel_are_hashed_the_same_way_every_time() {
        assert_eq!(route_name("orders.placed"), "orders.placed");
        let odd = route_name("orders.placed\nX-Forged: 1");
        assert!(odd.starts_with('~') && odd.len() == 17, "{odd}");
        assert_eq!(odd, route_name("orders.placed\nX-Forged: 1"));
        assert_ne!(route_name(&"a".repeat(201)), route_name(&"a".repeat(202)));
        assert!(route_name("~looks-hashed").starts_with("~") && route_name("~x").len() == 17);
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    }
}
