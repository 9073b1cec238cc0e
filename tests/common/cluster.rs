//! Private PostgreSQL clusters a test may crash, restart, replicate and fail over, made with
//! Debian's postgresql-common (`pg_createcluster`, run as root; `initdb` itself refuses root)
//! and removed when the [`Cluster`] is dropped, whether the test passed or panicked. The shared
//! test server is never touched.
//!
//! Where postgresql-common is absent, [`Cluster::create`] says why and returns `None`, and the
//! test passes without running.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use sqlx::{Connection, PgConnection};

/// A private cluster: `pg_dropcluster --stop` when dropped.
pub struct Cluster {
    version: String,
    name: String,
    port: u16,
}

impl Cluster {
    /// A new cluster `name` on `port` with trust authentication, started. `settings` are lines
    /// of `postgresql.conf` (in its `conf.d`). `None` (after saying why) where clusters cannot
    /// be made on this machine.
    pub fn create(name: &str, port: u16, settings: &[&str]) -> Option<Cluster> {
        let cluster = Cluster::made(name, port)?;
        cluster.configure(settings);
        cluster.ctl(&["start"]);
        Some(cluster)
    }

    /// A streaming standby of `primary`, named `name` (its `application_name` on the primary,
    /// for `synchronous_standby_names`), on `port`, started: a cluster whose data directory is
    /// replaced by `pg_basebackup -R` of the primary, reached at `upstream` (the primary's
    /// address, or a proxy in front of it). `synchronous_standby_names` is emptied in the copy,
    /// so that once promoted it does not wait for a standby it does not have.
    pub fn standby_of(primary: &Cluster, upstream: u16, name: &str, port: u16) -> Cluster {
        let standby = Cluster::made(name, port).expect("postgresql-common is installed");
        let data = standby.data_dir();
        // Emptied, not removed: its parent belongs to root, and pg_basebackup runs as postgres.
        for entry in std::fs::read_dir(&data).expect("the standby's data directory") {
            let path = entry.expect("an entry").path();
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.expect("empty the standby's data directory");
        }
        let conninfo =
            format!("host=127.0.0.1 port={upstream} user=postgres application_name={name}");
        let basebackup = format!("/usr/lib/postgresql/{}/bin/pg_basebackup", primary.version);
        let data_arg = data.to_string_lossy().into_owned();
        assert!(
            as_postgres(
                &basebackup,
                &[
                    "-d", &conninfo, "-D", &data_arg, "-R", "-X", "stream", "-c", "fast"
                ],
            ),
            "pg_basebackup of {} into {name} failed",
            primary.name
        );
        // Later lines of postgresql.auto.conf win over what pg_basebackup wrote.
        let auto = data.join("postgresql.auto.conf");
        let mut text = std::fs::read_to_string(&auto).unwrap_or_default();
        text.push_str(&format!(
            "\nprimary_conninfo = '{conninfo}'\nsynchronous_standby_names = ''\n"
        ));
        std::fs::write(&auto, text).expect("write the standby's postgresql.auto.conf");
        assert!(run(
            "chown",
            &["postgres:postgres", &auto.to_string_lossy()]
        ));
        standby.ctl(&["start"]);
        standby
    }

    fn made(name: &str, port: u16) -> Option<Cluster> {
        if !on_path("pg_createcluster") {
            eprintln!("skipping: pg_createcluster (postgresql-common) is not installed");
            return None;
        }
        let version = installed_version()?;
        // A cluster left behind by a run that was killed outright.
        let _ = run("pg_dropcluster", &["--stop", &version, name]);
        let port_arg = port.to_string();
        let created = run(
            "pg_createcluster",
            &[&version, name, "--port", &port_arg, "--", "--auth=trust"],
        );
        assert!(created, "pg_createcluster {version} {name} failed");
        Some(Cluster {
            version,
            name: name.to_owned(),
            port,
        })
    }

