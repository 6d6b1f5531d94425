//! Starts a real `soulbased` on loopback with ephemeral ports.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, missing_docs)]

pub mod k8s;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use soulbase_grpc::proto::tool_invoker_client::ToolInvokerClient;
use soulbase_grpc::proto::tool_registry_client::ToolRegistryClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

/// A config for most tests: dev headers on; `acme` may do everything; `limited`
/// may invoke but echo is limited to 1/min; `other` has no rule.
pub const DEV_CONFIG: &str = r#"
server:
  dev_insecure: true
  shutdown_grace_ms: 10000
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"], actions: [invoke, preflight, register, update, unregister, enable, disable, deprecate, reload] }
    - { effect: allow, tenant: limited, tools: ["*"] }
quota:
  limits:
    - { tenant: limited, tool: soulbase.builtin.echo, rate: 1/min }
"#;

/// `DEV_CONFIG` with `extra` (lines indented for `server:`) under `server:`.
pub fn config_with(extra: &str) -> String {
    DEV_CONFIG.replacen("server:\n", &format!("server:\n{extra}"), 1)
}

pub struct Server {
    child: Child,
    pub grpc: String,
    pub http: String,
    lines: mpsc::Receiver<String>,
    pending: Vec<String>,
    _dir: Option<tempfile::TempDir>,
    envs: Vec<(String, String)>,
    grpc_addr: String,
}

/// A loopback address with a port free right now (for a server that must come
/// back on the same address after a restart).
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", soulbase_testkit::free_port().unwrap())
}

impl Server {
    /// Starts `soulbased` with `config` as its config file; waits until ready.
    pub fn start(config: &str) -> Server {
        Self::start_in(config, |_| {})
    }

    /// Like [`start`](Self::start), after `prepare` has filled the server's working
    /// directory (e.g. a `skills/` folder).
    pub fn start_in(config: &str, prepare: impl FnOnce(&std::path::Path)) -> Server {
        Self::start_env(config, prepare, &[])
    }

    /// Like [`start_in`](Self::start_in), with extra environment variables.
    pub fn start_env(
        config: &str,
        prepare: impl FnOnce(&std::path::Path),
        envs: &[(&str, &str)],
    ) -> Server {
        let dir = tempfile::tempdir().unwrap();
        prepare(dir.path());
        std::fs::write(dir.path().join("config.yaml"), config).unwrap();
        let envs = envs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Self::spawn(dir, envs, "127.0.0.1:0".into())
    }

    /// Starts `soulbased` in `dir`, which already holds its `config.yaml` (e.g.
    /// written by `soulbase init`), with extra environment variables.
    pub fn start_prepared(dir: tempfile::TempDir, envs: &[(&str, &str)]) -> Server {
        let envs = envs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Self::spawn(dir, envs, "127.0.0.1:0".into())
    }

    /// Like [`start_env`](Self::start_env), serving gRPC on `grpc_addr`, which a
    /// [`restart`](Self::restart) keeps.
    pub fn start_at(config: &str, envs: &[(&str, &str)], grpc_addr: &str) -> Server {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.yaml"), config).unwrap();
        let envs = envs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Self::spawn(dir, envs, grpc_addr.to_owned())
    }

    /// Stops this server with SIGTERM (it must exit cleanly) and starts a new one in
    /// the same working directory: same config file, same `./data`.
    pub fn restart(mut self) -> Server {
        self.stop();
        self.start_again()
    }

    /// Stops this server with SIGTERM; it must exit cleanly.
    pub fn stop(&mut self) {
        self.sigterm();
        let (status, _) = self.wait_exit(Duration::from_secs(30));
        assert!(status.success(), "{status:?}");
    }

    /// Starts a stopped server again in the same working directory, on the same
    /// gRPC address when it was fixed ([`start_at`](Self::start_at)).
    pub fn start_again(mut self) -> Server {
        let dir = self._dir.take().unwrap();
        let envs = std::mem::take(&mut self.envs);
        let grpc_addr = std::mem::take(&mut self.grpc_addr);
        Self::spawn(dir, envs, grpc_addr)
    }

