//! The executor: plan the confinement from the profile, spawn, watch, collect.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::Value;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::SideEffectRecord;
use soulbase_sandbox::{
    ExecOutput, ExecRequest, Executor, Operation, Profile, ProviderBinding, Scratch,
};

use crate::confine::{BwrapConfinement, Confinement, Plan, bpf_bytes, interpreter, plan_seccomp};
use crate::sys;

/// Whether tools also run inside bubblewrap (`bwrap`) namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Bubblewrap {
    /// Never: Landlock + seccomp + rlimits only (the default).
    #[default]
    Off,
    /// When [`ProcessOptions::bwrap_path`] exists; otherwise the usual confinement,
    /// with a logged warning.
    Auto,
    /// Always: calls are refused with `PROVIDER.UNAVAILABLE` when bwrap is missing.
    Required,
}

impl Bubblewrap {
    /// Parses `off`, `auto` or `required` (the config's `sandbox.process_bubblewrap`).
    /// Anything else is `None`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "off" => Some(Self::Off),
            "auto" => Some(Self::Auto),
            "required" => Some(Self::Required),
            _ => None,
        }
    }
}

/// How the process executor runs programs, beyond what each call's profile says.
#[derive(Debug, Clone)]
pub struct ProcessOptions {
    /// Directories searched for a command that is not an absolute path.
    pub search_path: Vec<PathBuf>,
    /// Paths every tool may read because programs need them to run (shared
    /// libraries, the loader cache). Keep `/etc` out: it holds secrets.
    pub runtime_paths: Vec<PathBuf>,
    /// Where per-call scratch directories are created.
    pub scratch_parent: PathBuf,
    /// The stdout cap when the call has no `max_bytes_out`.
    pub max_output_bytes: usize,
    /// How much of stderr is kept for error notes.
    pub max_stderr_bytes: usize,
    /// `RLIMIT_FSIZE` when no `tmp` is granted.
    pub max_file_bytes: u64,
    /// `RLIMIT_NOFILE`.
    pub max_open_files: u64,
    /// `RLIMIT_NPROC` (per user; not enforced by the kernel for root, which is why
    /// process creation is also filtered by seccomp).
    pub max_processes: u64,
    /// Whether to wrap tools in bubblewrap as well (see `docs/sandbox.md`).
    pub bubblewrap: Bubblewrap,
    /// The `bwrap` binary; bubblewrap counts as available when it is a file.
    pub bwrap_path: PathBuf,
}

impl Default for ProcessOptions {
    fn default() -> Self {
        let existing = |paths: &[&str]| -> Vec<PathBuf> {
            paths
                .iter()
                .map(PathBuf::from)
                .filter(|p| p.exists())
                .collect()
        };
        Self {
            search_path: existing(&["/usr/local/bin", "/usr/bin", "/bin"]),
            runtime_paths: existing(&[
                "/lib",
                "/lib64",
                "/usr/lib",
                "/usr/lib64",
                "/usr/local/lib",
                "/etc/ld.so.cache",
                "/etc/ld.so.conf",
                "/etc/ld.so.conf.d",
            ]),
            scratch_parent: std::env::temp_dir(),
            max_output_bytes: 4 << 20,
            max_stderr_bytes: 4096,
            max_file_bytes: 16 << 20,
            max_open_files: 64,
            max_processes: 64,
            bubblewrap: Bubblewrap::Off,
            bwrap_path: ["/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap"]
                .into_iter()
                .map(PathBuf::from)
                .find(|p| p.is_file())
                .unwrap_or_else(|| PathBuf::from("/usr/bin/bwrap")),
        }
    }
}

impl ProcessOptions {
    /// Defaults, with scratch directories under `sandbox.scratch_dir` when set and
    /// bubblewrap as `sandbox.process_bubblewrap` says. An unknown value (which
    /// config validation rejects) fails closed to [`Bubblewrap::Required`].
    pub fn from_config(config: &soulbase_config::SandboxConfig) -> Self {
        let mut o = Self::default();
        if let Some(dir) = &config.scratch_dir {
            o.scratch_parent = dir.clone();
        }
        o.bubblewrap =
            Bubblewrap::parse(&config.process_bubblewrap).unwrap_or(Bubblewrap::Required);
        o
    }
}

