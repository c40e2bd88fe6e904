//! Register plans of the x86 micro-kernels, as data, checked against the
//! solver's `x86-avx2` accounting for the tile before anything is emitted.
//!
//! The solver counts, per tile ep × hp (hb = hp/8 ymm columns):
//! accumulators ep·hb, A 1 (every row broadcast in turn into one renamed
//! register), B hb, reserved (4 for the int8 class: its two temporaries
//! and the int4 unpack's two). A plan lists what a loop really keeps
//! live. A loop may use fewer A, B or reserved registers than counted and
//! may use leftover budget for `extra` registers (the float loops' second
//! accumulator set, the GEMV loop's extra sets), but its accumulators are
//! the tile's and its total never exceeds the 16 ymm registers. (W4A8's
//! accumulators are its group's integer sums; the f32 totals live in the
//! stack frame, see [`super::int8`].)

use crate::target::TargetCaps;
use crate::tile::TileConfig;

use super::asm::Ymm;
use super::float::FloatSpec;
use super::int8::Int8Spec;

/// The ymm registers of the AVX2 register file.
pub const YMM_REGS: u32 = 16;

/// What one loop of a kernel keeps in ymm registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoopPlan {
    pub name: &'static str,
    pub accumulators: u32,
    /// Broadcast activation registers.
    pub a: u32,
    /// Weight registers.
    pub b: u32,
    /// Constants and temporaries (mask, zero, ones, shift counts, products).
    pub reserved: u32,
    /// Registers beyond the solver's categories (see the module doc).
    pub extra: u32,
    pub extra_purpose: &'static str,
}

impl LoopPlan {
    pub fn total(&self) -> u32 {
        self.accumulators + self.a + self.b + self.reserved + self.extra
    }
}

/// Every loop of one kernel: the tile's main loop first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelPlan {
    /// The ep-row loop, counted exactly as the solver counts the tile.
    pub main: LoopPlan,
    /// Other loops (the one-row GEMV loop).
    pub others: Vec<LoopPlan>,
}

impl KernelPlan {
    /// Check the plan against the solver's accounting of `tile` on x86-avx2.
    pub fn check(&self, tile: &TileConfig) -> Result<(), String> {
        let acc = &tile.accounting;
        let m = &self.main;
        if m.accumulators != acc.accumulators {
            return Err(format!(
                "{}: {} accumulators, the solver counted {}",
                m.name, m.accumulators, acc.accumulators
            ));
        }
        if m.a > acc.a_regs || m.b > acc.b_regs {
            return Err(format!(
                "{}: A {} / B {} registers exceed the solver's {} / {}",
                m.name, m.a, m.b, acc.a_regs, acc.b_regs
            ));
        }
        if m.reserved > acc.reserved {
            return Err(format!(
                "{}: {} reserved registers, the solver reserved {}",
                m.name, m.reserved, acc.reserved
            ));
        }
        let budget = acc.budget.min(YMM_REGS);
        for l in std::iter::once(m).chain(&self.others) {
            if l.total() > budget {
                return Err(format!(
                    "{} needs {} ymm registers ({} accumulators + {} A + {} B + {} reserved + {} {}), \
                     more than the {budget} available",
                    l.name,
                    l.total(),
                    l.accumulators,
                    l.a,
                    l.b,
                    l.reserved,
                    l.extra,
                    l.extra_purpose
                ));
            }
        }
        Ok(())
    }
}

/// The x86-avx2 target the plans are checked against.
pub fn target() -> &'static TargetCaps {
    TargetCaps::by_name(super::NAME).expect("x86-avx2 is a built-in target")
}

/// Float kernels (see [`super::float`] for the register table). The k
/// loop keeps nothing reserved: its one A register is renamed per row, and
/// the epilogue's column mask and bias temporary take the A and B
/// registers once the loop is done, which the `epilogue` entry checks.
pub fn float_plan(spec: &FloatSpec) -> KernelPlan {
    let (ep, hb) = (spec.ep as u32, spec.hb as u32);
    let sets = super::float::gemv_sets(spec) as u32;
    let gemv_b = if spec.w == tessera_dsl::Format::F32 {
        0
    } else {
        hb
    };
    let gemm_sets = super::float::gemm_sets(spec) as u32;
    KernelPlan {
        main: LoopPlan {
            name: "gemm",
            accumulators: ep * hb,
            a: 1,
            b: hb,
            reserved: 0,
            extra: (gemm_sets - 1) * ep * hb,
            extra_purpose: "a second accumulator set (independent FMA chains)",
        },
        others: vec![
            LoopPlan {
                name: "gemv",
                accumulators: hb,
                a: 1,
                b: gemv_b,
                reserved: 0,
                extra: (sets - 1) * hb,
                extra_purpose: "extra accumulator sets (independent FMA chains)",
            },
            LoopPlan {
                name: "epilogue",
                accumulators: ep * hb,
                a: 0,
                b: 0,
                reserved: 2,
                extra: 0,
                extra_purpose: "",
            },
        ],
    }
}

