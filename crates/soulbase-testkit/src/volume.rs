//! Throwaway volumes that really fill up, for full-disk drills: a small tmpfs
//! ([`SmallVolume`]) mounted by a test running as root ([`as_root`]: here when the
//! test process is root, as in CI, otherwise re-run in a user and mount namespace).
//!
//! Each function panics on failure: they are for tests only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// The effective user id of this process in its user namespace.
pub fn euid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let uids = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .expect("a Uid line");
    uids.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Set in the environment of a test re-run inside a user and mount namespace.
pub const IN_NAMESPACE: &str = "SOULBASE_TEST_IN_NAMESPACE";

/// Runs `body` as root, able to mount: here when this process is root (as in
/// CI); otherwise this binary runs the test `name` again inside a new user and
/// mount namespace where it is root (`unshare --user --map-root-user --mount`),
/// and that run must pass — the test never skips.
pub fn as_root(name: &str, body: impl FnOnce()) {
    if euid() == 0 {
        return body();
    }
    assert!(
        std::env::var_os(IN_NAMESPACE).is_none(),
        "not root even inside a user namespace"
    );
    let out = std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount"])
        .arg(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(IN_NAMESPACE, "1")
        .output()
        .expect("unshare runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(&format!("test {name} ... ok")),
        "{name} in a user and mount namespace: {}\n{stdout}\n{stderr}",
        out.status
    );
}

/// A small tmpfs mounted on a temp dir: a volume that really fills up. Unmounted
/// when dropped, also when the test fails (lazily: a sink's writer thread may still
/// hold files open for a moment), then the temp dir is removed.
pub struct SmallVolume {
    dir: tempfile::TempDir,
}

impl SmallVolume {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it, e.g. `4m`).
    pub fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("mount runs");
        assert!(
            out.status.success(),
            "mounting a tmpfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self { dir }
    }

    /// The volume's mount point.
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Fills what is left of the volume with files of its own (kept: a filler is
    /// only ever extended), until not one more byte can be written; returns the
    /// bytes written. Space freed meanwhile (the spool giving up a file) is taken
    /// too: bounded rounds until a file of one byte cannot be written.
    pub fn fill(&self) -> u64 {
        fill(self.path())
    }

    /// [`SmallVolume::fill`] as a closure of its own, to run on another thread
    /// while the volume is in use.
    pub fn filler(&self) -> impl FnOnce() -> u64 + Send + 'static {
        let path = self.path().to_owned();
        move || fill(&path)
    }
}

/// See [`SmallVolume::fill`]: fills the volume mounted at `path`.
fn fill(path: &std::path::Path) -> u64 {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path.join("filler"))
        .unwrap();
    let mut written = 0u64;
    for round in 0..20 {
        for chunk in [64usize << 10, 4 << 10, 1] {
            let bytes = vec![1u8; chunk];
            while written < 1 << 30 {
                match f.write(&bytes) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => written += n as u64,
                }
            }
        }
        let probe = path.join(format!("one-byte-{round}"));
        if std::fs::write(probe, b"x").is_err() {
            return written;
        }
    }
    panic!("the volume never stayed full");
}

impl Drop for SmallVolume {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("--lazy")
            .arg(self.dir.path())
            .status();
    }
}
