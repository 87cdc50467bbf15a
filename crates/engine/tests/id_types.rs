//! Mistakes with ids that must not compile: each case in
//! `tests/compile_fail/` is compiled, and the compiler's errors must match
//! its `.stderr` snapshot, error code and all.
//!
//! trybuild runs `cargo` on the source tree, so this binary cannot run from
//! the GPU bundle. After a change to the compiler's wording,
//! `TRYBUILD=overwrite cargo test -p cuda-streams-engine --test id_types`
//! rewrites the snapshots: read the diff before committing it.

#[test]
fn ids_of_captured_and_eager_operations_do_not_mix() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/compile_fail/*.rs");
}
