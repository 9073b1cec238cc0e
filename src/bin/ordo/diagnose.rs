//! Why a connection could not be made, in words an operator can act on.
//!
//! sqlx's pool retries a refused connection and a silent server alike until its acquire
//! timeout, then says only "pool timed out". One direct attempt tells the cases apart.

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

/// The message for a pool that could not connect (`error`), after one direct attempt.
pub(crate) async fn connect_failure(options: &PgConnectOptions, error: &sqlx::Error) -> String {
    let place = place(options);
    let reached = match socket(options) {
        Some(path) => reach_socket(&path).await,
        None => reach_tcp(options.get_host(), options.get_port()).await,
    };
    if let Err(why) = reached {
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

async fn reach_tcp(host: &str, port: u16) -> Result<(), String> {
    match tokio::time::timeout(PROBE, tokio::net::TcpStream::connect((host, port))).await {
        Err(_) => Err(format!(
            "no answer to a connection attempt within {}s (the host is down, or a firewall drops the packets)",
            PROBE.as_secs()
        )),
        Ok(Err(error)) => Err(io_reason(&error)),
        Ok(Ok(_)) => Ok(()),
    }
}

#[cfg(unix)]
async fn reach_socket(path: &str) -> Result<(), String> {
    match tokio::time::timeout(PROBE, tokio::net::UnixStream::connect(path)).await {
        Err(_) => Err(format!(
            "no answer on the socket within {}s",
            PROBE.as_secs()
        )),
        Ok(Err(error)) => Err(io_reason(&error)),
        Ok(Ok(_)) => Ok(()),
    }
}

#[cfg(not(unix))]
async fn reach_socket(_path: &str) -> Result<(), String> {
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
