//! PTX emission: every kernel × variant × SM assembles with `ptxas -v`
//! (no spills, registers within the solver's budget), the parameter list
//! and launch geometry are the shared GPU plan's, the instructions the
//! design relies on (mma.sync, cp.async, ldmatrix, shfl) are there, and a
//! canonical set is pinned by insta.

mod ptx_common;

use ptx_common::{assemble, matmuls, ptxas, rows, tiles};
use tessera_codegen::artifact::{Artifact, Backend, EmitError, SourceLang, Variant};
use tessera_codegen::gpu::{self, ArgKind, MatmulShape, WeightMemory};
use tessera_codegen::opencl;
use tessera_codegen::ptx::{PtxBackend, Sm};
use tessera_dsl::library;

/// One emitted instance.
struct Instance {
    name: String,
    sm: Sm,
    text: String,
    budget: u32,
}

/// The canonical set (the solver's best tile per kernel × variant × SM)
/// plus `extra` further solver tiles of each, spread over the ranking.
fn instances(extra: usize) -> Vec<Instance> {
    let mut out = Vec::new();
    for sm in Sm::ALL {
        let be = PtxBackend::new(sm);
        for k in matmuls() {
            for v in Variant::ALL {
                let ranked = tiles(sm, &k, rows(v));
                let step = (ranked.len() / (extra + 1)).max(1);
                for (n, t) in ranked.iter().step_by(step).take(extra + 1).enumerate() {
                    match be.emit_variant(&k, t, v) {
                        Ok(a) => out.push(Instance {
                            name: format!("{}-{v}-{n}", k.name),
                            sm,
                            text: a.to_string(),
                            budget: t.accounting.budget,
                        }),
                        // A solver tile the plan cannot block (too much
                        // shared memory for the flat variant's shape) is
                        // refused with a reason, never emitted wrong.
                        Err(EmitError::BadTile { .. }) if n > 0 => {}
                        Err(e) => panic!("{} {v} on {}: {e}", k.name, sm.arch()),
                    }
                }
            }
        }
    }
    out
}

