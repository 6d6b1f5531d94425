//! The harness the process executor's tests share: the fixture tool, profiles and
//! one call through a `LocalSandbox`.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use soulbase_errors::SoulError;
use soulbase_sandbox::{
    BuiltinExecutor, Capability, ExecOutput, ExecRequest, FsAccess, LocalSandbox, Profile,
    ProviderBinding, ProviderKind, Sandbox,
};
use soulbase_sandbox_process::{ProcessExecutor, ProcessOptions};
use soulbase_types::{CallId, TenantId, ToolId};

/// The environment variable naming a copy of the fixture tool to use instead of the
/// one Cargo built (the escape corpus re-run as `nobody` uses a copy it can reach).
pub const TOOL_ENV: &str = "SOULBASE_FIXTURE_TOOL";

/// The native fixture tool (`fixtures/process/fixture_tool.rs`), or the copy
/// [`TOOL_ENV`] names.
pub fn tool() -> &'static str {
    static TOOL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOOL.get_or_init(|| {
        std::env::var(TOOL_ENV)
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_soulbase-sandbox-fixture").to_owned())
    })
}
/// A timeout no healthy call comes near.
pub const T: Duration = Duration::from_secs(10);

/// A sandbox whose process executor has `options`.
pub fn sandbox(options: ProcessOptions) -> LocalSandbox {
    LocalSandbox::new(BuiltinExecutor::new()).with_executor(
        ProviderKind::Process,
        Arc::new(ProcessExecutor::new(options)),
    )
}

/// A profile granting the fixture itself and `extra`.
pub fn proc_only(extra: Vec<Capability>) -> Profile {
    let mut caps = vec![Capability::Proc {
        commands: vec![tool().into()],
    }];
    caps.extend(extra);
    Profile::new(caps)
}

/// An `fs` grant of `path` with `access`.
pub fn fs(path: &Path, access: &[FsAccess]) -> Capability {
    Capability::Fs {
        paths: vec![path.to_string_lossy().into_owned()],
        access: access.iter().copied().collect(),
    }
}

/// One call of the fixture through `sb`, guard first.
pub async fn call(
    sb: &LocalSandbox,
    profile: &Profile,
    args: Value,
    timeout: Duration,
    max_out: Option<u64>,
) -> Result<ExecOutput, SoulError> {
    call_with_max_files(sb, profile, args, timeout, max_out, None).await
}

/// Like [`call`], with the manifest's `limits.max_files`.
pub async fn call_with_max_files(
    sb: &LocalSandbox,
    profile: &Profile,
    args: Value,
    timeout: Duration,
    max_out: Option<u64>,
    max_files: Option<u32>,
) -> Result<ExecOutput, SoulError> {
    let provider = ProviderBinding::Process {
        command: tool().into(),
        args: vec![],
    };
    let call_id = CallId::generate();
    let tenant = TenantId::new("t1").unwrap();
    let tool = ToolId::new("demo.proc.fixture").unwrap();
    let req = ExecRequest {
        call_id: &call_id,
        tenant: &tenant,
        tool: &tool,
        provider: &provider,
        args,
        profile,
        timeout,
        max_bytes_out: max_out,
        max_memory_bytes: None,
        max_processes: None,
        max_files,
        reporter: soulbase_sandbox::Reporter::none(),
    };
    sb.guard(&req)?;
    sb.execute(req).await
}

/// One call with the default options.
pub async fn run(
    profile: &Profile,
    args: Value,
    timeout: Duration,
    max_out: Option<u64>,
) -> Result<ExecOutput, SoulError> {
    call(
        &sandbox(ProcessOptions::default()),
        profile,
        args,
        timeout,
        max_out,
    )
    .await
}

/// The fixture's answer to a call that must succeed.
pub async fn ok(profile: &Profile, args: Value) -> Value {
    run(profile, args, T, None).await.unwrap().output
}

/// Whether the fixture reported a file-system refusal: denied by Landlock, absent
/// from the tool's mount tree, or on its read-only root.
pub fn refused(v: &Value) -> bool {
    matches!(
        v["error"].as_str(),
        Some("PermissionDenied" | "NotFound" | "ReadOnlyFilesystem")
    )
}

/// Whether some live process has `marker` among its arguments.
pub fn marked_process_alive(marker: &str) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        let p = e.path();
        let cmdline = std::fs::read(p.join("cmdline")).unwrap_or_default();
        let has = cmdline
            .split(|b| *b == 0)
            .any(|arg| arg == marker.as_bytes());
        let zombie = std::fs::read_to_string(p.join("stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true);
        has && !zombie
    })
}

/// Makes `path` usable by the tool user a root server runs tools as (`nobody`):
/// granted paths must be accessible to it, as `docs/sandbox.md` says.
pub fn open_to_tools(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}
