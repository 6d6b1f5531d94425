//! SQLite's memory from the process's global allocator.
//!
//! Bundled SQLite allocates through the C library's `malloc` unless told
//! otherwise. In the drain's inserts that is ~23 allocations a governed call, and
//! glibc's `malloc`/`free` (arena bins, consolidation) took ~10,600 instructions a
//! call of them against a few hundred for the global allocator the binaries
//! install (mimalloc in `soulbased`) — `xtask/call_instructions.py`,
//! docs/performance.md. [`install`] hands SQLite a `sqlite3_mem_methods` over
//! [`std::alloc`] before the first connection initializes the library: exported
//! as [`install_sqlite_allocator`](crate::install_sqlite_allocator), which
//! `soulbased` calls at the start of `main`.
//!
//! Each block carries its size in an 8-byte header in front of what SQLite gets:
//! `dealloc` needs the layout, and SQLite asks a block's size (`xSize`). Blocks
//! are 8-byte aligned, which is what SQLite requires of its allocator.

#![allow(unsafe_code)]

use std::alloc::{Layout, alloc, dealloc, realloc};
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use libsqlite3_sys as ffi;

/// The header in front of each block, holding its usable size (a `usize`): 8
/// bytes on every target, so what SQLite gets stays 8-byte aligned.
const HEADER: usize = 8;
/// The alignment of every block (and so of what SQLite gets, `HEADER` past it).
const ALIGN: usize = 8;
const _: () = assert!(HEADER.is_multiple_of(ALIGN) && HEADER >= std::mem::size_of::<usize>());

/// The layout of a block with `size` usable bytes; `None` past what a layout holds.
fn layout(size: usize) -> Option<Layout> {
    Layout::from_size_align(size.checked_add(HEADER)?, ALIGN).ok()
}

/// `size` rounded up to the alignment, as SQLite's `xRoundup` must.
fn rounded(size: c_int) -> Option<usize> {
    let size = usize::try_from(size).ok()?;
    Some(size.checked_add(ALIGN - 1)? & !(ALIGN - 1))
}

/// `xMalloc`: a block of at least `size` bytes, or null.
unsafe extern "C" fn x_malloc(size: c_int) -> *mut c_void {
    let Some(size) = rounded(size) else {
        return std::ptr::null_mut();
    };
    let Some(layout) = layout(size) else {
        return std::ptr::null_mut();
    };
    // SAFETY: the layout's size is at least HEADER, never zero.
    let base = unsafe { alloc(layout) };
    if base.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `base` is valid for HEADER + size bytes and 8-byte aligned.
    unsafe {
        base.cast::<usize>().write(size);
        base.add(HEADER).cast()
    }
}

/// The start of the block `p` (from [`x_malloc`] or [`x_realloc`]) and its size.
///
/// # Safety
/// `p` must be a live block of this allocator.
unsafe fn block(p: *mut c_void) -> (*mut u8, usize) {
    // SAFETY: every block starts HEADER bytes before what SQLite was given, and
    // its header holds its size (the caller's contract).
    unsafe {
        let base = p.cast::<u8>().sub(HEADER);
        (base, base.cast::<usize>().read())
    }
}

/// `xFree`: returns a block (SQLite never frees null through it; tolerated).
unsafe extern "C" fn x_free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    // SAFETY: SQLite frees only blocks this allocator gave it.
    let (base, size) = unsafe { block(p) };
    if let Some(layout) = layout(size) {
        // SAFETY: `base` was allocated with exactly this layout.
        unsafe { dealloc(base, layout) };
    }
}

/// `xRealloc`: the block resized to at least `size` bytes (contents kept), or
/// null with the old block untouched.
unsafe extern "C" fn x_realloc(p: *mut c_void, size: c_int) -> *mut c_void {
    if p.is_null() {
        // SAFETY: forwarding to xMalloc's contract.
        return unsafe { x_malloc(size) };
    }
    let (Some(size), true) = (rounded(size), size > 0) else {
        return std::ptr::null_mut();
    };
    // SAFETY: SQLite resizes only blocks this allocator gave it.
    let (base, old) = unsafe { block(p) };
    let (Some(old_layout), Some(_)) = (layout(old), layout(size)) else {
        return std::ptr::null_mut();
    };
    // SAFETY: `base` was allocated with `old_layout`; the new size (checked to
    // make a valid layout above) is not zero.
    let new = unsafe { realloc(base, old_layout, size + HEADER) };
    if new.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `new` is valid for HEADER + size bytes and 8-byte aligned.
    unsafe {
        new.cast::<usize>().write(size);
        new.add(HEADER).cast()
    }
}

