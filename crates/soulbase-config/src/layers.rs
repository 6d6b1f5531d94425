//! Merging the layers into one tree, then into a typed [`Config`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::snapshot::ConfigSnapshot;
use crate::{Config, ConfigError, ConfigProblem};

/// The development preset: trusted identity headers, a default identity (`dev` /
/// `dev`), every tool allowed to tenant `dev`, and what the repository's example
/// skills need. Layered between the defaults and the file by
/// [`ConfigLoader::with_dev_preset`].
pub const DEV_PRESET: &str = include_str!("dev.yaml");

/// The environment variable naming the config file.
const CONFIG_FILE_VAR: &str = "SOULBASE_CONFIG";
/// The prefix of environment overrides: `SOULBASE_SKILLS__DIR` sets `skills.dir`.
const ENV_PREFIX: &str = "SOULBASE_";

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Built-in default.
    Default,
    /// A named preset (the development preset of `--dev`).
    Preset(&'static str),
    /// The config file at this path.
    File(PathBuf),
    /// An environment variable.
    Env(String),
    /// A command-line flag.
    Flag(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("defaults"),
            Source::Preset(name) => write!(f, "preset {name}"),
            Source::File(p) => write!(f, "{}", p.display()),
            Source::Env(v) => write!(f, "environment {v}"),
            Source::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// Collects the layers and loads them into a [`ConfigSnapshot`].
///
/// Build one at start-up (capturing the environment and flags once) and keep it: the
/// watcher re-runs it when the file changes, so environment and flags keep
/// overriding the file across reloads.
#[derive(Debug, Clone, Default)]
pub struct ConfigLoader {
    checks: Vec<ConfigCheck>,
    preset: Option<(&'static str, &'static str)>,
    file: Option<PathBuf>,
    file_required: bool,
    env: Vec<(String, String)>,
    flags: Vec<(String, String, String)>,
}

/// A check a layer above adds to every load (e.g. that the sandbox grants compile,
/// which this crate cannot judge): `(field path, problem)` for each problem.
#[derive(Clone)]
pub struct ConfigCheck(std::sync::Arc<CheckFn>);

/// The function of a [`ConfigCheck`].
type CheckFn = dyn Fn(&Config) -> Vec<(String, String)> + Send + Sync;

impl fmt::Debug for ConfigCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ConfigCheck")
    }
}

impl ConfigLoader {
    /// Adds `check` to every load, after the model's own validation: a snapshot
    /// it finds problems in is refused like any invalid file — at start-up, by the
    /// watcher and by an explicit reload alike — each problem naming its field and
    /// the layer that set it.
    pub fn with_check(
        mut self,
        check: impl Fn(&Config) -> Vec<(String, String)> + Send + Sync + 'static,
    ) -> Self {
        self.checks.push(ConfigCheck(std::sync::Arc::new(check)));
        self
    }

    /// A loader with no file, no environment and no flags: defaults only.
    pub fn new() -> Self {
        Self::default()
    }

    /// The usual set-up for a binary: the process environment, and the file named by
    /// `SOULBASE_CONFIG` (required to exist) or `./config.yaml` (used if present).
    pub fn from_process_env() -> Self {
        let env: Vec<(String, String)> = std::env::vars().collect();
        let named = env
            .iter()
            .find(|(k, _)| k == CONFIG_FILE_VAR)
            .map(|(_, v)| PathBuf::from(v));
        let loader = Self::new().with_env(env);
        match named {
            Some(path) => loader.with_file(path),
            None => loader.with_optional_file("config.yaml"),
        }
    }

    /// Adds the development preset ([`DEV_PRESET`]) as a layer between the defaults
    /// and the file, under the name `flag` (what the user typed, e.g. `--dev`).
    pub fn with_dev_preset(mut self, flag: &'static str) -> Self {
        self.preset = Some((flag, DEV_PRESET));
        self
    }

    /// Whether the development preset is layered in.
    pub fn has_dev_preset(&self) -> bool {
        self.preset.is_some()
    }

