//! The few raw system calls the executor needs that std does not offer.
//!
//! `unsafe` is allowed here (the workspace denies it elsewhere) because rlimits,
//! `prctl`, `killpg`, `waitid`, namespaces and mounts have no safe wrapper in std or
//! our dependencies.
//! Each call passes plain integers or a pointer to a local, initialized struct, and
//! every return value is checked.
#![allow(unsafe_code)]

use std::io;

/// Sets a resource limit (soft and hard) in the calling process.
pub(crate) fn set_rlimit(resource: libc::__rlimit_resource_t, value: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: value as libc::rlim_t,
        rlim_max: value as libc::rlim_t,
    };
    // SAFETY: `lim` is a valid, initialized rlimit that outlives the call.
    if unsafe { libc::setrlimit(resource, &lim) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Asks the kernel to SIGKILL the calling process when its parent thread exits.
pub(crate) fn die_with_parent() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    } == 0
    {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets `no_new_privs`: no setuid binary or file capability can raise privileges.
pub(crate) fn no_new_privs() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// SIGKILLs every process in group `pgid`. A group that is already gone is fine.
pub(crate) fn kill_group(pgid: u32) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    if pgid <= 1 {
        return;
    }
    // SAFETY: killpg with integer arguments only; pgid > 1 so it never targets
    // our own group (0) or every process (-1 / 1).
    unsafe {
        libc::killpg(pgid, libc::SIGKILL);
    }
}

/// Blocks until process `pid` has exited, without reaping it, so its pid (and so
/// its process group id) cannot be reused while the group is being killed.
pub(crate) fn wait_exited_no_reap(pid: u32) -> io::Result<()> {
    let id: libc::id_t = pid;
    loop {
        // SAFETY: an all-zero siginfo_t is a valid value; the kernel fills it in.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid, writable siginfo_t for the duration of the call.
        let r = unsafe { libc::waitid(libc::P_PID, id, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Turns a `-1` return into the last OS error.
fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `unshare(flags)`: moves the calling process into new namespaces.
pub(crate) fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare with an integer argument only.
    check(unsafe { libc::unshare(flags) })
}

/// `setns(fd, nstype)`: joins the namespace `fd` refers to.
pub(crate) fn setns(fd: libc::c_int, nstype: libc::c_int) -> io::Result<()> {
    // SAFETY: setns with integer arguments only.
    check(unsafe { libc::setns(fd, nstype) })
}

/// The Landlock ABI version this kernel supports (0 without Landlock).
pub(crate) fn landlock_abi() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
    // SAFETY: the version query takes a null attribute pointer and size 0.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    r.max(0)
}

/// Makes a user namespace and an empty network namespace owned by it, and returns
/// descriptors that keep both alive (`(user, net)`): a forked child — as `run_as`
/// when given — unshares them, maps `uid_map` / `gid_map`, and waits while the parent
/// opens its namespace files; then it exits.
pub(crate) fn hold_user_and_net(
    run_as: Option<(u32, u32)>,
    uid_map: &std::ffi::CStr,
    gid_map: &std::ffi::CStr,
) -> Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd), String> {
    use std::os::fd::AsRawFd;
    let (mut ready, ready_w) = io::pipe().map_err(|e| format!("pipe: {e}"))?;
    let (hold_r, hold) = io::pipe().map_err(|e| format!("pipe: {e}"))?;
    let (rfd, hfd) = (ready_w.as_raw_fd(), hold_r.as_raw_fd());
    let pid = fork().map_err(|e| format!("fork: {e}"))?;
    if pid == 0 {
        // Only the report's write end and the hold's read end stay open here: the
        // hold ends when every write end is closed, the parent's included.
        close_all_fds_except([rfd, hfd]);
        let made = (|| -> io::Result<()> {
            if let Some((uid, gid)) = run_as {
                become_user(uid, gid)?;
            }
            unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET)?;
            write_file(c"/proc/self/setgroups", b"deny")?;
            write_file(c"/proc/self/uid_map", uid_map.to_bytes())?;
            write_file(c"/proc/self/gid_map", gid_map.to_bytes())?;
            Ok(())
        })();
        let report: i32 = match made {
            Ok(()) => 0,
            Err(e) => e.raw_os_error().unwrap_or(libc::EINVAL),
        };
        let mut byte = 0u8;
        // SAFETY: system calls on our pipes with locals, then _exit.
        unsafe {
            libc::write(rfd, (&report as *const i32).cast(), 4);
            libc::read(hfd, (&mut byte as *mut u8).cast(), 1);
            libc::_exit(0);
        }
    }
    drop((ready_w, hold_r));
    let mut report = [0u8; 4];
    let got = std::io::Read::read_exact(&mut ready, &mut report);
    let opened = match (got, i32::from_ne_bytes(report)) {
        (Err(e), _) => Err(format!("the namespace holder ended without a report: {e}")),
        (Ok(()), 0) => {
            let open = |kind: &str| {
                std::fs::File::open(format!("/proc/{pid}/ns/{kind}"))
                    .map(std::os::fd::OwnedFd::from)
                    .map_err(|e| format!("opening the holder's {kind} namespace: {e}"))
            };
            open("user").and_then(|user| Ok((user, open("net")?)))
        }
        (Ok(()), errno) => Err(format!(
            "making the namespaces: {}",
            io::Error::from_raw_os_error(errno)
        )),
    };
    drop(hold);
    let _ = wait_status(pid);
    opened
}

