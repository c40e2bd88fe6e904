//! `tessera-kernels-gen`: list, print, check and solve Tessera kernels.
//!
//! `show --list` lists the built-in library; `show NAME` prints a kernel's
//! canonical text; `check FILE` parses and verifies a kernel text file;
//! `solve --target T --kernel NAME` prints the register-constrained tile;
//! `emit --target T --kernel NAME` prints an emitted instance's listing or
//! source; `gen --target T[,T…] --model NAME --out DIR` writes a model's
//! kernels, `manifest.json` and `kernels.rs` for build-time embedding.
//! Errors go to stderr with exit code 1 and name the problem.

mod emit;
mod solve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tessera_dsl::{Kernel, library};

#[derive(Parser)]
#[command(
    name = "tessera-kernels-gen",
    version,
    about = "Tessera's kernel generator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the built-in kernels, or print one in canonical text.
    Show {
        /// List the library's kernel names.
        #[arg(long)]
        list: bool,
        /// Kernel to print.
        name: Option<String>,
    },
    /// Parse and verify a kernel text file; print its canonical text.
    Check {
        /// Path of the kernel text file (`-` for standard input).
        file: String,
    },
    /// Solve the register-constrained tile of a kernel on a target.
    Solve {
        /// Target name (e.g. aarch64-i8mm, x86-avx2).
        #[arg(long)]
        target: String,
        /// Library kernel name (e.g. matmul-w4a8) or a kernel text file.
        #[arg(long)]
        kernel: String,
        /// How many ranked tiles to list.
        #[arg(long, default_value_t = 1)]
        top: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Emit one kernel instance: print its listing (machine code) or source.
    Emit {
        /// x86-avx2, x86-avx512 (f32, W4A8), host (cranelift), aarch64-neon|fp16|dotprod|i8mm, opencl, ptx-sm80|ptx-sm90.
        #[arg(long)]
        target: String,
        /// Library kernel name or a kernel text file.
        #[arg(long)]
        kernel: String,
        /// Matmul loop structure: gemv, flat-gemm or gemm.
        #[arg(long, default_value = "gemm")]
        variant: String,
        /// A feasible tile other than the solver's optimum: E,H,L.
        #[arg(long)]
        tile: Option<String>,
        /// OpenCL half precision: native (cl_khr_fp16) or storage.
        #[arg(long, default_value = "storage")]
        fp16: String,
        /// Head dim of an OpenCL prefill program (a constant of its code).
        #[arg(long, default_value_t = 128)]
        head_dim: usize,
        /// Also write the machine-code bytes to this file.
        #[arg(long)]
        bin: Option<std::path::PathBuf>,
    },
    /// Generate every kernel a model needs: code files, manifest.json and
    /// kernels.rs (to include! in a crate; no JIT at run time).
    Gen {
        /// Comma-separated targets: x86-avx2, host, aarch64-neon|fp16|dotprod|i8mm, opencl, ptx-sm80|sm90.
        #[arg(long, value_delimiter = ',', required = true)]
        target: Vec<String>,
        /// Embedded model name (e.g. qwen2-1.5b) or a Hugging Face config.json.
        #[arg(long)]
        model: String,
        /// Comma-separated formats (w4a8, w8a8, w4a16, f16, …); default w4a8.
        #[arg(long, value_delimiter = ',')]
        format: Vec<String>,
        /// Also generate the lm_head shape [vocab, hidden].
        #[arg(long)]
        lm_head: bool,
        /// Tuning record (tessera-autotune) for tiles and M ranges.
        #[arg(long)]
        record: Option<std::path::PathBuf>,
        /// Output directory.
        #[arg(long)]
        out: std::path::PathBuf,
    },
}

/// A library name, or else a path to a kernel text file.
fn resolve_kernel(name: &str) -> Result<Kernel, String> {
    match library::get(name) {
        Ok(k) => Ok(k),
        Err(lib_err) => {
            if std::path::Path::new(name).is_file() {
                read_kernel_file(name)
            } else {
                Err(lib_err.to_string())
            }
        }
    }
}

fn read_kernel_file(path: &str) -> Result<Kernel, String> {
    let text = if path == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(|e| format!("stdin: {e}"))?
    } else {
        std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?
    };
    text.parse::<Kernel>().map_err(|e| format!("{path}: {e}"))
}

fn run(cli: Cli) -> Result<String, String> {
    match cli.command {
        Command::Show { list: true, .. } => {
            Ok(library::names().iter().map(|n| format!("{n}\n")).collect())
        }
        Command::Show {
            list: false,
            name: Some(name),
        } => resolve_kernel(&name).map(|k| k.to_string()),
        Command::Show {
            list: false,
            name: None,
        } => Err(format!(
            "show: give a kernel name or --list; kernels: {}",
            library::names().join(", ")
        )),
        Command::Check { file } => read_kernel_file(&file).map(|k| k.to_string()),
        Command::Solve {
            target,
            kernel,
            top,
            json,
        } => {
            let k = resolve_kernel(&kernel)?;
            solve::run(&target, &k, top.max(1), json).map_err(|e| e.to_string())
        }
        Command::Emit {
            target,
            kernel,
            variant,
            tile,
            fp16,
            head_dim,
            bin,
        } => {
            let request = emit::EmitRequest {
                target: &target,
                kernel: resolve_kernel(&kernel)?,
                variant: variant.parse()?,
                tile: tile.as_deref().map(emit::parse_tile).transpose()?,
                fp16: fp16.parse().map_err(|e| format!("--fp16 `{fp16}`: {e}"))?,
                head_dim,
            };
            let out = emit::run(request)?;
            if let Some(path) = bin {
                let bytes = out.bytes.as_ref().ok_or_else(|| {
                    format!("--bin: target {target} emits source text, not machine code")
                })?;
                std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
            }
            Ok(out.text)
        }
        Command::Gen {
            target,
            model,
            format,
            lm_head,
            record,
            out,
        } => {
            use tessera_kernels_gen::r#gen::{GenConfig, ModelSpec, generate};
            let cfg = GenConfig {
                targets: target,
                model: ModelSpec::Model {
                    name_or_config: model,
                    lm_head,
                },
                formats: format,
                record,
                out_dir: out.clone(),
                cargo: false,
            };
            let report = generate(&cfg).map_err(|e| e.to_string())?;
            let mut text: String = report
                .notes
                .iter()
                .map(|n| format!("note: {n}\n"))
                .collect();
            text.push_str(&format!(
                "{} entries, {} attention, {} kernel files in {}: {} written, {} unchanged, {} removed\n",
                report.entries,
                report.attention,
                report.kernels,
                out.display(),
                report.written.len(),
                report.unchanged.len(),
                report.removed.len()
            ));
            Ok(text)
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}