    /// Reads `path` as the file layer; a missing file is an error.
    pub fn with_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.file = Some(path.into());
        self.file_required = true;
        self
    }

    /// Reads `path` as the file layer if it exists.
    pub fn with_optional_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.file = Some(path.into());
        self.file_required = false;
        self
    }

    /// Uses these variables as the environment layer (only `SOULBASE_*` and `SKILLS_DIR` count).
    pub fn with_env<K: Into<String>, V: Into<String>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.env = vars
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        self
    }

    /// Adds a `--set path=value` flag (highest precedence).
    pub fn with_flag(self, path: impl Into<String>, value: impl Into<String>) -> Self {
        let path = path.into();
        let label = format!("--set {path}");
        self.with_named_flag(label, path, value)
    }

    /// Adds a binary's own flag (e.g. `--skills-dir`) that sets `path`.
    pub fn with_named_flag(
        mut self,
        flag: impl Into<String>,
        path: impl Into<String>,
        value: impl Into<String>,
    ) -> Self {
        self.flags.push((path.into(), value.into(), flag.into()));
        self
    }

    /// The config file this loader reads, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Loads all layers.
    pub fn load(&self) -> Result<ConfigSnapshot, ConfigError> {
        let bytes = match &self.file {
            Some(path) => match std::fs::read(path) {
                Ok(b) => Some(b),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !self.file_required => None,
                Err(e) => {
                    return Err(ConfigError::one(
                        "",
                        path.display().to_string(),
                        format!("cannot read the file: {e}"),
                    ));
                }
            },
            None => None,
        };
        self.load_with_file_bytes(bytes.as_deref())
    }

    /// Loads all layers, taking the file layer's contents from `bytes`.
    pub(crate) fn load_with_file_bytes(
        &self,
        bytes: Option<&[u8]>,
    ) -> Result<ConfigSnapshot, ConfigError> {
        let mut tree = serde_json::to_value(Config::default()).map_err(|e| {
            ConfigError::one("", "defaults", format!("cannot encode defaults: {e}"))
        })?;
        let mut provenance: BTreeMap<String, Source> = BTreeMap::new();
        let mut sources = vec!["defaults".to_owned()];
        if let (Some(path), None, true) = (&self.file, bytes, self.file_required) {
            return Err(ConfigError::one(
                "",
                path.display().to_string(),
                "the file does not exist",
            ));
        }

        if let Some((name, yaml)) = self.preset {
            let source = Source::Preset(name);
            let preset = parse_yaml(yaml.as_bytes())
                .map_err(|m| ConfigError::one("", source.to_string(), m))?;
            merge(&mut tree, preset, "", &source, &mut provenance);
            sources.push(source.to_string());
        }
        if let (Some(path), Some(bytes)) = (&self.file, bytes) {
            let source = Source::File(path.clone());
            let file_tree =
                parse_yaml(bytes).map_err(|m| ConfigError::one("", source.to_string(), m))?;
            merge(&mut tree, file_tree, "", &source, &mut provenance);
            sources.push(source.to_string());
        }
        for (key, raw) in &self.env {
            let Some(path) = env_path(key, &tree) else {
                continue;
            };
            let source = Source::Env(key.clone());
            set_coerced(&mut tree, &path, raw, &source, &mut provenance);
            sources.push(source.to_string());
        }
        for (path, raw, flag) in &self.flags {
            let source = Source::Flag(flag.clone());
            set_coerced(&mut tree, path, raw, &source, &mut provenance);
            sources.push(source.to_string());
        }

        let config: Config = serde_path_to_error::deserialize(tree).map_err(|e| {
            let path = e.path().to_string();
            let path = if path == "." { String::new() } else { path };
            let source = source_of(&provenance, &path);
            ConfigError::one(path, source.to_string(), e.into_inner().to_string())
        })?;
        let mut config = config;
        let mut problems: Vec<ConfigProblem> = secret_files(&mut config)
            .into_iter()
            .map(|(path, message)| ConfigProblem {
                source: source_of(&provenance, &path).to_string(),
                path,
                message,
            })
            .collect();
        if !problems.is_empty() {
            return Err(ConfigError { problems });
        }
        problems = config
            .validate()
            .into_iter()
            .chain(self.checks.iter().flat_map(|c| (c.0)(&config)))
            .map(|(path, message)| ConfigProblem {
                source: source_of(&provenance, &path).to_string(),
                path,
                message,
            })
            .collect();
        if !problems.is_empty() {
            return Err(ConfigError { problems });
        }
        Ok(ConfigSnapshot::new(config, sources))
    }
}

