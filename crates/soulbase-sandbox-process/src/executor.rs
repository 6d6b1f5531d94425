//! The executor: plan the confinement from the profile, spawn, watch, collect.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::Value;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::SideEffectRecord;
use soulbase_sandbox::cpu::cpu_ms;
use soulbase_sandbox::{
    ExecOutput, ExecRequest, Executor, Operation, Profile, ProviderBinding, Scratch,
};

use crate::confine::{Confinement, Plan, interpreter};
use crate::namespace::{NamespacePlan, SharedNet};
use crate::sys;
use crate::warm::{Reply, Spare, Spares};

/// How native tools are isolated from the host (`sandbox.process_isolation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// Fresh user, PID, mount, network (unless `net` is granted), IPC, UTS and cgroup
    /// namespaces and a mount tree of only the plan's paths, under Landlock and
    /// seccomp (the default). Where namespaces cannot be made, native tools are
    /// refused with `PROVIDER.UNAVAILABLE`, never run with less.
    #[default]
    Namespaces,
    /// Landlock, seccomp and rlimits only, for hosts without user namespaces: the
    /// tool shares the server's PID and mount namespaces (see `docs/sandbox.md`).
    LandlockOnly,
}

impl Isolation {
    /// Parses `namespaces` or `landlock-only`; anything else is `None`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "namespaces" => Some(Self::Namespaces),
            "landlock-only" => Some(Self::LandlockOnly),
            _ => None,
        }
    }

    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Namespaces => "namespaces",
            Self::LandlockOnly => "landlock-only",
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
    /// `RLIMIT_NPROC` when the call does not set `max_processes`. Under namespaces it
    /// counts the tool's own processes, root's included; without them it counts every
    /// process of the server's uid and is not enforced for root (process creation is
    /// then also filtered by seccomp).
    pub max_processes: u64,
    /// `RLIMIT_DATA` (heap and private writable mappings) when the call does not set
    /// `max_memory_bytes`.
    pub max_memory_bytes: u64,
    /// How tools are isolated from the host.
    pub isolation: Isolation,
    /// The uid and gid tools run as outside their user namespace when the server runs
    /// as root (under [`Isolation::Namespaces`]): the kernel does not apply
    /// `RLIMIT_NPROC` to uid 0, and a tool must hold no root identity. Scratch
    /// directories are given to this user; granted paths must be accessible to it.
    /// Default 65534:65534 (`nobody`).
    pub run_as: (u32, u32),
    /// How many spare launches may wait at once (`sandbox.process_spares`, default
    /// 8); 0 launches every call afresh (spare launches: `docs/sandbox.md`).
    pub spares: usize,
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
            max_memory_bytes: 512 << 20,
            isolation: Isolation::Namespaces,
            run_as: (65534, 65534),
            spares: 8,
        }
    }
}

impl ProcessOptions {
    /// Defaults, with scratch directories under `sandbox.scratch_dir` when set and
    /// the isolation `sandbox.process_isolation` names. An unknown value (which config
    /// validation rejects) fails closed to [`Isolation::Namespaces`].
    pub fn from_config(config: &soulbase_config::SandboxConfig) -> Self {
        let mut o = Self::default();
        if let Some(dir) = &config.scratch_dir {
            o.scratch_parent = dir.clone();
        }
        o.isolation = Isolation::parse(&config.process_isolation).unwrap_or_default();
        o.spares = usize::try_from(config.process_spares).unwrap_or(0);
        o
    }
}

/// The process executor; plug it into `LocalSandbox` for `ProviderKind::Process`.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct ProcessExecutor {
    options: Arc<ProcessOptions>,
    /// Launches built ahead for the next call of a tool (see [`crate::warm`]).
    spares: Arc<Spares>,
    /// The network namespace tools without `net` share (namespaces only).
    shared_net: Option<Arc<SharedNet>>,
    /// Why native tools are refused (namespaces were asked for and cannot be made).
    refusal: Option<Arc<str>>,
}

impl Default for ProcessExecutor {
    fn default() -> Self {
        Self::new(ProcessOptions::default())
    }
}

fn unavailable(note: String) -> SoulError {
    SoulError::of(ErrorCode::ProviderUnavailable).with_note(note)
}