/// The process executor; plug it into `LocalSandbox` for `ProviderKind::Process`.
/// Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct ProcessExecutor {
    options: Arc<ProcessOptions>,
    /// Set once the "bubblewrap missing" warning has been logged.
    warned: Arc<AtomicBool>,
}

fn unavailable(note: String) -> SoulError {
    SoulError::of(ErrorCode::ProviderUnavailable).with_note(note)
}

fn failed(note: String) -> SoulError {
    SoulError::of(ErrorCode::ToolExecutionFailed).with_note(note)
}

impl ProcessExecutor {
    /// An executor with `options`.
    pub fn new(options: ProcessOptions) -> Self {
        Self {
            options: Arc::new(options),
            warned: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Resolves a command to an absolute, symlink-free path.
    fn resolve(&self, command: &str) -> Result<PathBuf, SoulError> {
        resolve_command(&self.options, command)
    }
}

/// Resolves a command to an absolute, symlink-free path: absolute as given, a bare
/// name on the search path, anything else refused.
fn resolve_command(options: &ProcessOptions, command: &str) -> Result<PathBuf, SoulError> {
    {
        let p = Path::new(command);
        let found = if p.is_absolute() {
            p.canonicalize().ok()
        } else if command.contains('/') {
            None
        } else {
            options
                .search_path
                .iter()
                .find_map(|d| d.join(command).canonicalize().ok())
        };
        found
            .filter(|p| p.is_file())
            .ok_or_else(|| unavailable(format!("command {command} not found")))
    }
}

/// The confinement plan for a call.
fn plan(
    options: &ProcessOptions,
    binary: &Path,
    profile: &Profile,
    scratch: Option<&Scratch>,
    timeout: Duration,
    command: &str,
) -> Plan {
    let mut plan = Plan {
        read: options.runtime_paths.clone(),
        net: profile.grants_net(),
        devices: ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"]
            .into_iter()
            .map(PathBuf::from)
            .collect(),
        ..Plan::default()
    };
    let mut exec = vec![binary.to_path_buf()];
    for c in profile.capabilities() {
        if let soulbase_sandbox::Capability::Proc { commands } = c {
            for other in commands.iter().filter(|c| *c != command) {
                plan.spawn = true;
                if let Ok(p) = resolve_command(options, other) {
                    exec.push(p);
                }
            }
        }
    }
    // The loader (or script interpreter), and the loader of an interpreter.
    let mut i = 0;
    while i < exec.len() && exec.len() < 16 {
        if let Some(interp) = interpreter(&exec[i])
            && !exec.contains(&interp)
        {
            exec.push(interp);
        }
        i += 1;
    }
    plan.exec = exec;
    for g in profile.fs_grants(None) {
        if g.write {
            plan.write.push(g.path.clone());
        }
        if g.read && g.list {
            plan.read.push(g.path.clone());
        } else if g.read {
            plan.read_files.push(g.path.clone());
        } else if g.list {
            plan.list.push(g.path.clone());
        }
    }
    if let Some(s) = scratch {
        plan.write.push(s.path().to_path_buf());
        plan.read.push(s.path().to_path_buf());
    }
    let cpu = timeout.as_secs().saturating_add(1);
    let fsize = scratch
        .map(|s| s.max_bytes())
        .unwrap_or(options.max_file_bytes);
    plan.rlimits = vec![
        (libc::RLIMIT_CPU, cpu),
        (libc::RLIMIT_FSIZE, fsize),
        (libc::RLIMIT_NOFILE, options.max_open_files),
        (libc::RLIMIT_NPROC, options.max_processes),
        (libc::RLIMIT_CORE, 0),
    ];
    plan
}

/// bwrap's arguments up to (not including) `--` and the command: fresh namespaces
/// (the network shared only when granted), an empty read-only root with `/proc`,
/// a minimal `/dev`, the plan's paths bound read-only (runtime paths, read / list
/// grants, executables) or read-write (write grants, the scratch directory), the
/// scrubbed environment and the seccomp programs.
fn bwrap_args(
    plan: &Plan,
    home: &Path,
    scratch: Option<&Scratch>,
    cwd: &Path,
    seccomp_fds: &[std::os::fd::RawFd],
) -> Vec<std::ffi::OsString> {
    let mut a: Vec<std::ffi::OsString> = Vec::new();
    let mut push = |parts: &[&std::ffi::OsStr]| a.extend(parts.iter().map(|p| p.to_os_string()));
    let s = |x: &'static str| std::ffi::OsStr::new(x);
    push(&[s("--die-with-parent"), s("--unshare-all")]);
    if plan.net {
        push(&[s("--share-net")]);
    }
    push(&[
        s("--new-session"),
        s("--clearenv"),
        s("--setenv"),
        s("PATH"),
        s("/usr/local/bin:/usr/bin:/bin"),
        s("--setenv"),
        s("LANG"),
        s("C.UTF-8"),
        s("--setenv"),
        s("HOME"),
        home.as_os_str(),
    ]);
    if let Some(sc) = scratch {
        push(&[s("--setenv"), s("TMPDIR"), sc.path().as_os_str()]);
    }
    push(&[s("--proc"), s("/proc"), s("--dev"), s("/dev")]);
    // A path under one already bound is visible through it (and bwrap cannot create
    // a mount point inside a read-only bind), so it is skipped.
    let mut bound: Vec<&Path> = Vec::new();
    for p in plan
        .read
        .iter()
        .chain(&plan.read_files)
        .chain(&plan.list)
        .chain(&plan.exec)
    {
        if bound.iter().any(|b| p.starts_with(b)) {
            continue;
        }
        bound.push(p);
        push(&[s("--ro-bind-try"), p.as_os_str(), p.as_os_str()]);
    }
    // Read-write binds last, so they win over a read-only bind of a parent.
    for p in &plan.write {
        push(&[s("--bind-try"), p.as_os_str(), p.as_os_str()]);
    }
    push(&[s("--remount-ro"), s("/"), s("--chdir"), cwd.as_os_str()]);
    for fd in seccomp_fds {
        let fd = fd.to_string();
        push(&[s("--add-seccomp-fd"), std::ffi::OsStr::new(&fd)]);
    }
    a
}

enum Event {
    Exited(std::io::Result<ExitStatus>),
    Overflow,
}

struct Finished {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    timed_out: bool,
    overflow: bool,
}

/// Spawns and watches the child on plain threads (called from the blocking pool).
fn supervise(
    mut cmd: Command,
    input: Vec<u8>,
    timeout: Duration,
    max_out: usize,
    max_err: usize,
) -> Result<Finished, SoulError> {
    let started = Instant::now();
    let mut child: Child = cmd
        .spawn()
        .map_err(|e| unavailable(format!("cannot start the tool: {e}")))?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel::<Event>();

    let stdin = child.stdin.take();
    let writer = thread::spawn(move || {
        if let Some(mut s) = stdin {
            let _ = s.write_all(&input);
        }
    });
    let stdout = child.stdout.take();
    let overflow_tx = tx.clone();
    let out_reader = thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(s) = stdout {
            // One byte past the cap tells "exactly at the cap" from "over it".
            let limit = u64::try_from(max_out).unwrap_or(u64::MAX).saturating_add(1);
            let _ = s.take(limit).read_to_end(&mut buf);
            if buf.len() > max_out {
                let _ = overflow_tx.send(Event::Overflow);
            }
        }
        buf
    });
    let stderr = child.stderr.take();
    let err_reader = thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut s) = stderr {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = s.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                let room = max_err.saturating_sub(buf.len());
                buf.extend_from_slice(&chunk[..n.min(room)]);
            }
        }
        buf
    });
    let waiter = thread::spawn(move || {
        // Kill the rest of the group while the leader is a zombie, so its pid (the
        // group id) cannot have been reused; then reap.
        let _ = sys::wait_exited_no_reap(pid);
        sys::kill_group(pid);
        let _ = tx.send(Event::Exited(child.wait()));
    });

    let deadline = started + timeout;
    let (mut timed_out, mut overflow) = (false, false);
    let status = loop {
        let wait = if timed_out || overflow {
            Duration::from_secs(10)
        } else {
            deadline.saturating_duration_since(Instant::now())
        };
        match rx.recv_timeout(wait) {
            Ok(Event::Exited(s)) => break s,
            Ok(Event::Overflow) => {
                overflow = true;
                sys::kill_group(pid);
            }
            Err(mpsc::RecvTimeoutError::Timeout) if !(timed_out || overflow) => {
                timed_out = true;
                sys::kill_group(pid);
            }
            Err(_) => {
                sys::kill_group(pid);
                return Err(unavailable("the tool's process could not be reaped".into()));
            }
        }
    };
    let _ = waiter.join();
    let _ = writer.join();
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    let status = status.map_err(|e| unavailable(format!("waiting for the tool: {e}")))?;
    Ok(Finished {
        status,
        stdout,
        stderr,
        timed_out,
        overflow,
    })
}

