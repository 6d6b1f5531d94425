//! Validates `deploy/`: every YAML parses, every kustomization resource exists,
//! and every ConfigMap, Secret and named port a workload references is defined.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn load(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The documents of a kustomization directory and its bases, recursively.
fn documents(dir: &Path, out: &mut Vec<(PathBuf, Value)>) {
    let kust = load(&dir.join("kustomization.yaml"));
    let mut files: Vec<String> = Vec::new();
    for key in ["resources", "patches"] {
        for r in kust[key].as_array().into_iter().flatten() {
            let name = r
                .as_str()
                .or_else(|| r["path"].as_str())
                .unwrap()
                .to_owned();
            files.push(name);
        }
    }
    for f in files {
        let path = dir.join(&f);
        assert!(path.exists(), "{} lists missing {f}", dir.display());
        if path.is_dir() {
            documents(&path, out);
        } else {
            out.push((path.clone(), load(&path)));
        }
    }
}

fn check_overlay(name: &str) {
    let dir = deploy_dir().join("k8s/overlays").join(name);
    let mut docs = Vec::new();
    documents(&dir, &mut docs);
    let defined = |kind: &str| -> BTreeSet<String> {
        docs.iter()
            .filter(|(_, d)| d["kind"] == kind)
            .map(|(_, d)| d["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let config_maps = defined("ConfigMap");
    let secrets = defined("Secret");
    let mut container_ports = BTreeSet::new();
    for (path, d) in docs.iter().filter(|(_, d)| d["kind"] == "Deployment") {
        let spec = &d["spec"]["template"]["spec"];
        if spec.is_null() {
            continue; // a patch without a pod spec
        }
        for v in spec["volumes"].as_array().into_iter().flatten() {
            if let Some(cm) = v["configMap"]["name"].as_str() {
                assert!(
                    config_maps.contains(cm),
                    "{}: ConfigMap {cm} is not defined",
                    path.display()
                );
            }
            if let Some(s) = v["secret"]["secretName"].as_str() {
                assert!(
                    secrets.contains(s),
                    "{}: Secret {s} is not defined",
                    path.display()
                );
            }
        }
        for c in spec["containers"].as_array().into_iter().flatten() {
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
            for e in c["envFrom"].as_array().into_iter().flatten() {
                if let Some(s) = e["secretRef"]["name"].as_str() {
                    assert!(
                        secrets.contains(s),
                        "{}: Secret {s} is not defined",
                        path.display()
                    );
                }
                if let Some(cm) = e["configMapRef"]["name"].as_str() {
                    assert!(
                        config_maps.contains(cm),
                        "{}: ConfigMap {cm} undefined",
                        path.display()
                    );
                }
            }
            container_ports.extend(ports);
        }
    }
    for (path, d) in docs.iter().filter(|(_, d)| d["kind"] == "Service") {
        for p in d["spec"]["ports"].as_array().into_iter().flatten() {
            if let Some(t) = p["targetPort"].as_str() {
                assert!(
                    container_ports.contains(t),
                    "{}: targetPort {t} undefined",
                    path.display()
                );
            }
        }
    }
    // The embedded configuration is a valid soulbased configuration.
    let cfg = docs
        .iter()
        .find(|(_, d)| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "soulbase-config")
        .map(|(_, d)| d["data"]["config.yaml"].as_str().unwrap().to_owned())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, cfg).unwrap();
    let secret = docs
        .iter()
        .find(|(_, d)| d["kind"] == "Secret")
        .map(|(_, d)| d["stringData"].as_object().unwrap().clone())
        .unwrap();
    let env: Vec<(String, String)> = secret
        .into_iter()
        .map(|(k, v)| (k, v.as_str().unwrap().to_owned()))
        .collect();
    let loaded = soulbase_config::ConfigLoader::new()
        .with_file(&file)
        .with_env(env)
        .load();
    assert!(loaded.is_ok(), "{name}: {:?}", loaded.err());
}

#[test]
fn all_in_one_overlay_is_consistent() {
    check_overlay("all-in-one");
}

#[test]
fn split_roles_overlay_is_consistent() {
    check_overlay("split-roles");
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
