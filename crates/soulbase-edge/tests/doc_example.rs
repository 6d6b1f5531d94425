//! `docs/architecture.md`'s linked-use example is `examples/linked.rs` verbatim,
//! which every test run compiles (and `cargo run --example linked` runs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[test]
fn the_architecture_docs_example_is_the_compiled_example() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("../../docs/architecture.md")).unwrap();
    let section = doc
        .split_once("## Using the pipeline linked")
        .expect("the section is there")
        .1;
    let block = section
        .split_once("```rust\n")
        .expect("a rust block")
        .1
        .split_once("```")
        .unwrap()
        .0;
    let example = std::fs::read_to_string(root.join("examples/linked.rs")).unwrap();
    assert_eq!(block.trim(), example.trim(), "update docs/architecture.md");
}