fn failed(note: String) -> SoulError {
    SoulError::of(ErrorCode::ToolExecutionFailed).with_note(note)
}

impl ProcessExecutor {
    /// An executor with `options`. With [`Isolation::Namespaces`] it first checks
    /// that namespaces can be made here (a forked probe, about a millisecond); when
    /// they cannot, it logs a warning and refuses every call with
    /// `PROVIDER.UNAVAILABLE` naming the failed step.
    pub fn new(options: ProcessOptions) -> Self {
        let refusal = match options.isolation {
            Isolation::LandlockOnly => None,
            Isolation::Namespaces => {
                match crate::namespace::probe(crate::namespace::outside_ids(options.run_as)) {
                    Ok(()) => None,
                    Err(why) => {
                        let note = format!(
                            "native tools are refused: sandbox.process_isolation is namespaces \
                         and this host cannot create them ({why}); allow unprivileged user \
                         namespaces, or set sandbox.process_isolation: landlock-only to \
                         accept the weaker isolation (see docs/sandbox.md)"
                        );
                        tracing::warn!("{note}");
                        Some(Arc::from(note))
                    }
                }
            }
        };
        let shared_net = match (options.isolation, &refusal) {
            (Isolation::Namespaces, None) => {
                SharedNet::create(crate::namespace::outside_ids(options.run_as)).map(Arc::new)
            }
            _ => None,
        };
        Self {
            spares: Arc::new(Spares::new(options.spares)),
            options: Arc::new(options),
            shared_net,
            refusal,
        }
    }

    /// `Err` with the reason when this executor refuses every call (namespaces were
    /// asked for and cannot be made here).
    pub fn availability(&self) -> Result<(), SoulError> {
        match &self.refusal {
            Some(note) => Err(unavailable(note.to_string())),
            None => Ok(()),
        }
    }

    /// How many spare launches wait for a next call (each a confined child blocked
    /// before `exec`; see `docs/sandbox.md`).
    pub fn spares_waiting(&self) -> usize {
        self.spares.len()
    }

    /// Starts a spare launch for `key` unless one is waiting. Failing to make one
    /// only means the next call launches afresh.
    fn start_spare(&self, binary: &Path, key: &LaunchKey) {
        if self.options.spares == 0 || self.spares.has(key) {
            return;
        }
        let spare = Launch::new(
            self.options.clone(),
            self.shared_net.clone(),
            binary.to_path_buf(),
            key.clone(),
        )
        .and_then(Launch::into_spare);
        match spare {
            Ok(spare) => self.spares.put(spare),
            Err(e) => tracing::debug!(error = %e, "no spare launch"),
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

/// The memory, process and file caps of one call, and how they are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Caps {
    memory_bytes: u64,
    processes: u64,
    /// `RLIMIT_NOFILE`: stdio plus the call's `max_files`, never above the
    /// executor's `max_open_files`.
    open_files: u64,
    /// The call's `max_files`: entries left in the scratch directory.
    files: Option<u32>,
}

/// The confinement plan for a call.
fn plan(
    options: &ProcessOptions,
    binary: &Path,
    profile: &Profile,
    scratch: Option<&Scratch>,
    timeout: Duration,
    command: &str,
    caps: Caps,
) -> Plan {
    let mut plan = Plan {
        read: options.runtime_paths.clone(),
        net: profile.grants_net(),
        // Under namespaces only bound socket paths exist; without them a grant must
        // name a socket for `AF_UNIX` to be allowed at all.
        unix: options.isolation == Isolation::Namespaces
            || profile.fs_grants(None).iter().any(|g| {
                std::fs::metadata(&g.path)
                    .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
            }),
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
        (libc::RLIMIT_NOFILE, caps.open_files),
        (libc::RLIMIT_NPROC, caps.processes),
        (libc::RLIMIT_DATA, caps.memory_bytes),
        (libc::RLIMIT_CORE, 0),
    ];
    plan
}

/// What the End evidence records of the confinement that was applied.
fn confinement_record(isolation: Isolation, caps: Caps) -> SideEffectRecord {
    SideEffectRecord {
        kind: "sandbox.confinement".into(),
        target: format!(
            "isolation={}; memory=rlimit_data:{}; pids=rlimit_nproc:{}; files=rlimit_nofile:{}",
            isolation.as_str(),
            caps.memory_bytes,
            caps.processes,
            caps.open_files
        ),
    }
}

/// Everything a launch depends on besides the call's input: calls with equal keys get
/// the same confinement, so a spare made for one serves the other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LaunchKey {
    command: String,
    args: Vec<String>,
    profile: Profile,
    caps: Caps,
    timeout: Duration,
}

#[cfg(test)]
impl LaunchKey {
    /// A key for running `command` with no grants.
    pub(crate) fn for_test(command: &str) -> Self {
        Self {
            command: command.into(),
            args: Vec::new(),
            profile: Profile::new(Vec::new()),
            caps: Caps {
                memory_bytes: 1 << 20,
                processes: 1,
                open_files: 16,
                files: None,
            },
            timeout: Duration::from_secs(1),
        }
    }
}

/// What only the call itself brings.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    /// The JSON arguments, written to the tool's stdin.
    input: Vec<u8>,
    /// The stdout cap.
    max_out: usize,
}

