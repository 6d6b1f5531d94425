//! The few raw system calls the executor needs that std does not offer.
//!
//! `unsafe` is allowed here (the workspace denies it elsewhere) because rlimits,
//! `prctl`, `fcntl`, `killpg` and `waitid` have no safe wrapper in std or our dependencies.
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

/// Clears `FD_CLOEXEC` on `fd` so the next `exec` passes it on (used in the child).
pub(crate) fn clear_cloexec(fd: std::os::fd::RawFd) -> io::Result<()> {
    // SAFETY: fcntl with integer arguments only; an invalid fd is reported as EBADF.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
