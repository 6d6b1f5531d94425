//! Reloads racing with invocations and listings never expose a half-loaded set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::*;
use serde_json::json;
use soulbase_skills::views::enabled_tools;
use soulbase_tools::pipeline::ToolCall;

const N: usize = 12;

/// Each worker makes at least this many rounds...
const MIN_ROUNDS: usize = 300;
/// ...and keeps going until the reloader has applied at least this many
/// reloads since the worker started, so every worker races with reloads
/// however the threads are scheduled.
const MIN_RELOADS: usize = 5;

/// Whether a worker in round `i`, which saw `start` reloads when it began,
/// goes on: no timing, only progress counts. A reloader that has ended (it
/// panicked: its join fails the test) makes no more progress to wait for.
fn keep_going(i: usize, start: usize, reloads: &AtomicUsize, reloader_done: &AtomicBool) -> bool {
    i < MIN_ROUNDS
        || (reloads.load(Ordering::Relaxed) < start + MIN_RELOADS
            && !reloader_done.load(Ordering::Relaxed))
}

/// Sets its flag when dropped: marks a reloader thread's end, panics included.
struct Done(Arc<AtomicBool>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Writes generation `g` of the directory: N skills whose descriptions all say `g`.
fn write_generation(dir: &std::path::Path, g: usize) {
    for i in 0..N {
        write(
            dir,
            &format!("s{i:02}.yaml"),
            &descriptor(&format!("s{i:02}"), &format!("gen {g}")),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reloads_racing_with_invocations_never_expose_a_half_loaded_set() {
    let dir = tempfile::tempdir().unwrap();
    write_generation(dir.path(), 0);
    let e = Arc::new(env(dir.path()));
    let stop = Arc::new(AtomicBool::new(false));
    let reloads = Arc::new(AtomicUsize::new(0));
    let reloader_done = Arc::new(AtomicBool::new(false));

    // The reloader flips the whole directory between two generations; each
    // generation is written completely before the reload that applies it.
    let reloader = {
        let e = e.clone();
        let stop = stop.clone();
        let reloads = reloads.clone();
        let path = dir.path().to_path_buf();
        let done = Done(reloader_done.clone());
        std::thread::spawn(move || {
            let _done = done;
            let mut g = 0;
            while !stop.load(Ordering::Relaxed) {
                g = 1 - g;
                write_generation(&path, g);
                e.catalog.reload();
                reloads.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let mut tasks = Vec::new();
    for w in 0..4 {
        let e = e.clone();
        let reloads = reloads.clone();
        let reloader_done = reloader_done.clone();
        tasks.push(tokio::spawn(async move {
            let t = tenant();
            let mut checks = 0;
            let start = reloads.load(Ordering::Relaxed);
            let mut i = 0;
            while keep_going(i, start, &reloads, &reloader_done) {
                // A listing comes from one registry snapshot and one skill set.
                let set = e.catalog.current();
                let specs = enabled_tools(&set, &e.registry.view(), &t);
                assert_eq!(specs.len(), N, "a listing saw {} tools", specs.len());
                let descs: std::collections::BTreeSet<_> =
                    specs.iter().map(|s| s.description.clone()).collect();
                assert_eq!(descs.len(), 1, "a listing mixed generations: {descs:?}");
                assert_eq!(set.len(), N);
                let sdescs: std::collections::BTreeSet<_> =
                    set.skills().map(|s| s.description.clone()).collect();
                assert_eq!(sdescs.len(), 1, "a skill set mixed generations: {sdescs:?}");
                // Every invocation finds its tool and runs it.
                let tool = id(&format!("skills.s{:02}.s{:02}", (w + i) % N, (w + i) % N));
                let r = e
                    .invoker
                    .invoke(ToolCall::new(subject(), tool, json!({"text": "hi"})))
                    .await;
                assert!(r.is_ok(), "{r:?}");
                assert_eq!(r.output.unwrap(), json!({"text": "hi"}));
                checks += 1;
                i += 1;
                tokio::task::yield_now().await;
            }
            checks
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    reloader.join().unwrap();
    assert!(total >= 4 * MIN_ROUNDS);
    assert!(reloads.load(Ordering::Relaxed) >= MIN_RELOADS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adding_and_removing_skills_while_calling_through_the_pipeline_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    write_generation(dir.path(), 0);
    // A provider with a subscription-bound tool that comes and goes.
    let paid = "---\nname: paid\ndescription: paid\nprovider: {type: builtin, handler: echo}\nexports:\n  api_version: \"1.0\"\n  tools:\n    - name: t\n      description: x\n      input_schema: {type: object}\n      output_schema: {type: object}\n  access:\n    requires_subscription: true\n---\n";
    write(dir.path(), "paid/SKILL.md", paid);
    write(dir.path(), "extra.yaml", &descriptor("extra", "extra"));
    let e = Arc::new(env(dir.path()));
    let gw = Arc::new(Calls::of(&e));
    let stop = Arc::new(AtomicBool::new(false));
    let reloads = Arc::new(AtomicUsize::new(0));
    let reloader_done = Arc::new(AtomicBool::new(false));
    let reloader = {
        let e = e.clone();
        let stop = stop.clone();
        let reloads = reloads.clone();
        let path = dir.path().to_path_buf();
        let done = Done(reloader_done.clone());
        std::thread::spawn(move || {
            let _done = done;
            let mut present = true;
            while !stop.load(Ordering::Relaxed) {
                present = !present;
                if present {
                    write(&path, "paid/SKILL.md", paid);
                    write(&path, "extra.yaml", &descriptor("extra", "extra"));
                } else {
                    std::fs::remove_dir_all(path.join("paid")).unwrap();
                    std::fs::remove_file(path.join("extra.yaml")).unwrap();
                }
                e.catalog.reload();
                reloads.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let mut tasks = Vec::new();
    for w in 0..4 {
        let e = e.clone();
        let gw = gw.clone();
        let reloads = reloads.clone();
        let reloader_done = reloader_done.clone();
        tasks.push(tokio::spawn(async move {
            let t = tenant();
            let start = reloads.load(Ordering::Relaxed);
            let mut i = 0;
            while keep_going(i, start, &reloads, &reloader_done) {
                // Listings never show a skill tool without an owner in their set.
                let set = e.catalog.current();
                for s in enabled_tools(&set, &e.registry.view(), &t) {
                    assert!(
                        set.owner_of(&s.name).is_some(),
                        "{} listed without an owner",
                        s.name
                    );
                }
                // The paid tool never runs without a subscription.
                let r = gw
                    .invoke(
                        None,
                        ToolCall::new(subject(), id("skills.paid.t"), json!({})),
                    )
                    .await;
                let code = r.error_code.map(|c| c.as_str());
                assert!(
                    matches!(code, Some("SUBSCRIPTION.REQUIRED" | "TOOL.NOT_FOUND")),
                    "{r:?}"
                );
                // A coming-and-going core-looking skill tool: ok or not found.
                let r = gw
                    .invoke(
                        None,
                        ToolCall::new(subject(), id("skills.extra.extra"), json!({})),
                    )
                    .await;
                assert!(
                    r.is_ok() || r.error_code.map(|c| c.as_str()) == Some("TOOL.NOT_FOUND"),
                    "{r:?}"
                );
                // Stable skills always run.
                let tool = id(&format!("skills.s{:02}.s{:02}", (w + i) % N, (w + i) % N));
                let r = gw
                    .invoke(None, ToolCall::new(subject(), tool, json!({"text": "hi"})))
                    .await;
                assert!(r.is_ok(), "{r:?}");
                i += 1;
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    reloader.join().unwrap();
    assert!(reloads.load(Ordering::Relaxed) >= MIN_RELOADS);
}