fn outcome(
    f: Finished,
    timeout: Duration,
    max_out: usize,
    scratch: Option<&Scratch>,
    command: &str,
    via_bwrap: bool,
) -> Result<ExecOutput, SoulError> {
    let stderr = || String::from_utf8_lossy(&f.stderr).into_owned();
    // bwrap reports a child killed by signal N as exit status 128 + N.
    let signal = f.status.signal().or_else(|| {
        f.status
            .code()
            .filter(|c| via_bwrap && (129..=192).contains(c))
            .map(|c| c - 128)
    });
    if f.timed_out {
        return Err(SoulError::of(ErrorCode::ProviderTimeout).with_note(format!(
            "the tool ran past its {} ms timeout; its process group was killed",
            timeout.as_millis()
        )));
    }
    if f.overflow {
        return Err(failed(format!(
            "the tool wrote more than {max_out} bytes to stdout; its process group was killed"
        )));
    }
    if let Some(sig) = signal {
        return Err(match sig {
            libc::SIGXCPU => SoulError::of(ErrorCode::ProviderTimeout)
                .with_note("the tool exhausted its CPU time limit"),
            libc::SIGXFSZ => SoulError::of(ErrorCode::SandboxCapabilityBlocked)
                .with_note("the tool exceeded its file size limit"),
            _ => failed(format!("the tool was killed by signal {sig}: {}", stderr())),
        });
    }
    if !f.status.success() {
        let code = f.status.code().unwrap_or(-1);
        return Err(
            failed(format!("the tool exited with status {code}: {}", stderr()))
                .with_field("exit_code", code.to_string()),
        );
    }
    if let Some(s) = scratch {
        s.check()?;
    }
    let output: Value = serde_json::from_slice(&f.stdout)
        .map_err(|e| failed(format!("the tool's stdout is not JSON: {e}")))?;
    Ok(ExecOutput {
        output,
        side_effects: vec![SideEffectRecord {
            kind: "proc.spawn".into(),
            target: command.to_owned(),
        }],
        cpu_ms: None,
    })
}

