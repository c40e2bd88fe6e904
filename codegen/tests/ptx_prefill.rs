//! PTX causal prefill on tensor cores: the programs assemble with `ptxas`
//! for sm_80 and sm_90 without spills, and executed by the simulator
//! (`ldmatrix`, `ldmatrix.trans`, `mma.sync`, `cp.async` as the hardware
//! defines them) they match the reference interpreter: f16 and kv8 caches
//! (sm_80's fp8 bit operations, sm_90's `cvt`), GQA groups 1 to 8, head dims
//! 16 to 256 (Q in registers up to 128, from shared memory above),
//! prefixes p ∈ {0, 1, 17}, rows and keys around the 64-row and 64-key
//! blocks, scores far outside the usual range, and q not prescaled.

#[path = "attention_inputs/mod.rs"]
mod attention_inputs;
mod ptx_common;
#[path = "ptx_sim/mod.rs"]
mod ptx_sim;

use half::f16;
use ptx_common::{assemble_entries, ptxas};
use tessera_codegen::gpu::LaunchExtent;
use tessera_codegen::ptx::prefill::BlockPlan;
use tessera_codegen::ptx::{PtxBackend, Sm, prefill};
use tessera_dsl::interp::{Bindings, Value, run};
use tessera_dsl::{Kernel, Op, library};

