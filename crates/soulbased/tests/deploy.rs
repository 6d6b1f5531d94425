//! Validates `deploy/`: every YAML parses, every kustomization resource and patch
//! exists, every ConfigMap, Secret (and key), volume and named port a workload
//! references is defined, and every embedded configuration loads. Each overlay is
//! rendered the way kustomize does (strategic-merge patches applied), and each
//! Deployment's effective configuration — its ConfigMap file, the image's and the
//! pod's environment — is loaded with `soulbase_config` and checked against the
//! manifests: every role is served once, the tools role reaches every other role
//! at an existing Service and port, role services admit only the tools pods.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::k8s::{self, deploy_dir, render, selects};
use serde_json::{Map, Value};
use soulbase_config::{Config, ConfigLoader, Role};

const ALL_ROLES: [Role; 5] = [
    Role::Tools,
    Role::Auth,
    Role::Qos,
    Role::Sandbox,
    Role::Evidence,
];

/// The image's `ENV` (the runtime stage of the Dockerfile).
fn image_env() -> Vec<(String, String)> {
    k8s::image().env
}

/// Kubernetes quantity (`256Mi`, `2Gi`, `1000`) in bytes.
fn quantity(q: &str) -> u64 {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
    ];
    for (suffix, mult) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<u64>().unwrap() * mult;
        }
    }
    q.parse().unwrap()
}

/// One rendered Deployment and its effective configuration.
struct Workload {
    path: PathBuf,
    name: String,
    labels: Value,
    spec: Value,
    container: Value,
    env: BTreeMap<String, String>,
    config: Config,
    /// The Secret files the pod mounts.
    secret_files: Mounted,
}

impl Workload {
    fn roles(&self) -> BTreeSet<Role> {
        self.config.server.roles.iter().copied().collect()
    }

    /// The volume mounted at the longest mount path containing `path`.
    fn volume_at(&self, path: &Path) -> Option<(&Value, &Value)> {
        let mount = self.container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| path.starts_with(m["mountPath"].as_str().unwrap()))
            .max_by_key(|m| m["mountPath"].as_str().unwrap().len())?;
        let volume = self.spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == mount["name"])?;
        Some((mount, volume))
    }

    /// Asserts `path` is on a writable emptyDir or PersistentVolumeClaim; returns the volume.
    fn writable(&self, path: &Path, what: &str) -> &Value {
        let (mount, volume) = self.volume_at(path).unwrap_or_else(|| {
            panic!(
                "{}: {what} {} is not on a volume",
                self.name,
                path.display()
            )
        });
        assert!(
            mount["readOnly"] != true
                && (volume["emptyDir"].is_object() || volume["persistentVolumeClaim"].is_object()),
            "{}: {what} {} is not on a writable emptyDir or PVC",
            self.name,
            path.display()
        );
        volume
    }

    /// The container port `target` (a port name or number) refers to.
    fn container_port(&self, target: &Value) -> Option<u64> {
        let ports = self.container["ports"].as_array()?;
        match target {
            Value::String(name) => ports
                .iter()
                .find(|p| p["name"] == name.as_str())
                .and_then(|p| p["containerPort"].as_u64()),
            Value::Number(n) => ports
                .iter()
                .find(|p| p["containerPort"].as_u64() == n.as_u64())
                .and_then(|p| p["containerPort"].as_u64()),
            _ => None,
        }
    }
}

struct Overlay {
    name: String,
    docs: Vec<(PathBuf, Value)>,
    workloads: Vec<Workload>,
}

impl Overlay {
    fn of_kind(&self, kind: &str) -> impl Iterator<Item = &(PathBuf, Value)> {
        let kind = kind.to_owned();
        self.docs
            .iter()
            .filter(move |(_, d)| d["kind"] == kind.as_str())
    }

    fn serving(&self, role: Role) -> Vec<&Workload> {
        self.workloads
            .iter()
            .filter(|w| w.config.server.roles.contains(&role))
            .collect()
    }
}

/// Files a volume places: (mount path, [(relative path, bytes)]).
type Mounted = Vec<(String, Vec<(String, Vec<u8>)>)>;

