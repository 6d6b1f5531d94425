//! The files `soulbase init` writes: a configuration and one working skill per
//! provider kind (builtin, http with its example service, wasm, process).
//!
//! The templates live in the crate's `scaffold/` directory (the WASM skill is the
//! repository's own `skills/text-length`); `@NAME@` placeholders are filled from
//! [`Params`].

/// What the templates are filled with.
#[derive(Debug, Clone)]
pub struct Params {
    /// The tenant the configuration allows and grants (a valid tenant id).
    pub tenant: String,
    /// The development identity's actor (a valid actor id).
    pub actor: String,
    /// The loopback port of the HTTP skill's example service.
    pub service_port: u16,
    /// The absolute real path of the native skill's script (`proc` grants name it).
    pub native_command: String,
}

/// One file of the scaffold.
#[derive(Debug, Clone)]
pub struct ScaffoldFile {
    /// Its path, relative to the project directory.
    pub path: &'static str,
    /// What it is, for the summary `init` prints.
    pub what: &'static str,
    /// Its contents.
    pub text: String,
    /// Whether it is a program (mode 0755, else 0644).
    pub executable: bool,
}

/// The native skill's script, relative to the project directory.
pub const NATIVE_SCRIPT: &str = "skills/hello-native/hello.sh";

/// The tools the scaffold's skills provide, one per provider kind: (kind, tool id,
/// example arguments).
pub const TOOLS: [(&str, &str, &str); 4] = [
    ("builtin", "skills.greet.greet", r#"{"name": "Ada"}"#),
    ("http", "skills.hello-http.hello-http", r#"{"name": "Ada"}"#),
    ("wasm", "skills.text-length.count", r#"{"text": "héllo"}"#),
    ("process", "skills.hello-native.hello", r#"{"name": "Ada"}"#),
];

const CONFIG: &str = include_str!("../scaffold/config.yaml");
const GREET: &str = include_str!("../scaffold/skills/greet.yaml");
const HELLO_HTTP: &str = include_str!("../scaffold/skills/hello-http.yaml");
const HELLO_SERVICE: &str = include_str!("../scaffold/services/hello_service.py");
const TEXT_LENGTH: &str = include_str!("../../../skills/text-length/SKILL.md");
const TEXT_LENGTH_WAT: &str = include_str!("../../../skills/text-length/text_length.wat");
const NATIVE_SKILL: &str = include_str!("../scaffold/skills/hello-native/SKILL.md");
const NATIVE_SCRIPT_TEXT: &str = include_str!("../scaffold/skills/hello-native/hello.sh");

/// Every file: (path relative to the project, what it is, template, executable).
const FILES: [(&str, &str, &str, bool); 8] = [
    (
        "config.yaml",
        "server, policy and sandbox grants (development identity: remove for production)",
        CONFIG,
        false,
    ),
    (
        "skills/greet.yaml",
        "builtin skill: the echo handler",
        GREET,
        false,
    ),
    (
        "skills/hello-http.yaml",
        "http skill: calls the example service",
        HELLO_HTTP,
        false,
    ),
    (
        "services/hello_service.py",
        "the http skill's example service (Python 3, standard library)",
        HELLO_SERVICE,
        true,
    ),
    (
        "skills/text-length/SKILL.md",
        "wasm skill: counts characters",
        TEXT_LENGTH,
        false,
    ),
    (
        "skills/text-length/text_length.wat",
        "its WebAssembly module (text format)",
        TEXT_LENGTH_WAT,
        false,
    ),
    (
        "skills/hello-native/SKILL.md",
        "process skill: a native tool",
        NATIVE_SKILL,
        false,
    ),
    (NATIVE_SCRIPT, "its script", NATIVE_SCRIPT_TEXT, true),
];

/// The paths of the scaffold's files, relative to the project directory.
pub fn paths() -> impl Iterator<Item = &'static str> {
    FILES.iter().map(|(path, ..)| *path)
}

/// `template` with its placeholders filled.
fn fill(template: &str, p: &Params) -> String {
    // A JSON string is a valid YAML double-quoted scalar: any path stays one string.
    let command = serde_json::Value::String(p.native_command.clone()).to_string();
    template
        .replace("@TENANT@", &p.tenant)
        .replace("@ACTOR@", &p.actor)
        .replace("@SERVICE_PORT@", &p.service_port.to_string())
        .replace("@NATIVE_COMMAND@", &command)
}

/// Every file of the scaffold, filled.
pub fn files(p: &Params) -> Vec<ScaffoldFile> {
    FILES
        .iter()
        .map(|&(path, what, template, executable)| ScaffoldFile {
            path,
            what,
            text: fill(template, p),
            executable,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Params {
        Params {
            tenant: "acme".into(),
            actor: "alice".into(),
            service_port: 9123,
            native_command: "/srv/my \"project\"/skills/hello-native/hello.sh".into(),
        }
    }

    #[test]
    fn every_placeholder_is_filled() {
        for f in files(&params()) {
            for name in ["@TENANT@", "@ACTOR@", "@SERVICE_PORT@", "@NATIVE_COMMAND@"] {
                assert!(!f.text.contains(name), "{}: {name}", f.path);
            }
        }
    }

    #[test]
    fn the_configuration_loads_and_names_the_parameters() {
        let config = files(&params())
            .into_iter()
            .find(|f| f.path == "config.yaml")
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, &config.text).unwrap();
        let snapshot = soulbase_config::ConfigLoader::new()
            .with_file(&path)
            .load()
            .unwrap();
        let c = snapshot.config();
        assert!(c.server.dev_insecure);
        let id = c.server.dev_identity.as_ref().unwrap();
        assert_eq!((id.tenant.as_str(), id.actor.as_str()), ("acme", "alice"));
        assert_eq!(c.policy.rules[0].tenant, "acme");
        let grant = serde_json::to_string(&c.sandbox.grants[0]).unwrap();
        assert!(grant.contains("9123"), "{grant}");
        assert!(grant.contains(r#"/srv/my \"project\"/skills"#), "{grant}");
    }

    #[test]
    fn every_tool_is_in_a_skill() {
        let all: String = files(&params()).into_iter().map(|f| f.text).collect();
        for (_, id, _) in TOOLS {
            let skill = id.split('.').nth(1).unwrap();
            assert!(all.contains(&format!("name: {skill}")), "{id}");
        }
    }
}
