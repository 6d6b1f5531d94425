//! Soulbase's process executor: native tools run as Linux processes under least
//! privilege, without needing root or user namespaces.
//!
//! Every call:
//! - resolves the binding's `command` (absolute, or found on
//!   [`ProcessOptions::search_path`]); the command must be granted by `proc`;
//! - spawns it with a **scrubbed environment** (`PATH`, `LANG=C.UTF-8`, `HOME` and
//!   `TMPDIR` pointing at the scratch directory when `tmp` is granted, nothing else),
//!   JSON arguments on stdin, JSON result expected on stdout;
//! - in **its own process group**, with `PR_SET_PDEATHSIG` so it dies with the host;
//! - under **rlimits**: CPU seconds (from the timeout), file size (the `tmp` grant or
//!   [`ProcessOptions::max_file_bytes`]), open files, processes, no core dumps;
//! - with **`no_new_privs`** and a **Landlock** ruleset: the file system is reduced
//!   to the profile's `fs` grants (read / list / write as granted), the scratch
//!   directory (read-write), what the binary needs to run (read-only
//!   [`ProcessOptions::runtime_paths`], execute on the binary, the dynamic loader and
//!   other `proc`-granted commands). A kernel without Landlock fails the call closed
//!   (`PROVIDER.UNAVAILABLE`) rather than running unconfined;
//! - with a **seccomp** filter: `socket` for anything but `AF_UNIX` fails with
//!   `EACCES` unless `net` is granted; `io_uring` is denied; `setsid` / `setpgid`
//!   are denied (the group cannot be left); and unless `proc` grants more commands
//!   than the tool itself, creating processes fails (`fork`, `vfork`, `clone`
//!   without `CLONE_THREAD` → `EPERM`; `clone3` → `ENOSYS` so threads still work
//!   through the `clone` fallback). This is what contains a fork bomb even as root,
//!   where `RLIMIT_NPROC` is not enforced;
//! - with a **wall-clock timeout** that kills the whole group (`PROVIDER.TIMEOUT`),
//!   and an **output cap** that kills it too (`TOOL.EXECUTION_FAILED`).
//!
//! All waiting happens on tokio's blocking pool and plain threads, never on async
//! workers.
//!
//! With [`ProcessOptions::bubblewrap`] on (`auto` when `bwrap` is installed, or
//! `required`), the tool additionally runs inside `bwrap` namespaces: an empty
//! read-only root with only the plan's paths bound in, private pid / ipc / uts /
//! network (unless `net` is granted) namespaces, and the same seccomp programs,
//! installed by bwrap itself. Landlock is not applied on that path (it forbids the
//! mounts bwrap needs); rlimits and `no_new_privs` still are (see `docs/sandbox.md`).

mod confine;
mod executor;
mod sys;

pub use executor::{Bubblewrap, ProcessExecutor, ProcessOptions};
