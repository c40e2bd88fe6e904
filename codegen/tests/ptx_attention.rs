//! PTX decode attention: both entries of every KV-format / softmax / scale
//! variant assemble with `ptxas -v` for sm_80 and sm_90 (no spills,
//! registers within the budget), the parameter lists and launch geometry
//! are the shared [`AttentionPlan`]'s (the OpenCL kernel's), the
//! instructions the design relies on are there, and the canonical kernels
//! are pinned by insta.
//!
//! Head dimension, query/KV head counts (the GQA ratio) and the sequence
//! length (the split count) are kernel arguments, not plan decisions: one
//! program serves them all, so the plan variations below are the ones that
//! change the text (cache formats, softmax mode, Q scaling).

mod ptx_common;

use ptx_common::{assemble_entries, ptxas};
use tessera_codegen::artifact::{Artifact, Backend, EmitError, SourceLang, Variant};
use tessera_codegen::gpu::{self, ArgKind, AttentionPlan, KernelArg, LaunchExtent};
use tessera_codegen::opencl;
use tessera_codegen::ptx::attention::register_budget;
use tessera_codegen::ptx::{PtxBackend, Sm};
use tessera_codegen::{TargetCaps, TileConfig, solve_kernel};
use tessera_dsl::ir::ParamType;
use tessera_dsl::{Format, Group, Kernel, Op, SoftmaxMode, library};

/// `base` with other cache formats, softmax mode or Q scaling.
fn variant(
    base: &str,
    name: &str,
    k: Format,
    v: Format,
    softmax: Option<SoftmaxMode>,
    prescaled: bool,
) -> Kernel {
    let mut kern = library::get(base).unwrap();
    kern.name = name.to_string();
    for t in &mut kern.tensors {
        match t.name.as_str() {
            "k" => t.format = k,
            "v" => t.format = v,
            _ => {}
        }
    }
    if let Op::Attention(a) = &mut kern.op {
        if let Some(s) = softmax {
            a.softmax = s;
        }
        a.q_prescaled = prescaled;
    }
    tessera_dsl::verify(&kern).unwrap();
    kern
}

/// The canonical pair plus the plan variations.
fn kernels() -> Vec<Kernel> {
    let i8row = Format::I8Asym(Group::Row, ParamType::F32);
    vec![
        library::get("attention-decode-f16").unwrap(),
        library::get("attention-decode-kv8").unwrap(),
        variant(
            "attention-decode-f16",
            "attention-k-f16-v-fp8",
            Format::F16,
            Format::Fp8E4M3,
            None,
            true,
        ),
        variant(
            "attention-decode-f16",
            "attention-k-f16-v-e5m2",
            Format::F16,
            Format::Fp8E5M2,
            None,
            true,
        ),
        variant(
            "attention-decode-kv8",
            "attention-k-i8-v-e5m2",
            i8row,
            Format::Fp8E5M2,
            None,
            true,
        ),
        variant(
            "attention-decode-f16",
            "attention-k-i8-v-f16-unscaled",
            i8row,
            Format::F16,
            None,
            false,
        ),
        variant(
            "attention-decode-kv8",
            "attention-kv8-online",
            i8row,
            Format::Fp8E4M3,
            Some(SoftmaxMode::Online),
            true,
        ),
        variant(
            "attention-decode-f16",
            "attention-f16-online-unscaled",
            Format::F16,
            Format::F16,
            Some(SoftmaxMode::Online),
            false,
        ),
    ]
}

