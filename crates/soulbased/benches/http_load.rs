//! The HTTP/JSON API's invoke (`POST /api/tools/{id}/invoke`) as clients load it,
//! against the `soulbased` binary and, in the same run, a bare axum handler
//! echoing JSON (the floor): `cargo xtask bench -p soulbased --bench http_load`.
//! What is measured and the knobs: see `common/mod.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    common::main(common::Surface::Http);
}
