//! The cranelift backend's matmuls against the reference interpreter:
//! every matmul library kernel, random inputs with tails in m, n and k,
//! several solver tiles, 1 and 2 threads.

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_codegen::TileConfig;
use tessera_codegen::artifact::{Artifact, Backend, EmitError, MachineCode, Variant};
use tessera_codegen::clif::{ClifBackend, MatmulJob};
use tessera_codegen::host::{HostInput, HostMatmul, HostOutput, HostTile, HostWeights, WeightsIn};
use tessera_codegen::tile::{Problem, neighbours, solve};
use tessera_dsl::interp::{self, Bindings, Value};
use tessera_dsl::ir::{Format, Kernel};

#[path = "../../tests/src/guarded.rs"]
#[allow(dead_code)] // its attention caches serve other tests
mod guarded;
use guarded::Guarded;
use tessera_dsl::{library, quant};

const MATMULS: [&str; 7] = [
    "matmul-e0m4a16",
    "matmul-f16",
    "matmul-f32",
    "matmul-w4a16",
    "matmul-w4a8",
    "matmul-w8a16",
    "matmul-w8a8",
];

fn machine(a: Artifact) -> MachineCode {
    match a {
        Artifact::Machine(m) => m,
        other => panic!("expected machine code, got {other}"),
    }
}

/// The best solver tile and up to `extra` of its neighbours.
fn tiles(backend: &ClifBackend, kernel: &Kernel, extra: usize) -> Vec<TileConfig> {
    let caps = backend.caps();
    let problem = Problem::from_kernel(caps, kernel).expect("problem");
    let best = backend.tiles(kernel).expect("tiles")[0];
    let mut v = vec![best];
    // The one-row (GEMV) tile: its loop shares one broadcast of x per step.
    let mut gemv = problem;
    gemv.e = 1;
    let one_row = solve(caps, &gemv)
        .expect("GEMV tiles")
        .into_iter()
        .find(|t| tessera_codegen::clif::matmul::check_tile(kernel, t).is_ok())
        .expect("an indexable GEMV tile");
    assert_eq!(one_row.ep, 1, "{}", one_row.summary());
    if one_row != best {
        v.push(one_row);
    }
    v.extend(
        neighbours(caps, &problem, &best, 8)
            .expect("neighbours")
            .into_iter()
            .filter(|t| tessera_codegen::clif::matmul::check_tile(kernel, t).is_ok())
            .take(extra),
    );
    v
}

fn fmt(kernel: &Kernel, name: &str) -> Format {
    kernel.tensor(name).unwrap().format
}

struct Compiled {
    host: HostMatmul,
}

fn compile(backend: &ClifBackend, kernel: &Kernel, tile: &TileConfig) -> Compiled {
    let code = machine(
        backend
            .emit(kernel, tile)
            .unwrap_or_else(|e| panic!("{} {}: {e}", kernel.name, tile.summary())),
    );
    let quantizer = (fmt(kernel, "x") == Format::I8Dyn)
        .then(|| backend.emit_quantizer(kernel, tile).expect("quantizer"));
    let host =
        HostMatmul::new(kernel, HostTile::from(tile), quantizer.as_ref(), &code).expect("map");
    Compiled { host }
}

