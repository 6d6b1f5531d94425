//! Boot tests: the real `soulbased` started exactly as each shipped deployment
//! shape configures it, then probed and called.
//!
//! - **The image** (`deploy/Dockerfile`, runtime stage): its `ENV`, `WORKDIR`,
//!   `USER`, `COPY`s and `ENTRYPOINT` read from the Dockerfile itself, with an
//!   operator's config file mounted and named by `SOULBASE_CONFIG` (as the image
//!   expects: "everything else comes from the config file").
//! - **Every overlay** under `deploy/k8s/overlays` (rendered by `common::k8s`):
//!   one process per Deployment, each with the image's environment, then the
//!   pod's `envFrom`/`env`, its ConfigMap and Secret volumes written as the
//!   kubelet places them (`items` paths included), `emptyDir`s, the container's
//!   `args`, and the uid/gid of its `securityContext` (the image's `USER` when
//!   unset).
//!
//! How the container world is mapped onto one host, and nothing else is changed:
//! - Each pod gets its own root directory (root-owned, mode 0755, so a process
//!   running as the pod's unprivileged uid can write only to its `emptyDir`s —
//!   and to the image user's home when the root file system is not read-only);
//!   every absolute path under a mount, `WORKDIR` or `COPY` destination is
//!   prefixed with it — in environment values and in the mounted files' text.
//!   A `/tmp` mount also sets `TMPDIR` to its mapped path.
//! - Listen addresses `0.0.0.0:<containerPort>` become `127.0.0.1:<free port>`;
//!   Service names (`name`, `name.ns`, `name.ns.svc`, … with their port) become
//!   the loopback address of the one Deployment the Service selects.
//! - The Secret's placeholder backend URLs become the test's (`DATABASE_URL`, a
//!   fresh database per boot; `REDIS_URL`), and the consent key's placeholder (not
//!   hex, so refused as shipped) a key; other Secret values stay as shipped.
//! - The process that authenticates (its roles include `auth`) gets two API keys
//!   added to its `auth.api_keys` (the manifests ship none; an operator adds
//!   theirs), so a first governed call can be made under the shipped policy.
//!
//! The test runs as root in CI and then starts each process under the uid the
//! manifests name; run unprivileged, the processes run as the current (non-root)
//! user. Skills live outside the working directory in every shape: a rule
//! confining them to it makes every boot here fail.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use common::http;
use common::k8s::{self, Image};
use serde_json::{Value, json};
use soulbase_types::{ActorId, Subject, TenantId};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// The effective uid of this test process.
fn euid() -> u32 {
    soulbase_testkit::volume::euid()
}

/// A free loopback port.
fn free_port() -> u16 {
    soulbase_testkit::free_port().unwrap()
}

/// Rewrites container-world strings to this host's: longest match first.
#[derive(Clone, Default)]
struct Rewrites(Vec<(String, String)>);

impl Rewrites {
    fn add(&mut self, from: impl Into<String>, to: impl Into<String>) {
        self.0.push((from.into(), to.into()));
        self.0.sort_by_key(|(f, _)| std::cmp::Reverse(f.len()));
    }

    /// Replaces every occurrence of a `from` where one can start: a path at the
    /// text's start or after a character that cannot be part of a path, a host
    /// (`name:port`) after one that cannot be part of a host name.
    fn apply(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut i = 0;
        let bytes = text.as_bytes();
        'outer: while i < text.len() {
            // A path starts after no path character; a host after no host character.
            let prev = (i > 0).then(|| bytes[i - 1]);
            let name_char = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.');
            let path_start = prev.is_none_or(|c| !name_char(c) && c != b'/');
            let host_start = prev.is_none_or(|c| !name_char(c));
            if host_start {
                for (from, to) in &self.0 {
                    let starts = if from.starts_with('/') {
                        path_start
                    } else {
                        host_start
                    };
                    if starts && text[i..].starts_with(from.as_str()) {
                        out.push_str(to);
                        i += from.len();
                        continue 'outer;
                    }
                }
            }
            let ch = text[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
        out
    }
}

/// The backends the Secret's placeholders are replaced with, for one boot.
struct Backends {
    database: String,
    database_url: String,
    redis_url: String,
}

impl Backends {
    async fn new() -> Backends {
        let server = soulbase_testkit::database_url();
        let database = soulbase_testkit::unique_name("sbd_boot");
        let admin = sqlx::PgPool::connect(&server).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
            .execute(&admin)
            .await
            .unwrap();
        admin.close().await;
        Backends {
            database_url: soulbase_testkit::with_database(&server, &database),
            database,
            redis_url: soulbase_testkit::redis_url(),
        }
    }