/// Reads the secrets configured as files (`evidence.url_file`,
/// `quota.redis_url_file`) into their fields; returns (field, problem) for a
/// field set both ways or a file that cannot be read.
fn secret_files(config: &mut Config) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    let fields = [
        (
            "evidence.url",
            config.evidence.url_file.as_deref(),
            &mut config.evidence.url,
        ),
        (
            "quota.redis_url",
            config.quota.redis_url_file.as_deref(),
            &mut config.quota.redis_url,
        ),
    ];
    for (field, file, value) in fields {
        let Some(file) = file else { continue };
        if value.is_some() {
            problems.push((
                format!("{field}_file"),
                format!("set either {field} or {field}_file, not both"),
            ));
            continue;
        }
        match read_secret_file(file) {
            Ok(v) => *value = Some(v),
            Err(e) => problems.push((format!("{field}_file"), e)),
        }
    }
    problems
}

/// A secret held in a file: its text, surrounding whitespace trimmed; empty,
/// unreadable or not UTF-8 is an error naming the file (never its contents).
pub fn read_secret_file(file: &Path) -> Result<String, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let text =
        String::from_utf8(bytes).map_err(|_| format!("{} is not valid UTF-8", file.display()))?;
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("{} is empty", file.display()));
    }
    Ok(text.to_owned())
}

fn parse_yaml(bytes: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "the file is not valid UTF-8".to_owned())?;
    if text.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    let value: Value = serde_saphyr::from_str(text).map_err(|e| match e.location() {
        Some(loc) => format!("line {}, column {}: {e}", loc.line(), loc.column()),
        None => e.to_string(),
    })?;
    match value {
        Value::Null => Ok(Value::Object(Map::new())),
        Value::Object(_) => Ok(value),
        _ => Err("the top level must be a mapping of sections (server:, skills:, …)".into()),
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Deep-merges `over` into `base`: mappings merge key by key, anything else replaces.
fn merge(
    base: &mut Value,
    over: Value,
    prefix: &str,
    source: &Source,
    prov: &mut BTreeMap<String, Source>,
) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                let path = join(prefix, &k);
                match b.get_mut(&k) {
                    Some(slot) if slot.is_object() && v.is_object() => {
                        merge(slot, v, &path, source, prov)
                    }
                    _ => {
                        forget_below(prov, &path);
                        prov.insert(path, source.clone());
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => {
            forget_below(prov, prefix);
            prov.insert(prefix.to_owned(), source.clone());
            *slot = v;
        }
    }
}

fn forget_below(prov: &mut BTreeMap<String, Source>, path: &str) {
    prov.retain(|k, _| !is_under(k, path));
}

/// Whether `path` is `prefix` or lies below it (`a.b` is under `a`, `a.bc` is not).
pub(crate) fn is_under(path: &str, prefix: &str) -> bool {
    path == prefix
        || (path.starts_with(prefix)
            && matches!(path.as_bytes().get(prefix.len()), Some(b'.') | Some(b'[')))
}

/// The layer that set `path` (or its nearest ancestor); defaults when none did.
fn source_of<'a>(prov: &'a BTreeMap<String, Source>, path: &str) -> &'a Source {
    prov.iter()
        .filter(|(k, _)| is_under(path, k) || (!path.is_empty() && is_under(k, path)))
        .max_by_key(|(k, _)| k.len())
        .map(|(_, s)| s)
        .unwrap_or(&Source::Default)
}

