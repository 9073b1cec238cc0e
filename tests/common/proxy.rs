//! A TCP proxy between a pool and the PostgreSQL server that can drop a client connection at
//! its `COMMIT`: right **before** forwarding it (the server never sees it and rolls back when
//! the socket closes), or right **after** (the server commits; the client never hears).
//!
//! It listens on 127.0.0.1 only, parses the client's messages (PostgreSQL wire protocol v3:
//! untyped start-up messages, then `type, length, body`), answers `SSLRequest` itself with `N`
//! so the stream stays readable, and copies the server's messages back. sqlx sends `COMMIT` as a
//! simple-query (`Q`) message. At most [`MAX_CONNECTIONS`] relays run at once; the proxy and
//! every relay stop when the [`Proxy`] is dropped, or after five minutes in any case. A fault
//! fires only on a connection that sent [`MARKER`], never on the outbox's own background work.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// Relays running at once; further connections are closed at once.
pub const MAX_CONNECTIONS: usize = 32;
/// The proxy stops by itself after this long even if a test leaks it.
const LIFETIME: Duration = Duration::from_secs(300);
/// After a drop-after-commit, how long the relay waits for the server's answer to `COMMIT`.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);
/// No protocol message ordo's tests send is near this; a bigger length means a parsing bug.
const MAX_MESSAGE: usize = 256 * 1024 * 1024;
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

/// A fault fires only at the `COMMIT` of a connection that has sent this text since its last
/// fault (run `SELECT 'ordo_proxy_fault_here'` in the transaction to break), so that the
/// outbox's own background transactions never take it.
pub const MARKER: &str = "ordo_proxy_fault_here";

/// Where, relative to forwarding the next `COMMIT`, the client connection is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitFault {
    /// The `COMMIT` is never forwarded: the server rolls the transaction back.
    DropBefore,
    /// The `COMMIT` is forwarded, then the client is cut off; its answer is read and discarded.
    DropAfter,
}

struct Armed {
    fault: CommitFault,
    /// Also become unreachable (cut every relay, refuse new connections) as the fault fires.
    then_unreachable: bool,
}

struct State {
    target: SocketAddr,
    armed: Mutex<Option<Armed>>,
    fired: AtomicUsize,
    unreachable: watch::Sender<bool>,
    active: AtomicUsize,
}

/// A running proxy. Dropping it stops it and every relay.
pub struct Proxy {
    /// The database URL through the proxy.
    pub url: String,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy in front of the server and database of `url`.
    pub async fn start(url: &str) -> Proxy {
        let (target, proxied) = split_url(url);
        let target = tokio::net::lookup_host(target.as_str())
            .await
            .expect("resolve the server's address")
            .next()
            .expect("the server has an address");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let state = Arc::new(State {
            target,
            armed: Mutex::new(None),
            fired: AtomicUsize::new(0),
            unreachable: watch::Sender::new(false),
            active: AtomicUsize::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&state)));
        let separator = if proxied.1.is_empty() { "?" } else { "&" };
        Proxy {
            url: format!(
                "{}127.0.0.1:{port}{}{}{separator}sslmode=disable",
                proxied.0, proxied.2, proxied.1
            ),
            state,
            accept,
        }
    }

    /// The next `COMMIT` of a connection that sent [`MARKER`] drops its client at `fault`.
    pub fn arm(&self, fault: CommitFault) {
        self.arm_with(fault, false);
    }

    /// As [`arm`](Self::arm), and at that moment the server also becomes unreachable through
    /// the proxy (every relay cut, new connections refused) until [`restore`](Self::restore).
    pub fn arm_then_unreachable(&self, fault: CommitFault) {
        self.arm_with(fault, true);
    }

    fn arm_with(&self, fault: CommitFault, then_unreachable: bool) {
        *self.state.armed.lock().expect("the proxy's lock") = Some(Armed {
            fault,
            then_unreachable,
        });
    }

    /// How many faults have fired.
    pub fn fired(&self) -> usize {
        self.state.fired.load(Ordering::SeqCst)
    }

    /// Makes the server unreachable now: every relay cut, new connections refused, until
    /// [`restore`](Self::restore).
    pub fn cut_off(&self) {
        self.state.unreachable.send_replace(true);
    }

    /// Makes the server reachable again.
    pub fn restore(&self) {
        self.state.unreachable.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // The accept task owns the relays' JoinSet: aborting it aborts them all.
        self.accept.abort();
    }
}

