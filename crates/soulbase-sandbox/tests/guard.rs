//! The guard on a real file system (the path escape corpus) and `LocalSandbox`
//! dispatch to plugged-in executors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_sandbox::{
    BuiltinExecutor, Capability, ExecOutput, ExecRequest, Executor, FsAccess, LocalSandbox,
    Operation, Profile, ProviderBinding, ProviderKind, Sandbox, handler_fn,
};
use soulbase_types::{CallId, TenantId, ToolId};

fn fs(path: &Path, access: &[FsAccess]) -> Capability {
    Capability::Fs {
        paths: vec![path.to_string_lossy().into_owned()],
        access: access.iter().copied().collect(),
    }
}

fn read(p: &Path) -> Operation<'_> {
    Operation::Fs {
        path: p,
        access: FsAccess::Read,
    }
}

fn blocked(r: Result<(), SoulError>) -> bool {
    r.is_err_and(|e| e.code() == ErrorCode::SandboxCapabilityBlocked)
}

#[test]
fn path_escape_corpus() {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().canonicalize().unwrap();
    let data = root.join("data");
    let database = root.join("database");
    std::fs::create_dir_all(data.join("sub")).unwrap();
    std::fs::create_dir_all(&database).unwrap();
    std::fs::write(data.join("ok.txt"), "").unwrap();
    std::fs::write(database.join("x.txt"), "").unwrap();
    std::fs::write(root.join("secret.txt"), "").unwrap();
    std::os::unix::fs::symlink(root.join("secret.txt"), data.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(&root, data.join("up")).unwrap();
    let p = Profile::new(vec![fs(&data, &[FsAccess::Read])]);

    assert!(p.check(&read(&data.join("ok.txt")), None).is_ok());
    assert!(p.check(&read(&data.join("sub/../ok.txt")), None).is_ok());
    // A file that does not exist yet below a granted directory.
    assert!(p.check(&read(&data.join("sub/new.txt")), None).is_ok());
    // `/data` does not cover `/database`.
    assert!(blocked(p.check(&read(&database.join("x.txt")), None)));
    assert!(blocked(p.check(&read(&database), None)));
    // `..` escapes, existing or not.
    assert!(blocked(p.check(&read(&data.join("../secret.txt")), None)));
    assert!(blocked(
        p.check(&read(&data.join("sub/../../secret.txt")), None)
    ));
    assert!(blocked(
        p.check(&read(&data.join("nope/../../secret.txt")), None)
    ));
    // Symlinks out of the granted directory.
    assert!(blocked(p.check(&read(&data.join("link.txt")), None)));
    assert!(blocked(p.check(&read(&data.join("up/secret.txt")), None)));
    assert!(blocked(
        p.check(&read(&data.join("up/database/x.txt")), None)
    ));
    // Access kinds are separate.
    let write = Operation::Fs {
        path: &data.join("ok.txt"),
        access: FsAccess::Write,
    };
    assert!(blocked(p.check(&write, None)));
}

#[test]
fn relative_grants_resolve_against_the_sandbox_root() {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().canonicalize().unwrap();
    std::fs::create_dir_all(root.join("data")).unwrap();
    let p = Profile::new(vec![Capability::Fs {
        paths: vec!["data".into()],
        access: [FsAccess::Read].into(),
    }]);
    assert!(p.check(&read(Path::new("data/a.txt")), Some(&root)).is_ok());
    assert!(blocked(p.check(&read(Path::new("../x")), Some(&root))));
    // Without a root a relative grant grants nothing and a relative path is refused.
    assert!(blocked(p.check(&read(&root.join("data/a.txt")), None)));
    assert!(blocked(p.check(&read(Path::new("data/a.txt")), None)));
    assert_eq!(p.fs_grants(Some(&root))[0].path, root.join("data"));
}

struct Counting(AtomicUsize);

#[async_trait]
impl Executor for Counting {
    fn guard(&self, _req: &ExecRequest<'_>) -> Result<(), SoulError> {
        Ok(())
    }
    async fn execute(&self, req: ExecRequest<'_>) -> Result<ExecOutput, SoulError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(ExecOutput::value(
            json!({"kind": req.provider.kind().as_str()}),
        ))
    }
}

#[tokio::test]
async fn local_sandbox_dispatches_by_kind_and_guards_first() {
    let builtin = BuiltinExecutor::new();
    builtin.register("echo", handler_fn(|a| async move { Ok(a) }));
    let wasm = Arc::new(Counting(AtomicUsize::new(0)));
    let sb = LocalSandbox::new(builtin).with_executor(ProviderKind::Wasm, wasm.clone());
    let (call_id, tenant, tool) = (
        CallId::generate(),
        TenantId::new("t").unwrap(),
        ToolId::new("a.b.c").unwrap(),
    );
    let empty = Profile::new(vec![]);
    let req = |provider: &'static ProviderBinding, profile: &'static Profile| ExecRequest {
        call_id: Box::leak(Box::new(call_id.clone())),
        tenant: Box::leak(Box::new(tenant.clone())),
        tool: Box::leak(Box::new(tool.clone())),
        provider,
        args: json!({"x": 1}),
        profile,
        timeout: Duration::from_secs(1),
        max_bytes_out: None,
        max_memory_bytes: None,
        max_processes: None,
        max_files: None,
        reporter: soulbase_sandbox::Reporter::none(),
    };
    let empty: &'static Profile = Box::leak(Box::new(empty));
    let builtin_b: &'static ProviderBinding = Box::leak(Box::new(ProviderBinding::Builtin {
        handler: Some("echo".into()),
    }));
    let out = sb.execute(req(builtin_b, empty)).await.unwrap();
    assert_eq!(out.output, json!({"x": 1}));

    let wasm_b: &'static ProviderBinding = Box::leak(Box::new(ProviderBinding::Wasm {
        module: "m.wasm".into(),
        sha256: "ab".repeat(32),
    }));
    sb.guard(&req(wasm_b, empty)).unwrap();
    assert_eq!(
        sb.execute(req(wasm_b, empty)).await.unwrap().output,
        json!({"kind": "wasm"})
    );
    assert_eq!(wasm.0.load(Ordering::SeqCst), 1);

    // No process executor plugged in: unavailable. Not granted: blocked first.
    let proc_b: &'static ProviderBinding = Box::leak(Box::new(ProviderBinding::Process {
        command: "/bin/true".into(),
        args: vec![],
    }));
    let e = sb.guard(&req(proc_b, empty)).unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked);
    let granted: &'static Profile = Box::leak(Box::new(Profile::new(vec![Capability::Proc {
        commands: vec!["/bin/true".into()],
    }])));
    let e = sb.guard(&req(proc_b, granted)).unwrap_err();
    assert_eq!(e.code(), ErrorCode::ProviderUnavailable);
    let e = sb.execute(req(proc_b, granted)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::ProviderUnavailable);
}