#[cfg(test)]
impl Job {
    /// An empty job.
    pub(crate) fn for_test() -> Self {
        Self {
            input: b"{}".to_vec(),
            max_out: 1024,
        }
    }
}

/// The pipe the tool's wait status comes up (namespaces).
type StatusPipe = (std::io::PipeReader, std::io::PipeWriter);

/// One launch of a tool: its key, resolved binary and scratch directory.
struct Launch {
    options: Arc<ProcessOptions>,
    shared_net: Option<Arc<SharedNet>>,
    binary: PathBuf,
    key: LaunchKey,
    scratch: Option<Scratch>,
}

impl Launch {
    /// A launch for `key`, with a fresh scratch directory when `tmp` is granted.
    fn new(
        options: Arc<ProcessOptions>,
        shared_net: Option<Arc<SharedNet>>,
        binary: PathBuf,
        key: LaunchKey,
    ) -> Result<Self, SoulError> {
        let scratch = match key.profile.tmp_bytes() {
            Some(max) => {
                Some(Scratch::create(&options.scratch_parent, max)?.limit_files(key.caps.files))
            }
            None => None,
        };
        Ok(Self {
            options,
            shared_net,
            binary,
            key,
            scratch,
        })
    }

    /// Plans the confinement and builds the command; with `go`, the child waits for
    /// a byte on that pipe, fully confined, before it `exec`s.
    fn command(
        &self,
        go: Option<std::os::fd::RawFd>,
    ) -> Result<(Command, Option<StatusPipe>), SoulError> {
        let (options, scratch) = (&self.options, self.scratch.as_ref());
        let plan = plan(
            options,
            &self.binary,
            &self.key.profile,
            scratch,
            self.key.timeout,
            &self.key.command,
            self.key.caps,
        );
        let home = scratch
            .map(|s| s.path().to_path_buf())
            .unwrap_or_else(|| PathBuf::from("/nonexistent"));
        let cwd = scratch.map(|s| s.path()).unwrap_or(Path::new("/"));
        let status_pipe = match options.isolation {
            Isolation::Namespaces => {
                Some(std::io::pipe().map_err(|e| unavailable(format!("status pipe: {e}")))?)
            }
            Isolation::LandlockOnly => None,
        };
        let namespaces = match options.isolation {
            Isolation::Namespaces => {
                let outside = crate::namespace::outside_ids(options.run_as);
                if let (Some((uid, gid)), Some(s)) = (outside, scratch) {
                    std::os::unix::fs::chown(s.path(), Some(uid), Some(gid)).map_err(|e| {
                        unavailable(format!(
                            "cannot give the scratch directory to the tool user: {e}"
                        ))
                    })?;
                }
                let ns = NamespacePlan::build(&plan, cwd, outside, self.shared_net.as_deref())?;
                Some(match &status_pipe {
                    Some((_, w)) => ns.report_status_to(std::os::fd::AsRawFd::as_raw_fd(w)),
                    None => ns,
                })
            }
            Isolation::LandlockOnly => None,
        };
        let mut confinement = Confinement::build(&plan, namespaces)?;
        if let Some(fd) = go {
            confinement = confinement.wait_for_go(fd);
        }
        let mut cmd = Command::new(&self.binary);
        cmd.args(&self.key.args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("LANG", "C.UTF-8")
            .env("HOME", &home)
            .current_dir(cwd);
        if let Some(s) = scratch {
            cmd.env("TMPDIR", s.path());
        }
        // SAFETY (pre_exec): the closure runs in the forked child before exec
        // and only makes system calls (see `Confinement::apply`).
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || confinement.apply());
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        Ok((cmd, status_pipe))
    }