/// `xSize`: the usable size of a block (SQLite asks only of live ones).
unsafe extern "C" fn x_size(p: *mut c_void) -> c_int {
    if p.is_null() {
        return 0;
    }
    // SAFETY: SQLite asks the size of blocks this allocator gave it.
    let (_, size) = unsafe { block(p) };
    c_int::try_from(size).unwrap_or(c_int::MAX)
}

/// `xRoundup`: the size [`x_malloc`] would give for `size`.
unsafe extern "C" fn x_roundup(size: c_int) -> c_int {
    rounded(size)
        .and_then(|s| c_int::try_from(s).ok())
        .unwrap_or(size)
}

/// `xInit`: nothing to set up.
unsafe extern "C" fn x_init(_: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

/// `xShutdown`: nothing to tear down.
unsafe extern "C" fn x_shutdown(_: *mut c_void) {}

/// Hands SQLite the process's global allocator, before SQLite initializes.
/// Returns whether SQLite allocates through it: `false` if SQLite was already
/// initialized, in which case it keeps the C library's `malloc` (correct, only
/// slower). Calls after the first return the first's answer.
///
/// # Safety
///
/// No other thread may be opening SQLite (through sqlx or otherwise) while this
/// runs: `sqlite3_config` is not thread-safe, and SQLite refuses it only once
/// initialization has finished, not while it is under way — blocks `malloc`
/// allocated then would reach this allocator's `free`. Call it at the start of
/// `main`, before anything can open SQLite (`soulbased` does); a process that
/// never calls it keeps the C library's `malloc`.
pub unsafe fn install() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        let methods = ffi::sqlite3_mem_methods {
            xMalloc: Some(x_malloc),
            xFree: Some(x_free),
            xRealloc: Some(x_realloc),
            xSize: Some(x_size),
            xRoundup: Some(x_roundup),
            xInit: Some(x_init),
            xShutdown: Some(x_shutdown),
            pAppData: std::ptr::null_mut(),
        };
        // SAFETY: SQLite copies the methods (they need not outlive the call), and
        // refuses with SQLITE_MISUSE, changing nothing, once it is initialized;
        // the caller guarantees that no initialization is under way meanwhile
        // (the contract above), and the `OnceLock` that calls of this function
        // do not race each other. So no block of another allocator can reach
        // these functions.
        let rc = unsafe {
            ffi::sqlite3_config(
                ffi::SQLITE_CONFIG_MALLOC,
                &methods as *const ffi::sqlite3_mem_methods,
            )
        };
        if rc != ffi::SQLITE_OK {
            tracing::debug!(
                rc,
                "SQLite was initialized before its allocator could be set; it keeps malloc"
            );
        }
        rc == ffi::SQLITE_OK
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_keep_their_size_and_contents_across_reallocation() {
        // SAFETY: the functions are used as SQLite would: sizes asked of live
        // blocks, each block freed once.
        unsafe {
            let p = x_malloc(13);
            assert!(!p.is_null());
            assert_eq!(p as usize % ALIGN, 0);
            assert_eq!(x_size(p), 16);
            assert_eq!(x_roundup(13), 16);
            std::ptr::copy_nonoverlapping(b"0123456789abc".as_ptr(), p.cast(), 13);
            let q = x_realloc(p, 5000);
            assert!(!q.is_null());
            assert_eq!(x_size(q), 5000);
            assert_eq!(
                std::slice::from_raw_parts(q.cast::<u8>(), 13),
                b"0123456789abc"
            );
            let r = x_realloc(q, 3);
            assert_eq!(x_size(r), 8);
            assert_eq!(std::slice::from_raw_parts(r.cast::<u8>(), 3), b"012");
            x_free(r);
            x_free(std::ptr::null_mut());
            assert!(x_malloc(-1).is_null());
            assert_eq!(x_size(std::ptr::null_mut()), 0);
        }
    }
}
