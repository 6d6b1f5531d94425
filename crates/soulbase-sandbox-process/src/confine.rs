//! The confinement a child applies to itself between `fork` and `exec`: namespaces
//! (see [`crate::namespace`]), rlimits, an empty capability bounding set,
//! `no_new_privs`, Landlock and seccomp. Everything that allocates or opens files is
//! prepared in the parent ([`Confinement::build`]); the child only makes syscalls
//! ([`Confinement::apply`]).

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, BitFlags, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreated,
    RulesetCreatedAttr, RulesetStatus, Scope,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use soulbase_errors::{ErrorCode, SoulError};

use crate::namespace::NamespacePlan;
use crate::sys;

/// The Landlock ABI we ask for; older kernels get the subset they support, and a
/// kernel without Landlock makes the spawn fail (see [`Confinement::apply`]).
const LANDLOCK_ABI: ABI = ABI::V6;

/// What a call's child may do, decided by the executor from the profile.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Read-only paths (files and directories: contents and listings).
    pub read: Vec<PathBuf>,
    /// Paths whose files may be read.
    pub read_files: Vec<PathBuf>,
    /// Paths whose directories may be listed.
    pub list: Vec<PathBuf>,
    /// Paths below which files may be created, written and removed.
    pub write: Vec<PathBuf>,
    /// Files that may be executed (and read).
    pub exec: Vec<PathBuf>,
    /// Device files opened read-write (`/dev/null`).
    pub devices: Vec<PathBuf>,
    /// Whether sockets other than `AF_UNIX` may be created.
    pub net: bool,
    /// Whether `AF_UNIX` sockets may be created: under namespaces (where only bound
    /// socket paths exist), or when an `fs` grant names a socket file.
    pub unix: bool,
    /// Whether new processes may be created.
    pub spawn: bool,
    /// `(resource, limit)` pairs.
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
}

/// A prepared confinement, moved into the child.
pub(crate) struct Confinement {
    namespaces: Option<NamespacePlan>,
    landlock: Option<RulesetCreated>,
    seccomp: Vec<BpfProgram>,
    rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    /// A pipe to read one byte from, fully confined and with every other descriptor
    /// but stdio closed, before `exec` (a spare launch, see [`crate::warm`]);
    /// end-of-file fails the launch instead.
    go: Option<libc::c_int>,
}

fn unavailable(note: String) -> SoulError {
    SoulError::of(ErrorCode::ProviderUnavailable).with_note(note)
}

fn add(
    ruleset: RulesetCreated,
    path: &Path,
    access: BitFlags<AccessFs>,
) -> Result<RulesetCreated, SoulError> {
    let Ok(fd) = PathFd::new(path) else {
        // A path that vanished grants nothing; skipping it only narrows access.
        return Ok(ruleset);
    };
    let access = if path.is_dir() {
        access
    } else {
        access & AccessFs::from_file(LANDLOCK_ABI)
    };
    if access.is_empty() {
        return Ok(ruleset);
    }
    ruleset
        .add_rule(PathBeneath::new(fd, access))
        .map_err(|e| unavailable(format!("landlock rule for {}: {e}", path.display())))
}

impl Confinement {
    /// Prepares the Landlock ruleset and seccomp programs for `plan`, inside
    /// `namespaces` when given.
    pub(crate) fn build(plan: &Plan, namespaces: Option<NamespacePlan>) -> Result<Self, SoulError> {
        let abi = LANDLOCK_ABI;
        let ll = |e: landlock::RulesetError| unavailable(format!("landlock: {e}"));
        let mut ruleset = Ruleset::default()
            .handle_access(AccessFs::from_all(abi))
            .map_err(ll)?
            .scope(Scope::Signal | Scope::AbstractUnixSocket)
            .map_err(ll)?
            .create()
            .map_err(ll)?;
        let read: BitFlags<AccessFs> = AccessFs::ReadFile | AccessFs::ReadDir;
        for p in &plan.read {
            ruleset = add(ruleset, p, read)?;
        }
        for p in &plan.read_files {
            ruleset = add(ruleset, p, AccessFs::ReadFile.into())?;
        }
        for p in &plan.list {
            ruleset = add(ruleset, p, AccessFs::ReadDir.into())?;
        }
        for p in &plan.write {
            ruleset = add(ruleset, p, AccessFs::from_all(abi) & !AccessFs::Execute)?;
        }
        for p in &plan.exec {
            ruleset = add(ruleset, p, AccessFs::ReadFile | AccessFs::Execute)?;
        }
        for p in &plan.devices {
            ruleset = add(ruleset, p, AccessFs::ReadFile | AccessFs::WriteFile)?;
        }
        Ok(Self {
            namespaces,
            landlock: Some(ruleset),
            seccomp: seccomp_programs(plan)?,
            rlimits: plan.rlimits.clone(),
            go: None,
        })
    }

