//! Namespace isolation: fresh user, PID, mount, IPC, UTS, cgroup and (unless `net`
//! is granted) network namespaces, and a mount tree holding only what the plan names.
//!
//! The parent turns the plan into a list of prepared operations
//! ([`NamespacePlan::build`]: every path resolved, every string a `CString`); the
//! forked child carries them out with system calls only ([`NamespacePlan::enter`]).
//!
//! In the child, `enter`:
//! 1. when the server is root, becomes an unprivileged uid/gid
//!    ([`crate::ProcessOptions::run_as`]); then `unshare`s the namespaces and maps one
//!    id: the tool is uid/gid [`SANDBOX_ID`] inside, that uid/gid outside;
//! 2. forks: the new process is PID 1 of the new PID namespace (nothing outside it
//!    can be seen or signalled from inside); the process in between closes every
//!    descriptor but the pipe the init reports on, and ends the way the tool ended,
//!    so the executor's process group and exit status work as without namespaces;
//! 3. mounts a tmpfs, `pivot_root`s into it with the old root at `/oldroot`, binds in
//!    the plan's paths from there (read-only, read-write or as a device), recreates
//!    the symlinks on the way to them (`/lib` → `usr/lib`), mounts a `/proc` of the new
//!    PID namespace, detaches the old root and remounts `/` read-only;
//! 4. forks the tool (PID 2) and stays as the namespace's init: it reaps, sends the
//!    tool's wait status straight to the executor with the CPU time of what it
//!    reaped (the tool's processes; `sys::reap_until`), and the status to the process
//!    in between, and exits, which ends anything the tool left.
//!
//! What is not bound does not exist for the tool: no UNIX socket of a local service, no
//! `/etc`, no other tool's scratch directory.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use soulbase_errors::{ErrorCode, SoulError};

use crate::confine::Plan;
use crate::sys;

/// The tool's uid and gid inside its user namespace (mapped to the server's).
pub(crate) const SANDBOX_ID: u32 = 1000;

/// Where the host's root is reachable while the tree is built.
const OLD_ROOT: &str = "/oldroot";

/// How a path is bound into the tool's tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum BindMode {
    /// Read-only, `nosuid`, `nodev`.
    ReadOnly,
    /// Read-write, `nosuid`, `nodev`.
    ReadWrite,
    /// A device node (`/dev/null`), `nosuid`.
    Device,
}

/// One prepared step of building the tree.
#[derive(Debug)]
enum Op {
    /// A directory in the new root's tmpfs.
    Dir(CString),
    /// An empty file in the new root's tmpfs (a file bind's mount point).
    File(CString),
    /// A symlink in the new root's tmpfs.
    Link { target: CString, path: CString },
    /// A bind mount from the old root.
    Bind {
        source: CString,
        target: CString,
        mode: BindMode,
    },
}

/// An empty network namespace (its only interface, loopback, down) and the user
/// namespace that owns it, made once per executor. Tools without `net` join it and
/// make their user namespace inside that one, instead of each creating and tearing
/// down a network namespace — the costliest namespace to make (≈ 0.5 ms, plus the
/// kernel's cleanup after). What tools could share in it is refused to them: seccomp
/// lets a tool without `net` create only `AF_UNIX` sockets, only bound socket paths
/// exist in its mount tree, and Landlock scopes abstract UNIX sockets to the tool's
/// own domain — so it is used only where the kernel's Landlock has that scoping
/// (ABI 6). No tool holds a capability in the owning user namespace (theirs are
/// nested inside it), so none can configure the namespace.
#[derive(Debug)]
pub(crate) struct SharedNet {
    user: std::os::fd::OwnedFd,
    net: std::os::fd::OwnedFd,
}

