//! MCP `tools/call` (streamable HTTP) as clients load it, against the `soulbased`
//! binary and, in the same run, a bare rmcp echo server (the floor):
//! `cargo xtask bench -p soulbased --bench mcp_load`. What is measured and the
//! knobs (`BENCH_ROUNDS`, `BENCH_SECONDS`, `BENCH_RATES`, …): see `common/mod.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    common::main(common::Surface::Mcp);
}
