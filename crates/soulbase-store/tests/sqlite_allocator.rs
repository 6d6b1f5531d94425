#![allow(clippy::unwrap_used, clippy::expect_used)]
//! SQLite allocates through the process's global allocator once
//! `install_sqlite_allocator` has run (as `soulbased`'s `main` does): a test
//! binary of its own, whose global allocator counts the bytes it hands out.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use soulbase_store::Db;

/// The system allocator, counting the bytes it allocates.
struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size, Ordering::Relaxed);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A sort SQLite does in memory (`temp_store = memory`) of 20,000 rows of
/// 1,000 random bytes: ~20 MB that only SQLite allocates, the query's text and
/// its one-row answer being all Rust sees. With SQLite on the C library's
/// `malloc`, the counter would barely move.
#[tokio::test]
async fn sqlite_allocates_through_the_global_allocator() {
    // SAFETY: the only test of this binary, and nothing has opened SQLite yet.
    #[allow(unsafe_code)]
    let installed = unsafe { soulbase_store::install_sqlite_allocator() };
    assert!(
        installed,
        "SQLite was initialized before the allocator was handed over"
    );
    let dir = tempfile::tempdir().unwrap();
    let db = Db::connect(&format!("sqlite://{}/e.db", dir.path().display()), true)
        .await
        .unwrap();
    let Db::Sqlite(pool) = &db else {
        unreachable!("a sqlite: URL opens SQLite")
    };
    let before = ALLOCATED.load(Ordering::Relaxed);
    let (rows, bytes): (i64, i64) = sqlx::query_as(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) \
         SELECT count(*), sum(length(b)) FROM (SELECT randomblob(1000) AS b FROM n ORDER BY b)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let allocated = ALLOCATED.load(Ordering::Relaxed) - before;
    assert_eq!((rows, bytes), (20_000, 20_000_000));
    assert!(
        allocated > 15_000_000,
        "SQLite's sort of 20 MB allocated {allocated} bytes through the global allocator"
    );
    db.close().await;
}