impl SharedNet {
    /// Makes the shared namespace for tools running as `outside`; `None` where it
    /// cannot be made or Landlock cannot scope abstract sockets (each tool then gets a
    /// network namespace of its own).
    pub(crate) fn create(outside: Option<(u32, u32)>) -> Option<Self> {
        if sys::landlock_abi() < 6 {
            return None;
        }
        let (uid_map, gid_map) = id_maps(outside);
        match sys::hold_user_and_net(outside, &uid_map, &gid_map) {
            Ok((user, net)) => Some(Self { user, net }),
            Err(why) => {
                tracing::debug!("no shared network namespace: {why}");
                None
            }
        }
    }
}

/// The namespaces and mount tree of one call, prepared in the parent.
#[derive(Debug)]
pub(crate) struct NamespacePlan {
    /// The ids to run_as before the namespaces are made (a root server's tools).
    run_as: Option<(u32, u32)>,
    /// The shared user and network namespaces to join first (`(user, net)`).
    join: Option<(libc::c_int, libc::c_int)>,
    flags: libc::c_int,
    uid_map: CString,
    gid_map: CString,
    /// The directory the new root's tmpfs is first mounted on.
    base: CString,
    /// `base` + `/oldroot`.
    base_old_root: CString,
    ops: Vec<Op>,
    cwd: CString,
    /// Where the tool's wait status is sent to the executor (the write end of a pipe
    /// the executor made); `-1`: nowhere.
    status_fd: libc::c_int,
}

fn unavailable(note: String) -> SoulError {
    SoulError::of(ErrorCode::ProviderUnavailable).with_note(note)
}

fn cstring(p: &Path) -> Result<CString, SoulError> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| unavailable(format!("path {} contains a NUL byte", p.display())))
}

/// The namespaces every tool gets; a network one unless `keep_net` (the tool has
/// `net`, or joins the shared one).
pub(crate) fn unshare_flags(keep_net: bool) -> libc::c_int {
    let mut flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP;
    if !keep_net {
        flags |= libc::CLONE_NEWNET;
    }
    flags
}

/// Who the tool is outside its user namespace: `run_as` when the server is root (the
/// kernel exempts uid 0 from `RLIMIT_NPROC`, and a tool that got out would be root),
/// else the server's own uid/gid. `None` for the server's own ids.
pub(crate) fn outside_ids(run_as: (u32, u32)) -> Option<(u32, u32)> {
    (sys::effective_ids().0 == 0).then_some(run_as)
}

/// The `uid_map` and `gid_map` lines: [`SANDBOX_ID`] inside is `outside` (else the
/// server's ids) outside.
pub(crate) fn id_maps(outside: Option<(u32, u32)>) -> (CString, CString) {
    let (uid, gid) = outside.unwrap_or_else(sys::effective_ids);
    let line =
        |outside: u32| CString::new(format!("{SANDBOX_ID} {outside} 1\n")).unwrap_or_default();
    (line(uid), line(gid))
}

/// Follows `path` component by component as the kernel would, returning the symlinks
/// met on the way (`(link, its target as written)`) and the symlink-free path. `None`
/// when the path does not exist or loops.
fn resolve(path: &Path) -> Option<(Vec<(PathBuf, PathBuf)>, PathBuf)> {
    let mut links = Vec::new();
    let mut current = PathBuf::from("/");
    let mut rest: Vec<PathBuf> = path
        .components()
        .rev()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(PathBuf::from(n)),
            Component::ParentDir => Some(PathBuf::from("..")),
            _ => None,
        })
        .collect();
    let mut hops = 0;
    while let Some(next) = rest.pop() {
        if next.as_os_str() == ".." {
            current.pop();
            continue;
        }
        let candidate = current.join(&next);
        let meta = std::fs::symlink_metadata(&candidate).ok()?;
        if meta.file_type().is_symlink() {
            hops += 1;
            if hops > 40 {
                return None;
            }
            let target = std::fs::read_link(&candidate).ok()?;
            links.push((candidate, target.clone()));
            if target.is_absolute() {
                current = PathBuf::from("/");
            }
            for c in target.components().rev() {
                match c {
                    Component::Normal(n) => rest.push(PathBuf::from(n)),
                    Component::ParentDir => rest.push(PathBuf::from("..")),
                    _ => {}
                }
            }
        } else {
            current = candidate;
        }
    }
    Some((links, current))
}

