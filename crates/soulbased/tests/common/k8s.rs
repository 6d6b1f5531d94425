//! What `deploy/` ships, read the way the platform reads it: the Dockerfile's
//! runtime stage (`ENV`, `WORKDIR`, `USER`, `COPY`) and each kustomize overlay
//! rendered (resources, bases, strategic-merge patches, `namespace`, `labels`,
//! `images`). Used by the static checks (`deploy.rs`), the boot tests (`boot.rs`)
//! and the schema and IaC scans (`deploy_scan.rs`).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// The repository's `deploy/` directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The repository root.
pub fn repo_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One YAML document.
pub fn load(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The strategic-merge key of a list field (the ones these manifests patch).
fn merge_key(field: &str) -> &'static str {
    match field {
        "volumeMounts" => "mountPath",
        "ports" => "containerPort",
        _ => "name",
    }
}

/// Applies a strategic-merge patch: maps merge, keyed lists merge by their key
/// (`$patch: delete` removes an element), anything else is replaced.
pub fn merge(base: &mut Value, patch: &Value, field: &str) {
    let key = merge_key(field);
    let keyed = |p: &[Value]| !p.is_empty() && p.iter().all(|e| !e[key].is_null());
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, pv) in p {
                match b.get_mut(k) {
                    Some(bv) => merge(bv, pv, k),
                    None => {
                        b.insert(k.clone(), pv.clone());
                    }
                }
            }
        }
        (Value::Array(b), Value::Array(p)) if keyed(p.as_slice()) => {
            for pe in p {
                if pe["$patch"] == "delete" {
                    let before = b.len();
                    b.retain(|e| e[key] != pe[key]);
                    assert!(
                        b.len() < before,
                        "$patch: delete of {field} {} matches nothing",
                        pe[key]
                    );
                } else if let Some(be) = b.iter_mut().find(|e| e[key] == pe[key]) {
                    merge(be, pe, "");
                } else {
                    b.push(pe.clone());
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

/// Kinds kustomize leaves without a namespace.
const CLUSTER_SCOPED: [&str; 4] = [
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
];

/// The kustomization keys this renderer implements; any other key fails the
/// render, so a manifest using a feature it does not know cannot pass unseen.
const KNOWN_KEYS: [&str; 7] = [
    "apiVersion",
    "kind",
    "namespace",
    "labels",
    "resources",
    "patches",
    "images",
];

/// The documents of a kustomization directory and its bases, recursively, with
/// its patches, namespace, labels and image overrides applied (each patch must
/// target a document by kind and name).
pub fn render(dir: &Path) -> Vec<(PathBuf, Value)> {
    let kust = load(&dir.join("kustomization.yaml"));
    for k in kust.as_object().unwrap().keys() {
        assert!(
            KNOWN_KEYS.contains(&k.as_str()),
            "{}: kustomization key {k} is not implemented by the test renderer",
            dir.display()
        );
    }
    let name_of = |r: &Value| {
        r.as_str()
            .or_else(|| r["path"].as_str())
            .unwrap()
            .to_owned()
    };
    let mut out = Vec::new();
    for r in kust["resources"].as_array().into_iter().flatten() {
        let f = name_of(r);
        let path = dir.join(&f);
        assert!(path.exists(), "{} lists missing {f}", dir.display());
        if path.is_dir() {
            out.extend(render(&path));
        } else {
            out.push((path.clone(), load(&path)));
        }
    }
    for r in kust["patches"].as_array().into_iter().flatten() {
        let f = name_of(r);
        let path = dir.join(&f);
        assert!(path.exists(), "{} lists missing patch {f}", dir.display());
        let patch = load(&path);
        let target = out
            .iter_mut()
            .find(|(_, d)| {
                d["kind"] == patch["kind"] && d["metadata"]["name"] == patch["metadata"]["name"]
            })
            .unwrap_or_else(|| panic!("{}: the patch targets no resource", path.display()));
        merge(&mut target.1, &patch, "");
    }
    if let Some(ns) = kust["namespace"].as_str() {
        for (_, d) in &mut out {
            if !CLUSTER_SCOPED.contains(&d["kind"].as_str().unwrap_or_default()) {
                d["metadata"]["namespace"] = Value::from(ns);
            }
        }
    }
    for l in kust["labels"].as_array().into_iter().flatten() {
        assert!(
            l["includeSelectors"] != true && l["includeTemplates"] != true,
            "{}: only metadata labels are implemented",
            dir.display()
        );
        for (_, d) in &mut out {
            let labels = &mut d["metadata"]["labels"];
            if labels.is_null() {
                *labels = Value::Object(Map::new());
            }
            for (k, v) in l["pairs"].as_object().unwrap() {
                labels[k] = v.clone();
            }
        }
    }
    for img in kust["images"].as_array().into_iter().flatten() {
        let name = img["name"].as_str().unwrap();
        let mut hits = 0;
        for (_, d) in &mut out {
            let Some(spec) = d.pointer_mut("/spec/template/spec") else {
                continue;
            };
            for list in ["containers", "initContainers"] {
                let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) else {
                    continue;
                };
                for c in containers {
                    let image = c["image"].as_str().unwrap_or_default();
                    let (repo, _) = split_image(image);
                    if repo != name {
                        continue;
                    }
                    let new = img["newName"].as_str().unwrap_or(name);
                    let image = if let Some(digest) = img["digest"].as_str() {
                        format!("{new}@{digest}")
                    } else if let Some(tag) = img["newTag"].as_str() {
                        format!("{new}:{tag}")
                    } else {
                        format!("{new}{}", &image[repo.len()..])
                    };
                    c["image"] = Value::from(image);
                    hits += 1;
                }
            }
        }
        assert!(
            hits > 0,
            "{}: image {name} matches no container",
            dir.display()
        );
    }
    out
}

/// `repo[:tag][@digest]` → (repo, rest).
pub fn split_image(image: &str) -> (&str, &str) {
    let end = image.find('@').unwrap_or(image.len());
    let name_part = &image[..end];
    let slash = name_part.rfind('/').map_or(0, |i| i + 1);
    let repo_end = name_part[slash..].find(':').map_or(end, |i| slash + i);
    (&image[..repo_end], &image[repo_end..])
}

/// The runtime stage of `deploy/Dockerfile`, as the container runtime applies it.
#[derive(Debug, Clone, Default)]
pub struct Image {
    /// `ENV`, in order.
    pub env: Vec<(String, String)>,
    /// `WORKDIR` (the last one).
    pub workdir: Option<String>,
    /// `USER` as `uid[:gid]`.
    pub user: Option<(u32, Option<u32>)>,
    /// `COPY src dst` from the build context (not `--from` another stage).
    pub copies: Vec<(String, String)>,
    /// Home directories created for the image's user (`useradd --home-dir X --create-home`).
    pub homes: Vec<String>,
    /// `ENTRYPOINT` (exec form).
    pub entrypoint: Vec<String>,
}

/// Joins `\`-continued lines into instructions.
fn instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim_end();
        if cur.is_empty() && (t.trim_start().starts_with('#') || t.trim().is_empty()) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
        } else {
            cur.push_str(t);
            out.push(std::mem::take(&mut cur));
        }
    }
    out
}

