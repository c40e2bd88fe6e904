//! The built-in library's canonical texts are a contract: every kernel prints
//! exactly the text pinned in `tests/library/NAME.kernel`, and parsing that
//! text gives back an equal kernel. The library is written with `kernel!`;
//! these pins were taken from the `KernelBuilder` descriptions it replaced,
//! so they also show that the two agree.
//!
//! To change a library kernel on purpose, run this test with
//! `TESSERA_BLESS=1` to rewrite the pins, and review the diff.

use std::path::PathBuf;
use tessera_dsl::Kernel;
use tessera_dsl::library;

fn pin_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/library")
}

#[test]
fn library_kernels_print_their_pinned_canonical_text() {
    let bless = std::env::var_os("TESSERA_BLESS").is_some();
    let mut failures = Vec::new();
    for name in library::names() {
        let kernel = library::get(name).unwrap_or_else(|e| panic!("{e}"));
        let text = kernel.to_string();
        let path = pin_dir().join(format!("{name}.kernel"));
        if bless {
            std::fs::write(&path, &text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            continue;
        }
        let pinned = match std::fs::read_to_string(&path) {
            Ok(pinned) => pinned,
            Err(e) => {
                failures.push(format!("{name}: no pin at {} ({e})", path.display()));
                continue;
            }
        };
        if text != pinned {
            failures.push(format!(
                "{name}: canonical text changed\n--- pinned\n{pinned}--- now\n{text}"
            ));
        }
        match pinned.parse::<Kernel>() {
            Ok(parsed) if parsed == kernel => {}
            Ok(parsed) => failures.push(format!("{name}: pinned text parses to {parsed:?}")),
            Err(e) => failures.push(format!("{name}: pinned text does not parse: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_pin_belongs_to_a_library_kernel() {
    if std::env::var_os("TESSERA_BLESS").is_some() {
        return; // the other test is rewriting the pins right now
    }
    let dir = std::fs::read_dir(pin_dir()).unwrap_or_else(|e| panic!("{e}"));
    let mut pins: Vec<String> = dir
        .map(|entry| {
            let entry = entry.unwrap_or_else(|e| panic!("{e}"));
            entry.file_name().to_string_lossy().into_owned()
        })
        .collect();
    pins.sort();
    let expected: Vec<String> = library::names()
        .iter()
        .map(|name| format!("{name}.kernel"))
        .collect();
    assert_eq!(pins, expected);
}