/// Loads `text` with `env`, the `mounts` written under a temporary directory
/// and the config's references to them pointed there (secret files named by
/// `*_file` keys are read at load).
fn load_config(text: &str, env: Vec<(String, String)>, mounts: &Mounted, what: &str) -> Config {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    let mut text = text.to_owned();
    for (mount, files) in mounts {
        let host = dir.path().join(mount.trim_start_matches('/'));
        for (rel, bytes) in files {
            let path = host.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
        text = text.replace(&format!("{mount}/"), &format!("{}/", host.display()));
    }
    std::fs::write(&file, text).unwrap();
    let loaded = ConfigLoader::new().with_file(&file).with_env(env).load();
    match loaded {
        Ok(snapshot) => snapshot.config().clone(),
        Err(e) => panic!("{what}: the configuration does not load: {e}"),
    }
}

/// Renders `name`, checks every reference and loads every configuration.
fn check_overlay(name: &str) -> Overlay {
    let dir = deploy_dir().join("k8s/overlays").join(name);
    let docs = render(&dir);
    for (path, d) in &docs {
        assert!(
            d["kind"].is_string() && d["metadata"]["name"].is_string(),
            "{}: no kind or name",
            path.display()
        );
    }
    let by_name = |kind: &str| -> BTreeMap<String, Value> {
        docs.iter()
            .filter(|(_, d)| d["kind"] == kind)
            .map(|(_, d)| {
                (
                    d["metadata"]["name"].as_str().unwrap().to_owned(),
                    d.clone(),
                )
            })
            .collect()
    };
    let config_maps = by_name("ConfigMap");
    let secrets: BTreeMap<String, Map<String, Value>> = by_name("Secret")
        .into_iter()
        .map(|(n, d)| (n, d["stringData"].as_object().cloned().unwrap_or_default()))
        .collect();
    let secret_value = |path: &Path, name: &str, key: &str| -> String {
        let s = secrets
            .get(name)
            .unwrap_or_else(|| panic!("{}: Secret {name} is not defined", path.display()));
        s.get(key)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("{}: Secret {name} has no key {key}", path.display()))
            .to_owned()
    };

    // Every embedded configuration file loads on its own, with the image's
    // environment and every Secret mounted where any Deployment mounts it (each
    // Deployment's exact environment and mounts are checked below).
    let mut all_secrets: Mounted = Vec::new();
    for d in docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| d["kind"] == "Deployment")
    {
        let spec = &d["spec"]["template"]["spec"];
        for c in spec["containers"].as_array().into_iter().flatten() {
            for m in c["volumeMounts"].as_array().into_iter().flatten() {
                let v = spec["volumes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|v| v["name"] == m["name"]);
                let mount = m["mountPath"].as_str().unwrap();
                if all_secrets.iter().any(|(at, _)| at == mount) {
                    continue;
                }
                if let Some(secret) = v.and_then(|v| v["secret"]["secretName"].as_str()) {
                    let whole = serde_json::json!({"secret": {"secretName": secret}});
                    let src = k8s::find(&docs, "Secret", secret);
                    all_secrets.push((
                        m["mountPath"].as_str().unwrap().to_owned(),
                        k8s::volume_files(&whole, src),
                    ));
                }
            }
        }
    }
    let mut config_files = Vec::new();
    for (cm, d) in &config_maps {
        if !cm.starts_with("soulbase-config") {
            continue;
        }
        for (key, text) in d["data"].as_object().into_iter().flatten() {
            if !key.ends_with(".yaml") {
                continue;
            }
            let text = text.as_str().unwrap();
            let _: Value = serde_saphyr::from_str(text)
                .unwrap_or_else(|e| panic!("{name}: ConfigMap {cm} {key}: {e}"));
            load_config(
                text,
                image_env(),
                &all_secrets,
                &format!("{name}: ConfigMap {cm} {key}"),
            );
            config_files.push(cm.clone());
        }
    }
    assert!(
        !config_files.is_empty(),
        "{name}: no embedded configuration"
    );
    for cm in &config_files {
        assert!(
            docs.iter().any(|(_, d)| d["kind"] == "Deployment"
                && d["spec"]["template"]["spec"]["volumes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|v| v["configMap"]["name"] == cm.as_str())),
            "{name}: ConfigMap {cm} is mounted by no Deployment"
        );
    }

    let mut workloads = Vec::new();
    for (path, d) in docs.iter().filter(|(_, d)| d["kind"] == "Deployment") {
        let spec = d["spec"]["template"]["spec"].clone();
        let labels = d["spec"]["template"]["metadata"]["labels"].clone();
        assert!(
            selects(&d["spec"]["selector"]["matchLabels"], &labels),
            "{}: the selector does not select the pod template",
            path.display()
        );
        let volumes: BTreeSet<String> = spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| v["name"].as_str().unwrap().to_owned())
            .collect();
        for v in spec["volumes"].as_array().into_iter().flatten() {
            if let Some(cm) = v["configMap"]["name"].as_str() {
                assert!(
                    config_maps.contains_key(cm),
                    "{}: ConfigMap {cm} is not defined",
                    path.display()
                );
            }
            if let Some(s) = v["secret"]["secretName"].as_str() {
                assert!(
                    secrets.contains_key(s),
                    "{}: Secret {s} is not defined",
                    path.display()
                );
            }
        }
        let containers = spec["containers"].as_array().unwrap();
        for c in containers {
            let ports: BTreeSet<String> = c["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["name"].as_str().map(str::to_owned))
                .collect();
            for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
                if let Some(port) = c[probe]["httpGet"]["port"].as_str() {
                    assert!(
                        ports.contains(port),
                        "{}: {probe} port {port} undefined",
                        path.display()
                    );
                }
            }
            assert_eq!(
                c["readinessProbe"]["httpGet"]["path"],
                "/readyz",
                "{}",
                path.display()
            );
            assert_eq!(
                c["livenessProbe"]["httpGet"]["path"],
                "/healthz",
                "{}",
                path.display()
            );
            assert!(
                c["resources"]["requests"].is_object() && c["resources"]["limits"].is_object(),
                "{}: no resource requests and limits",
                path.display()
            );
            for m in c["volumeMounts"].as_array().into_iter().flatten() {
                let v = m["name"].as_str().unwrap();
                assert!(
                    volumes.contains(v),
                    "{}: volumeMount of undefined volume {v}",
                    path.display()
                );
            }
            for e in c["envFrom"].as_array().into_iter().flatten() {
                if let Some(s) = e["secretRef"]["name"].as_str() {
                    assert!(
                        secrets.contains_key(s),
                        "{}: Secret {s} is not defined",
                        path.display()
                    );
                }
                if let Some(cm) = e["configMapRef"]["name"].as_str() {
                    assert!(
                        config_maps.contains_key(cm),
                        "{}: ConfigMap {cm} undefined",
                        path.display()
                    );
                }
            }
        }
        // The effective environment: the image, then envFrom, then env.
        let c = containers
            .iter()
            .find(|c| c["name"] == "soulbased")
            .unwrap_or_else(|| panic!("{}: no soulbased container", path.display()))
            .clone();
        let mut env: Vec<(String, String)> = image_env();
        for e in c["envFrom"].as_array().into_iter().flatten() {
            if let Some(s) = e["secretRef"]["name"].as_str() {
                env.extend(
                    secrets[s]
                        .iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned())),
                );
            }
        }
        for e in c["env"].as_array().into_iter().flatten() {
            let k = e["name"].as_str().unwrap().to_owned();
            let v = if let Some(v) = e["value"].as_str() {
                v.to_owned()
            } else if e["valueFrom"]["secretKeyRef"].is_object() {
                let r = &e["valueFrom"]["secretKeyRef"];
                secret_value(
                    path,
                    r["name"].as_str().unwrap(),
                    r["key"].as_str().unwrap(),
                )
            } else if e["valueFrom"]["configMapKeyRef"].is_object() {
                let r = &e["valueFrom"]["configMapKeyRef"];
                let cm = r["name"].as_str().unwrap();
                let key = r["key"].as_str().unwrap();
                config_maps
                    .get(cm)
                    .and_then(|d| d["data"][key].as_str())
                    .unwrap_or_else(|| {
                        panic!("{}: ConfigMap {cm} has no key {key}", path.display())
                    })
                    .to_owned()
            } else {
                panic!("{}: env {k} has no value", path.display())
            };
            env.push((k, v));
        }
        let env_map: BTreeMap<String, String> = env.iter().cloned().collect();
        let mut w = Workload {
            path: path.clone(),
            name: d["metadata"]["name"].as_str().unwrap().to_owned(),
            labels,
            spec,
            container: c,
            env: env_map,
            config: Config::default(),
            secret_files: Vec::new(),
        };
        // The config file SOULBASE_CONFIG names, from the ConfigMap mounted there.
        let file = PathBuf::from(
            w.env
                .get("SOULBASE_CONFIG")
                .unwrap_or_else(|| panic!("{}: SOULBASE_CONFIG is not set", path.display())),
        );
        let (mount, volume) = w
            .volume_at(&file)
            .unwrap_or_else(|| panic!("{}: {} is not on a volume", path.display(), file.display()));
        let cm = volume["configMap"]["name"].as_str().unwrap_or_else(|| {
            panic!(
                "{}: {} is not on a ConfigMap",
                path.display(),
                file.display()
            )
        });
        let key = file
            .strip_prefix(mount["mountPath"].as_str().unwrap())
            .unwrap()
            .to_str()
            .unwrap();
        let text = config_maps[cm]["data"][key]
            .as_str()
            .unwrap_or_else(|| panic!("{}: ConfigMap {cm} has no {key}", path.display()));
        // Only the Secret files this pod mounts (`items` honoured): a config
        // naming a file its pod does not get fails to load here.
        let mut mounts: Mounted = Vec::new();
        for m in w.container["volumeMounts"].as_array().into_iter().flatten() {
            let v = w.spec["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["name"] == m["name"]);
            if let Some(secret) = v.and_then(|v| v["secret"]["secretName"].as_str()) {
                let files = k8s::volume_files(v.unwrap(), k8s::find(&docs, "Secret", secret));
                mounts.push((m["mountPath"].as_str().unwrap().to_owned(), files));
            }
        }
        w.config = load_config(
            text,
            env,
            &mounts,
            &format!("{name}: Deployment {}", w.name),
        );
        w.secret_files = mounts;
        workloads.push(w);
    }
    assert!(!workloads.is_empty(), "{name}: no Deployment");

    for (path, d) in docs.iter().filter(|(_, d)| d["kind"] == "Service") {
        let backends: Vec<&Workload> = workloads
            .iter()
            .filter(|w| selects(&d["spec"]["selector"], &w.labels))
            .collect();
        assert!(
            !backends.is_empty(),
            "{}: the Service selects no Deployment",
            path.display()
        );
        for p in d["spec"]["ports"].as_array().into_iter().flatten() {
            let t = if p["targetPort"].is_null() {
                &p["port"]
            } else {
                &p["targetPort"]
            };
            for w in &backends {
                assert!(
                    w.container_port(t).is_some(),
                    "{}: targetPort {t} undefined in {}",
                    path.display(),
                    w.name
                );
            }
        }
    }

    let overlay = Overlay {
        name: name.to_owned(),
        docs: docs.clone(),
        workloads,
    };
    check_workloads(&overlay);
    overlay
}