    /// Watches a spawned child through `job` and makes the call's outcome of it; the
    /// scratch directory is gone when it returns.
    fn finish(
        self,
        spawned: std::io::Result<Child>,
        status: Option<StatusPipe>,
        job: Job,
    ) -> Result<ExecOutput, SoulError> {
        let finished = supervise(
            spawned,
            job.input,
            self.key.timeout,
            job.max_out,
            self.options.max_stderr_bytes,
            status,
        )?;
        outcome(
            finished,
            self.key.timeout,
            job.max_out,
            self.scratch.as_ref(),
            &self.key.command,
            confinement_record(self.options.isolation, self.key.caps),
            self.key.caps,
        )
    }

    /// Launches afresh and runs `job` (blocking).
    fn run(self, job: Job) -> Result<ExecOutput, SoulError> {
        let (mut cmd, status) = self.command(None)?;
        let spawned = cmd.spawn();
        self.finish(spawned, status, job)
    }

    /// Builds this launch as a spare: the child is made and confined, then waits for
    /// [`Spare::start`]. Runs on a thread of its own, which then watches the call (the
    /// child dies with the thread that forked it).
    fn into_spare(self) -> Result<Spare, SoulError> {
        let (go_reader, go) =
            std::io::pipe().map_err(|e| unavailable(format!("spare pipe: {e}")))?;
        let (jobs, waiting) = mpsc::channel::<(Job, Reply)>();
        let key = self.key.clone();
        thread::Builder::new()
            .name("soulbase-spare".into())
            .spawn(move || {
                let built = self.command(Some(std::os::fd::AsRawFd::as_raw_fd(&go_reader)));
                let Ok((mut cmd, status)) = built else {
                    // No child: the spare's pipe and queue close unused.
                    return;
                };
                // Returns once the child is confined and waiting (it closes the pipe
                // the spawn waits on); a failure before that is the spawn's error.
                let spawned = cmd.spawn();
                drop(go_reader);
                match waiting.recv() {
                    Ok((job, reply)) => {
                        let _ = reply.send(self.finish(spawned, status, job));
                    }
                    Err(_) => {
                        if let Ok(mut child) = spawned {
                            sys::kill_group(child.id());
                            let _ = child.wait();
                        }
                    }
                }
            })
            .map_err(|e| unavailable(format!("spare thread: {e}")))?;
        Ok(Spare {
            key,
            go,
            jobs,
            born: Instant::now(),
        })
    }
}

enum Event {
    /// The spawned process was reaped: its status and the CPU time of it and the
    /// descendants reaped below it.
    Exited(std::io::Result<(ExitStatus, Duration)>),
    /// The tool's wait status and the CPU time of its processes, reported by the
    /// namespace's init before the namespaces are torn down.
    Status(i32, Duration),
    Overflow,
}

struct Finished {
    status: ExitStatus,
    /// The CPU time (user and system) of the tool's processes that were reaped.
    cpu: Duration,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    timed_out: bool,
    overflow: bool,
}

