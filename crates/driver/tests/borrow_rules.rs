//! The borrow rules of `cuda_streams_driver::borrow_rules`, proved by code
//! that must not compile: each case in `tests/compile_fail/` is compiled, and
//! the compiler's errors must match its `.stderr` snapshot, error code and
//! all, so a case that fails for another reason (a typo, a renamed import)
//! fails here instead of passing as a proof.
//!
//! trybuild runs `cargo` on the source tree, so this binary cannot run from
//! the GPU bundle (`cargo xtask gpu-bundle` leaves it out). After a change to
//! the compiler's wording, `TRYBUILD=overwrite cargo test -p
//! cuda-streams-driver --test borrow_rules` rewrites the snapshots: read the
//! diff before committing it.

#[test]
fn borrow_rules_refuse_what_they_should() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/compile_fail/*.rs");
}
