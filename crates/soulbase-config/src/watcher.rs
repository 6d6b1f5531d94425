//! Reloading the configuration when its file changes.
//!
//! File events (inotify and friends, through `notify`) wake a dedicated thread; a
//! polling interval is the fallback when events are unavailable or missed. Changes
//! are debounced briefly so a file written in pieces is read once, and a reload only
//! happens when the file's bytes actually changed.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use sha2::{Digest, Sha256};

use crate::{ConfigHandle, ConfigLoader};

/// Quiet time after the last file event before the file is read.
const DEBOUNCE: Duration = Duration::from_millis(50);

enum Msg {
    Changed,
    Stop,
}

/// A running watcher; dropping it stops the watch.
pub struct ConfigWatcher {
    tx: mpsc::Sender<Msg>,
    thread: Option<JoinHandle<()>>,
    _events: Option<notify::RecommendedWatcher>,
}

impl Drop for ConfigWatcher {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn digest(bytes: Option<&[u8]>) -> Option<[u8; 32]> {
    bytes.map(|b| Sha256::digest(b).into())
}

/// Watches `loader`'s config file and publishes reloads through `handle`.
///
/// Does nothing useful (but succeeds) when the loader has no file. `poll` is the
/// fallback interval at which the file is re-read even without events.
pub fn watch(handle: ConfigHandle, loader: ConfigLoader, poll: Duration) -> ConfigWatcher {
    let (tx, rx) = mpsc::channel();
    let file = loader.file().map(Path::to_path_buf);
    let events = file.as_deref().and_then(|f| file_events(f, tx.clone()));
    let initial = file.as_deref().and_then(|f| std::fs::read(f).ok());
    let thread = std::thread::Builder::new()
        .name("soulbase-config-watch".into())
        .spawn(move || run(handle, loader, file, rx, poll, digest(initial.as_deref())))
        .ok();
    ConfigWatcher {
        tx,
        thread,
        _events: events,
    }
}

fn file_events(file: &Path, tx: mpsc::Sender<Msg>) -> Option<notify::RecommendedWatcher> {
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = file.file_name()?.to_owned();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if relevant(&res, &name) {
            let _ = tx.send(Msg::Changed);
        }
    })
    .map_err(|e| tracing::warn!(error = %e, "config file events unavailable; polling only"))
    .ok()?;
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .map_err(|e| tracing::warn!(error = %e, dir = %dir.display(), "cannot watch config dir; polling only"))
        .ok()?;
    Some(watcher)
}

/// Whether a file event in the config file's directory may have changed the file.
///
/// Opening and reading files are events too (inotify's OPEN and CLOSE_NOWRITE):
/// taken as changes, the watcher's own read of the file would wake it again, every
/// debounce, forever (and so would anything else reading the directory). Besides
/// events naming the file, those naming `..`-prefixed entries count: a Kubernetes
/// ConfigMap volume updates its files by swapping a `..data` symlink, and no event
/// names the file itself. An error (such as the event queue overflowing) or a
/// rescan request may hide a change, so it counts too.
fn relevant(event: &notify::Result<notify::Event>, name: &std::ffi::OsStr) -> bool {
    let Ok(event) = event else {
        return true;
    };
    if event.need_rescan() {
        return true;
    }
    !event.kind.is_access()
        && event.paths.iter().any(|p| {
            p.file_name()
                .is_some_and(|n| n == name || n.as_encoded_bytes().starts_with(b".."))
        })
}

fn run(
    handle: ConfigHandle,
    loader: ConfigLoader,
    file: Option<PathBuf>,
    rx: mpsc::Receiver<Msg>,
    poll: Duration,
    mut last: Option<[u8; 32]>,
) {
    let Some(file) = file else {
        let _ = rx.recv();
        return;
    };
    loop {
        match rx.recv_timeout(poll) {
            Ok(Msg::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
            Ok(Msg::Changed) => loop {
                match rx.recv_timeout(DEBOUNCE) {
                    Ok(Msg::Changed) => continue,
                    Ok(Msg::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    Err(mpsc::RecvTimeoutError::Timeout) => break,
                }
            },
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let bytes = match std::fs::read(&file) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                tracing::warn!(error = %e, file = %file.display(), "cannot read config file");
                continue;
            }
        };
        let now = digest(bytes.as_deref());
        if now == last {
            continue;
        }
        last = now;
        handle.reload_with_bytes(&loader, bytes.as_deref());
    }
}
