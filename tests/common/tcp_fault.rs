//! A generic TCP proxy that injects broker faults, for the sink tests: it knows no protocol.
//!
//! Modes ([`Fault`]), switchable at any time:
//! - `Pass`: bytes flow both ways.
//! - `Cut`: every open connection is closed and new ones are closed on accept.
//! - `BlackHole`: connections stay open and the client's bytes still reach the server, but
//!   the server's bytes are swallowed (read and dropped), so confirms and acks never arrive. A
//!   connection that lived through a black hole has lost bytes for good: only a new one works.
//! - `Slow(d)`: each chunk, either way, is held for `d` before it is forwarded.
//!
//! Besides the mode, [`TcpFault::wedge`] black-holes only the connections open now, for good,
//! while new ones pass: a broker connection that stopped answering although the broker is fine,
//! which only a new connection (a sink's `reset`) gets past.
//!
//! [`TcpFault::retarget`] sends later connections to another server: an address that moves
//! to a promoted standby (a virtual IP, a re-resolved name), as in a failover.
//!
//! It listens on 127.0.0.1 only. The proxy and every relay stop when the [`TcpFault`] is
//! dropped, or after five minutes in any case.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// The proxy stops by itself after this long even if a test leaks it.
const LIFETIME: Duration = Duration::from_secs(300);

/// What the proxy does to the traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Pass,
    Cut,
    BlackHole,
    Slow(Duration),
}

/// Which way a pump copies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    ToServer,
    ToClient,
}

/// Connection numbers: the next one to be accepted, and the first one a wedge spares.
#[derive(Default)]
struct Wedge {
    next: AtomicU64,
    spared_from: AtomicU64,
}

pub struct TcpFault {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    wedge: Arc<Wedge>,
    target: Arc<Mutex<SocketAddr>>,
    acceptor: JoinHandle<()>,
}

impl TcpFault {
    /// A proxy in front of `target`, passing traffic.
    pub async fn start(target: SocketAddr) -> TcpFault {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fault proxy");
        let addr = listener.local_addr().expect("the fault proxy's address");
        let (fault, _) = watch::channel(Fault::Pass);
        let faults = fault.clone();
        let wedge = Arc::new(Wedge::default());
        let wedges = Arc::clone(&wedge);
        let target = Arc::new(Mutex::new(target));
        let targets = Arc::clone(&target);
        let acceptor = tokio::spawn(async move {
            let accepting = accept(listener, targets, faults, wedges);
            let _ = tokio::time::timeout(LIFETIME, accepting).await;
        });
        TcpFault {
            addr,
            fault,
            wedge,
            target,
            acceptor,
        }
    }

    /// Sends every connection accepted from now on to `target`; open ones keep their server.
    pub fn retarget(&self, target: SocketAddr) {
        *self.target.lock().unwrap_or_else(|e| e.into_inner()) = target;
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches every connection, open or new, to `fault`.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// Swallows the server's bytes on every connection open now, for good; later connections
    /// are not affected.
    pub fn wedge(&self) {
        let next = self.wedge.next.load(Ordering::SeqCst);
        self.wedge.spared_from.store(next, Ordering::SeqCst);
    }
}

impl Drop for TcpFault {
    fn drop(&mut self) {
        // The acceptor owns the relays' JoinSet: aborting it drops (and aborts) them all.
        self.acceptor.abort();
    }
}

async fn accept(
    listener: TcpListener,
    target: Arc<Mutex<SocketAddr>>,
    faults: watch::Sender<Fault>,
    wedge: Arc<Wedge>,
) {
    let mut relays = JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if *faults.borrow() == Fault::Cut {
            drop(client);
            continue;
        }
        let receiver = faults.subscribe();
        let number = wedge.next.fetch_add(1, Ordering::SeqCst);
        let wedged = Wedged {
            wedge: Arc::clone(&wedge),
            number,
        };
        let target = *target.lock().unwrap_or_else(|e| e.into_inner());
        relays.spawn(relay(client, target, receiver, wedged));
        // Reap finished relays so the set does not grow for ever.
        while relays.try_join_next().is_some() {}
    }
}

/// Copies both ways until either side closes or the proxy cuts.
/// Whether one connection is wedged.
struct Wedged {
    wedge: Arc<Wedge>,
    number: u64,
}

impl Wedged {
    fn now(&self) -> bool {
        self.number < self.wedge.spared_from.load(Ordering::SeqCst)
    }
}

async fn relay(
    client: TcpStream,
    target: SocketAddr,
    faults: watch::Receiver<Fault>,
    wedged: Wedged,
) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        () = pump(client_read, server_write, Way::ToServer, faults.clone(), None) => {}
        () = pump(server_read, client_write, Way::ToClient, faults, Some(&wedged)) => {}
    }
    // Returning drops all four halves: both connections close.
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    way: Way,
    mut faults: watch::Receiver<Fault>,
    wedged: Option<&Wedged>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        if *faults.borrow_and_update() == Fault::Cut {
            return;
        }
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            changed = faults.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if wedged.is_some_and(Wedged::now) {
            continue;
        }
        let fault = *faults.borrow();
        match fault {
            Fault::Cut => return,
            Fault::BlackHole if way == Way::ToClient => continue,
            Fault::Slow(delay) => tokio::time::sleep(delay).await,
            Fault::Pass | Fault::BlackHole => {}
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}
