//! A throwaway PostgreSQL cluster a test owns: started from the local server
//! binaries (`initdb`, `pg_ctl`, found on `PATH` or under
//! `/usr/lib/postgresql/<version>/bin`) in a temp dir on a free port, so the test
//! can stop and restart it (database outages) without touching the shared server.
//! As root, the cluster runs as the `postgres` user via `runuser` (Postgres refuses
//! to run as root). Stopped and deleted on drop.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A private Postgres cluster.
pub struct PgCluster {
    dir: tempfile::TempDir,
    pg_ctl: PathBuf,
    port: u16,
    run_as: Option<String>,
}

fn find_binary(name: &str) -> Option<PathBuf> {
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

impl PgCluster {
    /// Initializes and starts a cluster. Panics with what to install when the
    /// binaries are missing: a test that needs it must fail loudly, never skip.
    pub fn start() -> PgCluster {
        let initdb = find_binary("initdb").unwrap_or_else(|| {
            panic!("this test needs the PostgreSQL server binaries (initdb, pg_ctl); install them (Debian: apt-get install postgresql)")
        });
        let pg_ctl = find_binary("pg_ctl").unwrap_or_else(|| panic!("pg_ctl not found"));
        let dir = tempfile::Builder::new()
            .prefix("soulbase-pgtest-")
            .tempdir()
            .unwrap_or_else(|e| panic!("creating a temp dir: {e}"));
        let run_as = if is_root() {
            let ok = Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(dir.path())
                .status()
                .is_ok_and(|s| s.success());
            assert!(
                ok,
                "running as root needs a `postgres` user to run the cluster"
            );
            Some("postgres".to_owned())
        } else {
            None
        };
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("finding a free port: {e}"));
        let pg = PgCluster {
            dir,
            pg_ctl,
            port,
            run_as,
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
            .unwrap_or_else(|e| panic!("running initdb: {e}"));
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pg.start_server();
        pg
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

    /// Starts the server (again), waiting until it accepts connections.
    pub fn start_server(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        let out = self
            .command(&self.pg_ctl)
            .arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.dir.path().join("postgres.log"))
            .args(["-w", "-t", "60", "-o", &opts, "start"])
            .output()
            .unwrap_or_else(|e| panic!("running pg_ctl: {e}"));
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
        );
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
