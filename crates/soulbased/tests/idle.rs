//! An idle server costs (next to) nothing: after some calls, a real `soulbased`
//! left alone burns no more than 5 ms of CPU a second (the target is 2 ms/s; the
//! bound is generous for a shared 2-core machine and a debug build) and wakes its
//! threads no more than 3 times a second. (Before: ~16 ms/s and ~510 wakeups/s with a skills
//! directory — the WASM epoch ticker every 2 ms, the config watcher re-reading
//! its file every 50 ms; then ~3.5 wakeups/s and up to 7 ms/s in a debug build
//! on CI — the idempotency heartbeat ticking every second with no key held.)
//!
//! What still wakes: the config file's and the skills directory's fallback polls
//! (every `skills.poll_interval_ms`, 5 s) and their inotify threads, ~1.3 times
//! a second, ~1 ms/s in a debug build. A timer ticking once a second on a
//! runtime worker adds two switches a second and breaks the wakeup bound.
//!
//! The test waits: the idle window is the measurement (10 s: the kernel counts CPU
//! time in 10 ms ticks, so the bound is 5 ticks).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::{DEV_CONFIG, Server, http};

/// The idle window.
const WINDOW: Duration = Duration::from_secs(10);

/// CPU time (user + system) the process has used, all threads, dead ones too.
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start at `state`.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    let hz: u64 = String::from_utf8(
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    Duration::from_micros(ticks * 1_000_000 / hz)
}

/// Context switches (voluntary and not) of each live thread, by thread id.
fn switches(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let Ok(status) = std::fs::read_to_string(dir.join("status")) else {
            continue; // the thread ended meanwhile
        };
        let n = status
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .map(|l| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap())
            .sum();
        out.insert(dir.file_name().unwrap().to_string_lossy().into_owned(), n);
    }
    out
}

/// Wakeups during the window: the growth of each thread alive at both ends,
/// plus everything of a thread born meanwhile.
fn wakeups(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> u64 {
    after
        .iter()
        .map(|(t, n)| n.saturating_sub(before.get(t).copied().unwrap_or(0)))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_server_burns_next_to_no_cpu() {
    // A skills directory: the WASM executor (and its epoch ticker) starts too.
    let server = Server::start_in(DEV_CONFIG, |dir| {
        std::fs::create_dir(dir.join("skills")).unwrap();
    });
    // Some work first: what runs per call must stop when calls stop.
    for i in 0..20 {
        let (status, body) = http(
            &server.http,
            "POST",
            "/api/tools/soulbase.builtin.echo/invoke",
            &[("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "agent")],
            &format!("{{\"i\": {i}}}"),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    // Let the evidence drain and the connections close.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let pid = server.pid();
    let (cpu0, sw0, t0) = (cpu(pid), switches(pid), Instant::now());
    tokio::time::sleep(WINDOW).await;
    let (cpu1, sw1, elapsed) = (cpu(pid), switches(pid), t0.elapsed());
    let secs = elapsed.as_secs_f64();
    let per_s = (cpu1 - cpu0).as_secs_f64() * 1000.0 / secs;
    let woke = wakeups(&sw0, &sw1) as f64 / secs;
    eprintln!("idle: {per_s:.2} ms CPU/s, {woke:.1} wakeups/s over {secs:.1} s");
    assert!(per_s <= 5.0, "idle CPU {per_s:.1} ms/s over {secs:.1} s");
    assert!(woke <= 3.0, "idle threads woke {woke:.1} times a second");
}