/// The ancestors of `path` below `/`, outermost first.
fn ancestors(path: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = path
        .ancestors()
        .skip(1)
        .filter(|a| a.parent().is_some())
        .map(Path::to_path_buf)
        .collect();
    out.reverse();
    out
}

/// Builds the tree's operations: directories and mount points exist only where no
/// bind already provides them (a `mkdir` inside a bind would write to the host).
struct TreeBuilder {
    ops: Vec<Op>,
    made: BTreeSet<PathBuf>,
    /// Binds made so far, parents before children.
    bound: Vec<(PathBuf, BindMode)>,
}

impl TreeBuilder {
    fn under_bind(&self, path: &Path) -> bool {
        self.bound.iter().any(|(b, _)| path.starts_with(b))
    }

    /// The mode `path` already has through the innermost bind covering it.
    fn mode_at(&self, path: &Path) -> Option<BindMode> {
        self.bound
            .iter()
            .filter(|(b, _)| path.starts_with(b))
            .max_by_key(|(b, _)| b.components().count())
            .map(|(_, m)| *m)
    }

    fn dirs_for(&mut self, path: &Path) -> Result<(), SoulError> {
        for a in ancestors(path) {
            if self.made.insert(a.clone()) {
                self.ops.push(Op::Dir(cstring(&a)?));
            }
        }
        Ok(())
    }

    fn bind(&mut self, path: &Path, mode: BindMode) -> Result<(), SoulError> {
        // Already there as wanted (inside a bind of the same kind): nothing to mount.
        // Devices always get their own bind (their parent may be `nodev`).
        if mode != BindMode::Device && self.mode_at(path) == Some(mode) {
            return Ok(());
        }
        if !self.under_bind(path) {
            self.dirs_for(path)?;
            if path.is_dir() {
                if self.made.insert(path.to_path_buf()) {
                    self.ops.push(Op::Dir(cstring(path)?));
                }
            } else {
                self.ops.push(Op::File(cstring(path)?));
            }
        }
        let source = Path::new(OLD_ROOT).join(path.strip_prefix("/").unwrap_or(path));
        self.ops.push(Op::Bind {
            source: cstring(&source)?,
            target: cstring(path)?,
            mode,
        });
        self.bound.push((path.to_path_buf(), mode));
        Ok(())
    }

    fn link(&mut self, path: &Path, target: &Path) -> Result<(), SoulError> {
        if self.under_bind(path) || self.made.contains(path) {
            return Ok(());
        }
        self.dirs_for(path)?;
        self.made.insert(path.to_path_buf());
        self.ops.push(Op::Link {
            target: cstring(target)?,
            path: cstring(path)?,
        });
        Ok(())
    }
}