    /// A Secret value as the test serves it.
    fn secret(&self, value: &str) -> String {
        if value.starts_with("postgres://") || value.starts_with("postgresql://") {
            self.database_url.clone()
        } else if value.starts_with("redis://") || value.starts_with("rediss://") {
            self.redis_url.clone()
        } else if value == "replace-with-openssl-rand-hex-32" {
            "5b".repeat(32)
        } else {
            value.to_owned()
        }
    }

    async fn drop_database(&self) {
        let admin = sqlx::PgPool::connect(&soulbase_testkit::database_url())
            .await
            .unwrap();
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.database
        )))
        .execute(&admin)
        .await;
    }
}

/// The API keys the test adds where credentials are checked.
struct Keys {
    /// Tenant `acme`: the shipped policy's example tenant.
    acme: String,
    /// Tenant `outsider`: no policy names it.
    outsider: String,
    config: Value,
}

impl Keys {
    fn new() -> Keys {
        let subject =
            |t: &str| Subject::new(TenantId::new(t).unwrap(), ActorId::new("boot").unwrap());
        let acme = soulbase_auth::generate_api_key("bootacme", &subject("acme"));
        let outsider = soulbase_auth::generate_api_key("bootout", &subject("outsider"));
        Keys {
            config: json!([
                serde_json::to_value(&acme.config).unwrap(),
                serde_json::to_value(&outsider.config).unwrap()
            ]),
            acme: acme.key,
            outsider: outsider.key,
        }
    }
}

/// One running process of a shape, and what the test knows of it.
struct Pod {
    name: String,
    child: Child,
    /// containerPort → loopback port.
    ports: BTreeMap<u64, u16>,
    container: Value,
    roles: Vec<String>,
    stderr: Arc<Mutex<Vec<String>>>,
    root: tempfile::TempDir,
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Pod {
    fn addr(&self, container_port: u64) -> String {
        let p = self.ports.get(&container_port).unwrap_or_else(|| {
            panic!(
                "{}: nothing listens for container port {container_port}",
                self.name
            )
        });
        format!("127.0.0.1:{p}")
    }

    /// A probe's port (a number or a container port's name) as a loopback address.
    fn probe_addr(&self, port: &Value) -> String {
        let n = match port {
            Value::Number(n) => n.as_u64().unwrap(),
            Value::String(name) => self.container["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == name.as_str())
                .and_then(|p| p["containerPort"].as_u64())
                .unwrap_or_else(|| panic!("{}: no container port named {name}", self.name)),
            other => panic!("{}: probe port {other}", self.name),
        };
        self.addr(n)
    }

    fn serves(&self, role: &str) -> bool {
        self.roles.is_empty() || self.roles.iter().any(|r| r == role)
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// Every probe the container declares answers as Kubernetes expects.
    async fn check_probes(&self) -> usize {
        let mut checked = 0;
        for kind in ["startupProbe", "readinessProbe", "livenessProbe"] {
            let probe = &self.container[kind];
            if probe.is_null() {
                continue;
            }
            if probe["httpGet"].is_object() {
                let addr = self.probe_addr(&probe["httpGet"]["port"]);
                let path = probe["httpGet"]["path"].as_str().unwrap_or("/");
                let (status, body) = http(&addr, "GET", path, &[], "").await;
                assert!(
                    (200..400).contains(&status),
                    "{}: {kind} GET {path} answered {status}: {body}",
                    self.name
                );
            } else if probe["grpc"].is_object() {
                let addr = self.probe_addr(&probe["grpc"]["port"]);
                let service = probe["grpc"]["service"].as_str().unwrap_or("");
                grpc_health(&addr, service, &format!("{}: {kind}", self.name)).await;
            } else if probe["tcpSocket"].is_object() {
                let addr = self.probe_addr(&probe["tcpSocket"]["port"]);
                tokio::net::TcpStream::connect(&addr).await.unwrap();
            } else {
                panic!(
                    "{}: {kind} of a kind the boot test cannot run: {probe}",
                    self.name
                );
            }
            checked += 1;
        }
        checked
    }
}

/// The gRPC health service at `addr` reports `service` SERVING.
async fn grpc_health(addr: &str, service: &str, what: &str) {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{what}: gRPC connect: {e}"));
    let status = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .unwrap_or_else(|e| panic!("{what}: gRPC health: {e}"))
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::Serving as i32, "{what}: gRPC health");
}

/// Writes `bytes` at `path`, creating parents (mode 0755), the file with `mode`.
fn write_file(path: &Path, bytes: &[u8], mode: u32) {
    let parent = path.parent().unwrap();
    std::fs::create_dir_all(parent).unwrap();
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Copies `from` (a file or a directory tree) to `to`, world-readable.
fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            copy_tree(&e.path(), &to.join(e.file_name()));
        }
    } else {
        write_file(to, &std::fs::read(from).unwrap(), 0o644);
    }
}