    fn configure(&self, settings: &[&str]) {
        let dir = format!("/etc/postgresql/{}/{}/conf.d", self.version, self.name);
        std::fs::create_dir_all(&dir).expect("the cluster's conf.d");
        let mut text = settings.join("\n");
        text.push('\n');
        std::fs::write(format!("{dir}/ordo-test.conf"), text).expect("write the settings");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL of database `postgres` on this cluster.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn data_dir(&self) -> PathBuf {
        PathBuf::from(format!(
            "/var/lib/postgresql/{}/{}",
            self.version, self.name
        ))
    }

    /// Stops the server the hard way: every backend dies at once, as in a crash.
    pub fn stop_immediate(&self) {
        self.ctl(&["stop", "-m", "immediate"]);
    }

    /// Starts the server and returns once it accepts connections.
    pub fn start(&self) {
        self.ctl(&["start"]);
    }

    /// A storage snapshot of the data directory, as a volume snapshot would take it: the
    /// server is stopped at once (what it had not flushed is in its WAL, as after a crash),
    /// the directory copied beside it, and the server started again.
    pub fn snapshot(&self) -> PathBuf {
        self.stop_immediate();
        let copy = PathBuf::from(format!("{}.snapshot", self.data_dir().to_string_lossy()));
        let _ = std::fs::remove_dir_all(&copy);
        assert!(
            run(
                "cp",
                &[
                    "-a",
                    &self.data_dir().to_string_lossy(),
                    &copy.to_string_lossy()
                ]
            ),
            "copy the data directory of {}",
            self.name
        );
        self.start();
        copy
    }

    /// Rolls the data directory back to `snapshot` (made by [`snapshot`](Self::snapshot)):
    /// the server stops at once, its directory is replaced by the copy, and it starts again,
    /// recovering to the moment of the snapshot on the same timeline.
    pub fn roll_back_to(&self, snapshot: &std::path::Path) {
        self.stop_immediate();
        let data = self.data_dir();
        for entry in std::fs::read_dir(&data).expect("the data directory") {
            let path = entry.expect("an entry").path();
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.expect("empty the data directory");
        }
        let from = format!("{}/.", snapshot.to_string_lossy());
        assert!(
            run("cp", &["-a", &from, &data.to_string_lossy()]),
            "copy the snapshot back into {}",
            self.name
        );
        let _ = std::fs::remove_dir_all(snapshot);
        self.start();
    }

    /// SIGKILL to the postmaster and every process it started, at once: the machine is gone.
    pub fn kill(&self) {
        let pid_file = self.data_dir().join("postmaster.pid");
        let text = std::fs::read_to_string(&pid_file).expect("the postmaster's pid file");
        let postmaster = text.lines().next().expect("a pid").trim().to_owned();
        let children = Command::new("pgrep")
            .args(["-P", &postmaster])
            .output()
            .expect("pgrep");
        let children = String::from_utf8_lossy(&children.stdout).into_owned();
        assert!(
            run("kill", &["-9", &postmaster]),
            "kill -9 the postmaster of {}",
            self.name
        );
        // A child may have exited meanwhile: each is killed on its own, and may be gone.
        for child in children.split_whitespace() {
            let _ = run("kill", &["-9", child]);
        }
    }

    /// Promotes this standby and returns once it takes writes.
    pub async fn promote(&self) {
        self.ctl(&["promote"]);
        let url = self.url();
        for _ in 0..200 {
            if let Ok(mut conn) = PgConnection::connect(&url).await {
                let recovering: Result<bool, _> = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                    .fetch_one(&mut conn)
                    .await;
                if let Ok(false) = recovering {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{} did not leave recovery after promote", self.name);
    }

    fn ctl(&self, args: &[&str]) {
        let mut all = vec![self.version.as_str(), self.name.as_str()];
        all.extend_from_slice(args);
        assert!(run("pg_ctlcluster", &all), "pg_ctlcluster {all:?} failed");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !run("pg_dropcluster", &["--stop", &self.version, &self.name]) {
            eprintln!(
                "could not drop the private cluster {}; remove it by hand",
                self.name
            );
        }
    }
}

fn on_path(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// The newest PostgreSQL major version installed for postgresql-common.
fn installed_version() -> Option<String> {
    let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort_unstable();
    match versions.last() {
        Some(version) => Some(version.to_string()),
        None => {
            eprintln!("skipping: no PostgreSQL server under /usr/lib/postgresql");
            None
        }
    }
}

fn run(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Runs `program` as the `postgres` user (the clusters' owner).
fn as_postgres(program: &str, args: &[&str]) -> bool {
    let mut all = vec!["-u", "postgres", "--", program];
    all.extend_from_slice(args);
    run("runuser", &all)
}