/// Spawns and watches the child on plain threads (called from the blocking pool).
///
/// With a `status` pipe (namespaces), the call ends as soon as the tool's status comes
/// through it; reaping the process in between (which waits for the namespaces'
/// teardown) and killing what is left of the group go on in the background.
fn supervise(
    spawned: std::io::Result<Child>,
    input: Vec<u8>,
    timeout: Duration,
    max_out: usize,
    max_err: usize,
    status: Option<StatusPipe>,
) -> Result<Finished, SoulError> {
    let started = Instant::now();
    let (status_reader, status_writer) = status.unzip();
    // Only the child may hold the write end: EOF then means it is gone.
    drop(status_writer);
    let mut child: Child =
        spawned.map_err(|e| unavailable(format!("cannot start the tool: {e}")))?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel::<Event>();
    if let Some(mut r) = status_reader {
        let tx = tx.clone();
        thread::spawn(move || {
            let mut raw = [0u8; sys::STATUS_REPORT_LEN];
            if r.read_exact(&mut raw).is_ok() {
                let (status, cpu) = sys::parse_status_report(&raw);
                let _ = tx.send(Event::Status(status, cpu));
            }
        });
    }

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
        // Reaped with its rusage (`wait4` on this pid only, so concurrent calls
        // never see each other's CPU); `child` is not waited on through std.
        let reaped = sys::wait_with_cpu(pid).map(|(raw, cpu)| (ExitStatus::from_raw(raw), cpu));
        drop(child);
        let _ = tx.send(Event::Exited(reaped));
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
            Ok(Event::Status(raw, cpu)) => break Ok((ExitStatus::from_raw(raw), cpu)),
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
    // A reported status leaves the waiter to reap (and kill the group) by itself.
    if waiter.is_finished() {
        let _ = waiter.join();
    }
    let _ = writer.join();
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    let (status, cpu) = status.map_err(|e| unavailable(format!("waiting for the tool: {e}")))?;
    Ok(Finished {
        status,
        cpu,
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
    applied: SideEffectRecord,
    caps: Caps,
) -> Result<ExecOutput, SoulError> {
    let stderr = || String::from_utf8_lossy(&f.stderr).into_owned();
    let signal = f.status.signal();
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
            // What a failed allocation ends in for most runtimes.
            libc::SIGABRT | libc::SIGSEGV | libc::SIGBUS => failed(format!(
                "the tool was killed by signal {sig} (its memory limit is {} bytes): {}",
                caps.memory_bytes,
                stderr()
            )),
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
        side_effects: vec![
            SideEffectRecord {
                kind: "proc.spawn".into(),
                target: command.to_owned(),
            },
            applied,
        ],
        cpu_ms: Some(cpu_ms(f.cpu)),
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
        self.availability()?;
        self.resolve(command).map(|_| ())
    }

    async fn execute(&self, req: ExecRequest<'_>) -> Result<ExecOutput, SoulError> {
        let ProviderBinding::Process { command, args } = req.provider else {
            return Err(unavailable(
                "the process executor only runs process bindings".into(),
            ));
        };
        req.profile.check(&Operation::Exec { command }, None)?;
        self.availability()?;
        let binary = self.resolve(command)?;
        let timeout = if req.timeout.is_zero() {
            Duration::from_secs(30)
        } else {
            req.timeout
        };
        let job = Job {
            input: serde_json::to_vec(&req.args).map_err(SoulError::internal)?,
            max_out: req
                .max_bytes_out
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
                .unwrap_or(self.options.max_output_bytes),
        };
        let key = LaunchKey {
            command: command.clone(),
            args: args.clone(),
            profile: req.profile.clone(),
            caps: Caps {
                memory_bytes: req
                    .max_memory_bytes
                    .unwrap_or(self.options.max_memory_bytes),
                processes: req
                    .max_processes
                    .map(u64::from)
                    .unwrap_or(self.options.max_processes),
                open_files: req.max_files.map_or(self.options.max_open_files, |n| {
                    (u64::from(n) + 3).min(self.options.max_open_files)
                }),
                files: req.max_files,
            },
            timeout,
        };
        // A spare launch for this key runs the tool at once; the next call's spare is
        // started as this one runs.
        let started = self.spares.take(&key).map(|s| s.start(&job));
        self.start_spare(&binary, &key);
        if let Some(Ok(outcome)) = started {
            return outcome.await.unwrap_or_else(|_| {
                Err(unavailable(
                    "the tool's watcher ended without an outcome".into(),
                ))
            });
        }
        let launch = Launch::new(self.options.clone(), self.shared_net.clone(), binary, key)?;
        // Planning reads the binary (to find its loader) and opens every granted path:
        // file-system work, so it runs on the blocking pool with the child's wait.
        tokio::task::spawn_blocking(move || launch.run(job))
            .await
            .map_err(SoulError::internal)?
    }
}