/// Makes every directory from `root` down to `dir` traversable (0755).
fn open_dirs(root: &Path, dir: &Path) {
    let mut p = dir.to_path_buf();
    while p.starts_with(root) {
        if p.is_dir() {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        if !p.pop() {
            break;
        }
    }
}

fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
}

/// What one process of a shape is started with.
struct Spec {
    name: String,
    container: Value,
    pod_spec: Value,
    /// Files the volumes place, by absolute container path.
    files: Vec<(String, Vec<u8>, u32)>,
    /// `emptyDir` mount paths.
    empty_dirs: Vec<String>,
    env: Vec<(String, String)>,
    /// containerPort → loopback port (allocated before any process starts, so
    /// Services can be mapped).
    ports: BTreeMap<u64, u16>,
}

/// Starts one process as `spec` and `image` describe; waits until it is ready.
fn start(image: &Image, spec: Spec, rewrites: &Rewrites, keys: &Keys) -> Pod {
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let host = |p: &str| -> PathBuf {
        assert!(p.starts_with('/'), "{}: {p} is not absolute", spec.name);
        root.path().join(&p[1..])
    };
    // This pod's own paths, on top of the shape's rewrites.
    let mut rw = rewrites.clone();
    let mut prefixes: Vec<String> = image.copies.iter().map(|(_, d)| d.clone()).collect();
    prefixes.extend(image.homes.iter().cloned());
    prefixes.extend(image.workdir.iter().cloned());
    prefixes.extend(spec.empty_dirs.iter().cloned());
    for m in spec.container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
    {
        assert!(
            m["subPath"].is_null(),
            "{}: subPath is not mapped",
            spec.name
        );
        prefixes.push(m["mountPath"].as_str().unwrap().to_owned());
    }
    for p in &prefixes {
        rw.add(p.clone(), host(p).display().to_string());
    }
    for (cport, lport) in &spec.ports {
        rw.add(format!("0.0.0.0:{cport}"), format!("127.0.0.1:{lport}"));
    }

    let sc = |k: &str| {
        let c = &spec.container["securityContext"][k];
        if c.is_null() {
            spec.pod_spec["securityContext"][k].clone()
        } else {
            c.clone()
        }
    };
    let uid = sc("runAsUser")
        .as_u64()
        .map(|u| u as u32)
        .or(image.user.map(|(u, _)| u));
    let gid = sc("runAsGroup")
        .as_u64()
        .map(|g| g as u32)
        .or(image.user.and_then(|(_, g)| g))
        .or(uid);
    if sc("runAsNonRoot") == true {
        assert!(
            uid.is_some_and(|u| u != 0),
            "{}: runAsNonRoot without a non-root uid in the manifest or the image",
            spec.name
        );
    }
    let read_only = spec.container["securityContext"]["readOnlyRootFilesystem"] == true;

    // The image's file system.
    for (src, dst) in &image.copies {
        copy_tree(&k8s::repo_dir().join(src), &host(dst));
        open_dirs(root.path(), &host(dst));
    }
    for home in &image.homes {
        let h = host(home);
        std::fs::create_dir_all(&h).unwrap();
        open_dirs(root.path(), &h);
        if let (Some(u), Some(g), false, 0) = (uid, gid, read_only, euid()) {
            chown(&h, u, g);
        }
    }
    let workdir = spec.container["workingDir"]
        .as_str()
        .map(str::to_owned)
        .or(image.workdir.clone())
        .unwrap_or_else(|| "/".to_owned());
    std::fs::create_dir_all(host(&workdir)).unwrap();
    open_dirs(root.path(), &host(&workdir));
    // The volumes, over it.
    for d in &spec.empty_dirs {
        let h = host(d);
        std::fs::create_dir_all(&h).unwrap();
        open_dirs(root.path(), h.parent().unwrap());
        std::fs::set_permissions(&h, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    // The kubelet gives volume files the pod's fsGroup as their group.
    let fs_group = spec.pod_spec["securityContext"]["fsGroup"]
        .as_u64()
        .map(|g| g as u32);
    for (path, bytes, mode) in &spec.files {
        let bytes = match std::str::from_utf8(bytes) {
            Ok(text) => rw.apply(text).into_bytes(),
            Err(_) => bytes.clone(),
        };
        write_file(&host(path), &bytes, *mode);
        open_dirs(root.path(), host(path).parent().unwrap());
        if let (Some(g), 0) = (fs_group, euid()) {
            chown(&host(path), 0, g);
        }
    }

    let mut env: Vec<(String, String)> = spec
        .env
        .iter()
        .map(|(k, v)| (k.clone(), rw.apply(v)))
        .collect();
    if spec.empty_dirs.iter().any(|d| d == "/tmp") {
        env.push(("TMPDIR".into(), host("/tmp").display().to_string()));
    }
    // The config file: which roles it serves; credentials where it authenticates.
    let mut roles = Vec::new();
    if let Some((_, file)) = env.iter().find(|(k, _)| k == "SOULBASE_CONFIG") {
        let file = PathBuf::from(file);
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: SOULBASE_CONFIG {}: {e}", spec.name, file.display()));
        let mut tree: Value = serde_saphyr::from_str(&text).unwrap();
        roles = tree["server"]["roles"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| r.as_str().unwrap().to_owned())
            .collect();
        if roles.is_empty() || roles.iter().any(|r| r == "auth") {
            tree["auth"]["api_keys"] = keys.config.clone();
            // JSON is YAML; the file stays where the mount put it.
            let mode = std::fs::metadata(&file).unwrap().permissions().mode();
            write_file(&file, tree.to_string().as_bytes(), mode);
        }
    }

    let bin = env!("CARGO_BIN_EXE_soulbased");
    let entry = spec.container["command"]
        .as_array()
        .map(|c| c.iter().map(|a| a.as_str().unwrap().to_owned()).collect())
        .unwrap_or_else(|| image.entrypoint.clone());
    assert!(
        entry.first().is_some_and(|e| e.ends_with("/soulbased")),
        "{}: the entrypoint is not soulbased: {entry:?}",
        spec.name
    );
    let mut cmd = Command::new(bin);
    cmd.args(&entry[1..]);
    for a in spec.container["args"].as_array().into_iter().flatten() {
        cmd.arg(rw.apply(a.as_str().unwrap()));
    }
    cmd.env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("RUST_LOG", "error")
        .current_dir(host(&workdir))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if euid() == 0 {
        let uid = uid
            .unwrap_or_else(|| panic!("{}: neither the image nor the pod names a user", spec.name));
        cmd.uid(uid).gid(gid.unwrap_or(uid));
    }
    let mut child = cmd.spawn().unwrap();
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let errs = stderr.clone();
    let err_pipe = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        for line in BufReader::new(err_pipe).lines().map_while(Result::ok) {
            eprintln!("{line}");
            errs.lock().unwrap().push(line);
        }
    });
    let (tx, rx) = mpsc::channel();
    let out_pipe = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out_pipe).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut pod = Pod {
        name: spec.name,
        child,
        ports: spec.ports,
        container: spec.container,
        roles,
        stderr,
        root,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line == "soulbased: ready" => break,
            Ok(_) => {}
            Err(e) => {
                // Exited (stdout closed) or hung: stop it, then read all it said.
                let _ = pod.child.kill();
                let status = pod.child.wait();
                let _ = err_reader.join();
                panic!(
                    "{}: soulbased did not become ready ({e:?}, {status:?}); stderr:\n{}",
                    pod.name,
                    pod.stderr()
                )
            }
        }
    }
    // Keep draining stdout so the process never blocks on a full pipe.
    std::thread::spawn(move || while rx.recv().is_ok() {});
    pod
}

