//! `tessera-kernels-gen`: list, print, check and solve Tessera kernels.
//!
//! `show --list` lists the built-in library; `show NAME` prints a kernel's
//! canonical text; `check FILE` parses and verifies a kernel text file;
//! `solve --target T --kernel NAME` prints the register-constrained tile.
//! Errors go to stderr with exit code 1 and name the problem.

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
