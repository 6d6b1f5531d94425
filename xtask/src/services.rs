//! Postgres and Redis for tests and benchmarks.
//!
//! `DATABASE_URL` / `REDIS_URL` are used when set. Otherwise throwaway servers are
//! started from the local binaries (`initdb`/`pg_ctl`, `redis-server`) in a temp dir on
//! free ports, and stopped when [`Services`] is dropped. Postgres refuses to run as
//! root, so when xtask runs as root the cluster runs as the `postgres` user via
//! `runuser`. When neither a URL nor the binaries are available, provisioning fails
//! with a message naming what to install. The Postgres cluster is the tests' own
//! [`PgCluster`], so there is one way to start one.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use soulbase_testkit::{PgCluster, find_binary, free_port};

use crate::Result;

/// The provisioned services; throwaway servers stop when this is dropped.
pub struct Services {
    database_url: String,
    redis_url: String,
    postgres: Option<PgCluster>,
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
                let pg = PgCluster::try_start(300).map_err(|e| {
                    format!(
                        "DATABASE_URL is not set, and a throwaway Postgres cannot be started: \
                         {e}; or set DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres"
                    )
                })?;
                eprintln!(
                    "xtask: started a throwaway Postgres on 127.0.0.1:{}",
                    pg.port()
                );
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
        // Kept for their drop (which stops them).
        let _ = (&self.postgres, &self.redis);
    }
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