/// Checks each Deployment against its own configuration and the other roles.
fn check_workloads(o: &Overlay) {
    let name = &o.name;
    for role in ALL_ROLES {
        let serving: Vec<&str> = o.serving(role).iter().map(|w| w.name.as_str()).collect();
        assert_eq!(
            serving.len(),
            1,
            "{name}: role {role:?} is served by {serving:?}, not exactly one Deployment"
        );
    }
    let has_pdbs = o.of_kind("PodDisruptionBudget").next().is_some();
    for w in &o.workloads {
        let cfg = &w.config;
        let at = format!("{name}: {} ({})", w.name, w.path.display());
        // Listeners match the declared container ports.
        let grpc = w.container_port(&Value::from("grpc"));
        assert_eq!(
            grpc,
            Some(u64::from(cfg.server.grpc_addr.port())),
            "{at}: gRPC port"
        );
        let http = w.container_port(&Value::from("http"));
        assert_eq!(
            http,
            Some(u64::from(cfg.server.http_addr.port())),
            "{at}: HTTP port"
        );
        // Draining fits in the termination grace period.
        let grace = w.spec["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap_or(30);
        assert!(
            grace * 1000 > cfg.server.shutdown_grace_ms,
            "{at}: terminationGracePeriodSeconds too short"
        );
        if let Some(var) = &cfg.server.internal_token_env {
            assert!(
                w.env.contains_key(var),
                "{at}: the internal token {var} is not in the environment"
            );
        }
        let roles = w.roles();
        // Persistence (spool, SQLite) under data_dir.
        if roles.contains(&Role::Tools) || roles.contains(&Role::Evidence) {
            let volume = w.writable(&cfg.data_dir, "data_dir");
            if let Some(limit) = volume["emptyDir"]["sizeLimit"].as_str() {
                assert!(
                    // Unset, the cap derives from the volume's free space, at most 1 GiB.
                    quantity(limit) > cfg.evidence.spool_max_bytes.unwrap_or(1 << 30),
                    "{at}: the data volume's sizeLimit does not hold evidence.spool_max_bytes"
                );
            }
        }
        // Where calls execute: skills (WASM modules) and scratch space.
        let executes = roles.contains(&Role::Sandbox)
            || (roles.contains(&Role::Tools) && cfg.server.remote.sandbox.is_none());
        if executes {
            let root = cfg
                .sandbox
                .wasm_module_root
                .clone()
                .unwrap_or_else(|| cfg.skills.dir.clone());
            let (_, volume) = w.volume_at(&root).unwrap_or_else(|| {
                panic!(
                    "{at}: the WASM module root {} is not mounted",
                    root.display()
                )
            });
            assert!(
                volume["configMap"]["name"].is_string(),
                "{at}: the skills are not from a ConfigMap"
            );
            let scratch = cfg
                .sandbox
                .scratch_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("/tmp"));
            w.writable(&scratch, "the scratch directory");
            soulbase_sandbox::parse_capabilities(cfg.sandbox.ceiling.as_deref(), "sandbox.ceiling")
                .unwrap_or_else(|e| panic!("{at}: {e:?}"));
            soulbase_sandbox::IntersectingProfiles::from_config(&cfg.sandbox)
                .unwrap_or_else(|e| panic!("{at}: {e:?}"));
        }
        if roles.contains(&Role::Tools) {
            w.volume_at(&cfg.skills.dir).unwrap_or_else(|| {
                panic!(
                    "{at}: skills.dir {} is not mounted",
                    cfg.skills.dir.display()
                )
            });
        }
        // Cedar policy files are mounted where authorization runs.
        if let Some(cedar) = &cfg.auth.cedar {
            for f in &cedar.files {
                let (mount, volume) = w
                    .volume_at(f)
                    .unwrap_or_else(|| panic!("{at}: Cedar file {} is not mounted", f.display()));
                let cm = volume["configMap"]["name"].as_str().unwrap();
                let key = f
                    .strip_prefix(mount["mountPath"].as_str().unwrap())
                    .unwrap();
                let doc = o
                    .of_kind("ConfigMap")
                    .find(|(_, d)| d["metadata"]["name"] == cm)
                    .unwrap();
                assert!(
                    doc.1["data"][key.to_str().unwrap()].is_string(),
                    "{at}: ConfigMap {cm} has no {}",
                    key.display()
                );
            }
        }
        // The tools role reaches every role it does not serve at that role's Service.
        if roles.contains(&Role::Tools) {
            let r = &cfg.server.remote;
            for (role, url) in [
                (Role::Auth, &r.auth),
                (Role::Qos, &r.qos),
                (Role::Sandbox, &r.sandbox),
                (Role::Evidence, &r.evidence),
            ] {
                if roles.contains(&role) {
                    continue;
                }
                let url = url.as_deref().unwrap_or_else(|| {
                    panic!(
                        "{at}: role {role:?} is not served here and has no server.remote endpoint"
                    )
                });
                check_remote(o, w, role, url);
            }
        }
        if has_pdbs {
            assert!(
                o.of_kind("PodDisruptionBudget")
                    .any(|(_, d)| selects(&d["spec"]["selector"]["matchLabels"], &w.labels)),
                "{at}: no PodDisruptionBudget"
            );
        }
    }
}