/// Writes `data` to the file `path` (opened write-only, not created): the
/// `/proc/self/{uid_map,gid_map,setgroups}` files. No allocation.
pub(crate) fn write_file(path: &std::ffi::CStr, data: &[u8]) -> io::Result<()> {
    // SAFETY: `path` is a valid NUL-terminated string for the duration of the call.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `data` is a valid buffer of `data.len()` bytes; `fd` is ours.
    let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
    let err = io::Error::last_os_error();
    // SAFETY: closing the fd opened above.
    unsafe { libc::close(fd) };
    if n < 0 || n as usize != data.len() {
        return Err(if n < 0 {
            err
        } else {
            io::Error::from_raw_os_error(libc::EIO)
        });
    }
    Ok(())
}

/// `fork()`. Only for the forked child of a `Command` (single-threaded), or for a
/// child that makes system calls only and then `_exit`s.
pub(crate) fn fork() -> io::Result<libc::pid_t> {
    // SAFETY: the callers' children only make system calls before exec or _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(pid)
    }
}

/// A pipe whose both ends close on `exec`: `(read, write)`.
pub(crate) fn pipe_cloexec() -> io::Result<(libc::c_int, libc::c_int)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for the duration of the call.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    Ok((fds[0], fds[1]))
}

/// Closes every file descriptor but those in `keep` (at most two, any order): a
/// process that only waits holds nothing of the tool's (its pipes must see EOF when
/// the tool ends, and `Command`'s error pipe when it `exec`s).
pub(crate) fn close_all_fds_except(keep: [libc::c_int; 2]) {
    let (a, b) = (keep[0].min(keep[1]), keep[0].max(keep[1]));
    // The ranges between the kept descriptors, as close_range takes them.
    let ranges = [(0, a - 1), (a + 1, b - 1), (b + 1, libc::c_int::MAX)];
    for (first, last) in ranges {
        if first > last || last < 0 {
            continue;
        }
        // SAFETY: close_range with integer arguments only.
        let r = unsafe { libc::syscall(libc::SYS_close_range, first as u32, last as u32, 0u32) };
        if r != 0 {
            for fd in first..=last.min(4095) {
                // SAFETY: closing a descriptor that may not exist is harmless (EBADF).
                unsafe { libc::close(fd) };
            }
        }
    }
}

/// Closes every descriptor but stdin, stdout, stderr and `keep`.
pub(crate) fn close_fds_except_stdio_and(keep: libc::c_int) {
    // `keep` is never stdio (0–2 are dup2'd over it), but a stray value must not close stdio.
    for (first, last) in [(3, keep - 1), ((keep + 1).max(3), libc::c_int::MAX)] {
        if first > last {
            continue;
        }
        // SAFETY: close_range with integer arguments only.
        let r = unsafe { libc::syscall(libc::SYS_close_range, first as u32, last as u32, 0u32) };
        if r != 0 {
            for fd in first..=last.min(4095) {
                // SAFETY: closing a descriptor that may not exist is harmless (EBADF).
                unsafe { libc::close(fd) };
            }
        }
    }
}