/// `POST /api/tools/{tool}/invoke` with an API key.
async fn invoke(pod: &Pod, http_port: u64, key: &str, tool: &str, args: Value) -> (u16, Value) {
    let (status, body) = http(
        &pod.addr(http_port),
        "POST",
        &format!("/api/tools/{tool}/invoke"),
        &[("x-api-key", key), ("content-type", "application/json")],
        &args.to_string(),
    )
    .await;
    let v = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("{}: {tool}: {status} {body}: {e}", pod.name));
    (status, v)
}

async fn tool_ids(pod: &Pod, http_port: u64, key: &str) -> Vec<String> {
    let (status, body) = http(
        &pod.addr(http_port),
        "GET",
        "/api/tools",
        &[("x-api-key", key)],
        "",
    )
    .await;
    assert_eq!(status, 200, "{}: {body}", pod.name);
    let v: Value = serde_json::from_str(&body).unwrap();
    v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

/// The first governed calls: `acme` (the shipped policy's tenant) runs the
/// builtin echo; a tenant no policy names is denied before anything runs.
async fn first_governed_call(pod: &Pod, http_port: u64, keys: &Keys) {
    let (status, v) = invoke(
        pod,
        http_port,
        &keys.acme,
        "soulbase.builtin.echo",
        json!({"hello": "boot"}),
    )
    .await;
    assert_eq!(status, 200, "{}: {v}; stderr:\n{}", pod.name, pod.stderr());
    assert_eq!(v["status"], "ok", "{}: {v}", pod.name);
    assert_eq!(
        v["output"]["echo"],
        json!({"hello": "boot"}),
        "{}: {v}",
        pod.name
    );
    let (status, v) = invoke(
        pod,
        http_port,
        &keys.outsider,
        "soulbase.builtin.echo",
        json!({}),
    )
    .await;
    assert_eq!(status, 403, "{}: {v}", pod.name);
    assert_eq!(v["status"], "denied", "{}: {v}", pod.name);
}

/// The WASM example skill (a package in a sub-folder with its module), served
/// from the skills directory the shape configures, far from the working directory.
async fn wasm_skill_call(pod: &Pod, http_port: u64, keys: &Keys) {
    let ids = tool_ids(pod, http_port, &keys.acme).await;
    assert!(
        ids.iter().any(|i| i == "skills.text-length.count"),
        "{}: the example skills are not served: {ids:?}",
        pod.name
    );
    let (status, v) = invoke(
        pod,
        http_port,
        &keys.acme,
        "skills.text-length.count",
        json!({"text": "héllo"}),
    )
    .await;
    assert_eq!(status, 200, "{}: {v}; stderr:\n{}", pod.name, pod.stderr());
    assert_eq!(v["output"], json!({"length": 5}), "{}: {v}", pod.name);
}

/// The operator's config file for the bare image (`docker run -v`): the image
/// ships none. Evidence stays in the image's default store under
/// `SOULBASE_DATA_DIR`.
const IMAGE_CONFIG: &str = r#"
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["soulbase.builtin.echo", "skills.text-length.count"], actions: [invoke, list] }
"#;