/// Int8 kernels (see [`super::int8`] for the register tables). Both
/// formats count like the solver: accumulators rows·hb (W4A8: the group's
/// integer sums, its f32 totals live in the stack frame), one renamed A;
/// grouped `vpdpbusd` loops of few sums add a second set as `extra`
/// ([`super::int8::Dot::chains_in_flight`]).
pub fn int8_plan(spec: &Int8Spec) -> KernelPlan {
    let (ep, hb) = (spec.ep as u32, spec.hb as u32);
    let main = |name, rows: u32| match spec.group {
        // group sums, 1 A, hb B, mask + shift + product temp, and the odd
        // steps' sums where vpdpbusd chains are too few
        Some(_) => {
            let odd = super::int8::loop_regs::<Ymm>(spec, rows as usize)
                .odd_sums
                .map_or(0, |_| rows * hb);
            LoopPlan {
                name,
                accumulators: rows * hb,
                a: 1,
                b: hb,
                reserved: 3,
                extra: odd,
                extra_purpose: "odd-step group sums",
            }
        }
        // i32 acc, 1 A, |w| + raw w + product temp + ones
        None => LoopPlan {
            name,
            accumulators: rows * hb,
            a: 1,
            b: 1,
            reserved: 3,
            extra: 0,
            extra_purpose: "",
        },
    };
    KernelPlan {
        main: main("gemm", ep),
        others: vec![main("gemv", 1)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tile::{Problem, feasible};
    use tessera_dsl::library;

    /// Every feasible x86-avx2 tile of every kernel the backend runs: the
    /// main loop's plan matches the solver's accounting (accumulators
    /// equal, A/B/reserved within it, total ≤ the solver's total ≤ 16) and
    /// the backend emits it.
    #[test]
    fn register_plans_match_the_solver_accounting() {
        let caps = target();
        let backend = super::super::X86Backend::default();
        for name in ["matmul-f32", "matmul-f16", "matmul-w8a8", "matmul-w4a8"] {
            let kernel = library::get(name).unwrap();
            let problem = Problem::from_kernel(caps, &kernel).unwrap();
            let tiles = feasible(caps, &problem).unwrap();
            assert!(!tiles.is_empty());
            let mut emitted = 0;
            for tile in &tiles {
                let acc = &tile.accounting;
                assert!(acc.total <= 16 && acc.budget == 16, "{}", tile.summary());
                let hb = tile.hp as usize / 8;
                let plan = if name.contains("a8") {
                    int8_plan(&Int8Spec {
                        ep: tile.ep as usize,
                        hb,
                        group: name.contains("w4").then_some(32),
                        wbits: 4,
                        zero: crate::x86::int8::ZeroPoint::Offset,
                        params: tessera_dsl::ir::ParamType::F32,
                        y: tessera_dsl::Format::F32,
                        bias: true,
                        activation: tessera_dsl::ir::Activation::None,
                        dot: Default::default(),
                    })
                } else {
                    let f = if name == "matmul-f16" {
                        tessera_dsl::Format::F16
                    } else {
                        tessera_dsl::Format::F32
                    };
                    float_plan(&FloatSpec {
                        ep: tile.ep as usize,
                        hb,
                        x: f,
                        w: f,
                        y: f,
                        bias: true,
                        activation: tessera_dsl::ir::Activation::None,
                    })
                };
                let m = &plan.main;
                assert_eq!(
                    m.accumulators,
                    acc.accumulators,
                    "{name} {}",
                    tile.summary()
                );
                assert!(
                    m.a <= acc.a_regs && m.b <= acc.b_regs,
                    "{name} {}",
                    tile.summary()
                );
                assert!(m.reserved <= acc.reserved, "{name} {}", tile.summary());
                let fits = plan.check(tile).is_ok();
                assert_eq!(
                    fits,
                    backend.emit_code(&kernel, tile).is_ok(),
                    "{name} {}",
                    tile.summary()
                );
                // Every tile the solver offers fits; its count bounds the main
                // loop's registers in its own categories (extra accumulator
                // sets use the slack up to 16).
                assert!(fits, "{name} {}: {:?}", tile.summary(), plan.check(tile));
                let own = m.total() - m.extra;
                assert!(own <= acc.total, "{name} {}", tile.summary());
                assert!(m.total() <= 16, "{name} {}", tile.summary());
                emitted += usize::from(fits);
            }
            assert!(emitted > 0, "{name}: no tile emitted");
        }
    }

    fn f32_spec(ep: usize, hb: usize) -> FloatSpec {
        FloatSpec {
            ep,
            hb,
            x: tessera_dsl::Format::F32,
            w: tessera_dsl::Format::F32,
            y: tessera_dsl::Format::F32,
            bias: true,
            activation: tessera_dsl::ir::Activation::None,
        }
    }

    /// The solver's best tiles, as the plan tables in the emitters' docs
    /// describe them (4x24 f32: 12 acc + 1 A + 3 B, nothing reserved; the
    /// epilogue's mask and bias temporary take A's and B's registers).
    #[test]
    fn best_tiles_and_their_plans() {
        let caps = target();
        let best = |name: &str| {
            let kernel = library::get(name).unwrap();
            let problem = Problem::from_kernel(caps, &kernel).unwrap();
            crate::tile::solve(caps, &problem).unwrap()[0]
        };
        let t = best("matmul-f32");
        assert_eq!((t.ep, t.hp, t.lp), (4, 24, 1));
        let p = float_plan(&f32_spec(4, 3));
        assert_eq!(p.main.total(), 12 + 1 + 3);
        assert_eq!(p.others[1].total(), 12 + 2);
        assert!(p.check(&t).is_ok());
        // 14x8 fits the register file too (14 + 1 + 1; epilogue 14 + 2).
        let p = float_plan(&f32_spec(14, 1));
        assert_eq!(p.main.total(), 14 + 1 + 1);
        assert_eq!(p.others[1].total(), 14 + 2);
        // The classic 6x16 fits too (12 acc + 1 A + 2 B), one set.
        let p = float_plan(&f32_spec(6, 2));
        assert_eq!(p.main.total(), 12 + 1 + 2);
        // 6x8 keeps a second accumulator set for independent FMA chains.
        let p = float_plan(&f32_spec(6, 1));
        assert_eq!(p.main.total(), 6 + 6 + 1 + 1);
        // Int8: one renamed A register, so 10 rows fit (10 + 1 + 1 + 4).
        for name in ["matmul-w4a8", "matmul-w8a8"] {
            let t = best(name);
            assert_eq!((t.ep, t.hp, t.lp), (10, 8, 4), "{name}");
            assert_eq!(t.accounting.total, 16, "{name}");
        }
        let int8 = |ep, hb, group| {
            int8_plan(&Int8Spec {
                ep,
                hb,
                group,
                wbits: 4,
                zero: crate::x86::int8::ZeroPoint::Offset,
                params: tessera_dsl::ir::ParamType::F32,
                y: tessera_dsl::Format::F32,
                bias: true,
                activation: tessera_dsl::ir::Activation::None,
                dot: Default::default(),
            })
        };
        // W4A8: group sums + A + B + mask, shifts, product temp.
        let p = int8(10, 1, Some(32));
        assert_eq!(p.main.total(), 10 + 1 + 1 + 3);
        // W8A8: accumulators + A + |w| + raw w, product temp, ones.
        let w8 = int8(10, 1, None);
        assert_eq!(w8.main.total(), 10 + 1 + 1 + 3);
        assert!(w8.check(&best("matmul-w8a8")).is_ok());
        assert!(p.check(&best("matmul-w4a8")).is_ok());
        // The flat-GEMM tile at M = 8 holds every row in one block.
        let kernel = library::get("matmul-w4a8").unwrap();
        let mut problem = Problem::from_kernel(caps, &kernel).unwrap();
        problem.e = 8;
        let flat = crate::tile::solve(caps, &problem).unwrap()[0];
        assert_eq!((flat.ep, flat.hp), (8, 8));
        assert!(int8(8, 1, Some(32)).check(&flat).is_ok());
    }
}