#[test]
fn every_attention_kernel_assembles_without_spills_within_the_budget() {
    let Some(ptxas) = ptxas() else {
        eprintln!(
            "SKIP every_attention_kernel_assembles_without_spills_within_the_budget: ptxas not \
             found (set PTXAS, or run scripts/test.sh, which pip-installs nvidia-cuda-nvcc-cu12)"
        );
        return;
    };
    let mut failures = Vec::new();
    let mut checked = 0;
    for sm in Sm::ALL {
        for k in kernels() {
            let prog = PtxBackend::new(sm).attention_program(&k).unwrap();
            match assemble_entries(&ptxas, sm, &k.name, &prog.text) {
                Ok(reports) => {
                    let mut names: Vec<&str> = reports.iter().map(|(e, _)| e.as_str()).collect();
                    names.sort_unstable();
                    let mut want = [
                        prog.plan.partial_entry.as_str(),
                        prog.plan.combine_entry.as_str(),
                    ];
                    want.sort_unstable();
                    assert_eq!(names, want, "{} {}", k.name, sm.arch());
                    for (entry, r) in reports {
                        eprintln!("{entry} {}: {r:?}", sm.arch());
                        checked += 1;
                        if r.spill_stores != 0 || r.spill_loads != 0 || r.stack_frame != 0 {
                            failures.push(format!("{entry} {}: spills {r:?}", sm.arch()));
                        }
                        if r.registers > register_budget(sm) {
                            failures.push(format!(
                                "{entry} {}: {} registers > budget {}",
                                sm.arch(),
                                r.registers,
                                register_budget(sm)
                            ));
                        }
                    }
                }
                Err(e) => failures.push(e),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(checked, 2 * 2 * kernels().len());
}

/// fp8 keys: the shared plan accepts them (`KvFormat::of`) though
/// the IR's verifier does not yet, so the printer's path is assembled from
/// a plan built by hand.
#[test]
fn fp8_keys_assemble_from_a_hand_made_plan() {
    let Some(ptxas) = ptxas() else {
        eprintln!("SKIP fp8_keys_assemble_from_a_hand_made_plan: ptxas not found");
        return;
    };
    for (sm, fp8) in Sm::ALL
        .into_iter()
        .flat_map(|sm| [(sm, gpu::KvFormat::Fp8E4M3), (sm, gpu::KvFormat::Fp8E5M2)])
    {
        let k = library::get("attention-decode-f16").unwrap();
        let mut plan = gpu::plan_attention(&k, sm.caps()).unwrap();
        plan.k = fp8;
        plan.v = fp8;
        for a in plan.partial_args.iter_mut() {
            if a.name == "k" || a.name == "v" {
                a.kind = ArgKind::BytesIn;
            }
        }
        let text = tessera_codegen::ptx::attention::print(&plan, sm, "fp8 keys").unwrap();
        let reports = assemble_entries(&ptxas, sm, "fp8-keys", &text).unwrap();
        assert_eq!(reports.len(), 2);
        for (entry, r) in reports {
            assert_eq!((r.spill_stores, r.spill_loads), (0, 0), "{entry}");
            assert!(r.registers <= register_budget(sm), "{entry}: {r:?}");
        }
    }
}

/// The `.entry NAME(` parameters: (type, name) in order.
fn entry_params(text: &str, entry: &str) -> Vec<(String, String)> {
    let start = text
        .find(&format!(".visible .entry {entry}("))
        .unwrap_or_else(|| panic!("no entry {entry}"));
    let open = start + text[start..].find('(').unwrap();
    let close = open + text[open..].find(')').unwrap();
    text[open + 1..close]
        .split(',')
        .map(|p| {
            let f: Vec<&str> = p.split_whitespace().collect();
            assert_eq!(f[0], ".param", "{p}");
            (f[1].to_string(), f[2].to_string())
        })
        .collect()
}

/// The `.reqntid` of `entry`.
fn reqntid(text: &str, entry: &str) -> [u32; 3] {
    let start = text.find(&format!(".visible .entry {entry}(")).unwrap();
    let line = text[start..]
        .lines()
        .find_map(|l| l.strip_prefix(".reqntid "))
        .unwrap();
    let v: Vec<u32> = line.split(", ").map(|n| n.parse().unwrap()).collect();
    [v[0], v[1], v[2]]
}

fn assert_params(text: &str, entry: &str, args: &[KernelArg]) {
    let params = entry_params(text, entry);
    assert_eq!(params.len(), args.len(), "{entry}");
    for ((ty, name), a) in params.iter().zip(args) {
        assert_eq!(name, &format!("{entry}_param_{}", a.name));
        let want = if a.kind == ArgKind::Int {
            ".u32"
        } else {
            ".u64"
        };
        assert_eq!(ty, want, "{name}");
    }
}

#[test]
fn parameters_and_launch_are_the_shared_plans() {
    for sm in Sm::ALL {
        let warp = sm.caps().gpu.unwrap().warp_width;
        for k in kernels() {
            let prog = PtxBackend::new(sm).attention_program(&k).unwrap();
            let plan: &AttentionPlan = &prog.plan;
            assert_eq!(plan, &gpu::plan_attention(&k, sm.caps()).unwrap());
            assert_params(&prog.text, &plan.partial_entry, &plan.partial_args);
            assert_params(&prog.text, &plan.combine_entry, &plan.combine_args);
            assert_eq!(
                reqntid(&prog.text, &plan.partial_entry),
                plan.partial_launch.map(|d| d.local)
            );
            assert_eq!(
                reqntid(&prog.text, &plan.combine_entry),
                plan.combine_launch.map(|d| d.local)
            );
            // The shapes the printer relies on: whole warps, a warp wide
            // combine block in x with its warps in z; the target's split.
            assert_eq!(plan.wg % warp, 0);
            let split = sm.caps().gpu.unwrap().attention;
            assert_eq!(
                (plan.wg, plan.keys_per_split, plan.combine_launch[2].local),
                (split.block, split.keys_per_split, split.combine_warps)
            );
            assert_eq!((plan.wg, plan.keys_per_split), (128, 256));
            assert_eq!(plan.combine_launch[2].extent, LaunchExtent::One);
            assert_eq!(plan.partial_launch[0].extent, LaunchExtent::Splits);
            assert_eq!(plan.partial_launch[1].extent, LaunchExtent::KvHeads);
            assert_eq!(plan.combine_launch[0].extent, LaunchExtent::HeadDim);
            assert_eq!(plan.combine_launch[0].local, warp);
            assert_eq!(plan.combine_launch[1].extent, LaunchExtent::Heads);
            // p[keys_per_split] and three per-warp reductions, statically.
            assert!(prog.text.contains(&format!(
                ".shared .align 16 .f32 {}_p[{}];",
                plan.partial_entry, plan.keys_per_split
            )));
            // The OpenCL kernel binds the same arguments in the same order
            // and launches over the same extents; it keeps the
            // interpreter's 64-key partials, one work item per key, and a
            // combine of one work item per element.
            let cl = opencl::OpenClBackend::new(opencl::Fp16Mode::Storage);
            let opencl::Program::Attention { plan: ocl, .. } = cl.attention_program(&k).unwrap()
            else {
                panic!("an attention program");
            };
            assert_eq!(ocl.partial_args, plan.partial_args);
            assert_eq!(ocl.combine_args, plan.combine_args);
            assert_eq!(
                (&ocl.partial_entry, &ocl.combine_entry),
                (&plan.partial_entry, &plan.combine_entry)
            );
            assert_eq!((ocl.wg, ocl.keys_per_split), (64, 64));
            assert_eq!(ocl.combine_launch[2].local, 1);
            assert_eq!(
                ocl.partial_launch.map(|d| d.extent),
                plan.partial_launch.map(|d| d.extent)
            );
            assert_eq!(
                ocl.combine_launch.map(|d| d.extent),
                plan.combine_launch.map(|d| d.extent)
            );
            assert_eq!(
                (ocl.k, ocl.v, ocl.phi, ocl.lo, ocl.hi, ocl.q_prescaled),
                (plan.k, plan.v, plan.phi, plan.lo, plan.hi, plan.q_prescaled)
            );
        }
    }
}

#[test]
fn the_design_s_instructions_are_there() {
    let f16 = library::get("attention-decode-f16").unwrap();
    let kv8 = library::get("attention-decode-kv8").unwrap();
    for sm in Sm::ALL {
        let be = PtxBackend::new(sm);
        for k in [&f16, &kv8] {
            let t = be.attention_program(k).unwrap().text;
            for needle in [
                "shfl.sync.bfly.b32",
                "vote.sync.any.pred",
                "ex2.approx.ftz.f32",
                "fma.rn.f32",
                "ld.global.nc.v4.u32",
                "bar.sync 0",
                "st.shared.f32",
                "div.rn.f32",
                "cvt.rn.f16.f32",
            ] {
                assert!(
                    t.contains(needle),
                    "{} {} lacks {needle}",
                    k.name,
                    sm.arch()
                );
            }
            // The log2 e prescale of every exponent.
            assert!(t.contains(&format!("{:08X}", std::f32::consts::LOG2_E.to_bits())));
            assert!(t.is_ascii(), "ptxas rejects non-ASCII text");
        }
        let t = be.attention_program(&kv8).unwrap().text;
        // int8 keys: 64-bit loads, bytes under 2^23 by prmt, no int->float.
        assert!(t.contains("ld.global.nc.v2.u32") && t.contains("0x80808080"));
        assert!(t.contains("prmt.b32"));
        match sm {
            // sm_80 has no fp8 conversion: bit operations.
            Sm::Sm80 => {
                assert!(!t.contains("e4m3x2"));
                assert!(t.contains("0x87F00000"));
            }
            Sm::Sm90 => assert!(t.contains("cvt.rn.f16x2.e4m3x2")),
        }
        assert!(!be.attention_program(&f16).unwrap().text.contains("e4m3"));
    }
}

#[test]
fn output_is_byte_stable() {
    for sm in Sm::ALL {
        for k in kernels() {
            let a = PtxBackend::new(sm).attention_program(&k).unwrap();
            let b = PtxBackend::new(sm).attention_program(&k).unwrap();
            assert_eq!(a, b);
        }
    }
}

fn any_tile() -> TileConfig {
    let caps = TargetCaps::by_name("ptx-sm80").unwrap();
    let w4 = library::get("matmul-w4a16").unwrap();
    solve_kernel(caps, &w4).unwrap().tiles.remove(0)
}

#[test]
fn the_backend_trait_emits_attention_and_refuses_what_it_cannot() {
    let be = PtxBackend::new(Sm::Sm80);
    let tile = any_tile();
    let f16 = library::get("attention-decode-f16").unwrap();
    // Through the trait, tile and variant are ignored.
    let a = be.emit_variant(&f16, &tile, Variant::Gemv).unwrap();
    let Artifact::Source {
        lang: SourceLang::Ptx,
        text,
    } = a
    else {
        panic!("PTX source");
    };
    assert_eq!(text, be.attention_program(&f16).unwrap().text);
    // program() is the matmul entry point: attention is a clear error.
    assert!(matches!(
        be.program(&f16, &tile, Variant::Gemm),
        Err(EmitError::Unsupported { .. })
    ));
    // Prefill is not a decode kernel.
    let prefill = library::get("attention-prefill-f16").unwrap();
    let err = be.attention_program(&prefill).unwrap_err();
    assert!(matches!(err, EmitError::Unsupported { .. }), "{err}");
    assert!(be.emit(&prefill, &tile).is_err());
    // int8 values and unsupported cache formats.
    let i8v = variant(
        "attention-decode-f16",
        "attention-i8-values",
        Format::F16,
        Format::I8Asym(Group::Row, ParamType::F32),
        None,
        true,
    );
    assert!(be.attention_program(&i8v).is_err());
    // Values the IR allows but the shared plan does not read.
    let bf16v = variant(
        "attention-decode-f16",
        "attention-bf16-values",
        Format::F16,
        Format::BF16,
        None,
        true,
    );
    assert!(matches!(
        be.attention_program(&bf16v),
        Err(EmitError::Unsupported { .. })
    ));
    // A matmul through attention_program.
    let w4 = library::get("matmul-w4a16").unwrap();
    assert!(be.attention_program(&w4).is_err());
}

#[test]
fn canonical_snapshots() {
    let cases = [
        ("attention-decode-f16", Sm::Sm80),
        ("attention-decode-kv8", Sm::Sm80),
        ("attention-decode-kv8", Sm::Sm90),
    ];
    for (name, sm) in cases {
        let k = library::get(name).unwrap();
        let text = PtxBackend::new(sm).attention_program(&k).unwrap().text;
        insta::assert_snapshot!(format!("ptx_{}_{}", name, sm.arch()), text);
    }
}

mod ptx_sim;

use tessera_codegen::ptx::attention::Depth;

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_dsl::interp::{Bindings, Value, run};
use tessera_dsl::quant::quantize;

/// A cache bound as the interpreter binds it, and its bytes and per-row
/// parameters as the kernel reads them.
fn cache(
    format: Format,
    rows: usize,
    d: usize,
    data: &[f32],
) -> (Value, Vec<u8>, Vec<f32>, Vec<f32>) {
    match format {
        Format::F16 => {
            let h: Vec<f16> = data.iter().map(|&v| f16::from_f32(v)).collect();
            let bytes = h.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
            (Value::F16(h), bytes, vec![], vec![])
        }
        f => {
            let q = quantize(f, rows, d, data).unwrap();
            let (codes, s, o) = (q.codes.clone(), q.scales.clone(), q.offsets.clone());
            (Value::Quant(q), codes, s, o)
        }
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Runs `kernel`'s PTX for `sm` in the simulator and the interpreter on one
/// random case; returns (interpreter, kernel) recompute counts.
#[allow(clippy::too_many_arguments)]
fn simulate(
    kernel: &Kernel,
    sm: Sm,
    hq: usize,
    kvh: usize,
    d: usize,
    s: usize,
    q_amp: f32,
    k_amp: f32,
    rng: &mut ChaCha8Rng,
) -> (usize, usize) {
    let kf = kernel.tensor("k").unwrap().format;
    let vf = kernel.tensor("v").unwrap().format;
    let q: Vec<f16> = (0..hq * d)
        .map(|_| f16::from_f32(rng.gen_range(-q_amp..q_amp)))
        .collect();
    let kd: Vec<f32> = (0..s * kvh * d)
        .map(|_| rng.gen_range(-k_amp..k_amp))
        .collect();
    let vd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let kc = cache(kf, s * kvh, d, &kd);
    let vc = cache(vf, s * kvh, d, &vd);
    let r = run_both(kernel, sm, [hq, kvh, d, s], &q, kc, vc);
    assert_eq!(r.got.len(), r.want.len());
    for (i, (&g, &w)) in r.got.iter().zip(&r.want).enumerate() {
        let tol = 4e-3 * w.abs() + 2e-3;
        assert!(
            (g - w).abs() <= tol,
            "{} {} hq={hq} kvh={kvh} d={d} s={s} at {i}: got {g} want {w}",
            kernel.name,
            sm.arch()
        );
    }
    (r.interp_recomputed, r.recomputed)
}

/// Outputs and recompute counts of the simulated kernel and the
/// interpreter.
struct Both {
    got: Vec<f32>,
    want: Vec<f32>,
    recomputed: usize,
    interp_recomputed: usize,
}

type Cache = (Value, Vec<u8>, Vec<f32>, Vec<f32>);

/// Runs the interpreter and the simulated PTX on the same inputs.
fn run_both(kernel: &Kernel, sm: Sm, dims: [usize; 4], q: &[f16], kc: Cache, vc: Cache) -> Both {
    run_both_at(kernel, sm, dims, q, kc, vc, Depth::DEFAULT)
}

/// [`run_both`] with the partial kernel's loops at `depth`.
fn run_both_at(
    kernel: &Kernel,
    sm: Sm,
    [hq, kvh, d, s]: [usize; 4],
    q: &[f16],
    kc: Cache,
    vc: Cache,
    depth: Depth,
) -> Both {
    use ptx_sim::{Arg, Buffer, Module, launch};
    let (kval, kbytes, ks, ko) = kc;
    let (vval, vbytes, _, _) = vc;
    let b = Bindings::decode_attention([hq, kvh, d, s], Value::F16(q.to_vec()), kval, vval);
    let out = run(kernel, &b).unwrap();
    let want = out.get("o").unwrap().to_vec();

    let prog = PtxBackend::new(sm).attention_program(kernel).unwrap();
    let plan = &prog.plan;
    let budget = tessera_codegen::ptx::attention::register_budget(sm);
    let text = tessera_codegen::ptx::attention::print_at(plan, sm, "depth", depth, budget).unwrap();
    let module = Module::parse(&text);
    let splits = s.div_ceil(plan.keys_per_split as usize);
    // Exactly sized buffers: the simulator fails any access past them.
    let mut bufs: Vec<Buffer> = [
        q.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
        kbytes,
        f32_bytes(&ks),
        f32_bytes(&ko),
        vbytes,
        vec![0u8; 4 * splits * hq * d],
        vec![0u8; 4 * splits * hq],
        vec![0u8; 4 * splits * hq],
        vec![0u8; 4 * splits * hq],
        vec![0u8; 2 * hq * d],
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
        ("part_o", Arg::Buf(5)),
        ("part_m", Arg::Buf(6)),
        ("part_l", Arg::Buf(7)),
        ("recomputed", Arg::Buf(8)),
        ("o", Arg::Buf(9)),
        ("hq", int(hq)),
        ("kvh", int(kvh)),
        ("d", int(d)),
        ("s", int(s)),
        ("splits", int(splits)),
    ];
    let extent = |x: LaunchExtent| match x {
        LaunchExtent::Splits => splits,
        LaunchExtent::KvHeads => kvh,
        LaunchExtent::Heads => hq,
        LaunchExtent::HeadDim => d,
        _ => 1,
    };
    for (entry, dims) in [
        (&plan.partial_entry, &plan.partial_launch),
        (&plan.combine_entry, &plan.combine_launch),
    ] {
        let grid = dims.map(|dim| (dim.global(extent(dim.extent)) / dim.local as usize) as u32);
        let block = dims.map(|dim| dim.local);
        launch(&module, entry, grid, block, &args, &mut bufs);
    }
    let got: Vec<f32> = bufs[9]
        .bytes
        .chunks(2)
        .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
        .collect();
    let recomputed = bufs[8]
        .bytes
        .chunks(4)
        .filter(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) != 0)
        .count();
    Both {
        got,
        want,
        recomputed,
        interp_recomputed: out.softmax.unwrap().recomputed,
    }
}

/// The emitted PTX, executed by the simulator, against the interpreter:
/// f16 and kv8 caches, both SMs (sm_80's fp8 bit operations, sm_90's
/// `cvt`), GQA ratios 1-6, head dims 64, 128 and 40 (a key row per group
/// of lanes, vector P·V; 40 leaves 3 of 8 lanes idle) and 20, 37 (the
/// scalar loops), one to five 256-key splits with tails.
#[test]
fn simulated_ptx_matches_the_interpreter() {
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    let shapes = [
        (4, 1, 64, 1),
        (8, 2, 128, 130),
        (2, 2, 64, 64),
        (6, 1, 40, 65),
        (3, 3, 37, 200),
        (4, 2, 20, 300),
        (2, 1, 64, 1100),
    ];
    for (n, k) in kernels().iter().enumerate() {
        // Every shape for the library pair; two (vector steps, tails) for
        // the plan variations, to keep the suite quick.
        let shapes: &[(usize, usize, usize, usize)] = if n < 2 { &shapes } else { &shapes[1..3] };
        for sm in Sm::ALL {
            for &(hq, kvh, d, s) in shapes {
                let amp = (1.0 / d as f32).sqrt();
                let (interp, kernel) = simulate(k, sm, hq, kvh, d, s, amp, 1.0, &mut rng);
                // Online softmax recomputes everywhere; async never, for
                // benign scores.
                if matches!(k.as_attention().unwrap().softmax, SoftmaxMode::Online) {
                    let kps = sm.caps().gpu.unwrap().attention.keys_per_split as usize;
                    assert_eq!(kernel, s.div_ceil(kps) * hq, "{}", k.name);
                } else {
                    assert_eq!((interp, kernel), (0, 0), "{}", k.name);
                }
            }
        }
    }
}

/// Other loop depths (deeper or shallower trips) compute the same outputs:
/// f16 and kv8, tails in every loop.
#[test]
fn simulated_depths_match_the_interpreter() {
    let mut rng = ChaCha8Rng::seed_from_u64(33);
    let depths = [
        Depth {
            score: 16,
            values: 4,
        },
        Depth {
            score: 3,
            values: 7,
        },
    ];
    for name in ["attention-decode-f16", "attention-decode-kv8"] {
        let k = library::get(name).unwrap();
        let (kf, vf) = (k.tensor("k").unwrap().format, k.tensor("v").unwrap().format);
        for depth in depths {
            let (hq, kvh, d, s) = (4, 2, 64, 700);
            let q: Vec<f16> = (0..hq * d)
                .map(|_| f16::from_f32(rng.gen_range(-0.12..0.12)))
                .collect();
            let kd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let vd: Vec<f32> = (0..s * kvh * d).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let (kc, vc) = (cache(kf, s * kvh, d, &kd), cache(vf, s * kvh, d, &vd));
            let r = run_both_at(&k, Sm::Sm90, [hq, kvh, d, s], &q, kc, vc, depth);
            for (i, (&g, &w)) in r.got.iter().zip(&r.want).enumerate() {
                let tol = 4e-3 * w.abs() + 2e-3;
                assert!(
                    (g - w).abs() <= tol,
                    "{name} {depth:?} at {i}: got {g} want {w}"
                );
            }
        }
    }
}

/// Scores far outside [phi + lo, phi + hi]: the split abandons the unified
/// max and recomputes with its own, and still matches.
#[test]
fn simulated_adversarial_scores_take_the_recompute_path() {
    let mut rng = ChaCha8Rng::seed_from_u64(32);
    for name in ["attention-decode-f16", "attention-decode-kv8"] {
        let k = library::get(name).unwrap();
        for sm in Sm::ALL {
            for (hq, kvh, d, s) in [(4, 2, 32, 200), (2, 1, 64, 64)] {
                let (interp, kernel) = simulate(&k, sm, hq, kvh, d, s, 3.0, 3.0, &mut rng);
                assert!(interp > 0, "the oracle recomputed");
                assert!(kernel > 0, "the kernel took the recompute path");
            }
        }
    }
}

/// Every fp8 code as a value, through each SM's decode (sm_80's bit
/// operations and sm_90's `cvt` for e4m3, the shift for e5m2): with q = 0
/// every score is 0, p = 1 exactly, so o is the value row itself, which
/// f16 holds exactly: bit-exact against the interpreter (NaN codes as NaN).
#[test]
fn simulated_fp8_values_decode_every_code_exactly() {
    for (name, vf) in [
        ("attention-k-f16-v-fp8", Format::Fp8E4M3),
        ("attention-k-f16-v-e5m2", Format::Fp8E5M2),
    ] {
        let k = kernels().into_iter().find(|k| k.name == name).unwrap();
        let d = 256;
        let mut vq = quantize(vf, 1, d, &vec![0.0; d]).unwrap();
        vq.codes = (0..=255u8).collect();
        vq.validate().unwrap();
        let vval = Value::Quant(vq.clone());
        let vc: Cache = (vval, vq.codes.clone(), vec![], vec![]);
        let kc = cache(Format::F16, 1, d, &vec![0.5; d]);
        let q = vec![f16::ZERO; d];
        for sm in Sm::ALL {
            let r = run_both(&k, sm, [1, 1, d, 1], &q, kc.clone(), vc.clone());
            for (code, (g, w)) in r.got.iter().zip(&r.want).enumerate() {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{name} {} code {code:#04x}: got {g} want {w}",
                    sm.arch()
                );
            }
        }
    }
}