/// Where the operator mounts that file, and the variable naming it.
const IMAGE_CONFIG_PATH: &str = "/etc/soulbase/config/config.yaml";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_boots_as_built_and_serves_its_skills() {
    let image = k8s::image();
    let keys = Keys::new();
    let exposed: Vec<u64> = image
        .env
        .iter()
        .filter_map(|(_, v)| v.strip_prefix("0.0.0.0:").and_then(|p| p.parse().ok()))
        .collect();
    assert!(
        exposed.len() >= 2,
        "the image's ENV sets no listen addresses"
    );
    let ports: BTreeMap<u64, u16> = exposed.iter().map(|p| (*p, free_port())).collect();
    let mut env = image.env.clone();
    env.push(("SOULBASE_CONFIG".into(), IMAGE_CONFIG_PATH.into()));
    let spec = Spec {
        name: "image".into(),
        container: json!({
            "volumeMounts": [{"name": "config", "mountPath": "/etc/soulbase/config"}],
            "ports": exposed.iter().map(|p| json!({"containerPort": p})).collect::<Vec<_>>(),
        }),
        pod_spec: json!({}),
        files: vec![(
            IMAGE_CONFIG_PATH.to_owned(),
            IMAGE_CONFIG.as_bytes().to_vec(),
            0o644,
        )],
        empty_dirs: Vec::new(),
        env,
        ports,
    };
    let pod = start(&image, spec, &Rewrites::default(), &keys);
    // The image's layout: skills outside the working directory.
    let workdir = image.workdir.clone().expect("the image sets a WORKDIR");
    let skills = image
        .env
        .iter()
        .find(|(k, _)| k == "SKILLS_DIR")
        .map(|(_, v)| v.clone())
        .expect("the image sets SKILLS_DIR");
    assert!(!Path::new(&skills).starts_with(&workdir));
    let (uid, _) = image.user.expect("the image sets a USER");
    assert_ne!(uid, 0, "the image runs as root");
    if euid() == 0 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", pod.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert!(
            line.split_whitespace()
                .skip(1)
                .all(|u| u == uid.to_string()),
            "{line}"
        );
    }
    // What the manifests probe, on the image alone: HTTP readiness and liveness,
    // the gRPC health service.
    let http_port = *exposed.iter().find(|p| **p != 50051).unwrap();
    for path in ["/readyz", "/healthz"] {
        let (status, body) = http(&pod.addr(http_port), "GET", path, &[], "").await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    grpc_health(&pod.addr(50051), "", "image").await;
    first_governed_call(&pod, http_port, &keys).await;
    wasm_skill_call(&pod, http_port, &keys).await;
    // Evidence went to the image's default store under SOULBASE_DATA_DIR.
    let data = image
        .env
        .iter()
        .find(|(k, _)| k == "SOULBASE_DATA_DIR")
        .map(|(_, v)| v.clone())
        .expect("the image sets SOULBASE_DATA_DIR");
    assert!(pod.root.path().join(&data[1..]).is_dir());
}

