//! The generator hash covers what changes emitted code or packed bytes: the
//! hash the build baked in is the one of the sources on disk, and editing a
//! library kernel (in `dsl/`, outside the emitters) changes it.

#[path = "../generator_hash.rs"]
mod generator_hash;

use std::path::{Path, PathBuf};

use generator_hash::{generator_hash, lock_file, source_roots};

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let path = entry.path();
        let dest = to.join(entry.file_name());
        if path.is_dir() {
            copy_tree(&path, &dest);
        } else {
            std::fs::copy(&path, &dest).unwrap();
        }
    }
}

fn codegen_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_baked_hash_is_the_hash_of_the_sources() {
    let dir = codegen_dir();
    let (hash, _) = generator_hash(&source_roots(&dir), lock_file(&dir).as_deref());
    assert_eq!(hash, tessera_codegen::TEMPLATE_HASH);
}

#[test]
fn editing_a_library_kernel_or_a_locked_assembler_version_changes_the_hash() {
    let dir = codegen_dir();
    let scratch = std::env::temp_dir().join(format!("tessera-genhash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    // A copy of the workspace's hashed trees and its lock file.
    let copy = scratch.join("codegen");
    for (_, root) in source_roots(&dir) {
        let rel = root.strip_prefix(dir.parent().unwrap()).unwrap();
        copy_tree(&root, &scratch.join(rel));
    }
    let lock = lock_file(&dir).expect("the workspace has a Cargo.lock");
    std::fs::copy(&lock, scratch.join("Cargo.lock")).unwrap();
    let hash_of_copy = || generator_hash(&source_roots(&copy), lock_file(&copy).as_deref()).0;
    let original = hash_of_copy();
    assert_eq!(original, tessera_codegen::TEMPLATE_HASH);

    // A library kernel's group size (dsl/src/library.rs).
    let library = scratch.join("dsl/src/library.rs");
    let text = std::fs::read_to_string(&library).unwrap();
    assert!(text.contains("g32"), "the library names a g32 format");
    std::fs::write(&library, text.replacen("g32", "g64", 1)).unwrap();
    let edited = hash_of_copy();
    assert_ne!(
        edited, original,
        "a library kernel edit must change the hash"
    );
    std::fs::write(&library, &text).unwrap();
    assert_eq!(hash_of_copy(), original);

    // A quantizer (dsl/src/quant) and the macro (dsl/macros/src).
    for file in ["dsl/src/quant/quantize.rs", "dsl/macros/src/expand.rs"] {
        let path = scratch.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{text}\n// edited\n")).unwrap();
        assert_ne!(hash_of_copy(), original, "{file}");
        std::fs::write(&path, &text).unwrap();
    }

    // cranelift's version in the lock file; an unrelated crate's is not hashed.
    let lock_text = std::fs::read_to_string(scratch.join("Cargo.lock")).unwrap();
    let bump = |name: &str| {
        let at = lock_text
            .find(&format!("name = \"{name}\"\nversion = \""))
            .unwrap_or_else(|| panic!("{name} is in Cargo.lock"));
        let start = at + format!("name = \"{name}\"\nversion = \"").len();
        format!("{}9{}", &lock_text[..start], &lock_text[start..])
    };
    std::fs::write(scratch.join("Cargo.lock"), bump("cranelift-codegen")).unwrap();
    assert_ne!(hash_of_copy(), original, "cranelift's version");
    std::fs::write(scratch.join("Cargo.lock"), bump("serde_json")).unwrap();
    assert_eq!(hash_of_copy(), original, "serde_json's version is not code");
    let _ = std::fs::remove_dir_all(&scratch);
}