/// `postgres://user@host:port/db?query` → (`host:port`, (`postgres://user@`, `?query` or
/// empty, `/db`)).
fn split_url(url: &str) -> (String, (String, String, String)) {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let after_scheme = &base[scheme_end..];
    let (authority, path) = match after_scheme.find('/') {
        Some(slash) => (&after_scheme[..slash], &after_scheme[slash..]),
        None => (after_scheme, ""),
    };
    let (userinfo, host) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let host = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    };
    let prefix = format!("{}{userinfo}", &base[..scheme_end]);
    (host, (prefix, query, path.to_owned()))
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    let mut relays = JoinSet::new();
    let end = tokio::time::Instant::now() + LIFETIME;
    loop {
        // Leaving drops `relays`, which aborts every relay.
        let Ok(Ok((client, _))) = tokio::time::timeout_at(end, listener.accept()).await else {
            return;
        };
        while relays.try_join_next().is_some() {}
        let refused =
            *state.unreachable.borrow() || state.active.load(Ordering::SeqCst) >= MAX_CONNECTIONS;
        if refused {
            drop(client);
            continue;
        }
        state.active.fetch_add(1, Ordering::SeqCst);
        let state = Arc::clone(&state);
        relays.spawn(async move {
            relay(client, &state).await;
            state.active.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// How the client-to-server half ended.
enum UpEnd {
    Closed,
    DroppedBeforeCommit,
    DroppedAfterCommit,
}

async fn relay(client: TcpStream, state: &State) {
    let Ok(server) = TcpStream::connect(state.target).await else {
        return;
    };
    // Without it, Nagle's algorithm and delayed acks cost tens of milliseconds per round trip.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut cut = state.unreachable.subscribe();
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let client_write = Arc::new(tokio::sync::Mutex::new(Some(client_write)));
    let client_gone = Arc::new(AtomicBool::new(false));
    let down = server_to_client(
        server_read,
        Arc::clone(&client_write),
        Arc::clone(&client_gone),
    );
    tokio::pin!(down);
    let fired_here = AtomicBool::new(false);
    let up = client_to_server(
        client_read,
        server_write,
        client_write,
        client_gone,
        state,
        &fired_here,
    );
    tokio::pin!(up);
    let mut obey_cut = true;
    let end = loop {
        tokio::select! {
            end = &mut up => break end,
            _ = &mut down => return,
            _ = cut.wait_for(|cut| *cut), if obey_cut => {
                // The relay whose fault made the proxy unreachable finishes its own script.
                if fired_here.load(Ordering::SeqCst) {
                    obey_cut = false;
                    continue;
                }
                return;
            }
        }
    };
    if let UpEnd::DroppedAfterCommit = end {
        // Keep the server's socket open until it has answered the COMMIT: closing it with the
        // answer unread would reset the connection, and the outcome would depend on timing.
        let _ = tokio::time::timeout(DRAIN_LIMIT, down).await;
    }
}

async fn client_to_server(
    mut client: tokio::net::tcp::OwnedReadHalf,
    mut server: OwnedWriteHalf,
    client_write: Arc<tokio::sync::Mutex<Option<OwnedWriteHalf>>>,
    client_gone: Arc<AtomicBool>,
    state: &State,
    fired_here: &AtomicBool,
) -> UpEnd {
    // Start-up: untyped messages until the StartupMessage itself.
    loop {
        let Ok(message) = read_untyped(&mut client).await else {
            return UpEnd::Closed;
        };
        let code = u32::from_be_bytes([message[4], message[5], message[6], message[7]]);
        if code == SSL_REQUEST || code == GSSENC_REQUEST {
            // Refuse encryption ourselves, so that every later byte is readable.
            let mut guard = client_write.lock().await;
            let Some(write) = guard.as_mut() else {
                return UpEnd::Closed;
            };
            if write.write_all(b"N").await.is_err() {
                return UpEnd::Closed;
            }
            continue;
        }
        if server.write_all(&message).await.is_err() {
            return UpEnd::Closed;
        }
        break;
    }
    let mut marked = false;
    loop {
        let Ok(message) = read_typed(&mut client).await else {
            return UpEnd::Closed;
        };
        if !marked && contains(&message, MARKER.as_bytes()) {
            marked = true;
        }
        if marked && is_commit(&message) {
            // A mark lasts until the next COMMIT, fault or not.
            marked = false;
            let armed = state.armed.lock().expect("the proxy's lock").take();
            if let Some(armed) = armed {
                state.fired.fetch_add(1, Ordering::SeqCst);
                fired_here.store(true, Ordering::SeqCst);
                if armed.then_unreachable {
                    state.unreachable.send_replace(true);
                }
                match armed.fault {
                    CommitFault::DropBefore => return UpEnd::DroppedBeforeCommit,
                    CommitFault::DropAfter => {
                        // Mark the client gone before the server can answer, so that no byte
                        // of the answer reaches it.
                        client_gone.store(true, Ordering::SeqCst);
                        client_write.lock().await.take();
                        let _ = server.write_all(&message).await;
                        return UpEnd::DroppedAfterCommit;
                    }
                }
            }
        }
        if server.write_all(&message).await.is_err() {
            return UpEnd::Closed;
        }
    }
}

/// Copies the server's messages to the client; once the client is gone, reads up to the next
/// `ReadyForQuery` (the end of the answer to `COMMIT`) and stops.
async fn server_to_client(
    mut server: tokio::net::tcp::OwnedReadHalf,
    client_write: Arc<tokio::sync::Mutex<Option<OwnedWriteHalf>>>,
    client_gone: Arc<AtomicBool>,
) {
    loop {
        let Ok(message) = read_typed(&mut server).await else {
            return;
        };
        if client_gone.load(Ordering::SeqCst) {
            if message[0] == b'Z' {
                return;
            }
            continue;
        }
        let mut guard = client_write.lock().await;
        // Taken after `client_gone` was set: the next message goes to the check above.
        let Some(write) = guard.as_mut() else {
            continue;
        };
        if write.write_all(&message).await.is_err() {
            return;
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

fn is_commit(message: &[u8]) -> bool {
    if message[0] != b'Q' {
        return false;
    }
    let text = &message[5..];
    let text = text.strip_suffix(&[0]).unwrap_or(text);
    let text = String::from_utf8_lossy(text);
    let text = text.trim().trim_end_matches(';').trim();
    text.eq_ignore_ascii_case("COMMIT")
}

/// A start-up phase message: length (including itself), body.
async fn read_untyped<R: AsyncRead + Unpin>(reader: &mut R) -> std::io::Result<Vec<u8>> {
    let mut length = [0u8; 4];
    reader.read_exact(&mut length).await?;
    let total = checked_length(length)?;
    if total < 8 {
        return Err(std::io::Error::other("start-up message too short"));
    }
    let mut message = vec![0u8; total];
    message[..4].copy_from_slice(&length);
    reader.read_exact(&mut message[4..]).await?;
    Ok(message)
}

/// A regular message: type byte, length (including itself, not the type), body.
async fn read_typed<R: AsyncRead + Unpin>(reader: &mut R) -> std::io::Result<Vec<u8>> {
    let mut head = [0u8; 5];
    reader.read_exact(&mut head).await?;
    let length = checked_length([head[1], head[2], head[3], head[4]])?;
    if length < 4 {
        return Err(std::io::Error::other("message length below 4"));
    }
    let mut message = vec![0u8; 1 + length];
    message[..5].copy_from_slice(&head);
    reader.read_exact(&mut message[5..]).await?;
    Ok(message)
}

fn checked_length(bytes: [u8; 4]) -> std::io::Result<usize> {
    let length = u32::from_be_bytes(bytes) as usize;
    if length > MAX_MESSAGE {
        return Err(std::io::Error::other("message length out of range"));
    }
    Ok(length)
}
