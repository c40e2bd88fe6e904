//! `tessera-kernels-gen solve`: the tile solver's answer for a kernel on a
//! target, as text (first line `ep=E hp=H lp=L` and the register
//! accounting) or JSON. The CLI resolves `--kernel NAME` and calls [`run`].

use std::fmt;

use tessera_codegen::TargetCaps;
use tessera_codegen::target::UnknownTarget;
use tessera_codegen::tile::{SolveError, solve_kernel};
use tessera_dsl::Kernel;

/// Why `solve` fails; every variant's message names the bad input and the
/// valid choices, and the CLI exits 1 with it.
#[derive(Debug)]
pub enum SolveCliError {
    UnknownTarget(UnknownTarget),
    Solve(SolveError),
    Json(serde_json::Error),
}

impl fmt::Display for SolveCliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SolveCliError::UnknownTarget(e) => e.fmt(f),
            SolveCliError::Solve(e) => e.fmt(f),
            SolveCliError::Json(e) => write!(f, "cannot encode the solution as JSON: {e}"),
        }
    }
}

impl std::error::Error for SolveCliError {}

/// Solve `kernel` on the target named `target`; `top` best tiles (at least
/// one) as plain text, or the same as JSON.
pub fn run(target: &str, kernel: &Kernel, top: usize, json: bool) -> Result<String, SolveCliError> {
    let caps = TargetCaps::by_name(target).map_err(SolveCliError::UnknownTarget)?;
    let solution = solve_kernel(caps, kernel).map_err(SolveCliError::Solve)?;
    if json {
        let mut s =
            serde_json::to_string_pretty(&solution.to_report(top)).map_err(SolveCliError::Json)?;
        s.push('\n');
        Ok(s)
    } else {
        Ok(solution.to_text(top))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_dsl::ir::ParamType;
    use tessera_dsl::{
        Activation, Epilogue, Format, Group, KernelBuilder, Matmul, Op, Role, TileSize,
    };

    fn matmul(x: Format, w: Format) -> Kernel {
        KernelBuilder::new("matmul-test")
            .dyn_axis("e")
            .dyn_axis("h")
            .reduce_axis("l")
            .tile("ep", "e", TileSize::Solve)
            .tile("hp", "h", TileSize::Solve)
            .tile("lp", "l", TileSize::Solve)
            .tensor("x", Role::Input, &["e", "l"], x)
            .tensor("w", Role::Weight, &["h", "l"], w)
            .tensor("y", Role::Output, &["e", "h"], Format::F32)
            .op(Op::Matmul(Matmul {
                x: "x".into(),
                w: "w".into(),
                y: "y".into(),
                e: "e".into(),
                h: "h".into(),
                l: "l".into(),
                epilogue: Epilogue {
                    scale: true,
                    zero_point: w.is_asymmetric(),
                    bias: None,
                    activation: Activation::None,
                },
            }))
            .build()
            .expect("valid test kernel")
    }

    /// Per-row scales: MNN-LLM Table 2's int8 tile (grouped weights add
    /// partial-sum registers on `smmla`).
    fn w4a8() -> Kernel {
        matmul(Format::I8Dyn, Format::U4Asym(Group::Row, ParamType::F32))
    }

    #[test]
    fn first_line_reproduces_table_2() {
        let out = run("aarch64-i8mm", &w4a8(), 1, false).unwrap();
        assert!(
            out.lines().next().unwrap().starts_with("ep=10 hp=8 lp=8 "),
            "{out}"
        );
        let out = run("aarch64-dotprod", &w4a8(), 1, false).unwrap();
        assert!(
            out.lines().next().unwrap().starts_with("ep=12 hp=8 lp=4 "),
            "{out}"
        );
    }

    #[test]
    fn top_lists_that_many_ranked_tiles() {
        let out = run("aarch64-dotprod", &w4a8(), 3, false).unwrap();
        let ranked: Vec<&str> = out.lines().filter(|l| l.starts_with('#')).collect();
        assert_eq!(ranked.len(), 3, "{out}");
        assert!(ranked[0].starts_with("#1 ep=12 hp=8 lp=4 "));
        assert!(ranked.iter().all(|l| l.contains(" cost=")));
    }

    #[test]
    fn json_has_the_same_best_tile() {
        let out = run("aarch64-i8mm", &w4a8(), 2, true).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["target"], "aarch64-i8mm");
        assert_eq!(v["tiles"].as_array().unwrap().len(), 2);
        let best = &v["tiles"][0];
        assert_eq!(
            (
                best["ep"].as_u64(),
                best["hp"].as_u64(),
                best["lp"].as_u64()
            ),
            (Some(10), Some(8), Some(8))
        );
        assert_eq!(best["accounting"]["total"], 31);
        assert_eq!(best["accounting"]["budget"], 32);
    }

    #[test]
    fn unknown_target_lists_the_valid_ones() {
        let err = run("riscv-v", &w4a8(), 1, false).unwrap_err().to_string();
        assert!(err.contains("riscv-v"), "{err}");
        for name in TargetCaps::names() {
            assert!(err.contains(name), "{err}");
        }
    }

    #[test]
    fn missing_format_path_is_named() {
        let err = run("opencl-gpu", &w4a8(), 1, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("opencl-gpu") && err.contains("i8dyn") && err.contains("u4asym:row"),
            "{err}"
        );
        assert!(err.contains("supports"), "{err}");
        // W4A8 without dotprod runs through smull/sadalp.
        assert!(run("aarch64-neon", &w4a8(), 1, false).is_ok());
    }
}