impl NamespacePlan {
    /// Prepares the namespaces and the tree for `plan`: runtime paths, read and list
    /// grants and executables read-only, write grants and the scratch directory
    /// read-write, the plan's devices, a `/proc`, and `cwd` as the working directory.
    /// Tools without `net` join `shared` when given (the caller keeps it alive until
    /// the child has started).
    pub(crate) fn build(
        plan: &Plan,
        cwd: &Path,
        outside: Option<(u32, u32)>,
        shared: Option<&SharedNet>,
    ) -> Result<Self, SoulError> {
        let mut wanted: BTreeMap<PathBuf, BindMode> = BTreeMap::new();
        let mut links: Vec<(PathBuf, PathBuf)> = Vec::new();
        let mut want = |p: &Path, mode: BindMode| {
            // A path that does not exist grants nothing (as with Landlock).
            let Some((via, real)) = resolve(p) else {
                return;
            };
            if real.starts_with(OLD_ROOT) || real == Path::new("/") {
                return;
            }
            links.extend(via);
            let entry = wanted.entry(real).or_insert(mode);
            *entry = (*entry).max(mode);
        };
        for p in plan
            .read
            .iter()
            .chain(&plan.read_files)
            .chain(&plan.list)
            .chain(&plan.exec)
        {
            want(p, BindMode::ReadOnly);
        }
        for p in &plan.write {
            want(p, BindMode::ReadWrite);
        }
        for p in &plan.devices {
            want(p, BindMode::Device);
        }
        // Parents before children, so a nested bind lands on top of its parent's.
        let mut binds: Vec<(PathBuf, BindMode)> = wanted.into_iter().collect();
        binds.sort_by(|(a, _), (b, _)| {
            (a.components().count(), a.as_os_str()).cmp(&(b.components().count(), b.as_os_str()))
        });
        let mut tree = TreeBuilder {
            ops: Vec::new(),
            made: BTreeSet::new(),
            bound: Vec::new(),
        };
        for (path, mode) in &binds {
            tree.bind(path, *mode)?;
        }
        for (path, target) in &links {
            tree.link(path, target)?;
        }
        let proc_dir = Path::new("/proc");
        if !tree.under_bind(proc_dir) && tree.made.insert(proc_dir.to_path_buf()) {
            tree.ops.push(Op::Dir(cstring(proc_dir)?));
        }
        // The tmpfs that becomes the root is first mounted on a directory every
        // system has; the pivot moves it away, so the host's directory is visible
        // again under the old root.
        let base = if Path::new("/tmp").is_dir() {
            PathBuf::from("/tmp")
        } else {
            PathBuf::from("/proc")
        };
        use std::os::fd::AsRawFd;
        let join = shared
            .filter(|_| !plan.net)
            .map(|s| (s.user.as_raw_fd(), s.net.as_raw_fd()));
        // Inside the shared user namespace the tool's outside id is already SANDBOX_ID.
        let (uid_map, gid_map) = if join.is_some() {
            id_maps(Some((SANDBOX_ID, SANDBOX_ID)))
        } else {
            id_maps(outside)
        };
        Ok(Self {
            run_as: outside,
            join,
            flags: unshare_flags(plan.net || join.is_some()),
            uid_map,
            gid_map,
            base_old_root: cstring(&base.join(OLD_ROOT.trim_start_matches('/')))?,
            base: cstring(&base)?,
            ops: tree.ops,
            cwd: cstring(cwd)?,
            status_fd: -1,
        })
    }

    /// Sends the tool's wait status to `fd` (a pipe's write end, inherited by the
    /// child) as soon as the tool has ended.
    pub(crate) fn report_status_to(mut self, fd: std::os::fd::RawFd) -> Self {
        self.status_fd = fd;
        self
    }

