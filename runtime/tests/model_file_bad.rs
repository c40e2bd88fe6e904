//! Bad model files: each way a GGUF file can be broken gives an error that
//! names the file, the tensor or key, and the field — never a panic, never
//! an allocation sized by an unchecked field. Then a fuzz test: proptest
//! mutates the seed files in `tests/data/gguf` (written by llama.cpp's
//! `gguf` writer; see `tests/oracle/write_gguf.py`) and a safetensors file
//! written by the `safetensors` crate — bit flips, truncations, field
//! overwrites with extreme values, byte insertions — and loads every
//! tensor of whatever still opens, in several formats.
//!
//! `TESSERA_FUZZ_CASES` sets the fuzz test's case count (default 20 000).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use tessera_dsl::ir::{Format, Group, ParamType};
use tessera_runtime::ModelFile;
use tessera_runtime::model_file::{ModelFileError, TensorType};

/// A GGUF file written field by field, so a test can break one field.
#[derive(Clone)]
struct Gguf {
    magic: [u8; 4],
    version: u32,
    /// Overrides of the counts (else the real ones).
    tensor_count: Option<u64>,
    kv_count: Option<u64>,
    /// (key, value type, value bytes)
    kvs: Vec<(Vec<u8>, u32, Vec<u8>)>,
    /// (name, ne, type, offset)
    tensors: Vec<(Vec<u8>, Vec<u64>, u32, u64)>,
    alignment: u64,
    data: Vec<u8>,
}

fn gstr(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s);
    v
}