#[test]
fn every_kernel_assembles_without_spills_within_the_budget() {
    let Some(ptxas) = ptxas() else {
        eprintln!(
            "SKIP every_kernel_assembles_without_spills_within_the_budget: ptxas not found \
             (set PTXAS, or run scripts/test.sh, which pip-installs nvidia-cuda-nvcc-cu12)"
        );
        return;
    };
    let all = instances(3);
    assert!(all.len() >= 2 * 4 * 3);
    let mut failures = Vec::new();
    for inst in &all {
        match assemble(&ptxas, inst.sm, &inst.name, &inst.text) {
            Ok(r) => {
                eprintln!("{} {}: {:?}", inst.name, inst.sm.arch(), r);
                if r.spill_stores != 0 || r.spill_loads != 0 {
                    failures.push(format!("{} {}: spills {r:?}", inst.name, inst.sm.arch()));
                }
                if r.registers > inst.budget {
                    failures.push(format!(
                        "{} {}: {} registers > budget {}",
                        inst.name,
                        inst.sm.arch(),
                        r.registers,
                        inst.budget
                    ));
                }
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The `.entry` parameters of a program: (type, name) in order.
fn entry_params(text: &str) -> Vec<(String, String)> {
    let start = text.find(".visible .entry").expect("an entry");
    let open = start + text[start..].find('(').expect("a parameter list");
    let close = open + text[open..].find(')').expect("a closed parameter list");
    text[open + 1..close]
        .split(',')
        .map(|p| {
            let f: Vec<&str> = p.split_whitespace().collect();
            assert_eq!(f[0], ".param", "{p}");
            (f[1].to_string(), f[2].to_string())
        })
        .collect()
}

fn reqntid(text: &str) -> [u32; 3] {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(".reqntid "))
        .expect("a .reqntid line");
    let v: Vec<u32> = line.split(", ").map(|n| n.parse().unwrap()).collect();
    [v[0], v[1], v[2]]
}

#[test]
fn parameters_and_launch_are_the_shared_plans() {
    for sm in Sm::ALL {
        let be = PtxBackend::new(sm);
        for k in matmuls() {
            for v in Variant::ALL {
                let t = tiles(sm, &k, rows(v)).remove(0);
                let prog = be.program(&k, &t, v).unwrap();
                // The plan is the shared lowering's, untouched.
                let shared = gpu::plan_matmul(&k, &t, v, sm.caps(), WeightMemory::Buffer).unwrap();
                assert_eq!(prog.plan, shared);
                let params = entry_params(&prog.text);
                assert_eq!(params.len(), shared.args.len());
                for ((ty, name), a) in params.iter().zip(&shared.args) {
                    assert_eq!(name, &format!("{}_param_{}", shared.entry, a.name));
                    let want = if a.kind == ArgKind::Int {
                        ".u32"
                    } else {
                        ".u64"
                    };
                    assert_eq!(ty, want, "{name}");
                }
                let local = shared.launch.map(|d| d.local);
                assert_eq!(reqntid(&prog.text), local, "{} {v}", k.name);
                match shared.shape {
                    MatmulShape::Gemv(g) => {
                        assert_eq!(local, [g.wg_h, g.k_lanes, 1]);
                        assert_eq!(prog.dynamic_shared_bytes, 0);
                    }
                    MatmulShape::Tiled(tp) => {
                        // Warps of the solver's block, each a warp tile.
                        let b = t.block.unwrap();
                        assert_eq!(tp.unit_threads, 32);
                        assert_eq!(local[0], tp.threads());
                        assert!(tp.threads() <= sm.caps().gpu.unwrap().max_threads_per_block);
                        if v == Variant::Gemm {
                            assert_eq!((tp.tile_e, tp.tile_h), (b.tile_e, b.tile_h));
                            assert_eq!(tp.threads(), b.threads);
                        } else {
                            assert_eq!(tp.tile_e, gpu::FLAT_GEMM_ROWS);
                        }
                        assert!(prog.dynamic_shared_bytes <= tp.local_bytes);
                        assert!(
                            prog.dynamic_shared_bytes <= sm.caps().gpu.unwrap().shared_mem_bytes
                        );
                    }
                }
                // The OpenCL backend binds the same arguments in the same order.
                let cl = opencl::OpenClBackend::new(opencl::Fp16Mode::Storage);
                let ocl_tile = {
                    let caps = opencl::caps();
                    let mut p = tessera_codegen::Problem::from_kernel(caps, &k).unwrap();
                    p.e = rows(v);
                    tessera_codegen::solve(caps, &p).unwrap().remove(0)
                };
                if let opencl::Program::Matmul { plan, .. } = cl.program(&k, &ocl_tile, v).unwrap()
                {
                    assert_eq!(plan.args, shared.args);
                    assert_eq!(plan.entry, shared.entry);
                } else {
                    panic!("a matmul program");
                }
            }
        }
    }
}

#[test]
fn the_design_s_instructions_are_there() {
    let be = PtxBackend::new(Sm::Sm80);
    let f16 = gpu::with_gpu_weight_layout(&library::get("matmul-f16").unwrap()).unwrap();
    let t = tiles(Sm::Sm80, &f16, 64).remove(0);
    let gemm = be.emit_variant(&f16, &t, Variant::Gemm).unwrap();
    assert!(matches!(
        gemm,
        Artifact::Source {
            lang: SourceLang::Ptx,
            ..
        }
    ));
    let gemm = gemm.to_string();
    for needle in [
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        "cp.async.cg.shared.global",
        "cp.async.commit_group",
        "cp.async.wait_group 0",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
        ".target sm_80",
        ".address_size 64",
    ] {
        assert!(gemm.contains(needle), "GEMM lacks {needle}");
    }
    // The flat GEMM is the GEMV with 4 rows of e a thread: one weight
    // load serves them all.
    let t = tiles(Sm::Sm80, &f16, 8).remove(0);
    let flat = be
        .emit_variant(&f16, &t, Variant::FlatGemm)
        .unwrap()
        .to_string();
    assert!(
        flat.contains("4 channels x 4 rows of e per thread"),
        "{flat}"
    );
    assert!(!flat.contains("mma.sync"), "flat GEMM on tensor cores");
    let w4 = library::get("matmul-w4a16").unwrap();
    let t = tiles(Sm::Sm80, &w4, 1).remove(0);
    let gemv = be.emit_variant(&w4, &t, Variant::Gemv).unwrap().to_string();
    for needle in [
        "shfl.sync.bfly.b32",
        "ld.global.nc.v4.u32",
        "lop3.b32",
        "prmt.b32",
        "fma.rn.f32",
    ] {
        assert!(gemv.contains(needle), "W4A16 GEMV lacks {needle}");
    }
    // No int→float conversion of 4-bit codes: bits and one subtract.
    assert!(!gemv.contains("cvt.rn.f32.s32") && !gemv.contains("cvt.rn.f32.u32"));
    let t = tiles(Sm::Sm90, &w4, 64).remove(0);
    let gemm4 = PtxBackend::new(Sm::Sm90)
        .emit_variant(&w4, &t, Variant::Gemm)
        .unwrap()
        .to_string();
    assert!(gemm4.contains(".target sm_90"));
    assert!(gemm4.contains("fma.rn.f16x2") && gemm4.contains("prmt.b32"));
    assert!(!gemm4.contains("cvt.rn.f16.s32"));
}

#[test]
fn output_is_byte_stable() {
    let a: Vec<String> = instances(1).into_iter().map(|i| i.text).collect();
    let b: Vec<String> = instances(1).into_iter().map(|i| i.text).collect();
    assert_eq!(a, b);
}

#[test]
fn unsupported_inputs_are_errors_not_panics() {
    let be = PtxBackend::new(Sm::Sm80);
    let w4 = library::get("matmul-w4a16").unwrap();
    let t = tiles(Sm::Sm80, &w4, 8).remove(0);
    // CPU weight layout.
    let f16 = library::get("matmul-f16").unwrap();
    assert!(be.emit_variant(&f16, &t, Variant::Gemv).is_err());
    // int8 activations.
    let w4a8 = library::get("matmul-w4a8").unwrap();
    assert!(be.emit_variant(&w4a8, &t, Variant::Gemm).is_err());
    // Prefill attention has no PTX kernel (decode does: ptx_attention.rs).
    let att = library::get("attention-prefill-f16").unwrap();
    let err = be.emit(&att, &t).unwrap_err();
    assert!(matches!(err, EmitError::Unsupported { .. }), "{err}");
    // A tile without a block (a CPU tile).
    let cpu = TargetCapsExt::cpu_tile(&w4);
    assert!(matches!(
        be.emit_variant(&w4, &cpu, Variant::FlatGemm),
        Err(EmitError::BadTile { .. })
    ));
}

struct TargetCapsExt;

impl TargetCapsExt {
    fn cpu_tile(k: &tessera_dsl::Kernel) -> tessera_codegen::TileConfig {
        let caps = tessera_codegen::TargetCaps::by_name("aarch64-neon").unwrap();
        tessera_codegen::solve_kernel(caps, k)
            .unwrap()
            .tiles
            .remove(0)
    }
}

#[test]
fn canonical_snapshots() {
    let cases = [
        ("matmul-w4a16", Variant::Gemv, Sm::Sm80),
        ("matmul-f16", Variant::FlatGemm, Sm::Sm80),
        ("matmul-w4a16", Variant::FlatGemm, Sm::Sm90),
        ("matmul-w8a16", Variant::Gemm, Sm::Sm80),
        ("matmul-e0m4a16", Variant::Gemv, Sm::Sm90),
    ];
    for (name, v, sm) in cases {
        let k = matmuls().into_iter().find(|k| k.name == name).unwrap();
        let t = tiles(sm, &k, rows(v)).remove(0);
        let text = PtxBackend::new(sm)
            .emit_variant(&k, &t, v)
            .unwrap()
            .to_string();
        insta::assert_snapshot!(format!("ptx_{}_{}_{}", name, v, sm.arch()), text);
    }
}
