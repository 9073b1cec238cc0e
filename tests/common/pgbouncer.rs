//! A real PgBouncer in front of the test server, started by the test on a port of its own and
//! killed when it ends. Debian's `pgbouncer` package provides it (`.ci/run` installs it).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use super::{KillOnDrop, server_url};

/// Where Debian's package installs it.
const BINARY: &str = "/usr/sbin/pgbouncer";

/// PgBouncer's `pool_mode`.
#[derive(Clone, Copy, Debug)]
pub enum PoolMode {
    Session,
    Transaction,
}

/// A running PgBouncer; stopped (SIGKILL) and its folder removed on drop.
pub struct PgBouncer {
    pub port: u16,
    process: Option<KillOnDrop>,
    dir: PathBuf,
}

impl PgBouncer {
    /// Starts one in `mode` with at most `server_connections` server connections per database
    /// and user, in front of the test server, for every database on it.
    pub async fn start(mode: PoolMode, server_connections: u32) -> PgBouncer {
        assert!(
            std::path::Path::new(BINARY).exists(),
            "the pooler tests need PgBouncer at {BINARY}: apt-get install pgbouncer (.ci/run does)"
        );
        let server = PgConnectOptions::from_str(server_url()).expect("a valid DATABASE_URL");
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("ordo-pgbouncer-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("PgBouncer's folder");
        let mode = match mode {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        };
        let user = server.get_username();
        // Trust between the tests and PgBouncer; PgBouncer logs in to the server as the client's
        // user, which the users file must name.
        std::fs::write(dir.join("users.txt"), format!("\"{user}\" \"\"\n")).expect("users file");
        let ini = format!(
            "[databases]\n\
             * = host={host} port={server_port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {dir}/users.txt\n\
             pool_mode = {mode}\n\
             default_pool_size = {server_connections}\n\
             max_client_conn = 200\n\
             ignore_startup_parameters = extra_float_digits\n\
             logfile = {dir}/pgbouncer.log\n",
            host = server.get_host(),
            server_port = server.get_port(),
            dir = dir.display(),
        );
        let config = dir.join("pgbouncer.ini");
        std::fs::write(&config, ini).expect("PgBouncer's configuration");
        // PgBouncer refuses to run as root: as root, run it as `postgres`. setpriv execs it, so
        // the child is PgBouncer itself and the kill on drop reaches it.
        let as_root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| out.stdout.starts_with(b"0\n"));
        let mut command = if as_root {
            let chown = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(&dir)
                .status()
                .expect("chown PgBouncer's folder");
            assert!(chown.success(), "chown PgBouncer's folder to postgres");
            let mut command = Command::new("setpriv");
            command.args([
                "--reuid=postgres",
                "--regid=postgres",
                "--clear-groups",
                BINARY,
            ]);
            command
        } else {
            Command::new(BINARY)
        };
        let child = command
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start PgBouncer");
        let process = KillOnDrop(child);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "PgBouncer did not listen on 127.0.0.1:{port} within 10 s; its log: {}",
                std::fs::read_to_string(dir.join("pgbouncer.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        PgBouncer {
            port,
            process: Some(process),
            dir,
        }
    }

    /// `url` (a database on the test server) through this PgBouncer.
    pub fn url(&self, url: &str) -> String {
        let options = PgConnectOptions::from_str(url).expect("a valid database URL");
        let database = options.get_database().unwrap_or("postgres");
        format!(
            "postgres://{}@127.0.0.1:{}/{database}",
            options.get_username(),
            self.port
        )
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        drop(self.process.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port nothing listens on now (the OS's pick, released at once).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}
