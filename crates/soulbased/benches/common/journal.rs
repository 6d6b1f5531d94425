//! The durable floor's journal: a call is answered once its bytes are on
//! disk. One thread writes whatever calls queued while it was busy as one
//! round, a `pwrite` and an `fdatasync`, then answers them all (group commit,
//! no linger), into a file zero-filled ahead so a round never grows it — the
//! spool's own way of writing, without its framing, its checks or a drain.
//!
//! Shared by `mcp_load`, `http_load` (through `common`) and `grpc_invoke`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::OnceLock;
use std::sync::mpsc::{self, Sender};

use tokio::sync::oneshot;

/// Set (to anything) in the floor's environment: keep the journal.
pub const ENV: &str = "BENCH_FLOOR_FSYNC";
/// The journal's size; rounds start again at its head when they reach its end.
const SIZE: u64 = 64 << 20;

static QUEUE: OnceLock<Sender<(Vec<u8>, oneshot::Sender<()>)>> = OnceLock::new();

/// Creates the journal in a temporary directory under `parent` (where the
/// governed server's spool goes, so both flush to the same disk) and starts its
/// writer. A journal that cannot be made fails the floor at once, naming it.
pub fn open(parent: &Path) {
    let dir = tempfile::tempdir_in(parent)
        .unwrap_or_else(|e| panic!("the floor's journal directory in {}: {e}", parent.display()));
    let path = dir.path().join("journal");
    let fail = |e: std::io::Error| -> ! { panic!("the floor's journal {}: {e}", path.display()) };
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap_or_else(|e| fail(e));
    let zeros = vec![0u8; 1 << 20];
    for mib in 0..SIZE >> 20 {
        file.write_all_at(&zeros, mib << 20)
            .unwrap_or_else(|e| fail(e));
    }
    file.sync_all().unwrap_or_else(|e| fail(e));
    let (queue, calls) = mpsc::channel::<(Vec<u8>, oneshot::Sender<()>)>();
    std::thread::Builder::new()
        .name("floor-journal".into())
        .spawn(move || {
            let _dir = dir;
            let (mut at, mut round, mut waiting) = (0u64, Vec::new(), Vec::new());
            while let Ok(first) = calls.recv() {
                for (bytes, done) in std::iter::once(first).chain(calls.try_iter()) {
                    round.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                    round.extend_from_slice(&bytes);
                    waiting.push(done);
                }
                if at + round.len() as u64 > SIZE {
                    at = 0;
                }
                // A failed write ends the writer: every call waiting on it, and
                // every later one, fails (see `record`), and the bench with them.
                let written = file
                    .write_all_at(&round, at)
                    .and_then(|()| file.sync_data());
                if let Err(e) = written {
                    eprintln!("the floor's journal {}: {e}", path.display());
                    return;
                }
                at += round.len() as u64;
                round.clear();
                for done in waiting.drain(..) {
                    let _ = done.send(());
                }
            }
        })
        .unwrap();
    QUEUE.set(queue).unwrap();
}

/// Returns once `bytes` are on disk; at once when there is no journal. Panics,
/// failing the call, once the journal could not be written.
pub async fn record(bytes: &[u8]) {
    let Some(queue) = QUEUE.get() else {
        return;
    };
    let (done, written) = oneshot::channel();
    let sent = queue.send((bytes.to_vec(), done)).is_ok();
    assert!(
        sent && written.await.is_ok(),
        "the floor's journal failed: a call was not written"
    );
}