/// `waitpid(pid)` until it reports, retrying on `EINTR`; `None` on another error.
fn wait_status(pid: libc::pid_t) -> Option<(libc::pid_t, libc::c_int)> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: `status` is a valid, writable int for the duration of the call.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r > 0 {
            return Some((r, status));
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return None;
        }
    }
}

/// Ends the calling process the way a wait `status` says a process ended: the same
/// exit code, or the same signal (re-raised with its default action, no core file).
fn end_like(status: libc::c_int) -> ! {
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain system calls with integer arguments or pointers to locals.
        unsafe {
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
    }
    // SAFETY: _exit with an integer argument only.
    unsafe { libc::_exit(libc::WEXITSTATUS(status)) }
}

/// Microseconds of user plus system time in `ru`.
fn rusage_micros(ru: &libc::rusage) -> u64 {
    let tv = |t: libc::timeval| -> u64 {
        u64::try_from(t.tv_sec)
            .unwrap_or(0)
            .saturating_mul(1_000_000)
            .saturating_add(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    tv(ru.ru_utime).saturating_add(tv(ru.ru_stime))
}

/// The size of the report the namespace's init sends the executor: the tool's wait
/// status (`i32`), then the CPU microseconds of the processes it reaped (`u64`),
/// native-endian. One write, under `PIPE_BUF`, so it arrives whole.
pub(crate) const STATUS_REPORT_LEN: usize = 12;

/// Splits a report of [`STATUS_REPORT_LEN`] bytes into the tool's wait status and
/// the CPU time of the processes the init reaped.
pub(crate) fn parse_status_report(
    raw: &[u8; STATUS_REPORT_LEN],
) -> (libc::c_int, std::time::Duration) {
    let mut status = [0u8; 4];
    status.copy_from_slice(&raw[..4]);
    let mut micros = [0u8; 8];
    micros.copy_from_slice(&raw[4..]);
    (
        libc::c_int::from_ne_bytes(status),
        std::time::Duration::from_micros(u64::from_ne_bytes(micros)),
    )
}

/// The init of the tool's PID namespace: reaps every process until `tool` ends,
/// sends the tool's wait status with the CPU time of every process it reaped (the
/// tool, with the children the tool waited for, and orphans the init reaped:
/// `RUSAGE_CHILDREN` of a process whose only child is the tool) to the executor on
/// `executor` ([`STATUS_REPORT_LEN`] bytes) and the status alone to the process in
/// between on `relay`, executor first so the call ends without waiting for another
/// process to wake, and exits (which ends whatever the tool left running in the
/// namespace; their CPU is not counted). A descriptor below 0 is skipped.
pub(crate) fn reap_until(tool: libc::pid_t, executor: libc::c_int, relay: libc::c_int) -> ! {
    loop {
        match wait_status(-1) {
            Some((pid, status)) if pid == tool => {
                // SAFETY: an all-zero rusage is a valid value; getrusage fills it
                // in (on failure it stays zero: no CPU reported).
                let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
                // SAFETY: `ru` is a valid, writable rusage for the duration of the call.
                unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
                let mut report = [0u8; STATUS_REPORT_LEN];
                report[..4].copy_from_slice(&status.to_ne_bytes());
                report[4..].copy_from_slice(&rusage_micros(&ru).to_ne_bytes());
                // SAFETY: writing locals to our pipes, then _exit.
                unsafe {
                    if executor >= 0 {
                        libc::write(executor, report.as_ptr().cast(), report.len());
                    }
                    if relay >= 0 {
                        libc::write(relay, (&status as *const libc::c_int).cast(), 4);
                    }
                    libc::_exit(0);
                }
            }
            Some(_) => {}
            // SAFETY: _exit with an integer argument only.
            None => unsafe { libc::_exit(127) },
        }
    }
}

/// `wait4(pid)` until it reports, retrying on `EINTR`: the process's wait status and
/// the CPU time (user and system) of it and of the descendants it (and they) reaped.
pub(crate) fn wait_with_cpu(pid: u32) -> io::Result<(libc::c_int, std::time::Duration)> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: an all-zero rusage is a valid value; the kernel fills it in.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `status` and `ru` are valid, writable locals for the duration of
        // the call.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            return Ok((status, std::time::Duration::from_micros(rusage_micros(&ru))));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The process between the executor and the tool's namespace: reads the tool's
/// wait status from `report` (the init sends it to the executor too, so the
/// namespaces' teardown, paid when their init exits, is not on the call's path),
/// reaps the namespace's init `init`, and ends as the tool ended (or as the init did,
/// when no status came), so the executor sees the tool's own exit code or signal
/// whichever way it learns it.
pub(crate) fn relay_exit(report: libc::c_int, init: libc::pid_t) -> ! {
    let mut status: libc::c_int = 0;
    let mut got = 0usize;
    while got < 4 {
        // SAFETY: reading into the remaining bytes of a local int.
        let n = unsafe {
            libc::read(
                report,
                (&mut status as *mut libc::c_int)
                    .cast::<u8>()
                    .add(got)
                    .cast(),
                4 - got,
            )
        };
        if n > 0 {
            got += n as usize;
        } else if n == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            break;
        }
    }
    let init_status = wait_status(init).map(|(_, s)| s);
    match (got, init_status) {
        (4, _) => end_like(status),
        (_, Some(s)) => end_like(s),
        // SAFETY: _exit with an integer argument only.
        _ => unsafe { libc::_exit(127) },
    }
}

/// Blocks until one byte arrives on `fd`, retrying on `EINTR`; end-of-file (the
/// writer is gone) or another error is an error.
pub(crate) fn wait_for_byte(fd: libc::c_int) -> io::Result<()> {
    let mut byte = 0u8;
    loop {
        // SAFETY: reading one byte into a local.
        let n = unsafe { libc::read(fd, (&mut byte as *mut u8).cast(), 1) };
        if n == 1 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `mount(2)` with optional source, file system type and data.
pub(crate) fn mount(
    source: Option<&std::ffi::CStr>,
    target: &std::ffi::CStr,
    fstype: Option<&std::ffi::CStr>,
    flags: libc::c_ulong,
    data: Option<&std::ffi::CStr>,
) -> io::Result<()> {
    let p = |s: Option<&std::ffi::CStr>| s.map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: every pointer is null or a valid NUL-terminated string.
    check(unsafe { libc::mount(p(source), target.as_ptr(), p(fstype), flags, p(data).cast()) })
}

/// The per-mount flags of the mount at `path` that a bind remount must keep (a user
/// namespace may not clear flags it inherited locked), as `MS_*` bits.
pub(crate) fn mount_flags(path: &std::ffi::CStr) -> io::Result<libc::c_ulong> {
    // SAFETY: an all-zero statvfs is a valid value; the kernel fills it in.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` writable for the duration of the call.
    check(unsafe { libc::statvfs(path.as_ptr(), &mut st) })?;
    let mut flags = 0;
    for (st_flag, ms_flag) in [
        (libc::ST_RDONLY, libc::MS_RDONLY),
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if st.f_flag & st_flag != 0 {
            flags |= ms_flag;
        }
    }
    Ok(flags)
}

/// Detaches the mount at `path` and everything below it.
pub(crate) fn umount_detach(path: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: `path` is a valid NUL-terminated string.
    check(unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) })
}

/// `pivot_root(new_root, put_old)`.
pub(crate) fn pivot_root(new_root: &std::ffi::CStr, put_old: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: both pointers are valid NUL-terminated strings.
    let r = unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) };
    check(if r < 0 { -1 } else { 0 })
}

