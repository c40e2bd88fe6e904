//! ggml's Q4_0, Q4_1 and Q8_0 against Tessera's `u4sym:g32:f16`,
//! `u4asym:g32:f16` and `i8sym:g32:f16`, with llama.cpp's own numpy
//! quantizers (PyPI `gguf`) as the oracle:
//!
//! - Tessera's quantizer writes the same bytes as gguf's for the same f32
//!   weights (both are ggml's reference quantizer);
//! - Tessera's dequantization of gguf's bytes equals gguf's, bit for bit.
//!
//! The test command installs `gguf` into Tessera's cache folder
//! (`~/.cache/tessera/gguf`, or `TESSERA_GGUF_PYTHONPATH`). Without it the
//! test prints SKIP, except under CI, where a missing oracle fails.

use std::path::PathBuf;
use std::process::Command;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_dsl::quant::{GgmlBlock, quantize};

/// Weights with the cases the quantizers treat specially: an all-zero
/// block, a block whose largest magnitude is negative, a constant block,
/// ties at .5 steps, and magnitudes from 1e-3 to 1e3.
fn weights(rows: usize, cols: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut w: Vec<f32> = (0..rows * cols)
        .map(|i| {
            let scale = [1e-3f32, 0.05, 1.0, 40.0, 1e3][(i / 32) % 5];
            rng.gen_range(-1.0f32..1.0) * scale
        })
        .collect();
    w[..32].fill(0.0);
    w[32..64].iter_mut().for_each(|v| *v = v.abs() * 0.5);
    w[40] = -3.0;
    w[64..96].fill(0.75);
    for (i, v) in w[96..128].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) * 0.5;
    }
    w
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn ggml_blocks_match_llama_cpp_quantizers_bit_for_bit() {
    let Some(pythonpath) = tessera_dsl::testing::gguf_pythonpath("ggml oracle") else {
        return;
    };
    let (rows, cols) = (9, 32 * 7);
    let w = weights(rows, cols);
    let dir = std::env::temp_dir().join(format!("tessera-ggml-oracle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("w.f32");
    std::fs::write(
        &input,
        w.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
    )
    .unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/gguf_blocks.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&input)
        .arg(rows.to_string())
        .arg(cols.to_string())
        .arg(&dir)
        .env("PYTHONPATH", &pythonpath)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "gguf oracle failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for block in [GgmlBlock::Q4_0, GgmlBlock::Q4_1, GgmlBlock::Q8_0] {
        let name = block.name();
        let theirs = std::fs::read(dir.join(format!("{name}.blocks"))).unwrap();
        let their_deq = f32s(&std::fs::read(dir.join(format!("{name}.deq"))).unwrap());

        let ours = quantize(block.format(), rows, cols, &w).unwrap();
        let our_bytes = block.encode(&ours).unwrap();
        assert_eq!(our_bytes.len(), theirs.len(), "{name}: byte count");
        if let Some(at) = (0..theirs.len()).find(|&i| our_bytes[i] != theirs[i]) {
            let b = block.block_bytes();
            panic!(
                "{name}: quantized bytes differ first in block {} (byte {}): ours {:?}, gguf {:?}",
                at / b,
                at % b,
                &our_bytes[at / b * b..(at / b + 1) * b],
                &theirs[at / b * b..(at / b + 1) * b]
            );
        }

        let decoded = block.decode(rows, cols, &theirs).unwrap();
        let deq = decoded.dequantize();
        assert_eq!(deq.len(), their_deq.len(), "{name}");
        for (i, (a, b)) in deq.iter().zip(&their_deq).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{name}: weight {i} (row {}, col {}) dequantizes to {a}, gguf says {b}",
                i / cols,
                i % cols
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