impl Gguf {
    /// Two tensors: `a` Q8_0 [2, 32] (68 bytes at 0) and `b` F32 [1, 8]
    /// (32 bytes at 96), plus string and array metadata.
    fn valid() -> Gguf {
        let mut arr = 4u32.to_le_bytes().to_vec(); // u32 elements
        arr.extend(3u64.to_le_bytes());
        for v in [7u32, 8, 9] {
            arr.extend(v.to_le_bytes());
        }
        let mut data = vec![0u8; 128];
        // Q8_0 scales 1.0 (f16 0x3c00) so the blocks are finite.
        data[0..2].copy_from_slice(&[0x00, 0x3c]);
        data[34..36].copy_from_slice(&[0x00, 0x3c]);
        Gguf {
            magic: *b"GGUF",
            version: 3,
            tensor_count: None,
            kv_count: None,
            kvs: vec![
                (b"general.architecture".to_vec(), 8, gstr(b"llama")),
                (b"test.array".to_vec(), 9, arr),
            ],
            tensors: vec![
                (b"a".to_vec(), vec![32, 2], 8, 0),
                (b"b".to_vec(), vec![8, 1], 0, 96),
            ],
            alignment: 32,
            data,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut v = self.magic.to_vec();
        v.extend(self.version.to_le_bytes());
        v.extend(
            self.tensor_count
                .unwrap_or(self.tensors.len() as u64)
                .to_le_bytes(),
        );
        v.extend(self.kv_count.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for (k, ty, val) in &self.kvs {
            v.extend(gstr(k));
            v.extend(ty.to_le_bytes());
            v.extend(val);
        }
        for (name, ne, ty, off) in &self.tensors {
            v.extend(gstr(name));
            v.extend((ne.len() as u32).to_le_bytes());
            for d in ne {
                v.extend(d.to_le_bytes());
            }
            v.extend(ty.to_le_bytes());
            v.extend(off.to_le_bytes());
        }
        while !(v.len() as u64).is_multiple_of(self.alignment) {
            v.push(0);
        }
        v.extend(&self.data);
        v
    }

    fn open(&self) -> Result<ModelFile, ModelFileError> {
        ModelFile::from_bytes("bad.gguf", self.bytes())
    }
}

/// The file opens with an error whose message has every `parts`.
#[track_caller]
fn refused(g: &Gguf, parts: &[&str]) -> String {
    let err = match g.open() {
        Ok(_) => panic!("a broken file opened (expected an error with {parts:?})"),
        Err(e) => e.to_string(),
    };
    assert!(err.starts_with("bad.gguf: "), "{err}");
    for p in parts {
        assert!(err.contains(p), "`{err}` lacks `{p}`");
    }
    err
}

#[test]
fn the_hand_written_file_is_valid() {
    let f = Gguf::valid().open().unwrap();
    let t = f.tensors();
    assert_eq!(t.len(), 2);
    assert_eq!(t[0].shape, vec![2, 32]);
    assert_eq!(f.dequantize("a").unwrap().len(), 64);
    assert_eq!(f.dequantize("b").unwrap(), vec![0.0; 8]);
    let h = f.gguf().unwrap();
    assert_eq!(h.data_start % 32, 0);
}

#[test]
fn every_truncation_is_an_error() {
    let full = Gguf::valid().bytes();
    for len in 0..full.len() {
        let err = ModelFile::from_bytes("cut.gguf", full[..len].to_vec())
            .map(|_| ())
            .expect_err(&format!("{len} of {} bytes opened", full.len()))
            .to_string();
        assert!(err.starts_with("cut.gguf: "), "{len}: {err}");
        assert!(
            err.contains("truncated") || err.contains("magic"),
            "{len}: {err}"
        );
    }
}

#[test]
fn wrong_magic_and_versions() {
    let mut g = Gguf::valid();
    g.magic = *b"GGML";
    refused(&g, &["header", "`magic`", "not a GGUF file"]);
    for (v, why) in [
        (1, "only versions 2 and 3"),
        (4, "is 4"),
        (0x0300_0000, "big-endian"),
    ] {
        let mut g = Gguf::valid();
        g.version = v;
        refused(&g, &["header", "`version`", why]);
    }
    let mut g = Gguf::valid();
    g.version = 2;
    assert!(g.open().is_ok(), "version 2 has the same layout");
}

#[test]
fn tensor_data_past_the_end_or_overlapping() {
    let mut g = Gguf::valid();
    g.tensors[1].3 = 1024;
    refused(&g, &["tensor `b`", "`offset`", "past the end"]);
    let mut g = Gguf::valid();
    g.data.truncate(100);
    refused(&g, &["tensor `b`", "past the end"]);
    let mut g = Gguf::valid();
    g.tensors[1].3 = 64; // a spans [0, 68)
    refused(&g, &["tensor `b`", "`offset`", "overlaps tensor `a`"]);
}

#[test]
fn absurd_counts_and_dimensions() {
    let mut g = Gguf::valid();
    g.tensor_count = Some(u64::MAX);
    refused(&g, &["header", "`tensor_count`", "cannot fit"]);
    let mut g = Gguf::valid();
    g.kv_count = Some(1 << 40);
    refused(&g, &["header", "`metadata_kv_count`"]);
    let mut g = Gguf::valid();
    g.tensors[0].1 = vec![32, 1 << 62];
    refused(&g, &["tensor `a`", "`ne[1]`", "absurd"]);
    let mut g = Gguf::valid();
    g.tensors[0].1 = vec![32, 1 << 40];
    refused(&g, &["tensor `a`", "`offset`", "past the end"]);
    let mut g = Gguf::valid();
    g.tensors[0].1 = vec![32, 0];
    refused(&g, &["tensor `a`", "`ne[1]`", "is 0"]);
    let mut g = Gguf::valid();
    g.tensors[0].1 = vec![32, 1, 1, 1, 1];
    refused(&g, &["tensor `a`", "`n_dims`", "is 5"]);
    let mut g = Gguf::valid();
    g.tensors[0].1 = vec![30, 2];
    refused(&g, &["tensor `a`", "`ne[0]`", "Q8_0 blocks"]);
    // A string length past the end.
    let mut g = Gguf::valid();
    g.kvs[0].2 = (1u64 << 60).to_le_bytes().to_vec();
    refused(
        &g,
        &["metadata `general.architecture`", "`value`", "truncated"],
    );
    // An array too long for the file.
    let mut g = Gguf::valid();
    g.kvs[1].2[4..12].copy_from_slice(&(1u64 << 61).to_le_bytes());
    refused(&g, &["metadata `test.array`", "`array length`"]);
    // A name over ggml's limit.
    let mut g = Gguf::valid();
    g.tensors[0].0 = vec![b'x'; 65];
    refused(&g, &["tensor `#0`", "`name`", "limit is 64"]);
}

#[test]
fn unknown_types_misaligned_offsets_and_bad_metadata() {
    let mut g = Gguf::valid();
    g.tensors[0].2 = 99;
    refused(&g, &["tensor `a`", "`type`", "99 is not a ggml type"]);
    let mut g = Gguf::valid();
    g.tensors[1].3 = 100;
    refused(&g, &["tensor `b`", "`offset`", "misaligned"]);
    let mut g = Gguf::valid();
    g.kvs.push((
        b"general.alignment".to_vec(),
        4,
        24u32.to_le_bytes().to_vec(),
    ));
    refused(&g, &["metadata `general.alignment`", "power of two"]);
    let mut g = Gguf::valid();
    g.kvs.push((
        b"general.alignment".to_vec(),
        10,
        32u64.to_le_bytes().to_vec(),
    ));
    refused(&g, &["metadata `general.alignment`", "u32"]);
    let mut g = Gguf::valid();
    g.kvs[0].1 = 13;
    refused(
        &g,
        &["metadata `general.architecture`", "`value type`", "13"],
    );
    let mut g = Gguf::valid();
    g.kvs.push((b"flag".to_vec(), 7, vec![2]));
    refused(&g, &["metadata `flag`", "not 0 or 1"]);
    let mut g = Gguf::valid();
    g.kvs[1].2[0..4].copy_from_slice(&9u32.to_le_bytes());
    refused(&g, &["metadata `test.array`", "arrays of arrays"]);
    let mut g = Gguf::valid();
    g.kvs
        .push((b"general.architecture".to_vec(), 4, vec![0; 4]));
    refused(&g, &["metadata `general.architecture`", "appears twice"]);
    let mut g = Gguf::valid();
    g.tensors[1].0 = b"a".to_vec();
    refused(&g, &["tensor `a`", "`name`", "appears twice"]);
    let mut g = Gguf::valid();
    g.tensors[1].0 = vec![0xff, 0xfe];
    refused(&g, &["tensor `#1`", "`name`", "UTF-8"]);
}

#[test]
fn unsupported_types_open_but_are_refused_by_name() {
    let mut g = Gguf::valid();
    g.tensors[0].2 = 6; // Q5_0: 22-byte blocks, 44 bytes
    let f = g.open().unwrap();
    assert_eq!(
        f.tensor("a").unwrap().dtype,
        TensorType::Ggml(tessera_runtime::model_file::GgmlType::Q5_0)
    );
    let err = f.dequantize("a").unwrap_err().to_string();
    assert!(
        err.contains("bad.gguf") && err.contains("tensor `a`") && err.contains("Q5_0"),
        "{err}"
    );
    assert!(err.contains("supported: F32, F16, BF16, Q4_0"), "{err}");
}

/// Found by the fuzz test: an F32 tensor whose values' abs max divided by
/// 127 is a subnormal made ggml's Q8_0 quantizer cast ±inf to a code.
#[test]
fn subnormal_weights_quantize_into_q8_0() {
    let mut g = Gguf::valid();
    for (i, v) in [1e-38f32, -1e-38, 0.0, 3e-39, -2e-39, 1e-38, 0.0, -1e-38]
        .iter()
        .enumerate()
    {
        g.data[96 + 4 * i..100 + 4 * i].copy_from_slice(&v.to_le_bytes());
    }
    let f = g.open().unwrap();
    let (w, ..) = f
        .weights("b", Format::I8Sym(Group::Size(32), ParamType::F16))
        .unwrap();
    let tessera_runtime::model_file::OwnedWeights::Quant(q) = w else {
        panic!("quantized")
    };
    q.validate().unwrap();
}

#[test]
fn model_files_on_disk_name_the_path() {
    let dir = std::env::temp_dir().join(format!("tessera-bad-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let err = ModelFile::open(&empty).unwrap_err().to_string();
    assert!(
        err.contains("empty.gguf") && err.contains("truncated"),
        "{err}"
    );
    let missing = dir.join("missing.gguf");
    let err = ModelFile::open(&missing).unwrap_err().to_string();
    assert!(err.contains("missing.gguf"), "{err}");
    let st = dir.join("bad.safetensors");
    std::fs::write(&st, b"\x10\0\0\0\0\0\0\0{\"a\": 1}").unwrap();
    let err = ModelFile::open(&st).unwrap_err().to_string();
    assert!(err.contains("bad.safetensors"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

// ---- fuzzing --------------------------------------------------------------

fn seeds() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf");
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    assert!(out.len() >= 3, "the seed corpus is in {}", dir.display());
    out.push(("hand.gguf".into(), Gguf::valid().bytes()));
    // A safetensors file from the crate's writer.
    let w: Vec<u8> = (0..4 * 32 * 4).map(|i| (i * 7 % 251) as u8).collect();
    let h: Vec<u8> = (0..2 * 32).map(|i| (i * 5 % 200) as u8).collect();
    let st = safetensors::serialize(
        vec![
            (
                "w",
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4, 32], &w)
                    .unwrap(),
            ),
            (
                "h",
                safetensors::tensor::TensorView::new(safetensors::Dtype::F16, vec![1, 32], &h)
                    .unwrap(),
            ),
        ],
        None,
    )
    .unwrap();
    out.push(("seed.safetensors".into(), st));
    out
}

#[derive(Clone, Debug)]
enum Mutation {
    FlipBit {
        at: usize,
        bit: u8,
    },
    Truncate {
        at: usize,
    },
    /// Overwrite 1, 2, 4 or 8 bytes with an extreme or random value.
    Overwrite {
        at: usize,
        width: u8,
        value: u64,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let extreme = prop_oneof![
        Just(0u64),
        Just(1),
        Just(31),
        Just(32),
        Just(255),
        Just(u32::MAX as u64),
        Just(u32::MAX as u64 + 1),
        Just(1 << 40),
        Just(1 << 62),
        Just(u64::MAX),
        any::<u64>(),
    ];
    prop_oneof![
        4 => (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        1 => any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        4 => (any::<usize>(), prop_oneof![Just(1u8), Just(2), Just(4), Just(8)], extreme)
            .prop_map(|(at, width, value)| Mutation::Overwrite { at, width, value }),
        1 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..9))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    match m {
        Mutation::FlipBit { at, bit } => {
            let i = at % bytes.len();
            bytes[i] ^= 1 << bit;
        }
        Mutation::Truncate { at } => bytes.truncate(at % bytes.len()),
        Mutation::Overwrite { at, width, value } => {
            let i = at % bytes.len();
            for (j, b) in value.to_le_bytes()[..*width as usize].iter().enumerate() {
                if let Some(d) = bytes.get_mut(i + j) {
                    *d = *b;
                }
            }
        }
        Mutation::Insert { at, bytes: ins } => {
            let i = at % (bytes.len() + 1);
            bytes.splice(i..i, ins.iter().copied());
        }
    }
}

fn cases() -> u32 {
    std::env::var("TESSERA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// Mutated files that still opened, and tensors that still loaded.
static OPENED: AtomicUsize = AtomicUsize::new(0);
static LOADED: AtomicUsize = AtomicUsize::new(0);

/// Load everything a (possibly broken) file offers: every error must name
/// the file; nothing may panic.
fn exercise(name: &str, bytes: Vec<u8>) -> Result<(), TestCaseError> {
    let file = match ModelFile::from_bytes(name, bytes) {
        Ok(f) => {
            OPENED.fetch_add(1, Ordering::Relaxed);
            f
        }
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(msg.starts_with(&format!("{name}: ")), "{msg}");
            return Ok(());
        }
    };
    let g32 = Group::Size(32);
    let targets = [
        Format::U4Sym(g32, ParamType::F16),
        Format::U4Asym(g32, ParamType::F16),
        Format::I8Sym(g32, ParamType::F16),
        Format::U4Asym(g32, ParamType::F32),
        Format::F32,
    ];
    for t in file.tensors() {
        match file.dequantize(&t.name) {
            Ok(_) => {
                LOADED.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.starts_with(&format!("{name}: ")), "{msg}");
            }
        }
        for target in targets {
            if let Err(e) = file.weights(&t.name, target) {
                let msg = e.to_string();
                prop_assert!(msg.starts_with(&format!("{name}: ")), "{msg}");
            }
        }
    }
    Ok(())
}

#[test]
fn fuzz_mutated_model_files_never_panic() {
    let seeds = seeds();
    for (name, bytes) in &seeds {
        // The seeds themselves load.
        let f = ModelFile::from_bytes(name, bytes.clone()).unwrap_or_else(|e| panic!("{e}"));
        assert!(f.tensor_count() > 0, "{name}");
    }
    let start = std::time::Instant::now();
    let config = ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let n = seeds.len();
    proptest!(config, |(seed in 0..n, muts in proptest::collection::vec(mutation(), 1..5))| {
        let (name, bytes) = &seeds[seed];
        let mut b = bytes.clone();
        for m in &muts {
            apply(&mut b, m);
        }
        exercise(name, b)?;
    });
    println!(
        "fuzz: {} mutated files in {:.1} s ({} still opened, {} tensors dequantized)",
        cases(),
        start.elapsed().as_secs_f64(),
        OPENED.load(Ordering::Relaxed),
        LOADED.load(Ordering::Relaxed)
    );
}
