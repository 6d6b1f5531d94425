//! Soulbase's process executor: native tools run as Linux processes isolated from the
//! host, without needing root, bubblewrap or any other helper binary.
//!
//! Every call:
//! - resolves the binding's `command` (absolute, or found on
//!   [`ProcessOptions::search_path`]); the command must be granted by `proc`;
//! - spawns it with a **scrubbed environment** (`PATH`, `LANG=C.UTF-8`, `HOME` and
//!   `TMPDIR` pointing at the scratch directory when `tmp` is granted, nothing else),
//!   JSON arguments on stdin, JSON result expected on stdout;
//! - under [`Isolation::Namespaces`] (the default), in **fresh user, PID, mount, IPC,
//!   UTS and cgroup namespaces** and, without `net`, a network namespace with no
//!   interface up (one the executor's tools share where Landlock scopes abstract
//!   sockets, else one of the tool's own): the tool is uid 1000 with no capabilities
//!   inside, PID 2 under an init of its own in a namespace that holds only its own
//!   processes, and its root is a read-only tmpfs holding
//!   only the runtime paths, the binary and its loader, the profile's `fs` grants, the
//!   scratch directory, `/dev/null` & co. and its own `/proc` — no host socket, no
//!   `/etc`, no other tool's files. Where the host cannot create namespaces, every
//!   call is refused with `PROVIDER.UNAVAILABLE` (and a warning at start), never run
//!   with less; [`Isolation::LandlockOnly`] is the explicit opt-out;
//! - in **its own process group**, with `PR_SET_PDEATHSIG` so it dies with the host;
//! - under **rlimits**: CPU seconds (from the timeout), memory (`RLIMIT_DATA`, the
//!   manifest's `limits.max_memory_bytes`), processes (`RLIMIT_NPROC`,
//!   `limits.max_processes`; counted inside the user namespace, so enforced for a root
//!   server too), file size (the `tmp` grant or [`ProcessOptions::max_file_bytes`]),
//!   open files, no core dumps. The End evidence records what was applied (a
//!   `sandbox.confinement` side effect);
//! - with an **empty capability bounding set**, **`no_new_privs`** and a **Landlock**
//!   ruleset: the profile's `fs` grants (read / list / write as granted), the scratch
//!   directory (read-write), what the binary needs to run (read-only
//!   [`ProcessOptions::runtime_paths`], execute on the binary, the dynamic loader and
//!   other `proc`-granted commands). A kernel without Landlock fails the call closed
//!   (`PROVIDER.UNAVAILABLE`) rather than running unconfined;
//! - with a **seccomp** filter: sockets need `net` (and `AF_UNIX` without namespaces a
//!   granted socket path); `prlimit64`, `setpriority` and the `sched_set*` calls only
//!   on the tool itself; no character or block device nodes; no `ptrace`, namespaces,
//!   mounts, keyrings, BPF, modules, clock or host-name changes, `io_uring`; `setsid`
//!   / `setpgid` are denied (the group cannot be left); and unless `proc` grants more
//!   commands than the tool itself, creating processes fails (`fork`, `vfork`, `clone`
//!   without `CLONE_THREAD` → `EPERM`; `clone3` → `ENOSYS` so threads still work
//!   through the `clone` fallback);
//! - with a **wall-clock timeout** that kills the whole group (`PROVIDER.TIMEOUT`),
//!   and an **output cap** that kills it too (`TOOL.EXECUTION_FAILED`);
//! - **measured**: a successful call's `cpu_ms` is the user and system time of the
//!   tool's processes from their rusage — under namespaces, the init's
//!   `RUSAGE_CHILDREN` once it has reaped the tool, sent with the tool's status;
//!   without them, `wait4` on the tool — always per pid, so concurrent calls never
//!   share a figure. Processes still running when the tool ends are killed
//!   unmeasured.
//!
//! After each call a **spare launch** for the same command, profile and limits is
//! built ahead and waits, confined, before `exec`; the next such call only writes its
//! input (see the `warm` module and `docs/sandbox.md`).
//!
//! All waiting happens on tokio's blocking pool and plain threads, never on async
//! workers. The threat model, per isolation mode, is in `docs/sandbox.md`.

mod confine;
mod executor;
mod namespace;
mod sys;
mod warm;

pub use executor::{Isolation, ProcessExecutor, ProcessOptions};