    /// Starts a stopped (or killed) server again in the same working directory with
    /// `envs` instead of the environment it had.
    pub fn start_again_env(mut self, envs: &[(&str, &str)]) -> Server {
        let dir = self._dir.take().unwrap();
        let grpc_addr = std::mem::take(&mut self.grpc_addr);
        let envs = envs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Self::spawn(dir, envs, grpc_addr)
    }

    /// Like [`start`](Self::start), with the server's open-file soft limit set to
    /// `soft` when it starts (through `prlimit`), as on a host whose default is low.
    pub fn start_with_nofile(config: &str, soft: u64) -> Server {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.yaml"), config).unwrap();
        Self::spawn_with(dir, Vec::new(), "127.0.0.1:0".into(), Some(soft))
    }

    fn spawn(dir: tempfile::TempDir, envs: Vec<(String, String)>, grpc_addr: String) -> Server {
        Self::spawn_with(dir, envs, grpc_addr, None)
    }

    fn spawn_with(
        dir: tempfile::TempDir,
        envs: Vec<(String, String)>,
        grpc_addr: String,
        nofile_soft: Option<u64>,
    ) -> Server {
        let path = dir.path().join("config.yaml");
        let bin = env!("CARGO_BIN_EXE_soulbased");
        // prlimit sets the limit, then execs the server (same pid).
        let mut cmd = match nofile_soft {
            None => Command::new(bin),
            Some(soft) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={soft}:")).arg("--").arg(bin);
                c
            }
        };
        for (k, _) in std::env::vars() {
            if k.starts_with("SOULBASE_") {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd
            .current_dir(dir.path())
            .arg("--config")
            .arg(&path)
            .args(["--grpc-addr", &grpc_addr, "--http-addr", "127.0.0.1:0"])
            .env("RUST_LOG", "error")
            .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let (mut grpc, mut http) = (None, None);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx
                .recv_timeout(left)
                .expect("soulbased did not become ready in time");
            if let Some(a) = line.strip_prefix("soulbased: grpc listening on ") {
                grpc = Some(a.to_owned());
            } else if let Some(a) = line.strip_prefix("soulbased: http listening on ") {
                http = Some(a.to_owned());
            } else if line == "soulbased: ready" {
                break;
            }
        }
        Server {
            child,
            grpc: grpc.unwrap(),
            http: http.unwrap(),
            lines: rx,
            pending: Vec::new(),
            _dir: Some(dir),
            envs,
            grpc_addr,
        }
    }

    /// The config file the server reads (rewrite it, then reload).
    pub fn config_path(&self) -> std::path::PathBuf {
        self.dir().join("config.yaml")
    }

    /// The server's working directory.
    pub fn dir(&self) -> &std::path::Path {
        self._dir.as_ref().unwrap().path()
    }

    /// Sends `signal` (e.g. `HUP`) to this server (by pid).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM to this server (by pid).
    pub fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit; returns its status and the stdout lines
    /// printed after `ready`.
    pub fn wait_exit(&mut self, timeout: Duration) -> (ExitStatus, Vec<String>) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The reader thread ends at EOF; collect what it still has.
                while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(2)) {
                    self.pending.push(l);
                }
                return (status, std::mem::take(&mut self.pending));
            }
            assert!(Instant::now() < deadline, "soulbased did not exit in time");
            if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(20)) {
                self.pending.push(l);
            }
        }
    }

    pub async fn invoker(&self) -> ToolInvokerClient<Channel> {
        ToolInvokerClient::new(self.channel().await)
    }

    pub async fn registry(&self) -> ToolRegistryClient<Channel> {
        ToolRegistryClient::new(self.channel().await)
    }

    /// A plaintext channel; connecting is lazy so a failure shows on the first call.
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.grpc))
            .unwrap()
            .connect_lazy()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A line of `/proc/<pid>/status` or `/proc/<pid>/limits` starting with `key`,
/// split into whitespace-separated words after it.
fn proc_line(pid: u32, file: &str, key: &str) -> Vec<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap();
    let line = text.lines().find(|l| l.starts_with(key)).unwrap();
    line[key.len()..]
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// The resident set size of process `pid` in KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> u64 {
    proc_line(pid, "status", "VmRSS:")[0].parse().unwrap()
}

