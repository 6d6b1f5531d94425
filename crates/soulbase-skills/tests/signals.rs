//! SIGHUP triggers a reload (in its own test binary: it installs a process-wide
//! signal handler).
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(unix)]

mod common;

use std::time::Duration;

use common::*;
use soulbase_skills::watch::reload_on_sighup;

#[tokio::test]
async fn sighup_reloads_the_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let e = env(dir.path());
    let task = reload_on_sighup(e.catalog.clone()).unwrap();
    write(
        dir.path(),
        "late.yaml",
        &descriptor("late", "added while running"),
    );
    assert!(
        e.catalog.current().get("late").is_none(),
        "no watcher: nothing yet"
    );
    let status = std::process::Command::new("kill")
        .arg("-HUP")
        .arg(std::process::id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
    let c = e.catalog.clone();
    assert!(
        wait_until_async(Duration::from_secs(5), || c.current().get("late").is_some()).await,
        "SIGHUP reloaded the directory"
    );
    task.abort();
}