    /// Makes the child wait, with everything applied, for one byte on `fd` (a pipe's
    /// read end it inherits) before it `exec`s.
    pub(crate) fn wait_for_go(mut self, fd: libc::c_int) -> Self {
        self.go = Some(fd);
        self
    }

    /// Applies everything to the calling process. Runs in the forked child, before
    /// `exec`: only system calls, no allocation beyond what the landlock crate does to
    /// report its status. Fails (and so fails the spawn) when Landlock is not enforced.
    pub(crate) fn apply(&mut self) -> io::Result<()> {
        sys::die_with_parent()?;
        if let Some(ns) = &self.namespaces {
            ns.enter()?;
        }
        for (resource, value) in &self.rlimits {
            sys::set_rlimit(*resource, *value)?;
        }
        sys::drop_capabilities()?;
        sys::no_new_privs()?;
        let Some(ruleset) = self.landlock.take() else {
            return Err(io::Error::other("landlock ruleset already used"));
        };
        let status = ruleset.restrict_self().map_err(io::Error::other)?;
        if status.ruleset == RulesetStatus::NotEnforced {
            return Err(io::Error::other("landlock is not supported by this kernel"));
        }
        for prog in &self.seccomp {
            seccompiler::apply_filter(prog).map_err(io::Error::other)?;
        }
        if let Some(fd) = self.go {
            // A spare may wait long: it must not keep other calls' pipes open (their
            // readers would never see end-of-file). This also closes the pipe the
            // spawn reports through, so the spawn returns now; after the go byte an
            // `exec` failure shows as exit status 1.
            sys::close_fds_except_stdio_and(fd);
            sys::wait_for_byte(fd)?;
        }
        Ok(())
    }
}

fn filter(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    errno: i32,
    arch: TargetArch,
) -> Result<BpfProgram, SoulError> {
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .map_err(|e| unavailable(format!("seccomp filter: {e}")))?;
    f.try_into()
        .map_err(|e: seccompiler::BackendError| unavailable(format!("seccomp filter: {e}")))
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompRule, SoulError> {
    let c = SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value)
        .map_err(|e| unavailable(format!("seccomp condition: {e}")))?;
    SeccompRule::new(vec![c]).map_err(|e| unavailable(format!("seccomp rule: {e}")))
}

/// A rule matching when argument `arg` is not zero (another process than the caller).
fn not_self(arg: u8) -> Result<SeccompRule, SoulError> {
    cond(arg, SeccompCmpOp::Ne, 0)
}

/// The seccomp programs: one per errno, since a filter has a single match action.
fn seccomp_programs(plan: &Plan) -> Result<Vec<BpfProgram>, SoulError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| unavailable(format!("seccomp: {e}")))?;
    let mut out = Vec::new();

    // EACCES: sockets the plan does not allow. `net` allows every family but
    // `AF_UNIX`; `unix` allows `AF_UNIX` (only the bound socket paths exist under
    // namespaces); socketpair makes no addressable socket and stays allowed.
    let family = match (plan.net, plan.unix) {
        (true, true) => None,
        (true, false) => Some(vec![cond(0, SeccompCmpOp::Eq, libc::AF_UNIX as u64)?]),
        (false, true) => Some(vec![cond(0, SeccompCmpOp::Ne, libc::AF_UNIX as u64)?]),
        // An empty rule list matches the call whatever its arguments.
        (false, false) => Some(Vec::new()),
    };
    if let Some(rule) = family {
        let mut rules = BTreeMap::new();
        rules.insert(libc::SYS_socket, rule);
        out.push(filter(rules, libc::EACCES, arch)?);
    }

    // EPERM: io_uring (it can open sockets and files behind seccomp's back), leaving
    // the process group, reaching other processes (resource limits, priorities,
    // affinity, tracing, their memory), kernel facilities a tool never needs
    // (namespaces, mounts, keyrings, BPF, modules, clocks, host names, reboot, file
    // handles that bypass path checks), device nodes, and — unless allowed — creating
    // processes.
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for sc in [
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_setsid,
        libc::SYS_setpgid,
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_kexec_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
        libc::SYS_adjtimex,
        libc::SYS_sethostname,
        libc::SYS_setdomainname,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
    ] {
        rules.insert(sc, Vec::new());
    }
    // Only on itself (pid 0): resource limits, scheduling, affinity.
    for sc in [
        libc::SYS_prlimit64,
        libc::SYS_sched_setaffinity,
        libc::SYS_sched_setscheduler,
        libc::SYS_sched_setparam,
        libc::SYS_sched_setattr,
    ] {
        rules.insert(sc, vec![not_self(0)?]);
    }
    // setpriority(which, who, prio): only PRIO_PROCESS of itself.
    rules.insert(libc::SYS_setpriority, vec![not_self(0)?, not_self(1)?]);
    // Device nodes: character and block special files (FIFOs stay allowed).
    let devices = |arg: u8| -> Result<Vec<SeccompRule>, SoulError> {
        let fmt = libc::S_IFMT as u64;
        Ok(vec![
            cond(arg, SeccompCmpOp::MaskedEq(fmt), libc::S_IFCHR as u64)?,
            cond(arg, SeccompCmpOp::MaskedEq(fmt), libc::S_IFBLK as u64)?,
        ])
    };
    rules.insert(libc::SYS_mknodat, devices(2)?);
    #[cfg(target_arch = "x86_64")]
    rules.insert(libc::SYS_mknod, devices(1)?);
    if !plan.spawn {
        rules.insert(
            libc::SYS_clone,
            vec![cond(
                0,
                SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64),
                0,
            )?],
        );
        #[cfg(target_arch = "x86_64")]
        {
            rules.insert(libc::SYS_fork, Vec::new());
            rules.insert(libc::SYS_vfork, Vec::new());
        }
    }
    out.push(filter(rules, libc::EPERM, arch)?);

    // ENOSYS for clone3 (its flags live in memory, out of seccomp's reach): libc then
    // falls back to clone, which the rule above inspects.
    if !plan.spawn {
        let mut rules = BTreeMap::new();
        rules.insert(libc::SYS_clone3, Vec::new());
        out.push(filter(rules, libc::ENOSYS, arch)?);
    }
    Ok(out)
}

