//! Applying skill file changes while running: file events (notify, recursive on
//! the skills root) with a polling fallback, a manual trigger, and SIGHUP.
//!
//! Events wake a dedicated thread that waits for a short quiet time (so a file
//! written in pieces is read once) and reloads the catalog. Independently, every
//! `poll` interval it fingerprints the directory (names, sizes, modification
//! times) and reloads when that changed — which also covers file systems where
//! events are unavailable or lost (a shared NFS volume sends none for changes
//! made on another machine).

use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use notify::{RecursiveMode, Watcher};
use sha2::{Digest, Sha256};

use crate::catalog::SkillCatalog;

/// Quiet time after the last file event before reloading.
pub const DEBOUNCE: Duration = Duration::from_millis(30);

/// The longest a burst of file events can postpone a reload.
pub const MAX_DEBOUNCE: Duration = Duration::from_millis(200);

enum Msg {
    Changed,
    Reload,
    Stop,
}

/// A running watcher; dropping it stops the watch.
pub struct SkillWatcher {
    tx: mpsc::Sender<Msg>,
    thread: Option<JoinHandle<()>>,
    events: bool,
    _watcher: Option<notify::RecommendedWatcher>,
}

impl std::fmt::Debug for SkillWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SkillWatcher")
            .field("events", &self.events)
            .finish()
    }
}

impl SkillWatcher {
    /// Asks for a reload now (the API's manual reload); returns at once.
    pub fn trigger(&self) {
        let _ = self.tx.send(Msg::Reload);
    }

    /// Whether file events are in use (otherwise polling only).
    pub fn has_events(&self) -> bool {
        self.events
    }
}

impl Drop for SkillWatcher {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Watches `catalog`'s directory; `poll` is the fallback interval.
pub fn watch(catalog: SkillCatalog, poll: Duration) -> SkillWatcher {
    let (tx, rx) = mpsc::channel();
    let watcher = file_events(catalog.root(), tx.clone());
    let events = watcher.is_some();
    let initial = fingerprint(catalog.root());
    let thread = std::thread::Builder::new()
        .name("soulbase-skills-watch".into())
        .spawn(move || run(catalog, rx, poll, initial))
        .map_err(|e| tracing::error!(error = %e, "cannot start the skills watcher"))
        .ok();
    SkillWatcher {
        tx,
        thread,
        events,
        _watcher: watcher,
    }
}

fn file_events(root: &Path, tx: mpsc::Sender<Msg>) -> Option<notify::RecommendedWatcher> {
    // Symlinks are not followed: a link must not make the watcher descend into
    // (and report on) directories outside the skills root.
    let config = notify::Config::default().with_follow_symlinks(false);
    let mut watcher = notify::RecommendedWatcher::new(
        move |res: notify::Result<notify::Event>| {
            // Reads are not changes; an error (the event queue overflowed) or a
            // rescan request may hide one.
            let changed = match &res {
                Ok(event) => event.need_rescan() || !event.kind.is_access(),
                Err(_) => true,
            };
            if changed {
                let _ = tx.send(Msg::Changed);
            }
        },
        config,
    )
    .map_err(|e| tracing::warn!(error = %e, "skill file events unavailable; polling only"))
    .ok()?;
    watcher
        .watch(root, RecursiveMode::Recursive)
        .map_err(|e| tracing::warn!(error = %e, dir = %root.display(), "cannot watch the skills directory; polling only"))
        .ok()?;
    Some(watcher)
}

/// A digest of the directory's skill-relevant metadata: entry names, and for
/// files (and each package's files) their size and modification time. Symlinks
/// are not followed.
pub fn fingerprint(root: &Path) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut stack = vec![(root.to_path_buf(), 0u8)];
    let mut entries = Vec::new();
    while let Some((dir, depth)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            // `symlink_metadata`: a link is fingerprinted as itself, never
            // followed (so a link to a directory outside the root is not walked).
            let Ok(meta) = std::fs::symlink_metadata(&p) else {
                entries.push((p, 0, 0));
                continue;
            };
            if meta.is_dir() {
                if depth < 3 {
                    stack.push((p.clone(), depth + 1));
                }
                entries.push((p, 0, 1));
            } else {
                let mtime = meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos());
                entries.push((p, mtime, meta.len()));
            }
        }
    }
    entries.sort();
    for (p, t, l) in entries {
        h.update(p.as_os_str().as_encoded_bytes());
        h.update(t.to_le_bytes());
        h.update(l.to_le_bytes());
    }
    h.finalize().into()
}

fn run(catalog: SkillCatalog, rx: mpsc::Receiver<Msg>, poll: Duration, mut last: [u8; 32]) {
    loop {
        let reload = match rx.recv_timeout(poll) {
            Ok(Msg::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
            Ok(Msg::Reload) => true,
            Ok(Msg::Changed) => {
                // Debounce: wait until events stop for DEBOUNCE, but never longer
                // than MAX_DEBOUNCE in all (a steady stream of events must not
                // postpone the reload forever).
                let deadline = Instant::now() + MAX_DEBOUNCE;
                loop {
                    let wait = DEBOUNCE.min(deadline.saturating_duration_since(Instant::now()));
                    if wait.is_zero() {
                        break;
                    }
                    match rx.recv_timeout(wait) {
                        Ok(Msg::Changed | Msg::Reload) => continue,
                        Ok(Msg::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                        Err(mpsc::RecvTimeoutError::Timeout) => break,
                    }
                }
                true
            }
            Err(mpsc::RecvTimeoutError::Timeout) => fingerprint(catalog.root()) != last,
        };
        if reload {
            last = fingerprint(catalog.root());
            catalog.reload();
        }
    }
}

/// Reloads `catalog` whenever the process receives SIGHUP, until the returned task
/// is aborted. Needs a Tokio runtime; Unix only.
#[cfg(unix)]
pub fn reload_on_sighup(catalog: SkillCatalog) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading skills");
            let c = catalog.clone();
            let _ = tokio::task::spawn_blocking(move || c.reload()).await;
        }
    }))
}