/// Run one case; panics with the worst error on mismatch.
fn check(c: &Compiled, kernel: &Kernel, m: usize, n: usize, k: usize, threads: usize, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let xs: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let ws: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let bias: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let (xf, wf, yf) = (fmt(kernel, "x"), fmt(kernel, "w"), fmt(kernel, "y"));

    // Weights: quantized once, the same tensor for the oracle and the kernel.
    let (w_value, w_dense, packed) = if wf.is_quantized() {
        let q = quant::quantize(wf, n, k, &ws).expect("quantize");
        let packed =
            HostWeights::pack(kernel, c.host.tile(), n, k, WeightsIn::Quant(&q)).expect("pack");
        let dense = q.dequantize();
        (Value::Quant(q), dense, packed)
    } else {
        let v = Value::from_f32(wf, &ws).unwrap();
        let dense: Vec<f32> = match &v {
            Value::F16(h) => h.iter().map(|x| x.to_f32()).collect(),
            _ => ws.clone(),
        };
        let packed =
            HostWeights::pack(kernel, c.host.tile(), n, k, WeightsIn::F32(&ws)).expect("pack");
        (v, dense, packed)
    };
    let x16: Vec<f16> = xs.iter().map(|&v| f16::from_f32(v)).collect();
    let x_dense: Vec<f32> = if xf == Format::F16 {
        x16.iter().map(|v| v.to_f32()).collect()
    } else {
        xs.clone()
    };
    let bindings = Bindings::new()
        .extent("e", m)
        .extent("h", n)
        .extent("l", k)
        .tensor("x", Value::from_f32(xf, &xs).unwrap())
        .tensor("w", w_value)
        .tensor("bias", Value::F32(bias.clone()));
    let want = interp::run(kernel, &bindings).expect("interp");
    let want = want.get("y").unwrap();

    let mut got = vec![0f32; m * n];
    let mut got16 = vec![f16::ZERO; m * n];
    // x ends at an inaccessible page: a read past it faults.
    let xg = if xf == Format::F16 {
        Guarded::from_halves(&x16)
    } else {
        Guarded::from_floats(&xs)
    };
    let input = if xf == Format::F16 {
        HostInput::F16(xg.halves())
    } else {
        HostInput::F32(xg.floats())
    };
    let out = if yf == Format::F16 {
        HostOutput::F16(&mut got16)
    } else {
        HostOutput::F32(&mut got)
    };
    c.host
        .run(input, m, &packed, Some(&bias), out, threads)
        .expect("run");
    if yf == Format::F16 {
        got = got16.iter().map(|v| v.to_f32()).collect();
    }
    // Tolerance: f32 accumulation error scaled by Σ|x·w|, plus the
    // output format's rounding; int8 activations add their own rounding
    // identically on both sides, so the same bound holds.
    let (acc_eps, out_eps) = match yf {
        Format::F16 => (2e-5, 2e-3),
        _ => (2e-5, 0.0),
    };
    for r in 0..m {
        for h in 0..n {
            let sum_abs: f32 = (0..k)
                .map(|l| (x_dense[r * k + l] * w_dense[h * k + l]).abs())
                .sum::<f32>()
                + bias[h].abs();
            let (g, w) = (got[r * n + h], want[r * n + h]);
            let tol = acc_eps * sum_abs + out_eps * w.abs() + 1e-6;
            assert!(
                (g - w).abs() <= tol,
                "{} tile {}x{}x{} m={m} n={n} k={k} threads={threads}: y[{r},{h}] = {g}, want {w} (tol {tol})",
                kernel.name,
                c.host.tile().ep,
                c.host.tile().hp,
                c.host.tile().lp,
            );
        }
    }
}

fn sweep(name: &str) {
    let backend = ClifBackend::host().expect("backend");
    let kernel = library::get(name).unwrap();
    let mut seed = 1;
    for (ti, tile) in tiles(&backend, &kernel, 2).iter().enumerate() {
        let c = compile(&backend, &kernel, tile);
        for &m in &[1usize, 2, 3, 7] {
            for &n in &[1usize, 5, 8, 17] {
                for &k in &[1usize, 7, 32, 33, 100] {
                    // The neighbour tiles get a thinner sweep.
                    if ti > 0 && (m + n + k) % 3 != 0 {
                        continue;
                    }
                    for threads in [1, 2] {
                        seed += 1;
                        check(&c, &kernel, m, n, k, threads, seed);
                    }
                }
            }
        }
    }
}

