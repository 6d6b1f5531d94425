//! Hot reload: a bad edit keeps the previous snapshot and reports why; fixing it applies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use soulbase_config::{ConfigHandle, ConfigLoader, ReloadStatus, watch};
use tokio::sync::watch::Receiver;

/// Waits for the next status (bounded, so a broken watcher fails instead of hanging).
async fn next(rx: &mut Receiver<ReloadStatus>) -> ReloadStatus {
    tokio::time::timeout(Duration::from_secs(10), rx.changed())
        .await
        .expect("no reload within 10 s")
        .expect("watcher gone");
    rx.borrow_and_update().clone()
}

#[tokio::test]
async fn bad_edit_keeps_the_last_good_snapshot_and_fixing_it_applies() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, "skills:\n  dir: /one\n").unwrap();
    let loader = ConfigLoader::new().with_file(&path);
    let handle = ConfigHandle::new(loader.load().unwrap());
    let first = handle.current();
    let mut rx = handle.subscribe();
    let _watcher = watch(handle.clone(), loader, Duration::from_millis(100));

    // In-flight work holds `first`; it must never change under it.
    std::fs::write(&path, "skills:\n  poll_interval_ms: [not, a, number]\n").unwrap();
    match next(&mut rx).await {
        ReloadStatus::Rejected { error, kept } => {
            assert_eq!(kept, first.hash());
            assert_eq!(error.problems[0].path, "skills.poll_interval_ms");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(
        handle.current().hash(),
        first.hash(),
        "previous snapshot kept"
    );
    assert_eq!(
        handle.current().skills.dir,
        std::path::PathBuf::from("/one")
    );

    std::fs::write(&path, "skills:\n  dir: /two\n").unwrap();
    match next(&mut rx).await {
        ReloadStatus::Applied { previous, hash } => {
            assert_eq!(previous, first.hash());
            assert_eq!(hash, handle.current().hash());
        }
        other => panic!("expected an applied reload, got {other:?}"),
    }
    assert_eq!(
        handle.current().skills.dir,
        std::path::PathBuf::from("/two")
    );
    assert_eq!(
        first.skills.dir,
        std::path::PathBuf::from("/one"),
        "old snapshot unchanged"
    );
}

#[tokio::test]
async fn environment_keeps_overriding_the_file_across_reloads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, "skills:\n  poll_interval_ms: 900\n").unwrap();
    let loader = ConfigLoader::new()
        .with_file(&path)
        .with_env([("SKILLS_DIR", "/env")]);
    let handle = ConfigHandle::new(loader.load().unwrap());
    let mut rx = handle.subscribe();
    let _watcher = watch(handle.clone(), loader, Duration::from_millis(100));
    std::fs::write(&path, "skills:\n  dir: /file\n  poll_interval_ms: 800\n").unwrap();
    assert!(matches!(next(&mut rx).await, ReloadStatus::Applied { .. }));
    let snap = handle.current();
    assert_eq!(snap.skills.dir, std::path::PathBuf::from("/env"));
    assert_eq!(snap.skills.poll_interval_ms, 800);
}

#[test]
fn manual_reload_reports_and_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, "data_dir: /d1\n").unwrap();
    let loader = ConfigLoader::new().with_file(&path);
    let handle = ConfigHandle::new(loader.load().unwrap());
    let before = handle.current().hash().to_owned();
    assert!(matches!(
        handle.reload(&loader),
        ReloadStatus::Unchanged { .. }
    ));
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        handle.reload(&loader),
        ReloadStatus::Rejected { .. }
    ));
    assert_eq!(handle.current().hash(), before);
}

/// The watcher's own reads of the file are not changes: an unchanged file is
/// opened once at the start (and at each poll), not again and again. (Opening
/// and closing the file are inotify events; taken as changes they woke the
/// watcher to read it again every debounce, ~20 times a second, forever.)
#[test]
fn an_unchanged_file_is_not_read_again_and_again() {
    use notify::{EventKind, RecursiveMode, Watcher};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, "data_dir: /d1\n").unwrap();
    let loader = ConfigLoader::new().with_file(&path);
    let handle = ConfigHandle::new(loader.load().unwrap());
    let opens = Arc::new(AtomicUsize::new(0));
    let counted = opens.clone();
    let mut spy = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if let Ok(e) = res
            && matches!(
                e.kind,
                EventKind::Access(notify::event::AccessKind::Open(_))
            )
            && e.paths.iter().any(|p| p.ends_with("config.yaml"))
        {
            counted.fetch_add(1, Ordering::SeqCst);
        }
    })
    .unwrap();
    spy.watch(dir.path(), RecursiveMode::NonRecursive).unwrap();
    let _watcher = watch(handle, loader, Duration::from_secs(3600));
    // Others reading the directory are not changes either (the skills watcher
    // scans `./skills` beside `./config.yaml` at every poll).
    std::fs::create_dir(dir.path().join("skills")).unwrap();
    std::fs::write(dir.path().join("other.txt"), "x").unwrap();
    for _ in 0..5 {
        let _ = std::fs::read_dir(dir.path().join("skills"))
            .unwrap()
            .count();
        let _ = std::fs::read(dir.path().join("other.txt")).unwrap();
    }
    // A measurement window: ten debounces.
    std::thread::sleep(Duration::from_millis(500));
    let read = opens.load(Ordering::SeqCst);
    assert!(read <= 1, "the unchanged file was opened {read} times");
}

/// A Kubernetes ConfigMap volume: `config.yaml` is a symlink into `..data`, and an
/// update swaps the `..data` symlink (no event names `config.yaml`). The swap is
/// applied from its file events, not by polling (the interval here is an hour).
#[cfg(unix)]
#[tokio::test]
async fn a_configmap_style_symlink_swap_is_applied_from_events() {
    use std::os::unix::fs::symlink;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("..v1")).unwrap();
    std::fs::write(root.join("..v1/config.yaml"), "skills:\n  dir: /one\n").unwrap();
    symlink("..v1", root.join("..data")).unwrap();
    symlink("..data/config.yaml", root.join("config.yaml")).unwrap();
    let loader = ConfigLoader::new().with_file(root.join("config.yaml"));
    let handle = ConfigHandle::new(loader.load().unwrap());
    let mut rx = handle.subscribe();
    let _watcher = watch(handle.clone(), loader, Duration::from_secs(3600));

    // What kubelet's atomic writer does: a new version directory, a temporary
    // symlink to it, renamed over `..data`.
    std::fs::create_dir(root.join("..v2")).unwrap();
    std::fs::write(root.join("..v2/config.yaml"), "skills:\n  dir: /two\n").unwrap();
    symlink("..v2", root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    assert!(matches!(next(&mut rx).await, ReloadStatus::Applied { .. }));
    assert_eq!(
        handle.current().skills.dir,
        std::path::PathBuf::from("/two")
    );
}