#[async_trait]
impl Executor for ProcessExecutor {
    fn guard(&self, req: &ExecRequest<'_>) -> Result<(), SoulError> {
        let ProviderBinding::Process { command, .. } = req.provider else {
            return Err(unavailable(
                "the process executor only runs process bindings".into(),
            ));
        };
        req.profile.check(&Operation::Exec { command }, None)?;
        self.resolve(command).map(|_| ())
    }

    async fn execute(&self, req: ExecRequest<'_>) -> Result<ExecOutput, SoulError> {
        let ProviderBinding::Process { command, args } = req.provider else {
            return Err(unavailable(
                "the process executor only runs process bindings".into(),
            ));
        };
        req.profile.check(&Operation::Exec { command }, None)?;
        let binary = self.resolve(command)?;
        let scratch = match req.profile.tmp_bytes() {
            Some(max) => Some(Scratch::create(&self.options.scratch_parent, max)?),
            None => None,
        };
        let timeout = if req.timeout.is_zero() {
            Duration::from_secs(30)
        } else {
            req.timeout
        };
        let input = serde_json::to_vec(&req.args).map_err(SoulError::internal)?;
        let max_out = req
            .max_bytes_out
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
            .unwrap_or(self.options.max_output_bytes);
        let options = self.options.clone();
        let warned = self.warned.clone();
        let profile = req.profile.clone();
        let (command, args) = (command.clone(), args.clone());
        // Planning reads the binary (to find its loader) and opens every granted path:
        // file-system work, so it runs on the blocking pool with the child's wait.
        tokio::task::spawn_blocking(move || {
            let plan = plan(
                &options,
                &binary,
                &profile,
                scratch.as_ref(),
                timeout,
                &command,
            );
            let wrap = match options.bubblewrap {
                Bubblewrap::Off => false,
                _ if options.bwrap_path.is_file() => true,
                Bubblewrap::Required => {
                    return Err(unavailable(format!(
                        "bubblewrap is required but {} is not available",
                        options.bwrap_path.display()
                    )));
                }
                Bubblewrap::Auto => {
                    if !warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            bwrap = %options.bwrap_path.display(),
                            "bubblewrap is not available; process tools run under \
                             Landlock + seccomp + rlimits only"
                        );
                    }
                    false
                }
            };
            let home = scratch
                .as_ref()
                .map(|s| s.path().to_path_buf())
                .unwrap_or_else(|| PathBuf::from("/nonexistent"));
            let cwd = scratch.as_ref().map(|s| s.path()).unwrap_or(Path::new("/"));
            // Pipes carrying the seccomp programs to bwrap; the read ends must stay
            // open until the spawn has happened.
            let mut _seccomp_pipes = Vec::new();
            let mut cmd = if wrap {
                let mut fds = Vec::new();
                for prog in plan_seccomp(&plan)? {
                    let bytes = bpf_bytes(&prog);
                    // A pipe holds 64 KiB without a reader; our programs are far smaller.
                    if bytes.len() > 32 << 10 {
                        return Err(unavailable("seccomp program too large".into()));
                    }
                    let (reader, mut writer) =
                        std::io::pipe().map_err(|e| unavailable(format!("seccomp pipe: {e}")))?;
                    writer
                        .write_all(&bytes)
                        .map_err(|e| unavailable(format!("seccomp pipe: {e}")))?;
                    drop(writer);
                    fds.push(std::os::fd::AsRawFd::as_raw_fd(&reader));
                    _seccomp_pipes.push(reader);
                }
                let mut cmd = Command::new(&options.bwrap_path);
                cmd.args(bwrap_args(&plan, &home, scratch.as_ref(), cwd, &fds))
                    .arg("--")
                    .arg(&binary)
                    .args(&args)
                    .env_clear()
                    .current_dir("/");
                let confinement = BwrapConfinement {
                    rlimits: plan.rlimits.clone(),
                    seccomp_fds: fds,
                };
                // SAFETY (pre_exec): the closure runs in the forked child before exec
                // and only makes system calls (see `BwrapConfinement::apply`).
                #[allow(unsafe_code)]
                unsafe {
                    cmd.pre_exec(move || confinement.apply());
                }
                cmd
            } else {
                let mut confinement = Confinement::build(&plan)?;
                let mut cmd = Command::new(&binary);
                cmd.args(&args)
                    .env_clear()
                    .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                    .env("LANG", "C.UTF-8")
                    .env("HOME", &home)
                    .current_dir(cwd);
                if let Some(s) = &scratch {
                    cmd.env("TMPDIR", s.path());
                }
                // SAFETY (pre_exec): the closure runs in the forked child before exec
                // and only makes system calls (see `Confinement::apply`).
                #[allow(unsafe_code)]
                unsafe {
                    cmd.pre_exec(move || confinement.apply());
                }
                cmd
            };
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0);
            let finished = supervise(cmd, input, timeout, max_out, options.max_stderr_bytes);
            drop(_seccomp_pipes);
            outcome(
                finished?,
                timeout,
                max_out,
                scratch.as_ref(),
                &command,
                wrap,
            )
        })
        .await
        .map_err(SoulError::internal)?
    }
}