/// `url` (`http://service[.ns…]:port`) names a Service with that port, selecting
/// the pods of the Deployment that serves `role`, on its gRPC container port.
fn check_remote(o: &Overlay, from: &Workload, role: Role, url: &str) {
    let at = format!("{}: {} server.remote.{role:?}", o.name, from.name);
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or_else(|| panic!("{at}: {url} has no scheme"));
    let (host, port) = rest
        .trim_end_matches('/')
        .split_once(':')
        .unwrap_or_else(|| panic!("{at}: {url} has no port"));
    let service = host.split('.').next().unwrap();
    let port: u64 = port
        .parse()
        .unwrap_or_else(|_| panic!("{at}: bad port in {url}"));
    let (path, svc) = o
        .of_kind("Service")
        .find(|(_, d)| d["metadata"]["name"] == service)
        .unwrap_or_else(|| panic!("{at}: {url} names no Service {service}"));
    let svc_port = svc["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["port"].as_u64() == Some(port))
        .unwrap_or_else(|| {
            panic!(
                "{at}: Service {service} ({}) has no port {port}",
                path.display()
            )
        });
    let target = o.serving(role)[0];
    assert!(
        selects(&svc["spec"]["selector"], &target.labels),
        "{at}: Service {service} does not select {}, which serves {role:?}",
        target.name
    );
    let t = if svc_port["targetPort"].is_null() {
        &svc_port["port"]
    } else {
        &svc_port["targetPort"]
    };
    assert_eq!(
        target.container_port(t),
        Some(u64::from(target.config.server.grpc_addr.port())),
        "{at}: Service {service} port {port} does not reach the gRPC port of {}",
        target.name
    );
}

/// The NetworkPolicies selecting `w`'s pods admit ingress only from the tools pods.
fn assert_ingress_only_from_tools(o: &Overlay, w: &Workload, egress_too: bool) {
    let at = format!("{}: {}", o.name, w.name);
    let tools = o.serving(Role::Tools)[0];
    let policies: Vec<&Value> = o
        .of_kind("NetworkPolicy")
        .map(|(_, d)| d)
        .filter(|d| selects(&d["spec"]["podSelector"]["matchLabels"], &w.labels))
        .collect();
    assert!(
        !policies.is_empty(),
        "{at}: no NetworkPolicy selects its pods"
    );
    let mut admits_tools = false;
    for np in policies {
        let types: Vec<&str> = np["spec"]["policyTypes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            types.contains(&"Ingress"),
            "{at}: NetworkPolicy without Ingress"
        );
        if egress_too {
            assert!(
                types.contains(&"Egress"),
                "{at}: NetworkPolicy without Egress (egress must be allow-listed)"
            );
        }
        for rule in np["spec"]["ingress"].as_array().into_iter().flatten() {
            let peers = rule["from"].as_array().cloned().unwrap_or_default();
            assert!(
                !peers.is_empty(),
                "{at}: an ingress rule admits every source"
            );
            for peer in &peers {
                let keys: Vec<&String> = peer.as_object().unwrap().keys().collect();
                assert_eq!(
                    keys,
                    ["podSelector"],
                    "{at}: an ingress peer is not a pod selector of this namespace"
                );
                let sel = &peer["podSelector"]["matchLabels"];
                assert!(
                    selects(sel, &tools.labels),
                    "{at}: an ingress peer is not the tools pods"
                );
                for other in o.workloads.iter().filter(|x| x.name != tools.name) {
                    assert!(
                        !selects(sel, &other.labels),
                        "{at}: an ingress peer also selects {}",
                        other.name
                    );
                }
            }
            let ports = rule["ports"].as_array().cloned().unwrap_or_default();
            assert!(!ports.is_empty(), "{at}: an ingress rule admits every port");
            for p in &ports {
                assert_eq!(
                    w.container_port(&p["port"]),
                    Some(u64::from(w.config.server.grpc_addr.port())),
                    "{at}: an ingress rule admits a port other than gRPC"
                );
            }
            admits_tools = true;
        }
    }
    assert!(admits_tools, "{at}: the tools pods cannot reach it");
}

/// What a platform team checks on every overlay: a Namespace for the overlay's
/// namespace; every pod without a service-account token and selected by a
/// NetworkPolicy; no Secret in the environment (mounted files only); Redis quota
/// wherever a role counting quota runs more than one replica; an autoscaler on
/// the tools role; skills packages (sub-folders, WASM) placed by `items`.
fn check_platform_rules(name: &str) {
    let o = check_overlay(name);
    let docs = &o.docs;
    let ns: Vec<&Value> = k8s::of_kind(docs, "Namespace").collect();
    assert_eq!(ns.len(), 1, "{name}: one Namespace");
    let ns_name = ns[0]["metadata"]["name"].as_str().unwrap();
    for (path, d) in docs {
        if d["kind"] != "Namespace" {
            assert_eq!(
                d["metadata"]["namespace"],
                ns_name,
                "{}: not in the overlay's Namespace",
                path.display()
            );
        }
    }
    let policies: Vec<&Value> = k8s::of_kind(docs, "NetworkPolicy").collect();
    let hpas: Vec<&Value> = k8s::of_kind(docs, "HorizontalPodAutoscaler").collect();
    for w in &o.workloads {
        let at = format!("{name}: {}", w.name);
        assert_eq!(
            w.spec["automountServiceAccountToken"], false,
            "{at}: service-account token mounted"
        );
        assert!(
            policies
                .iter()
                .any(|p| selects(&p["spec"]["podSelector"]["matchLabels"], &w.labels)),
            "{at}: no NetworkPolicy selects its pods"
        );
        for c in w.spec["containers"].as_array().unwrap() {
            assert!(
                c["envFrom"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .all(|e| e["secretRef"].is_null())
                    && c["env"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .all(|e| e["valueFrom"]["secretKeyRef"].is_null()),
                "{at}: a Secret in the environment (mount it as files)"
            );
        }
        let doc = k8s::find(docs, "Deployment", &w.name);
        let scaled = hpas
            .iter()
            .any(|h| h["spec"]["scaleTargetRef"]["name"] == w.name.as_str());
        let replicas = doc["spec"]["replicas"].as_u64().unwrap_or(1);
        let roles = w.roles();
        if (replicas > 1 || scaled) && (roles.contains(&Role::Qos) || roles.contains(&Role::Tools))
        {
            assert_eq!(
                w.config.quota.backend,
                soulbase_config::QuotaBackend::Redis,
                "{at}: {replicas} replicas count quota apart (quota.backend: memory)"
            );
        }
        if roles.contains(&Role::Tools) {
            assert!(
                scaled,
                "{at}: no HorizontalPodAutoscaler for the tools role"
            );
        }
        // The skills volume lays out the repository's example packages exactly.
        if let Some((mount, volume)) = w.volume_at(&w.config.skills.dir)
            && (roles.contains(&Role::Tools) || roles.contains(&Role::Sandbox))
        {
            assert_eq!(
                Path::new(mount["mountPath"].as_str().unwrap()),
                w.config.skills.dir
            );
            let cm = k8s::find(
                docs,
                "ConfigMap",
                volume["configMap"]["name"].as_str().unwrap(),
            );
            let files = k8s::volume_files(volume, cm);
            let repo = k8s::repo_dir().join("skills");
            assert!(
                files.iter().any(|(p, _)| p.ends_with("/SKILL.md")),
                "{at}: no package in a sub-folder"
            );
            assert!(
                files
                    .iter()
                    .any(|(p, _)| p.ends_with(".wat") || p.ends_with(".wasm")),
                "{at}: no WASM module"
            );
            for (rel, bytes) in &files {
                let want = std::fs::read(repo.join(rel))
                    .unwrap_or_else(|e| panic!("{at}: skills item {rel} is not in skills/: {e}"));
                assert_eq!(
                    &want, bytes,
                    "{at}: skills item {rel} differs from skills/{rel}"
                );
            }
            for (key, _) in cm["data"].as_object().into_iter().flatten() {
                assert!(
                    volume["configMap"]["items"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|i| i["key"] == key.as_str()),
                    "{at}: skills key {key} is placed by no item"
                );
            }
        }
    }
}

#[test]
fn every_overlay_meets_the_platform_rules() {
    let mut overlays = 0;
    for e in std::fs::read_dir(deploy_dir().join("k8s/overlays")).unwrap() {
        check_platform_rules(&e.unwrap().file_name().to_string_lossy());
        overlays += 1;
    }
    assert!(overlays >= 3, "all-in-one, split-roles, production");
    // Production pins the image by digest.
    let o = check_overlay("production");
    for w in &o.workloads {
        let image = w.container["image"].as_str().unwrap();
        assert!(
            image.contains("@sha256:"),
            "production: {}: {image} not pinned by digest",
            w.name
        );
    }
}

#[test]
fn all_in_one_overlay_is_consistent() {
    let o = check_overlay("all-in-one");
    assert_eq!(o.workloads.len(), 1);
    assert_eq!(o.workloads[0].roles(), ALL_ROLES.into_iter().collect());
}

#[test]
fn split_roles_overlay_is_consistent() {
    let o = check_overlay("split-roles");
    // One Deployment per role: tools, auth, qos, sandbox, evidence.
    let role_sets: BTreeSet<Vec<Role>> = o
        .workloads
        .iter()
        .map(|w| w.roles().into_iter().collect())
        .collect();
    let want: BTreeSet<Vec<Role>> = [
        vec![Role::Tools],
        vec![Role::Auth],
        vec![Role::Qos],
        vec![Role::Sandbox],
        vec![Role::Evidence],
    ]
    .into_iter()
    .collect();
    assert_eq!(o.workloads.len(), 5, "one Deployment per role");
    assert_eq!(role_sets, want);

    // The tools config names all four remote endpoints (each checked against its
    // Service in check_overlay) and the internal token.
    let tools = o.serving(Role::Tools)[0];
    let r = &tools.config.server.remote;
    for (role, url) in [
        (Role::Auth, &r.auth),
        (Role::Qos, &r.qos),
        (Role::Sandbox, &r.sandbox),
        (Role::Evidence, &r.evidence),
    ] {
        let url = url.as_deref().unwrap_or_else(|| {
            panic!("the tools config has no server.remote endpoint for {role:?}")
        });
        check_remote(&o, tools, role, url);
    }
    for w in &o.workloads {
        assert!(
            w.config.server.internal_token_file.is_some(),
            "{}: the role services and their client need server.internal_token_file",
            w.name
        );
    }
    // The token each pod reads: the mounted Secret file its config names.
    let token_of = |w: &Workload| -> Vec<u8> {
        let file = w.config.server.internal_token_file.clone().unwrap();
        w.secret_files
            .iter()
            .flat_map(|(mount, files)| {
                files
                    .iter()
                    .map(move |(rel, b)| (format!("{mount}/{rel}"), b))
            })
            .find(|(p, _)| file.ends_with(p.trim_start_matches('/')))
            .map(|(_, b)| b.clone())
            .unwrap_or_else(|| panic!("{}: {} is no mounted Secret file", w.name, file.display()))
    };
    let tokens: BTreeSet<Vec<u8>> = o.workloads.iter().map(token_of).collect();
    assert_eq!(
        tokens.len(),
        1,
        "every Deployment reads the same internal token"
    );

    // The sandbox admits only the tools pods and allow-lists its egress; so do
    // the other role services' ingress.
    assert_ingress_only_from_tools(&o, o.serving(Role::Sandbox)[0], true);
    assert_ingress_only_from_tools(&o, o.serving(Role::Evidence)[0], false);
    assert_ingress_only_from_tools(&o, o.serving(Role::Auth)[0], false);
    assert_ingress_only_from_tools(&o, o.serving(Role::Qos)[0], false);

    // The sandbox role re-derives every profile from the same grants and ceiling
    // the tools role computes them with (else it narrows or blocks calls).
    let sandbox = o.serving(Role::Sandbox)[0];
    assert_eq!(
        sandbox.config.sandbox.ceiling, tools.config.sandbox.ceiling,
        "sandbox.ceiling differs between tools and sandbox"
    );
    assert_eq!(
        sandbox.config.sandbox.default_grant, tools.config.sandbox.default_grant,
        "sandbox.default_grant differs between tools and sandbox"
    );
    assert_eq!(
        sandbox.config.sandbox.grants, tools.config.sandbox.grants,
        "sandbox.grants differs between tools and sandbox"
    );
    // Backend URLs go only where they are used.
    let backend_url = |b: &[u8]| b.starts_with(b"postgres") || b.starts_with(b"redis");
    assert!(
        !sandbox
            .secret_files
            .iter()
            .flat_map(|(_, f)| f)
            .any(|(_, b)| backend_url(b))
            && !sandbox.env.values().any(|v| backend_url(v.as_bytes())),
        "the sandbox pods get a backend URL"
    );
    let evidence = o.serving(Role::Evidence)[0];
    assert_eq!(
        evidence.config.evidence.backend,
        soulbase_config::EvidenceBackend::Postgres
    );
}

#[test]
fn dockerfile_builds_soulbased_in_stages() {
    let text = std::fs::read_to_string(deploy_dir().join("Dockerfile")).unwrap();
    assert_eq!(
        text.matches("\nFROM ").count() + usize::from(text.starts_with("FROM ")),
        2
    );
    assert!(text.contains("-p soulbased"));
    assert!(text.contains("USER 10001"));
}