    /// Runs in the forked child before `exec`: system calls only. Returns in the tool's
    /// process, inside the namespaces and the new root; the process in between never
    /// returns.
    pub(crate) fn enter(&self) -> io::Result<()> {
        // Errors keep their errno: that is all `Command::spawn` passes back.
        if let Some((uid, gid)) = self.run_as {
            sys::become_user(uid, gid)?;
            sys::die_with_parent()?;
        }
        if let Some((user, net)) = self.join {
            sys::setns(user, libc::CLONE_NEWUSER)?;
            sys::setns(net, libc::CLONE_NEWNET)?;
            sys::die_with_parent()?;
        }
        sys::unshare(self.flags)?;
        sys::write_file(c"/proc/self/setgroups", b"deny")?;
        sys::write_file(c"/proc/self/uid_map", self.uid_map.to_bytes())?;
        sys::write_file(c"/proc/self/gid_map", self.gid_map.to_bytes())?;
        let (report_read, report_write) = sys::pipe_cloexec()?;
        let pid = sys::fork()?;
        if pid > 0 {
            sys::close_all_fds_except([report_read, report_read]);
            sys::relay_exit(report_read, pid);
        }
        // PID 1 of the new namespace; it dies with the process in between.
        sys::die_with_parent()?;
        sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)?;
        sys::mount(
            Some(c"tmpfs"),
            &self.base,
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(c"mode=0755,size=1m"),
        )?;
        sys::mkdir(&self.base_old_root, 0o700)?;
        sys::pivot_root(&self.base, &self.base_old_root)?;
        sys::chdir(c"/")?;
        for op in &self.ops {
            match op {
                Op::Dir(p) => sys::mkdir(p, 0o755)?,
                Op::File(p) => sys::touch(p)?,
                Op::Link { target, path } => sys::symlink(target, path)?,
                Op::Bind {
                    source,
                    target,
                    mode,
                } => {
                    sys::mount(
                        Some(source),
                        target,
                        None,
                        libc::MS_BIND | libc::MS_REC,
                        None,
                    )?;
                    let mut flags = libc::MS_REMOUNT
                        | libc::MS_BIND
                        | libc::MS_NOSUID
                        | sys::mount_flags(target)?;
                    match mode {
                        BindMode::ReadOnly => flags |= libc::MS_RDONLY | libc::MS_NODEV,
                        BindMode::ReadWrite => flags |= libc::MS_NODEV,
                        BindMode::Device => {}
                    }
                    sys::mount(None, target, None, flags, None)?;
                }
            }
        }
        // A /proc of the new PID namespace (it shows only the tool's processes). The
        // kernel refuses it where the host's /proc is partly masked (some
        // containers); the tool then has no /proc, which only narrows what it sees.
        let _ = sys::mount(
            Some(c"proc"),
            c"/proc",
            Some(c"proc"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            None,
        );
        sys::umount_detach(c"/oldroot")?;
        sys::rmdir(c"/oldroot")?;
        sys::mount(
            None,
            c"/",
            None,
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
            None,
        )?;
        sys::chdir(&self.cwd)?;
        // PID 1 stays behind as the namespace's init (reaping, reporting the tool's
        // status); the tool is PID 2, so signals act on it as they would outside.
        let tool = sys::fork()?;
        if tool > 0 {
            sys::close_all_fds_except([self.status_fd, report_write]);
            sys::reap_until(tool, self.status_fd, report_write);
        }
        sys::die_with_parent()?;
        Ok(())
    }
}

/// Whether namespaces can be built here (as `outside` when given): `Err` names the
/// step that failed.
pub(crate) fn probe(outside: Option<(u32, u32)>) -> Result<(), String> {
    let (uid_map, gid_map) = id_maps(outside);
    sys::probe_namespaces(outside, unshare_flags(false), &uid_map, &gid_map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_records_the_symlinks_on_the_way() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().canonicalize().unwrap().join("real");
        std::fs::create_dir_all(real.join("inner")).unwrap();
        let link = real.parent().unwrap().join("link");
        std::os::unix::fs::symlink("real", &link).unwrap();
        let (links, path) = resolve(&link.join("inner")).unwrap();
        assert_eq!(path, real.join("inner"));
        assert_eq!(links, vec![(link, PathBuf::from("real"))]);
        assert!(resolve(&real.join("missing")).is_none());
    }

    #[test]
    fn no_directory_is_made_inside_a_bind() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(top.join("a/b")).unwrap();
        let plan = Plan {
            read: vec![top.clone()],
            write: vec![top.join("a/b")],
            ..Plan::default()
        };
        let ns = NamespacePlan::build(&plan, Path::new("/"), None, None).unwrap();
        let dirs: Vec<String> = ns
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Dir(p) => Some(p.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        assert!(
            dirs.iter()
                .all(|d| !d.starts_with(top.to_str().unwrap()) || *d == top.to_str().unwrap()),
            "{dirs:?}"
        );
        let binds = ns
            .ops
            .iter()
            .filter(|op| matches!(op, Op::Bind { .. }))
            .count();
        assert_eq!(binds, 2);
        // A read-only path inside a read-only bind needs no mount of its own.
        let plan = Plan {
            read: vec![top.clone(), top.join("a")],
            ..Plan::default()
        };
        let ns = NamespacePlan::build(&plan, Path::new("/"), None, None).unwrap();
        let binds = ns
            .ops
            .iter()
            .filter(|op| matches!(op, Op::Bind { .. }))
            .count();
        assert_eq!(binds, 1);
    }
}