/// `parallel` is a contract: without `h` listed, the caller's executor is
/// never handed the ranges (they run on the calling thread), with it the
/// executor runs them; both agree with the interpreter.
#[test]
fn clif_parallel_decides_whether_ranges_leave_the_caller() {
    let backend = ClifBackend::host().expect("backend");
    let spread = library::get("matmul-f32").expect("library");
    let mut serial = spread.clone();
    serial.schedule.parallel.clear();
    let (m, n, k) = (3, 45, 37);
    for (kernel, spreads) in [(&spread, true), (&serial, false)] {
        let tile = tiles(&backend, kernel, 0)[0];
        let c = compile(&backend, kernel, &tile);
        check(&c, kernel, m, n, k, 2, 7);
        let w: Vec<f32> = (0..n * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let x: Vec<f32> = (0..m * k).map(|i| (i % 5) as f32 - 2.0).collect();
        let packed =
            HostWeights::pack(kernel, c.host.tile(), n, k, WeightsIn::F32(&w)).expect("pack");
        let panels = n.div_ceil(c.host.tile().hp);
        let ranges = [0..1, 1..panels];
        let handed = std::sync::atomic::AtomicBool::new(false);
        let bias = vec![0.5f32; n];
        let mut y = vec![f32::NAN; m * n];
        c.host
            .run_ranges(
                HostInput::F32(&x),
                m,
                &packed,
                Some(&bias),
                HostOutput::F32(&mut y),
                &ranges,
                &|call| {
                    handed.store(true, std::sync::atomic::Ordering::Relaxed);
                    (0..2).for_each(call);
                },
            )
            .expect("run");
        assert_eq!(
            handed.into_inner(),
            spreads,
            "{:?}",
            kernel.schedule.parallel
        );
        assert!(y.iter().all(|v| v.is_finite()), "every column written");
    }
}

#[test]
fn clif_matmul_f32() {
    sweep("matmul-f32");
}

#[test]
fn clif_matmul_f16() {
    sweep("matmul-f16");
}

#[test]
fn clif_matmul_w4a8() {
    sweep("matmul-w4a8");
}

#[test]
fn clif_matmul_w8a8() {
    sweep("matmul-w8a8");
}

#[test]
fn clif_matmul_w4a16() {
    sweep("matmul-w4a16");
}

#[test]
fn clif_matmul_w8a16() {
    sweep("matmul-w8a16");
}

#[test]
fn clif_matmul_e0m4a16() {
    sweep("matmul-e0m4a16");
}

/// The blocked GEMM loop (partial sums through y between K blocks) with
/// K blocks of about 8 and 16 (rounded up to whole unrolled trips and
/// groups: 12 and 24 for f32, 32 for g32 weights), so k = 7..100 spans
/// one to nine blocks; n has a tail panel (which does all of k at once)
/// and m tails.
#[test]
fn clif_gemm_k_blocks() {
    let backend = ClifBackend::host().expect("backend");
    let mut seed = 9000;
    for name in MATMULS {
        let kernel = library::get(name).unwrap();
        let tile = backend.tiles(&kernel).expect("tiles")[0];
        for k_block in [8, 16] {
            let code = backend
                .emit_k_blocked(&kernel, &tile, k_block)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let quantizer = (fmt(&kernel, "x") == Format::I8Dyn)
                .then(|| backend.emit_quantizer(&kernel, &tile).expect("quantizer"));
            let host = HostMatmul::new(&kernel, HostTile::from(&tile), quantizer.as_ref(), &code)
                .expect("map");
            let c = Compiled { host };
            for &(m, n, k) in &[
                (1, 8, 7),
                (3, 17, 33),
                (7, 16, 100),
                (5, 9, 64),
                (2, 24, 16),
            ] {
                for threads in [1, 2] {
                    seed += 1;
                    check(&c, &kernel, m, n, k, threads, seed);
                }
            }
        }
    }
}

/// Every variant the runtime asks for compiles and computes the same
/// thing (GEMV and flat GEMM share the default loop; GEMM has K blocks).
#[test]
fn clif_every_variant() {
    let backend = ClifBackend::host().expect("backend");
    let mut seed = 7000;
    for name in ["matmul-f32", "matmul-w8a16", "matmul-w4a8"] {
        let kernel = library::get(name).unwrap();
        let tile = backend.tiles(&kernel).expect("tiles")[0];
        for variant in [Variant::Gemv, Variant::FlatGemm, Variant::Gemm] {
            let code = machine(
                backend
                    .emit_variant(&kernel, &tile, variant)
                    .unwrap_or_else(|e| panic!("{name} {variant}: {e}")),
            );
            let quantizer = (fmt(&kernel, "x") == Format::I8Dyn)
                .then(|| backend.emit_quantizer(&kernel, &tile).expect("quantizer"));
            let host = HostMatmul::new(&kernel, HostTile::from(&tile), quantizer.as_ref(), &code)
                .expect("map");
            let c = Compiled { host };
            for &(m, n, k) in &[(1, 17, 33), (6, 9, 100)] {
                seed += 1;
                check(&c, &kernel, m, n, k, 2, seed);
            }
        }
    }
}

/// The parallel batch gives, per job and in job order, exactly what one
/// compilation at a time gives; a bad job is an error that leaves the
/// others alone.
#[test]
fn clif_batch_matches_one_at_a_time() {
    let backend = ClifBackend::host().expect("backend");
    let kernels: Vec<Kernel> = ["matmul-f32", "matmul-w4a8", "matmul-w8a8", "matmul-f16"]
        .iter()
        .map(|n| library::get(n).unwrap())
        .collect();
    let mut jobs = Vec::new();
    for (i, kernel) in kernels.iter().enumerate() {
        let tile = backend.tiles(kernel).expect("tiles")[0];
        let variant = [Variant::Gemm, Variant::FlatGemm, Variant::Gemv][i % 3];
        jobs.push(MatmulJob {
            kernel,
            tile,
            variant,
        });
    }
    let mut bad = jobs[0];
    bad.tile.hp = 6;
    jobs.insert(1, bad);
    for threads in [1, 2, 3] {
        let got = backend.emit_matmuls(&jobs, threads);
        assert_eq!(got.len(), jobs.len());
        for (job, r) in jobs.iter().zip(&got) {
            if job.tile.hp == 6 {
                assert!(matches!(r, Err(EmitError::BadTile { .. })), "{r:?}");
                continue;
            }
            let c = r.as_ref().expect("compiled");
            let want = machine(
                backend
                    .emit_variant(job.kernel, &job.tile, job.variant)
                    .unwrap(),
            );
            assert_eq!(c.code, want, "{} {}", job.kernel.name, job.variant);
            let q = (fmt(job.kernel, "x") == Format::I8Dyn)
                .then(|| backend.emit_quantizer(job.kernel, &job.tile).unwrap());
            assert_eq!(c.quantizer, q, "{}", job.kernel.name);
        }
    }
}

/// Library matmuls cranelift refuses, by name: ggml's blocks (f16 group
/// parameters; Q4_0's implied zero point).
const REFUSED: [&str; 6] = [
    "matmul-q4_0",
    "matmul-q4_0a16",
    "matmul-q4_1",
    "matmul-q4_1a16",
    "matmul-q8_0",
    "matmul-q8_0a16",
];

#[test]
fn clif_every_matmul_kernel_is_covered() {
    let all: Vec<&str> = library::names()
        .iter()
        .copied()
        .filter(|n| n.starts_with("matmul-"))
        .collect();
    let mut known: Vec<&str> = MATMULS.iter().chain(&REFUSED).copied().collect();
    known.sort_unstable();
    assert_eq!(all, known);
    // The W4A8 kernel's tile has the same int8 shape: the refusal is the
    // weight format's, named in the error.
    let backend = ClifBackend::host().expect("backend");
    let w4a8 = library::get("matmul-w4a8").unwrap();
    let tile = backend.tiles(&w4a8).expect("tiles")[0];
    for name in REFUSED {
        let kernel = library::get(name).unwrap();
        let err = backend
            .emit_variant(&kernel, &tile, Variant::Gemm)
            .expect_err(name)
            .to_string();
        let w = fmt(&kernel, "w").to_string();
        assert!(err.contains(&w), "{name}: {err}");
    }
}

#[test]
fn clif_bad_tiles_are_errors() {
    let backend = ClifBackend::host().expect("backend");
    let kernel = library::get("matmul-f32").unwrap();
    let mut tile = tiles(&backend, &kernel, 0)[0];
    tile.hp = 6;
    assert!(matches!(
        backend.emit(&kernel, &tile),
        Err(EmitError::BadTile { .. })
    ));
    let kernel = library::get("matmul-w8a8").unwrap();
    let mut tile = tiles(&backend, &kernel, 0)[0];
    tile.lp = 3;
    assert!(matches!(
        backend.emit(&kernel, &tile),
        Err(EmitError::BadTile { .. })
    ));
}

/// The interpreter's y for f32 x `[m, k]` and quantized weights `q`.
fn interpreted(
    kernel: &Kernel,
    xs: &[f32],
    q: &quant::QuantTensor,
    bias: &[f32],
    m: usize,
) -> Vec<f32> {
    let bindings = Bindings::new()
        .extent("e", m)
        .extent("h", q.rows)
        .extent("l", q.cols)
        .tensor("x", Value::from_f32(fmt(kernel, "x"), xs).unwrap())
        .tensor("w", Value::Quant(q.clone()))
        .tensor("bias", Value::F32(bias.to_vec()));
    interp::run(kernel, &bindings)
        .expect("interp")
        .get("y")
        .unwrap()
        .to_vec()
}

/// `got` within f32 accumulation error of the interpreter's `want`.
fn assert_near(got: &[f32], want: &[f32], what: &str) {
    let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
    let err = got
        .iter()
        .zip(want)
        .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
    assert!(
        err <= 1e-4 * (1.0 + scale),
        "{what}: error {err} against the interpreter (scale {scale})"
    );
}

/// A quantized input is read by the kernel that made it and by any kernel
/// with a byte-identical quantizer, giving exactly the result of quantizing
/// inside the call; another quantizer's (here another weight group's) is
/// refused by name, as is quantizing for a float kernel.
#[test]
fn clif_quantized_input_is_read_only_where_it_quantizes_alike() {
    let backend = ClifBackend::host().expect("backend");
    let w4a8 = library::get("matmul-w4a8").unwrap();
    let w8a8 = library::get("matmul-w8a8").unwrap();
    let f32k = library::get("matmul-f32").unwrap();
    let tile = tiles(&backend, &w4a8, 0)[0];
    let a = compile(&backend, &w4a8, &tile);
    let twin = compile(&backend, &w4a8, &tile);
    let b = compile(&backend, &w8a8, &tiles(&backend, &w8a8, 0)[0]);
    let f = compile(&backend, &f32k, &tiles(&backend, &f32k, 0)[0]);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (n, k) = (17usize, 100usize);
    let ws: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let bias: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let qa = quant::quantize(fmt(&w4a8, "w"), n, k, &ws).expect("quantize");
    let qb = quant::quantize(fmt(&w8a8, "w"), n, k, &ws).expect("quantize");
    let wa = HostWeights::pack(&w4a8, a.host.tile(), n, k, WeightsIn::Quant(&qa)).expect("pack");
    let wb = HostWeights::pack(&w8a8, b.host.tile(), n, k, WeightsIn::Quant(&qb)).expect("pack");
    let panels = n.div_ceil(tile.hp as usize);
    let ranges = [0..panels / 2, panels / 2..panels];
    let mut reuse = None;
    for m in [1usize, 3, 7, 2] {
        let xs: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let q = a
            .host
            .quantize_input(&xs, m, k, reuse.take())
            .expect("quantize");
        assert_eq!((q.m(), q.k()), (m, k));
        assert!(a.host.reads(&q) && twin.host.reads(&q), "m={m}");
        assert!(!b.host.reads(&q) && !f.host.reads(&q), "m={m}");
        // The quantized runs come first, so a kernel that read its own
        // scratch (the previous m's x) instead of `q` would show.
        let mut runs = Vec::new();
        for c in [&a, &twin] {
            let mut got = vec![f32::NAN; m * n];
            c.host
                .run_ranges_quantized(
                    &q,
                    &wa,
                    Some(&bias),
                    HostOutput::F32(&mut got),
                    &ranges,
                    &|call| (0..2).for_each(call),
                )
                .expect("run quantized");
            runs.push(got);
        }
        let mut want = vec![f32::NAN; m * n];
        a.host
            .run(
                HostInput::F32(&xs),
                m,
                &wa,
                Some(&bias),
                HostOutput::F32(&mut want),
                1,
            )
            .expect("run");
        assert_near(&want, &interpreted(&w4a8, &xs, &qa, &bias, m), "w4a8 run");
        for got in runs {
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "m={m}: a shared quantization changes no bit"
            );
        }
        let mut y = vec![0f32; m * n];
        let err = b
            .host
            .run_ranges_quantized(
                &q,
                &wb,
                Some(&bias),
                HostOutput::F32(&mut y),
                &ranges,
                &|c| c(0),
            )
            .expect_err("another group's quantization");
        assert!(err.to_string().contains("quantized activations"), "{err}");
        reuse = Some(q);
    }
    let err = f
        .host
        .quantize_input(&[0.0; 8], 1, 8, None)
        .expect_err("a float kernel");
    assert!(err.to_string().contains("not quantized ones"), "{err}");
    let err = a
        .host
        .quantize_input(&[0.0; 8], 1, 9, None)
        .expect_err("short x");
    assert!(err.to_string().contains("x elements"), "{err}");
}

