//! Why a connection could not be made, in words an operator can act on.
//!
//! sqlx's pool retries a refused connection and a silent server alike until its acquire
//! timeout, then says only "pool timed out". So the server is reached once before the pool
//! is made ([`reach`]: refused is answered at once), and a pool that still fails is followed
//! by one direct attempt that tells the cases apart.

use std::io;
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

/// How long the direct attempt waits for the socket, then for PostgreSQL to answer.
const PROBE: Duration = Duration::from_secs(3);

/// Where `options` points: `host:port`, or the Unix socket's path. Never the password.
pub(crate) fn place(options: &PgConnectOptions) -> String {
    let database = options.get_database().unwrap_or(options.get_username());
    match socket(options) {
        Some(path) => format!("{database:?} on socket {path}"),
        None => format!(
            "{database:?} on {}:{}",
            options.get_host(),
            options.get_port()
        ),
    }
}

fn socket(options: &PgConnectOptions) -> Option<String> {
    if let Some(path) = options.get_socket() {
        return Some(path.display().to_string());
    }
    let host = options.get_host();
    host.starts_with('/')
        .then(|| format!("{host}/.s.PGSQL.{}", options.get_port()))
}

/// Whether anything listens where `options` points, within `timeout`: a refused connection or
/// a missing socket is answered at once, a host that drops the packets after `timeout`.
pub(crate) async fn reach(options: &PgConnectOptions, timeout: Duration) -> Result<(), String> {
    match socket(options) {
        Some(path) => reach_socket(&path, timeout).await,
        None => reach_tcp(options.get_host(), options.get_port(), timeout).await,
    }
}

/// The message for a pool that could not connect (`error`), after one direct attempt.
pub(crate) async fn connect_failure(options: &PgConnectOptions, error: &sqlx::Error) -> String {
    let place = place(options);
    if let Err(why) = reach(options, PROBE).await {
        return format!("cannot connect to the database {place}: {why}");
    }
    match tokio::time::timeout(PROBE, PgConnection::connect_with(options)).await {
        Err(_) => format!(
            "cannot connect to the database {place}: it accepts connections but PostgreSQL did not answer within {}s (a hung or overloaded server, or not PostgreSQL on that port)",
            PROBE.as_secs()
        ),
        Ok(Err(direct)) => format!(
            "cannot connect to the database {place}: {}",
            ordo::Error::from(direct)
        ),
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
            format!(
                "cannot connect to the database {place}: a direct connection works now, but the pool failed ({error}); try again, or raise --connect-timeout"
            )
        }
    }
}

async fn reach_tcp(host: &str, port: u16, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await {
        Err(_) => Err(format!(
            "no answer to a connection attempt within {}s (the host is down, or a firewall drops the packets)",
            timeout.as_secs_f64()
        )),
        Ok(Err(error)) => Err(io_reason(&error)),
        Ok(Ok(_)) => Ok(()),
    }
}

#[cfg(unix)]
async fn reach_socket(path: &str, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, tokio::net::UnixStream::connect(path)).await {
        Err(_) => Err(format!(
            "no answer on the socket within {}s",
            timeout.as_secs_f64()
        )),
        Ok(Err(error)) => Err(io_reason(&error)),
        Ok(Ok(_)) => Ok(()),
    }
}

#[cfg(not(unix))]
async fn reach_socket(_path: &str, _timeout: Duration) -> Result<(), String> {
    Ok(())
}

fn io_reason(error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::ConnectionRefused => {
            "connection refused: nothing listens there (is PostgreSQL running, on that host and port?)".to_owned()
        }
        io::ErrorKind::NotFound => {
            "no such socket: is PostgreSQL running, with that socket directory and port?"
                .to_owned()
        }
        io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => {
            format!("unreachable ({error}): check the host name and the network")
        }
        io::ErrorKind::TimedOut => {
            "the connection attempt timed out (the host is down, or a firewall drops the packets)"
                .to_owned()
        }
        _ => format!("{error}"),
    }
}