/// `mkdir(path, mode)`; an existing path is fine.
pub(crate) fn mkdir(path: &std::ffi::CStr, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: `path` is a valid NUL-terminated string.
    match check(unsafe { libc::mkdir(path.as_ptr(), mode) }) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        other => other,
    }
}

/// Creates an empty file at `path` (a mount point for a file bind); an existing one is fine.
pub(crate) fn touch(path: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: `path` is a valid NUL-terminated string.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0o644 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: closing the fd opened above.
    unsafe { libc::close(fd) };
    Ok(())
}

/// `symlink(target, path)`; an existing path is fine.
pub(crate) fn symlink(target: &std::ffi::CStr, path: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: both pointers are valid NUL-terminated strings.
    match check(unsafe { libc::symlink(target.as_ptr(), path.as_ptr()) }) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        other => other,
    }
}

/// `rmdir(path)`.
pub(crate) fn rmdir(path: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: `path` is a valid NUL-terminated string.
    check(unsafe { libc::rmdir(path.as_ptr()) })
}

/// `chdir(path)`.
pub(crate) fn chdir(path: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: `path` is a valid NUL-terminated string.
    check(unsafe { libc::chdir(path.as_ptr()) })
}

/// Empties the capability bounding set and the ambient set, so no `exec` can give
/// the tool a capability (root's included). Dropping needs `CAP_SETPCAP`: a process
/// without it (an unprivileged server without namespaces) has no capability an exec
/// could keep under `no_new_privs`, so `EPERM` there is not an error.
pub(crate) fn drop_capabilities() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        );
    }
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // Past the kernel's last capability.
                Some(libc::EINVAL) => return Ok(()),
                // SAFETY: geteuid has no arguments.
                Some(libc::EPERM) if unsafe { libc::geteuid() } != 0 => return Ok(()),
                _ => return Err(e),
            }
        }
    }
    Ok(())
}