/// The ELF interpreter (dynamic loader) of a binary, or the interpreter of a `#!`
/// script, so it can be granted execute. `None` for a static binary.
pub(crate) fn interpreter(path: &Path) -> Option<PathBuf> {
    // The program headers and the interpreter path sit at the start of the file.
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(64 * 1024)
        .read_to_end(&mut bytes)
        .ok()?;
    if let Some(rest) = bytes.strip_prefix(b"#!") {
        let line = rest.split(|b| *b == b'\n').next()?;
        let line = std::str::from_utf8(line).ok()?.trim();
        let prog = line.split_whitespace().next()?;
        return Some(PathBuf::from(prog));
    }
    if bytes.get(0..4)? != b"\x7fELF" || *bytes.get(4)? != 2 {
        return None; // Only 64-bit ELF.
    }
    let le = *bytes.get(5)? == 1;
    let u16_at = |o: usize| -> Option<u16> {
        let b: [u8; 2] = bytes.get(o..o + 2)?.try_into().ok()?;
        Some(if le {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        })
    };
    let u32_at = |o: usize| -> Option<u32> {
        let b: [u8; 4] = bytes.get(o..o + 4)?.try_into().ok()?;
        Some(if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    };
    let u64_at = |o: usize| -> Option<u64> {
        let b: [u8; 8] = bytes.get(o..o + 8)?.try_into().ok()?;
        Some(if le {
            u64::from_le_bytes(b)
        } else {
            u64::from_be_bytes(b)
        })
    };
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    for i in 0..phnum {
        let ph = phoff.checked_add(i.checked_mul(phentsize)?)?;
        if u32_at(ph)? == 3 {
            let off = usize::try_from(u64_at(ph + 8)?).ok()?;
            let len = usize::try_from(u64_at(ph + 32)?).ok()?;
            let raw = bytes.get(off..off.checked_add(len)?)?;
            let raw = raw.split(|b| *b == 0).next()?;
            return Some(PathBuf::from(std::str::from_utf8(raw).ok()?));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_dynamic_loader_and_script_interpreters() {
        let exe = std::env::current_exe().unwrap();
        let interp = interpreter(&exe).expect("test binaries are dynamically linked");
        assert!(interp.to_string_lossy().contains("ld-"), "{interp:?}");
        let dir = std::env::temp_dir().join(format!("sb-interp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("s.sh");
        std::fs::write(&script, "#!/bin/sh -e\necho\n").unwrap();
        assert_eq!(interpreter(&script), Some(PathBuf::from("/bin/sh")));
        std::fs::write(&script, "plain").unwrap();
        assert_eq!(interpreter(&script), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn seccomp_programs_compile() {
        let plan = |net, unix, spawn| Plan {
            net,
            unix,
            spawn,
            ..Plan::default()
        };
        assert_eq!(
            seccomp_programs(&plan(false, false, false)).unwrap().len(),
            3
        );
        assert_eq!(
            seccomp_programs(&plan(false, true, false)).unwrap().len(),
            3
        );
        assert_eq!(seccomp_programs(&plan(true, false, true)).unwrap().len(), 2);
        assert_eq!(seccomp_programs(&plan(true, true, true)).unwrap().len(), 1);
    }
}
