//! Compile-fail tests: each `ui/*.rs` is a malformed `kernel!` and its
//! `.stderr` the exact diagnostic (regenerate with `TRYBUILD=overwrite`, then
//! read the diff: the caret must sit on the offending token).

#[test]
fn malformed_kernels_fail_with_spanned_messages() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