/// Parses the last stage of the Dockerfile.
pub fn image() -> Image {
    let text = std::fs::read_to_string(deploy_dir().join("Dockerfile")).unwrap();
    let all = instructions(&text);
    let start = all
        .iter()
        .rposition(|i| i.starts_with("FROM "))
        .expect("the Dockerfile has a FROM");
    let mut img = Image::default();
    for i in &all[start + 1..] {
        let (op, rest) = i.split_once(' ').unwrap_or((i.as_str(), ""));
        let rest = rest.trim();
        match op {
            "ENV" => {
                for kv in rest.split_whitespace() {
                    let (k, v) = kv
                        .split_once('=')
                        .unwrap_or_else(|| panic!("ENV {kv}: only the key=value form is read"));
                    img.env.push((k.to_owned(), v.trim_matches('"').to_owned()));
                }
            }
            "WORKDIR" => img.workdir = Some(rest.to_owned()),
            "USER" => {
                let (u, g) = match rest.split_once(':') {
                    Some((u, g)) => (u, Some(g.parse().expect("USER gid is numeric"))),
                    None => (rest, None),
                };
                img.user = Some((u.parse().expect("USER is a numeric uid"), g));
            }
            "COPY" => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                if words.iter().any(|w| w.starts_with("--from")) {
                    continue;
                }
                let words: Vec<&str> = words.into_iter().filter(|w| !w.starts_with("--")).collect();
                assert_eq!(words.len(), 2, "COPY {rest}: one source is read");
                img.copies.push((words[0].to_owned(), words[1].to_owned()));
            }
            "RUN" if rest.contains("useradd") && rest.contains("--create-home") => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                if let Some(p) = words.iter().position(|w| *w == "--home-dir") {
                    img.homes.push(words[p + 1].to_owned());
                }
            }
            "ENTRYPOINT" => {
                img.entrypoint = serde_json::from_str(rest).expect("ENTRYPOINT in exec form");
            }
            _ => {}
        }
    }
    assert!(!img.env.is_empty(), "the Dockerfile sets no ENV");
    img
}

/// Rendered documents of kind `kind`.
pub fn of_kind<'a>(docs: &'a [(PathBuf, Value)], kind: &'a str) -> impl Iterator<Item = &'a Value> {
    docs.iter()
        .map(|(_, d)| d)
        .filter(move |d| d["kind"] == kind)
}

/// The rendered document `kind`/`name`.
pub fn find<'a>(docs: &'a [(PathBuf, Value)], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .map(|(_, d)| d)
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// Whether `selector` (`matchLabels` or a Service selector) selects pods labelled `labels`.
pub fn selects(selector: &Value, labels: &Value) -> bool {
    let Some(sel) = selector.as_object() else {
        return false;
    };
    !sel.is_empty() && sel.iter().all(|(k, v)| labels[k] == *v)
}

/// The files a ConfigMap or Secret volume places, relative to its mount path:
/// every key, or only `items` at their `path`s. Secret values are decoded.
pub fn volume_files(volume: &Value, source: &Value) -> Vec<(String, Vec<u8>)> {
    let mut data: Vec<(String, Vec<u8>)> = Vec::new();
    for field in ["data", "stringData", "binaryData"] {
        for (k, v) in source[field].as_object().into_iter().flatten() {
            let text = v.as_str().unwrap();
            let secret_data = source["kind"] == "Secret" && field == "data";
            let bytes = if secret_data || field == "binaryData" {
                base64_decode(text)
            } else {
                text.as_bytes().to_vec()
            };
            data.push((k.clone(), bytes));
        }
    }
    let items = volume["configMap"]["items"]
        .as_array()
        .or_else(|| volume["secret"]["items"].as_array());
    match items {
        None => data,
        Some(items) => items
            .iter()
            .map(|i| {
                let key = i["key"].as_str().unwrap();
                let bytes = data
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, b)| b.clone())
                    .unwrap_or_else(|| {
                        panic!(
                            "{}: items name key {key}, which it does not have",
                            source["metadata"]["name"]
                        )
                    });
                (i["path"].as_str().unwrap().to_owned(), bytes)
            })
            .collect(),
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c).expect("base64") as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}