/// The open-file limit of process `pid`: (soft, hard); `u64::MAX` for unlimited.
pub fn nofile_limit(pid: u32) -> (u64, u64) {
    let words = proc_line(pid, "limits", "Max open files");
    let parse = |w: &str| w.parse().unwrap_or(u64::MAX);
    (parse(&words[0]), parse(&words[1]))
}

/// Raises this test process's open-file soft limit to its hard limit (through
/// `prlimit`), so it can hold many connections; returns the soft limit after.
pub fn raise_own_nofile() -> u64 {
    let pid = std::process::id();
    let (soft, hard) = nofile_limit(pid);
    if soft < hard {
        let hard = if hard == u64::MAX {
            "unlimited".to_owned()
        } else {
            hard.to_string()
        };
        let status = Command::new("prlimit")
            .args([
                "--pid",
                &pid.to_string(),
                &format!("--nofile={hard}:{hard}"),
            ])
            .status()
            .unwrap();
        assert!(status.success());
    }
    nofile_limit(pid).0
}

/// The `soulbase` CLI, built beside `soulbased` by the workspace's test run.
pub fn cli_bin() -> std::path::PathBuf {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_soulbased")).with_file_name("soulbase");
    assert!(
        bin.exists(),
        "{} is missing: run the workspace's tests (cargo xtask test), which build the CLI",
        bin.display()
    );
    bin
}

/// `soulbase` in local mode in `dir` (a server's configuration and data, the
/// server stopped), acting for `acme/bob`, printing JSON.
pub fn cli(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut json = vec!["--json"];
    json.extend_from_slice(args);
    cli_text(dir, &json)
}