/// The `http` container port of a pod (named `http`).
fn http_port(pod: &Pod) -> u64 {
    pod.container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "http")
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("{}: no http port", pod.name))
}

/// Boots every Deployment of overlay `name` (role services first, the tools
/// role last), checks every probe and the first governed calls; returns the
/// running pods (stopped when dropped).
async fn boot_overlay(name: &str, backends: &Backends, keys: &Keys) -> Vec<Pod> {
    let image = k8s::image();
    let docs = k8s::render(&k8s::deploy_dir().join("k8s/overlays").join(name));
    let ns = k8s::of_kind(&docs, "Namespace")
        .next()
        .and_then(|n| n["metadata"]["name"].as_str())
        .map(str::to_owned);
    let deployments: Vec<&Value> = k8s::of_kind(&docs, "Deployment").collect();
    assert!(!deployments.is_empty(), "{name}: no Deployment");
    let container = |d: &Value| -> Value {
        d["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "soulbased")
            .unwrap_or_else(|| {
                panic!(
                    "{name}: {} has no soulbased container",
                    d["metadata"]["name"]
                )
            })
            .clone()
    };
    // Loopback ports for every container port, before anything starts.
    let ports: BTreeMap<String, BTreeMap<u64, u16>> = deployments
        .iter()
        .map(|d| {
            let ports = container(d)["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| (p["containerPort"].as_u64().unwrap(), free_port()))
                .collect();
            (d["metadata"]["name"].as_str().unwrap().to_owned(), ports)
        })
        .collect();
    // Service names → the loopback address of the Deployment they select.
    let mut rewrites = Rewrites::default();
    for svc in k8s::of_kind(&docs, "Service") {
        let svc_name = svc["metadata"]["name"].as_str().unwrap();
        let svc_ns = svc["metadata"]["namespace"]
            .as_str()
            .or(ns.as_deref())
            .unwrap_or("default");
        let selected: Vec<&&Value> = deployments
            .iter()
            .filter(|d| {
                k8s::selects(
                    &svc["spec"]["selector"],
                    &d["spec"]["template"]["metadata"]["labels"],
                )
            })
            .collect();
        assert_eq!(
            selected.len(),
            1,
            "{name}: Service {svc_name} selects {} Deployments",
            selected.len()
        );
        let d = selected[0];
        let c = container(d);
        for p in svc["spec"]["ports"].as_array().into_iter().flatten() {
            let target = if p["targetPort"].is_null() {
                &p["port"]
            } else {
                &p["targetPort"]
            };
            let cport = match target {
                Value::String(n) => c["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|cp| cp["name"] == n.as_str())
                    .and_then(|cp| cp["containerPort"].as_u64())
                    .unwrap_or_else(|| panic!("{name}: Service {svc_name}: no port {n}")),
                v => v.as_u64().unwrap(),
            };
            let lport = ports[d["metadata"]["name"].as_str().unwrap()][&cport];
            let port = p["port"].as_u64().unwrap();
            for host in [
                svc_name.to_owned(),
                format!("{svc_name}.{svc_ns}"),
                format!("{svc_name}.{svc_ns}.svc"),
                format!("{svc_name}.{svc_ns}.svc.cluster.local"),
            ] {
                rewrites.add(format!("{host}:{port}"), format!("127.0.0.1:{lport}"));
            }
        }
    }
    let source = |kind: &str, n: &str| -> Value { k8s::find(&docs, kind, n).clone() };
    let mut specs = Vec::new();
    for d in &deployments {
        let dname = d["metadata"]["name"].as_str().unwrap().to_owned();
        let pod_spec = d["spec"]["template"]["spec"].clone();
        let c = container(d);
        let mut files = Vec::new();
        let mut empty_dirs = Vec::new();
        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            let mount = m["mountPath"].as_str().unwrap();
            let v = pod_spec["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["name"] == m["name"])
                .unwrap_or_else(|| panic!("{dname}: no volume {}", m["name"]))
                .clone();
            let (src, mode) = if let Some(cm) = v["configMap"]["name"].as_str() {
                (
                    source("ConfigMap", cm),
                    v["configMap"]["defaultMode"].as_u64(),
                )
            } else if let Some(s) = v["secret"]["secretName"].as_str() {
                let mut s = source("Secret", s);
                for field in ["stringData"] {
                    for (_, val) in s[field].as_object_mut().into_iter().flatten() {
                        *val = Value::from(backends.secret(val.as_str().unwrap()));
                    }
                }
                (s, v["secret"]["defaultMode"].as_u64())
            } else if v["emptyDir"].is_object() {
                empty_dirs.push(mount.to_owned());
                continue;
            } else {
                panic!(
                    "{dname}: volume {} of a kind the boot test cannot lay out",
                    v["name"]
                );
            };
            for (rel, bytes) in k8s::volume_files(&v, &src) {
                files.push((
                    format!("{}/{rel}", mount.trim_end_matches('/')),
                    bytes,
                    mode.unwrap_or(0o644) as u32,
                ));
            }
        }
        let mut env = image.env.clone();
        for e in c["envFrom"].as_array().into_iter().flatten() {
            if let Some(s) = e["secretRef"]["name"].as_str() {
                for (k, v) in source("Secret", s)["stringData"]
                    .as_object()
                    .into_iter()
                    .flatten()
                {
                    env.push((k.clone(), backends.secret(v.as_str().unwrap())));
                }
            }
            if let Some(cm) = e["configMapRef"]["name"].as_str() {
                for (k, v) in source("ConfigMap", cm)["data"]
                    .as_object()
                    .into_iter()
                    .flatten()
                {
                    env.push((k.clone(), v.as_str().unwrap().to_owned()));
                }
            }
        }
        for e in c["env"].as_array().into_iter().flatten() {
            let k = e["name"].as_str().unwrap().to_owned();
            let v = if let Some(v) = e["value"].as_str() {
                v.to_owned()
            } else if let Some(r) = e["valueFrom"]["secretKeyRef"].as_object() {
                let s = source("Secret", r["name"].as_str().unwrap());
                backends.secret(
                    s["stringData"][r["key"].as_str().unwrap()]
                        .as_str()
                        .unwrap(),
                )
            } else if let Some(r) = e["valueFrom"]["configMapKeyRef"].as_object() {
                let cm = source("ConfigMap", r["name"].as_str().unwrap());
                cm["data"][r["key"].as_str().unwrap()]
                    .as_str()
                    .unwrap()
                    .to_owned()
            } else {
                panic!("{dname}: env {k} has no value the boot test can give")
            };
            env.push((k, v));
        }
        specs.push(Spec {
            ports: ports[&dname].clone(),
            name: dname,
            container: c,
            pod_spec,
            files,
            empty_dirs,
            env,
        });
    }
    // The tools role reaches the others: start it last.
    specs.sort_by_key(|s| s.env.iter().any(|(k, _)| k == "SOULBASE_CONFIG") && serves_tools(s));
    let mut pods = Vec::new();
    for spec in specs {
        pods.push(start(&image, spec, &rewrites, keys));
    }
    for pod in &pods {
        let n = pod.check_probes().await;
        assert_eq!(n, 3, "{}: readiness, liveness and startup probes", pod.name);
    }
    let tools: Vec<&Pod> = pods.iter().filter(|p| p.serves("tools")).collect();
    assert_eq!(
        tools.len(),
        1,
        "{name}: one Deployment serves the tools role"
    );
    first_governed_call(tools[0], http_port(tools[0]), keys).await;
    pods
}

/// Whether a spec's mounted config serves the tools role (roles unset: all).
fn serves_tools(spec: &Spec) -> bool {
    let Some((_, file)) = spec.env.iter().find(|(k, _)| k == "SOULBASE_CONFIG") else {
        return true;
    };
    let Some((_, text, _)) = spec.files.iter().find(|(p, _, _)| p == file) else {
        return true;
    };
    let tree: Value = serde_saphyr::from_str(std::str::from_utf8(text).unwrap()).unwrap();
    let roles = tree["server"]["roles"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    roles.is_empty() || roles.iter().any(|r| r == "tools")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_all_in_one_overlay_boots_and_serves() {
    let backends = Backends::new().await;
    let keys = Keys::new();
    let pods = boot_overlay("all-in-one", &backends, &keys).await;
    assert_eq!(pods.len(), 1);
    drop(pods);
    backends.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_split_roles_overlay_boots_one_process_per_deployment() {
    let backends = Backends::new().await;
    let keys = Keys::new();
    let pods = boot_overlay("split-roles", &backends, &keys).await;
    // tools, auth, qos, sandbox, evidence.
    assert_eq!(pods.len(), 5);
    drop(pods);
    backends.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_production_overlay_boots_as_split_roles_with_a_pinned_image() {
    let backends = Backends::new().await;
    let keys = Keys::new();
    let pods = boot_overlay("production", &backends, &keys).await;
    assert_eq!(pods.len(), 5);
    for pod in &pods {
        let image = pod.container["image"].as_str().unwrap();
        assert!(
            image.contains("@sha256:"),
            "{}: {image} is not pinned by digest",
            pod.name
        );
    }
    drop(pods);
    backends.drop_database().await;
}
