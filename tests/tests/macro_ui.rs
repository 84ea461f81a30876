//! Compile-fail tests for `#[job]`: each file in `ui/` must fail to compile
//! with the error recorded next to it in `ui/<name>.stderr`.
//!
//! Regenerate the expected output after an intended change with
//! `TRYBUILD=overwrite cargo test -p queue-tests --test macro_ui`, then read
//! the diff: every error must point at the offending token.

#[test]
fn job_macro_rejects_invalid_input() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/*.rs");
}