/// [`cli`] with text output (no `--json`).
pub fn cli_text(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(cli_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("SOULBASE_") {
            cmd.env_remove(k);
        }
    }
    cmd.current_dir(dir)
        .arg("--config")
        .arg(dir.join("config.yaml"))
        .args(["--tenant", "acme", "--actor", "bob"])
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

/// The evidence records of `call_id` as JSON lines, read from the database of the
/// server stopped in `dir`.
pub fn evidence_lines(dir: &std::path::Path, call_id: &str) -> Vec<String> {
    let out = cli(dir, &["evidence", "show", call_id, "--format", "json"]);
    assert!(
        out.status.success(),
        "evidence of {call_id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A request carrying the development identity headers.
pub fn as_dev<T>(body: T, tenant: &str, actor: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(body);
    req.metadata_mut()
        .insert("x-soulbase-tenant", tenant.parse().unwrap());
    req.metadata_mut()
        .insert("x-soulbase-actor", actor.parse().unwrap());
    req
}

/// The stable code in a status's `ErrorDetail`.
pub fn code_of(status: &tonic::Status) -> String {
    soulbase_errors::SoulError::from_status(status)
        .code()
        .as_str()
        .to_owned()
}

/// A minimal HTTP/1.1 exchange: returns (status, body).
pub async fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    try_http(addr, method, path, headers, body).await.unwrap()
}

/// [`http`] on one new connection, with a failure (refused, reset, closed
/// before a response: a killed server) as an error instead of a panic.
pub async fn try_http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(u16, String)> {
    let text = exchange(addr, method, path, headers, body).await?;
    let status: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("closed without a response"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// [`http`], answering the whole response as text: status line, headers, body.
pub async fn http_raw(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> String {
    exchange(addr, method, path, headers, body).await.unwrap()
}

async fn exchange(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream.write_all(req.as_bytes()).await?;
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// A new, empty database on the test Postgres server (`DATABASE_URL`), named
/// after `prefix`; its URL.
pub async fn fresh_database(prefix: &str) -> String {
    let server_url = soulbase_testkit::database_url();
    let name = soulbase_testkit::unique_name(prefix);
    let admin = sqlx::PgPool::connect(&server_url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    soulbase_testkit::with_database(&server_url, &name)
}

/// A round-robin TCP proxy on loopback, as a load balancer in front of
/// replicas: each new connection goes to the next backend in turn; one whose
/// backend does not answer is closed. Runs until dropped.
pub struct RoundRobin {
    pub addr: String,
    task: tokio::task::JoinHandle<()>,
}

impl RoundRobin {
    pub async fn start(backends: Vec<String>) -> RoundRobin {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let task = tokio::spawn(async move {
            let mut next = 0usize;
            while let Ok((mut client, _)) = listener.accept().await {
                let backend = backends[next % backends.len()].clone();
                next += 1;
                tokio::spawn(async move {
                    if let Ok(mut upstream) = tokio::net::TcpStream::connect(&backend).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                });
            }
        });
        RoundRobin { addr, task }
    }
}

/// A TCP proxy to `target` that a test can cut — every open connection dropped,
/// every new one closed at once — and restore: a database outage as its clients
/// see it, without stopping a shared server. Runs until dropped.
pub struct Cuttable {
    pub addr: String,
    up: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Cuttable {
    pub async fn start(target: String) -> Cuttable {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let up = std::sync::Arc::new(tokio::sync::watch::channel(true).0);
        let up_task = up.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut up = up_task.subscribe();
                if !*up.borrow() {
                    continue;
                }
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut upstream) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                        _ = up.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        Cuttable { addr, up, task }
    }

    /// `url` (`scheme://[user@]host:port/…`) with its host and port replaced by
    /// this proxy's.
    pub fn route(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").unwrap();
        let (user, hostpath) = match rest.split_once('@') {
            Some((u, h)) => (format!("{u}@"), h),
            None => (String::new(), rest),
        };
        let path = hostpath.find('/').map_or("", |i| &hostpath[i..]);
        format!("{scheme}://{user}{}{path}", self.addr)
    }

    /// The outage begins: open connections are dropped, new ones closed.
    pub fn cut(&self) {
        self.up.send_replace(false);
    }

    /// The outage ends.
    pub fn restore(&self) {
        self.up.send_replace(true);
    }
}

impl Drop for Cuttable {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Polls `/metrics` until `metric` has `value` or the deadline passes.
pub async fn wait_metric(addr: &str, metric: &str, pred: impl Fn(f64) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = self::metric(addr, metric).await;
        if v.is_some_and(&pred) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "metric {metric} never matched (last: {v:?})"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether the server closes `c` within `bound` (EOF or reset; anything it sends
/// before is read and dropped).
pub async fn closed_within(c: &mut (impl tokio::io::AsyncRead + Unpin), bound: Duration) -> bool {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(bound, async {
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// The HTTP/2 client connection preface.
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The frames of an HTTP/2 connection, written and read raw.
pub struct H2(pub tokio::net::TcpStream);

impl H2 {
    /// Connects with the client preface and an empty SETTINGS frame.
    pub async fn connect(addr: &str) -> H2 {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(H2_PREFACE).await.unwrap();
        c.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
        H2(c)
    }

    /// Sends a complete request without a body (HEADERS with END_STREAM) on
    /// stream `stream` (odd): `POST path` as gRPC.
    pub async fn grpc_request(&mut self, stream: u32, path: &str) {
        self.headers(stream, path, &[], true).await;
    }

    /// Sends a gRPC call on stream `stream` (odd): `POST path` with the metadata
    /// `extra` and one message, `message` (protobuf-encoded), ending the stream.
    pub async fn grpc_call(
        &mut self,
        stream: u32,
        path: &str,
        extra: &[(&str, &str)],
        message: &[u8],
    ) {
        self.headers(stream, path, extra, false).await;
        let mut data = vec![0];
        data.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        data.extend_from_slice(message);
        // DATA, END_STREAM.
        self.write_frame(0, 0x1, stream, &data).await;
    }

    /// A HEADERS frame for a gRPC `POST path` with `extra` (header block
    /// uncompressed: literal fields without indexing), ending the stream with
    /// `end`.
    async fn headers(&mut self, stream: u32, path: &str, extra: &[(&str, &str)], end: bool) {
        let mut block = Vec::new();
        let fixed = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ];
        for (name, value) in fixed.iter().chain(extra) {
            block.push(0);
            block.push(u8::try_from(name.len()).unwrap());
            block.extend_from_slice(name.as_bytes());
            block.push(u8::try_from(value.len()).unwrap());
            block.extend_from_slice(value.as_bytes());
        }
        // END_HEADERS, and END_STREAM with `end`.
        let flags = if end { 0x5 } else { 0x4 };
        self.write_frame(1, flags, stream, &block).await;
    }

    async fn write_frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let len = payload.len();
        let mut frame = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        frame.extend_from_slice(&stream.to_be_bytes());
        frame.extend_from_slice(payload);
        self.0.write_all(&frame).await.unwrap();
    }

    /// The next frame: (type, flags, payload); `None` at EOF.
    pub async fn frame(&mut self) -> Option<(u8, u8, Vec<u8>)> {
        self.next()
            .await
            .map(|(kind, flags, _, payload)| (kind, flags, payload))
    }

    /// Reads frames until one of type `kind` on `stream` arrives: (flags,
    /// payload); `None` at EOF.
    pub async fn until(&mut self, kind: u8, stream: u32) -> Option<(u8, Vec<u8>)> {
        loop {
            let (k, flags, id, payload) = self.next().await?;
            if k == kind && id == stream {
                return Some((flags, payload));
            }
        }
    }

    /// The next frame: (type, flags, stream, payload); `None` at EOF.
    async fn next(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
        let mut head = [0u8; 9];
        self.0.read_exact(&mut head).await.ok()?;
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        self.0.read_exact(&mut payload).await.ok()?;
        let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        Some((head[3], head[4], id, payload))
    }
}

/// The value of `metric` (no labels) on the server's `/metrics` now.
pub async fn metric(addr: &str, metric: &str) -> Option<f64> {
    let (_, text) = http(addr, "GET", "/metrics", &[], "").await;
    text.lines()
        .find(|l| l.starts_with(metric) && l[metric.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
}

/// An MCP client handler counting `notifications/tools/list_changed`.
#[derive(Clone, Default)]
pub struct ListChanged(pub std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl rmcp::ClientHandler for ListChanged {
    async fn on_tool_list_changed(
        &self,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// rmcp's streamable HTTP client transport to `http`'s `/mcp` as `tenant`
/// (dev identity headers).
pub fn mcp_transport(
    http: &str,
    tenant: &str,
) -> rmcp::transport::StreamableHttpClientTransport<reqwest::Client> {
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let mut headers = std::collections::HashMap::new();
    headers.insert(
        ::http::HeaderName::from_static("x-soulbase-tenant"),
        ::http::HeaderValue::from_str(tenant).unwrap(),
    );
    headers.insert(
        ::http::HeaderName::from_static("x-soulbase-actor"),
        ::http::HeaderValue::from_static("agent"),
    );
    let config = StreamableHttpClientTransportConfig::with_uri(format!("http://{http}/mcp"))
        .custom_headers(headers);
    rmcp::transport::StreamableHttpClientTransport::from_config(config)
}

/// The Python interpreter of the venv of standard clients and tools
/// (`SOULBASE_PYTHON_TOOLS`, which `cargo xtask test` sets after running
/// `.ci/python-tools`).
pub fn python() -> std::path::PathBuf {
    let dir = std::env::var_os("SOULBASE_PYTHON_TOOLS").expect(
        "SOULBASE_PYTHON_TOOLS is not set: run `.ci/python-tools` and set it to the \
         directory it prints, or run the suite with `cargo xtask test`",
    );
    std::path::Path::new(&dir).join("python")
}

/// Polls `cond` (async) until it holds, failing the test after 20 s with `what`:
/// for what the server does in the background (reloads, drains, watchers).
pub async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !cond().await {
        assert!(
            std::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Runs `tests/python/{script}` with `args` on the Python of [`python`] (off
/// the async runtime) and returns its output, failing the test with its stderr
/// when it fails.
pub async fn run_python(script: &str, args: &[&str]) -> std::process::Output {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(path)
            .args(args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Starts `soulbased` in a fresh directory with `config` as its config file,
/// expecting it to refuse to start (without `env_remove`d variables); its stderr.
pub fn refused_start(config: &str, env_remove: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, config).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_soulbased"));
    cmd.current_dir(dir.path())
        .arg("--config")
        .arg(&path)
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .env("RUST_LOG", "error");
    for k in env_remove {
        cmd.env_remove(k);
    }
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "soulbased started with:\n{config}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A loopback service that reports each request on `started` and answers it only
/// when the test adds a permit to the returned semaphore: (port, started,
/// permits, requests seen). A call of the [`http_skill`] tool on it stays in
/// flight until the test releases it.
pub async fn held_service() -> (
    String,
    tokio::sync::mpsc::UnboundedReceiver<()>,
    std::sync::Arc<tokio::sync::Semaphore>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let (started, started_rx) = tokio::sync::mpsc::unbounded_channel();
    let release = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (gate, counter) = (release.clone(), hits.clone());
    let app = axum::Router::new().route(
        "/execute",
        axum::routing::post(move || {
            let (started, gate, counter) = (started.clone(), gate.clone(), counter.clone());
            async move {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = started.send(());
                gate.acquire().await.unwrap().forget();
                let out = serde_json::json!({"lines": ["held and released"]});
                ([("content-type", "application/json")], out.to_string())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, started_rx, release, hits)
}

/// The `held` skill (tool `skills.held.held`): an HTTP tool calling
/// [`held_service`] on `port`.
pub fn http_skill(port: &str) -> String {
    format!(
        "name: held\ndescription: Answers when the test says so.\nprovider: http\n\
         endpoint: http://127.0.0.1:{port}/execute\ntimeout: 60\nrisk_level: read\n\
         parameters:\n  type: object\n  properties:\n    keyword: {{type: string}}\n\
         output_schema:\n  type: object\n  required: [lines]\n"
    )
}

/// The CLI against `server` as `tenant`/`actor` (development headers), JSON out.
pub fn remote_cli(
    server: &Server,
    tenant: &str,
    actor: &str,
    args: &[&str],
) -> std::process::Output {
    let url = format!("http://{}", server.grpc);
    let mut cmd = Command::new(cli_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("SOULBASE") {
            cmd.env_remove(k);
        }
    }
    cmd.args(args)
        .args([
            "--server", &url, "--tenant", tenant, "--actor", actor, "--json",
        ])
        .current_dir(server.dir())
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

/// A scripted OpenAI-compatible model upstream (no model can run here): answers
/// each chat completions request with the next scripted response (the last one
/// repeats) and keeps every request it got, with its `authorization` header.
#[derive(Clone, Default)]
pub struct ScriptedModel {
    responses: std::sync::Arc<Vec<serde_json::Value>>,
    /// The requests received, in order.
    pub seen: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
    /// Each request's `authorization` header, in the same order.
    pub auth: std::sync::Arc<std::sync::Mutex<Vec<Option<String>>>>,
}

async fn scripted_answer(
    axum::extract::State(s): axum::extract::State<ScriptedModel>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    let req: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let n = {
        let mut seen = s.seen.lock().unwrap();
        seen.push(req);
        s.auth.lock().unwrap().push(auth);
        seen.len() - 1
    };
    let reply = s.responses[n.min(s.responses.len() - 1)].to_string();
    axum::response::Response::builder()
        .header("content-type", "application/json")
        .body(axum::body::Body::from(reply))
        .unwrap()
}

/// Serves `responses` as a [`ScriptedModel`] on a loopback port: its base URL
/// (`http://ADDR/v1`, for `model.upstream.base_url`) and the script.
pub async fn scripted_model(responses: Vec<serde_json::Value>) -> (String, ScriptedModel) {
    let script = ScriptedModel {
        responses: std::sync::Arc::new(responses),
        ..ScriptedModel::default()
    };
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(scripted_answer))
        .with_state(script.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), script)
}

/// A chat completions response whose message is `message`.
pub fn model_turn(message: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-test",
           "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})
}

/// A browser's MCP `initialize` from page `origin`, as `acme`/`bob` over the
/// development headers: the status and body (the origin check answers 403).
pub async fn mcp_initialize_from(addr: &str, origin: &str) -> (u16, String) {
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    http(
        addr,
        "POST",
        "/mcp",
        &[
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("origin", origin),
            ("x-soulbase-tenant", "acme"),
            ("x-soulbase-actor", "bob"),
        ],
        init,
    )
    .await
}
