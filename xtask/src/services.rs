//! Postgres and Redis for tests and benchmarks.
//!
//! `DATABASE_URL` / `REDIS_URL` are used when set. Otherwise throwaway servers are
//! started from the local binaries (`initdb`/`pg_ctl`, `redis-server`) in a temp dir on
//! free ports, and stopped when [`Services`] is dropped. Postgres refuses to run as
//! root, so when xtask runs as root the cluster runs as the `postgres` user via
//! `runuser`. When neither a URL nor the binaries are available, provisioning fails
//! with a message naming what to install.
//!
//! Children learn about throwaway servers through `SOULBASE_TEST_PG_CTL`,
//! `SOULBASE_TEST_PGDATA` and `SOULBASE_TEST_PG_RUNAS` so that fault-injection tests
//! (database outage) can stop and restart the very server they use.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Result;

/// The provisioned services; throwaway servers stop when this is dropped.
pub struct Services {
    database_url: String,
    redis_url: String,
    postgres: Option<ThrowawayPostgres>,
    redis: Option<ThrowawayRedis>,
}

impl Services {
    /// Uses the configured URLs or starts throwaway servers.
    pub fn provision() -> Result<Services> {
        let (database_url, postgres) = match std::env::var("DATABASE_URL") {
            Ok(url) if !url.is_empty() => {
                eprintln!("xtask: using Postgres at DATABASE_URL");
                (url, None)
            }
            _ => {
                let pg = ThrowawayPostgres::start()?;
                (pg.url(), Some(pg))
            }
        };
        let (redis_url, redis) = match std::env::var("REDIS_URL") {
            Ok(url) if !url.is_empty() => {
                eprintln!("xtask: using Redis at REDIS_URL");
                (url, None)
            }
            _ => {
                let r = ThrowawayRedis::start()?;
                (r.url(), Some(r))
            }
        };
        Ok(Services {
            database_url,
            redis_url,
            postgres,
            redis,
        })
    }

    /// Passes the services to a child command through its environment.
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("DATABASE_URL", &self.database_url);
        cmd.env("REDIS_URL", &self.redis_url);
        if let Some(pg) = &self.postgres {
            cmd.env("SOULBASE_TEST_PG_CTL", &pg.pg_ctl);
            cmd.env("SOULBASE_TEST_PGDATA", pg.data_dir());
            cmd.env("SOULBASE_TEST_PG_RUNAS", pg.run_as.as_deref().unwrap_or(""));
        }
        let _ = &self.redis;
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; good enough for a test server).
fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("finding a free port: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// Finds `name` on PATH, or in `/usr/lib/postgresql/<newest>/bin` for Postgres tools.
fn find_binary(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Some(candidate);
        }
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

/// Polls `ready` until it holds or `limit` passes (server start-up, not test timing).
fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if ready() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("{what} did not become ready within {limit:?}"))
}

struct ThrowawayPostgres {
    dir: tempfile::TempDir,
    pg_ctl: PathBuf,
    port: u16,
    run_as: Option<String>,
}

impl ThrowawayPostgres {
    fn start() -> Result<ThrowawayPostgres> {
        let missing = "DATABASE_URL is not set and no local PostgreSQL server binaries were found \
                       (initdb, pg_ctl). Install them (Debian: `apt-get install postgresql`) or set \
                       DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres";
        let initdb = find_binary("initdb").ok_or(missing)?;
        let pg_ctl = find_binary("pg_ctl").ok_or(missing)?;
        let dir = tempfile::Builder::new()
            .prefix("soulbase-pg-")
            .tempdir()
            .map_err(|e| format!("creating a temp dir: {e}"))?;
        let run_as = if is_root() {
            let ok = Command::new("id")
                .arg("postgres")
                .stdout(Stdio::null())
                .status();
            if !ok.is_ok_and(|s| s.success()) {
                return Err(
                    "xtask runs as root and Postgres refuses to; create an unprivileged \
                            `postgres` user (Debian's postgresql package does) or set DATABASE_URL"
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
        let port = free_port()?;
        let pg = ThrowawayPostgres {
            dir,
            pg_ctl,
            port,
            run_as,
        };
        eprintln!("xtask: starting a throwaway Postgres on 127.0.0.1:{port}");
        let data = pg.data_dir();
        let out = pg
            .command(&initdb)
            .arg("-D")
            .arg(&data)
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
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off -c max_connections=300",
            pg.dir.path().display()
        );
        let out = pg
            .command(&pg.pg_ctl)
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(pg.dir.path().join("postgres.log"))
            .args(["-w", "-t", "60", "-o", &opts, "start"])
            .output()
            .map_err(|e| format!("running pg_ctl: {e}"))?;
        if !out.status.success() {
            let log =
                std::fs::read_to_string(pg.dir.path().join("postgres.log")).unwrap_or_default();
            return Err(format!(
                "pg_ctl start failed: {}{log}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
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

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for ThrowawayPostgres {
    fn drop(&mut self) {
        let _ = self
            .command(&self.pg_ctl)
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

struct ThrowawayRedis {
    _dir: tempfile::TempDir,
    child: Child,
    port: u16,
}

fn redis_pong(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

impl ThrowawayRedis {
    fn start() -> Result<ThrowawayRedis> {
        let server = find_binary("redis-server").ok_or(
            "REDIS_URL is not set and `redis-server` was not found; install it \
             (Debian: `apt-get install redis-server`) or set REDIS_URL=redis://127.0.0.1:6379",
        )?;
        let dir = tempfile::Builder::new()
            .prefix("soulbase-redis-")
            .tempdir()
            .map_err(|e| format!("creating a temp dir: {e}"))?;
        let port = free_port()?;
        eprintln!("xtask: starting a throwaway Redis on 127.0.0.1:{port}");
        let child = Command::new(server)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting redis-server: {e}"))?;
        let mut redis = ThrowawayRedis {
            _dir: dir,
            child,
            port,
        };
        let child = &mut redis.child;
        wait_until("redis-server", Duration::from_secs(20), || {
            matches!(child.try_wait(), Ok(None)) && redis_pong(port)
        })?;
        Ok(redis)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for ThrowawayRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
