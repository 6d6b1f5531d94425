//! A throwaway PostgreSQL cluster, started from the local server binaries
//! (`initdb`, `pg_ctl`, found on `PATH` or under `/usr/lib/postgresql/<version>/bin`)
//! in a temp dir on a free port. Tests own one to stop and restart it (database
//! outages) without touching the shared server; `cargo xtask test` starts one for
//! the whole suite when `DATABASE_URL` is not set. As root, the cluster runs as the
//! `postgres` user via `runuser` (Postgres refuses to run as root). Stopped and
//! deleted on drop.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A private Postgres cluster.
pub struct PgCluster {
    dir: tempfile::TempDir,
    pg_ctl: PathBuf,
    port: u16,
    run_as: Option<String>,
    max_connections: u32,
}

/// Finds `name` on `PATH`, or in `/usr/lib/postgresql/<newest>/bin` (where Debian
/// keeps the Postgres server tools).
pub fn find_binary(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(p) = std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|c| c.is_file())
    {
        return Some(p);
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    versions.sort_by_key(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0)
    });
    versions
        .into_iter()
        .rev()
        .map(|v| v.join("bin").join(name))
        .find(|c| c.is_file())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A free TCP port on 127.0.0.1 (bound and released; good enough for a test server).
///
/// The port is below the kernel's ephemeral range (`ip_local_port_range`): a port
/// the kernel handed out for `:0` is released here and bound later by a server, and
/// meanwhile any outgoing connection of the test run can take it as its source port
/// (seen as "Address already in use" when many tests start servers at once). Below
/// the range only an explicit bind takes a port, and a per-process cursor keeps
/// two callers of one test binary from being given the same one.
pub fn free_port() -> Result<u16, String> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CURSOR: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    if low > 12_000 {
        let span = (low - 10_000).min(12_000);
        let base = low - span;
        let offset = std::process::id().wrapping_mul(7_919) % span;
        for _ in 0..span.min(4_000) {
            let port = base + (offset + CURSOR.fetch_add(1, Ordering::Relaxed)) % span;
            if let Ok(port) = u16::try_from(port)
                && TcpListener::bind(("127.0.0.1", port)).is_ok()
            {
                return Ok(port);
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port: {e}"))
}

impl PgCluster {
    /// Initializes and starts a cluster for a test. Panics with what to install
    /// when the binaries are missing: a test that needs it must fail loudly, never skip.
    pub fn start() -> PgCluster {
        Self::try_start(200).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Initializes and starts a cluster accepting `max_connections`; the error says
    /// what is missing (the server binaries, or a `postgres` user to run them as root).
    pub fn try_start(max_connections: u32) -> Result<PgCluster, String> {
        let missing = "the PostgreSQL server binaries (initdb, pg_ctl) were not found; install \
                       them (Debian: `apt-get install postgresql`)";
        let initdb = find_binary("initdb").ok_or(missing)?;
        let pg_ctl = find_binary("pg_ctl").ok_or(missing)?;
        let dir = tempfile::Builder::new()
            .prefix("soulbase-pg-")
            .tempdir()
            .map_err(|e| format!("creating a temp dir: {e}"))?;
        let run_as = if is_root() {
            let user = Command::new("id")
                .arg("postgres")
                .stdout(Stdio::null())
                .status();
            if !user.is_ok_and(|s| s.success()) {
                return Err(
                    "running as root, and Postgres refuses to: create an unprivileged \
                            `postgres` user (Debian's postgresql package does)"
                        .into(),
                );
            }
            let chown = Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(dir.path())
                .status()
                .map_err(|e| format!("chown: {e}"))?;
            if !chown.success() {
                return Err("could not hand the temp dir to the postgres user".into());
            }
            Some("postgres".to_owned())
        } else {
            None
        };
        let pg = PgCluster {
            dir,
            pg_ctl,
            port: free_port()?,
            run_as,
            max_connections,
        };
        let out = pg
            .command(&initdb)
            .arg("-D")
            .arg(pg.data_dir())
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .output()
            .map_err(|e| format!("running initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        pg.try_start_server()?;
        Ok(pg)
    }

    fn command(&self, program: &Path) -> Command {
        match &self.run_as {
            Some(user) => {
                let mut cmd = Command::new("runuser");
                cmd.args(["-u", user, "--"]).arg(program);
                cmd
            }
            None => Command::new(program),
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Starts the server (again), waiting until it accepts connections. Panics
    /// with the server's log if it does not start.
    pub fn start_server(&self) {
        self.try_start_server().unwrap_or_else(|e| panic!("{e}"));
    }

    /// [`PgCluster::start_server`], returning the failure (with the server's log).
    pub fn try_start_server(&self) -> Result<(), String> {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off -c max_connections={}",
            self.port,
            self.dir.path().display(),
            self.max_connections
        );
        let log = self.dir.path().join("postgres.log");
        let out = self
            .command(&self.pg_ctl)
            .arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "60", "-o", &opts, "start"])
            .output()
            .map_err(|e| format!("running pg_ctl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "pg_ctl start failed: {}{}",
                String::from_utf8_lossy(&out.stderr),
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
        }
        Ok(())
    }

    /// Stops the server at once (`-m immediate`: like a crash or a network cut),
    /// waiting until it is down.
    pub fn stop_server(&self) {
        let _ = self
            .command(&self.pg_ctl)
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server URL (database `postgres`, user `postgres`).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.stop_server();
    }
}