/// A large x is quantized in parts of whole row blocks on the call's
/// threads: the same bytes as one pass (bit-identical outputs over 1, 2
/// and 3 ranges, and from an executor that runs no part itself), and the
/// interpreter's answer.
#[test]
fn clif_split_quantization_matches_one_pass() {
    let backend = ClifBackend::host().expect("backend");
    for name in ["matmul-w4a8", "matmul-w8a8"] {
        let kernel = library::get(name).unwrap();
        let c = compile(&backend, &kernel, &tiles(&backend, &kernel, 0)[0]);
        // 61 rows: a partial last row block; m·k above the split threshold.
        let (m, n, k) = (61usize, 40usize, 700usize);
        check(&c, &kernel, m, n, k, 2, 5);
        check(&c, &kernel, m, n, k, 3, 6);
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let xs: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-3.0..3.0)).collect();
        let ws: Vec<f32> = (0..n * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let bias = vec![0.25f32; n];
        let q = quant::quantize(fmt(&kernel, "w"), n, k, &ws).expect("quantize");
        let packed =
            HostWeights::pack(&kernel, c.host.tile(), n, k, WeightsIn::Quant(&q)).expect("pack");
        let bits = |threads: usize| {
            let mut y = vec![f32::NAN; m * n];
            c.host
                .run(
                    HostInput::F32(&xs),
                    m,
                    &packed,
                    Some(&bias),
                    HostOutput::F32(&mut y),
                    threads,
                )
                .expect("run");
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let one = bits(1);
        let y1: Vec<f32> = one.iter().map(|&b| f32::from_bits(b)).collect();
        assert_near(&y1, &interpreted(&kernel, &xs, &q, &bias, m), name);
        assert_eq!(bits(2), one, "{name}: 2 threads");
        assert_eq!(bits(3), one, "{name}: 3 threads");
        // An executor that runs nothing: every part (and range) still runs.
        let idle = |_: &(dyn Fn(usize) + Sync)| {};
        let split = c
            .host
            .quantize_input_on(&xs, m, k, None, Some((&idle, 4)))
            .expect("quantize");
        let panels = n.div_ceil(c.host.tile().hp);
        let mut y = vec![f32::NAN; m * n];
        c.host
            .run_ranges_quantized(
                &split,
                &packed,
                Some(&bias),
                HostOutput::F32(&mut y),
                &[0..panels / 2, panels / 2..panels],
                &|call| (0..2).rev().for_each(call),
            )
            .expect("run");
        assert_eq!(
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            one,
            "{name}: idle executor"
        );
    }
}