/// The calling process's effective user and group ids.
pub(crate) fn effective_ids() -> (u32, u32) {
    // SAFETY: no arguments.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// Whether this kernel and this process may build the sandbox's namespaces: forks a
/// child that makes the same unshare, id maps and private mount tree, and names the
/// first step that failed with its error.
pub(crate) fn probe_namespaces(
    run_as: Option<(u32, u32)>,
    flags: libc::c_int,
    uid_map: &std::ffi::CStr,
    gid_map: &std::ffi::CStr,
) -> Result<(), String> {
    const STEPS: [&str; 7] = [
        "",
        "unshare",
        "writing /proc/self/setgroups",
        "writing /proc/self/uid_map",
        "writing /proc/self/gid_map",
        "making the mount tree private",
        "becoming the unprivileged tool user",
    ];
    use std::os::fd::AsRawFd;
    let (mut reader, writer) = io::pipe().map_err(|e| format!("pipe: {e}"))?;
    let wfd = writer.as_raw_fd();
    let pid = fork().map_err(|e| format!("fork: {e}"))?;
    if pid == 0 {
        let step = (|| -> Result<(), (i32, io::Error)> {
            if let Some((uid, gid)) = run_as {
                become_user(uid, gid).map_err(|e| (6, e))?;
            }
            unshare(flags).map_err(|e| (1, e))?;
            write_file(c"/proc/self/setgroups", b"deny").map_err(|e| (2, e))?;
            write_file(c"/proc/self/uid_map", uid_map.to_bytes()).map_err(|e| (3, e))?;
            write_file(c"/proc/self/gid_map", gid_map.to_bytes()).map_err(|e| (4, e))?;
            mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None).map_err(|e| (5, e))?;
            Ok(())
        })();
        let report: [i32; 2] = match step {
            Ok(()) => [0, 0],
            Err((step, e)) => [step, e.raw_os_error().unwrap_or(0)],
        };
        // SAFETY: writing a local array to our pipe, then _exit; system calls only.
        unsafe {
            libc::write(wfd, report.as_ptr().cast(), std::mem::size_of_val(&report));
            libc::_exit(0);
        }
    }
    drop(writer);
    let mut bytes = Vec::new();
    let _ = std::io::Read::read_to_end(&mut reader, &mut bytes);
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: `status` is a valid, writable int.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid || (r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted) {
            break;
        }
    }
    let word = |i: usize| -> Option<i32> {
        Some(i32::from_ne_bytes(
            bytes.get(i * 4..i * 4 + 4)?.try_into().ok()?,
        ))
    };
    match (word(0), word(1)) {
        (Some(0), _) => Ok(()),
        (Some(step), Some(errno)) => Err(format!(
            "{} failed: {}",
            STEPS.get(step as usize).copied().unwrap_or("a step"),
            io::Error::from_raw_os_error(errno)
        )),
        _ => Err("the probe process ended without a report".into()),
    }
}

/// Becomes `uid`/`gid` (real, effective and saved; no supplementary groups) and
/// stays dumpable, so the process can still write its own `/proc/self` id maps.
/// Changing credentials clears the parent-death signal: the caller sets it again.
pub(crate) fn become_user(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: plain system calls with integer arguments (setgroups with a null list
    // of length 0).
    unsafe {
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setresgid(gid, gid, gid))?;
        check(libc::setresuid(uid, uid, uid))?;
        check(libc::prctl(
            libc::PR_SET_DUMPABLE,
            1 as libc::c_ulong,
            0,
            0,
            0,
        ))?;
    }
    Ok(())
}