/// Maps an environment variable to a config path, or `None` when it is not ours.
///
/// `SKILLS_DIR` → `skills.dir`; `SOULBASE_A__B` → `a.b` when `a` is a top-level key.
fn env_path(key: &str, tree: &Value) -> Option<String> {
    if key == "SKILLS_DIR" {
        return Some("skills.dir".into());
    }
    let rest = key.strip_prefix(ENV_PREFIX)?;
    let segments: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
    let top = segments.first()?;
    tree.get(top)?;
    Some(segments.join("."))
}

fn lookup<'a>(tree: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(tree, |v, seg| v.get(seg))
}

/// Interprets a string from the environment or a flag by the type of the value it replaces.
fn coerce(raw: &str, existing: Option<&Value>) -> Value {
    let text = || Value::String(raw.to_owned());
    match existing {
        Some(Value::Bool(_)) => match raw.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Value::Bool(true),
            "false" | "0" | "no" | "off" => Value::Bool(false),
            _ => text(),
        },
        Some(Value::Number(_)) => {
            let t = raw.trim();
            if let Ok(n) = t.parse::<u64>() {
                Value::from(n)
            } else if let Ok(n) = t.parse::<i64>() {
                Value::from(n)
            } else if let Ok(f) = t.parse::<f64>() {
                Value::from(f)
            } else {
                text()
            }
        }
        Some(Value::Array(_)) => {
            if raw.trim_start().starts_with('[') {
                serde_saphyr::from_str::<Value>(raw).unwrap_or_else(|_| text())
            } else {
                Value::Array(
                    raw.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(|s| Value::String(s.to_owned()))
                        .collect(),
                )
            }
        }
        Some(Value::Object(_)) => serde_saphyr::from_str::<Value>(raw).unwrap_or_else(|_| text()),
        _ => text(),
    }
}

fn set_coerced(
    tree: &mut Value,
    path: &str,
    raw: &str,
    source: &Source,
    prov: &mut BTreeMap<String, Source>,
) {
    let value = coerce(raw, lookup(tree, path));
    let mut slot = tree;
    for seg in path.split('.') {
        if !slot.is_object() {
            *slot = Value::Object(Map::new());
        }
        let Value::Object(map) = slot else { return };
        slot = map.entry(seg.to_owned()).or_insert(Value::Null);
    }
    *slot = value;
    forget_below(prov, path);
    prov.insert(path.to_owned(), source.clone());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_respects_component_boundaries() {
        assert!(is_under("quota.limits[0].rate", "quota.limits"));
        assert!(is_under("skills.dir", "skills"));
        assert!(!is_under("skillset", "skills"));
        assert!(is_under("skills", "skills"));
    }

    #[test]
    fn env_mapping() {
        let tree = serde_json::to_value(Config::default()).unwrap();
        assert_eq!(env_path("SKILLS_DIR", &tree).as_deref(), Some("skills.dir"));
        assert_eq!(
            env_path("SOULBASE_SERVER__GRPC_ADDR", &tree).as_deref(),
            Some("server.grpc_addr")
        );
        assert_eq!(
            env_path("SOULBASE_DATA_DIR", &tree).as_deref(),
            Some("data_dir")
        );
        assert_eq!(env_path("SOULBASE_TEST_PG_CTL", &tree), None);
        assert_eq!(env_path("HOME", &tree), None);
    }

    #[test]
    fn coercion_follows_the_replaced_type() {
        assert_eq!(coerce("on", Some(&Value::Bool(false))), Value::Bool(true));
        assert_eq!(coerce("42", Some(&Value::from(1))), Value::from(42));
        assert_eq!(
            coerce("a, b", Some(&Value::Array(vec![]))),
            serde_json::json!(["a", "b"])
        );
        assert_eq!(
            coerce("[1, 2]", Some(&Value::Array(vec![]))),
            serde_json::json!([1, 2])
        );
        assert_eq!(
            coerce("42", Some(&Value::String("x".into()))),
            Value::String("42".into())
        );
        assert_eq!(
            coerce("nope", Some(&Value::from(1))),
            Value::String("nope".into())
        );
    }
}