fn kernels() -> Vec<Kernel> {
    let mut unscaled = library::get("attention-prefill-f16").unwrap();
    unscaled.name = "attention-prefill-f16-unscaled".into();
    if let Op::Attention(a) = &mut unscaled.op {
        a.q_prescaled = false;
    }
    tessera_dsl::verify(&unscaled).unwrap();
    vec![
        library::get("attention-prefill-f16").unwrap(),
        library::get("attention-prefill-kv8").unwrap(),
        unscaled,
    ]
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// One prefill: `p` cached tokens, then `t` prompt tokens as queries.
struct Case {
    p: usize,
    t: usize,
    hq: usize,
    kvh: usize,
    d: usize,
    q_amp: f32,
    seed: u64,
}

/// Runs the simulated program and the interpreter on one case.
fn check(kernel: &Kernel, sm: Sm, c: &Case) {
    check_at(kernel, sm, c, None)
}

/// [`check`] under another block plan (keys per block, Q in registers).
fn check_at(kernel: &Kernel, sm: Sm, c: &Case, blocks: Option<BlockPlan>) {
    use ptx_sim::{Arg, Buffer, Module, launch_with_shared};
    let (t, hq, kvh, d) = (c.t, c.hq, c.kvh, c.d);
    let s = c.p + t;
    let inp = attention_inputs::inputs(kernel, t * hq * d, s * kvh, d, c.q_amp, c.seed);
    let bindings = Bindings::new()
        .extent("t", t)
        .extent("hq", hq)
        .extent("kvh", kvh)
        .extent("d", d)
        .extent("s", s)
        .tensor("q", Value::F16(inp.q.clone()))
        .tensor("k", inp.k.value.clone())
        .tensor("v", inp.v.value.clone());
    let out = run(kernel, &bindings).expect("interp");
    let want = out.get("o").unwrap();

    let prog = PtxBackend::new(sm)
        .prefill_program_at(kernel, d, blocks)
        .unwrap();
    let module = Module::parse(&prog.text);
    let (kb, ks, ko) = inp.k.gpu_bytes();
    let (vb, _, _) = inp.v.gpu_bytes();
    // Exactly sized buffers: the simulator fails any access past them.
    let mut bufs: Vec<Buffer> = [
        inp.q
            .iter()
            .flat_map(|v| v.to_bits().to_le_bytes())
            .collect(),
        kb,
        f32_bytes(&ks),
        f32_bytes(&ko),
        vb,
        vec![0xFFu8; 2 * t * hq * d],
    ]
    .into_iter()
    .map(|bytes| Buffer { bytes })
    .collect();
    let int = |v: usize| Arg::Int(i32::try_from(v).unwrap());
    let args = [
        ("q", Arg::Buf(0)),
        ("k", Arg::Buf(1)),
        ("k_scales", Arg::Buf(2)),
        ("k_offsets", Arg::Buf(3)),
        ("v", Arg::Buf(4)),
        ("o", Arg::Buf(5)),
        ("t", int(t)),
        ("s", int(s)),
        ("hq", int(hq)),
        ("kvh", int(kvh)),
    ];
    let extent = |x: LaunchExtent| match x {
        LaunchExtent::PrefillRows => t * (hq / kvh),
        LaunchExtent::KvHeads => kvh,
        _ => 1,
    };
    let dims = &prog.plan.launch;
    let grid = dims.map(|dim| (dim.global(extent(dim.extent)) / dim.local as usize) as u32);
    let block = dims.map(|dim| dim.local);
    launch_with_shared(
        &module,
        &prog.plan.entry,
        grid,
        block,
        prog.dynamic_shared_bytes,
        &args,
        &mut bufs,
    );
    let what = format!(
        "{} {} p={} t={t} hq={hq} kvh={kvh} d={d} amp={}",
        kernel.name,
        sm.arch(),
        c.p,
        c.q_amp
    );
    for (i, (pair, w)) in bufs[5].bytes.chunks(2).zip(want).enumerate() {
        let g = f16::from_bits(u16::from_le_bytes([pair[0], pair[1]])).to_f32();
        let tol = 4e-3 * w.abs() + 3e-3;
        assert!(
            (g - w).abs() <= tol,
            "{what}: o[{i}] (token {}, head {}) = {g}, want {w}",
            i / (hq * d),
            i / d % hq
        );
    }
}

/// Every library kernel on both SMs across the block sizes and head dims.
#[test]
fn simulated_prefill_matches_the_interpreter() {
    // (p, t, hq, kvh, d): one row block and one key block; rows and keys
    // past both; GQA 8 with d = 256 (Q from shared memory, 32-key blocks);
    // d = 80 and 96 (chunk counts not a power of two); MHA at d = 128.
    let shapes = [
        (0, 5, 2, 2, 16),
        (17, 70, 6, 2, 64),
        (1, 20, 8, 1, 256),
        (0, 40, 2, 1, 80),
        (17, 24, 3, 3, 96),
        (1, 33, 2, 2, 128),
        // Three and four key blocks: the staging buffers' rotation.
        (17, 130, 2, 1, 64),
        (40, 60, 4, 2, 256),
    ];
    let mut seed = 1;
    for (n, k) in kernels().iter().enumerate() {
        for sm in Sm::ALL {
            // Both SMs for the cache formats; one for the Q scaling.
            if n == 2 && sm == Sm::Sm80 {
                continue;
            }
            for &(p, t, hq, kvh, d) in &shapes {
                seed += 1;
                let c = Case {
                    p,
                    t,
                    hq,
                    kvh,
                    d,
                    q_amp: 0.5,
                    seed,
                };
                check(k, sm, &c);
            }
        }
    }
}

/// Other block plans (16, 32 and 128 keys; Q from shared memory at
/// d = 64; 1, 2 and 8 warps) compute the same outputs, f16 and kv8.
#[test]
fn simulated_plans_match_the_interpreter() {
    let ks = kernels();
    let plan = |keys, q_in_registers, warps| BlockPlan {
        keys,
        q_in_registers,
        warps,
    };
    let plans = [plan(16, true, 1), plan(32, false, 2), plan(128, true, 8)];
    for (n, blocks) in plans.into_iter().enumerate() {
        for k in &ks[..2] {
            let c = Case {
                p: 17,
                t: 70,
                hq: 6,
                kvh: 2,
                d: 64,
                q_amp: 0.5,
                seed: 300 + n as u64,
            };
            check_at(k, Sm::Sm90, &c, Some(blocks));
        }
    }
}

/// Scores of magnitude up to ~100: the running max moves between key
/// blocks by far more than the exponential's range (f16 keys: the kv8
/// keys' f16 rounding would move such scores by more than the tolerance).
#[test]
fn simulated_far_scores_rescale_exactly() {
    let k = library::get("attention-prefill-f16").unwrap();
    for (seed, (p, t)) in [(0usize, 100usize), (17, 60)].into_iter().enumerate() {
        let c = Case {
            p,
            t,
            hq: 4,
            kvh: 2,
            d: 128,
            q_amp: 8.0,
            seed: 900 + seed as u64,
        };
        check(&k, Sm::Sm90, &c);
    }
}

#[test]
fn prefill_programs_assemble_without_spills() {
    let Some(ptxas) = ptxas() else {
        eprintln!(
            "SKIP prefill_programs_assemble_without_spills: ptxas not found (set PTXAS, or run \
             scripts/test.sh, which pip-installs nvidia-cuda-nvcc-cu12)"
        );
        return;
    };
    let mut failures = Vec::new();
    for sm in Sm::ALL {
        for k in kernels() {
            for d in [64, 80, 96, 128, 256] {
                let prog = PtxBackend::new(sm).prefill_program(&k, d).unwrap();
                let reports = assemble_entries(&ptxas, sm, &k.name, &prog.text)
                    .unwrap_or_else(|e| panic!("{} d={d} {}: {e}", k.name, sm.arch()));
                assert_eq!(reports.len(), 1);
                for (entry, r) in reports {
                    eprintln!("{entry} d={d} {}: {r:?}", sm.arch());
                    if r.spill_stores != 0 || r.spill_loads != 0 || r.stack_frame != 0 {
                        failures.push(format!("{entry} d={d} {}: spills {r:?}", sm.arch()));
                    }
                    if r.registers > prefill::max_registers(sm) {
                        failures.push(format!("{entry} d={d} {}: {r:?}", sm.arch()));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Head dims the mma cannot step through, and tiles past the SM's shared
/// memory, are refused with the reason.
#[test]
fn refuses_what_it_cannot_run() {
    let k = library::get("attention-prefill-f16").unwrap();
    let e = PtxBackend::new(Sm::Sm90)
        .prefill_program(&k, 72)
        .unwrap_err()
        .to_string();
    assert!(e.contains("multiple of 16"), "{e}");
    let decode = library::get("attention-decode-f16").unwrap();
    let e = PtxBackend::new(Sm::Sm90)
        .prefill_program(&decode, 64)
        .unwrap_err()
        .to_string();
    assert!(e.contains("decode attention"), "{e}");
}

/// The canonical prefill programs, pinned (d = 128: f16 on sm_80, kv8 on
/// sm_90, whose fp8 values take the `cvt` path).
#[test]
fn canonical_snapshots() {
    for (name, sm) in [
        ("attention-prefill-f16", Sm::Sm80),
        ("attention-prefill-kv8", Sm::Sm90),
    ] {
        let k = library::get(name).unwrap();
        let a = PtxBackend::new(sm).prefill_program(&k, 128).unwrap();
        let b = PtxBackend::new(sm).prefill_program(&k, 128).unwrap();
        assert_eq!(a, b, "byte-stable");
        insta::assert_snapshot!(format!("ptx_{}_d128_{}", name, sm.arch()), a.text);
    }
}
