//! The committed `include/tessera.h` is exactly what cbindgen generates
//! from `src/lib.rs` (build.rs writes the fresh one into OUT_DIR), so the
//! header users include never drifts from the ABI.

#[test]
fn committed_header_matches_cbindgen() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/tessera.h"));
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/tessera.h");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map_or_else(
                || "the files differ in length".to_string(),
                |i| format!("first difference at line {}", i + 1),
            );
        panic!(
            "capi/include/tessera.h is out of date with capi/src/lib.rs ({line}).\n\
             Regenerate it with:\n    TESSERA_BLESS_HEADER=1 cargo build -p tessera-capi\n\
             and commit the result."
        );
    }
}
