//! `tessera-autotune`: see `tessera_autotune::cli`.

fn main() -> std::process::ExitCode {
    tessera_autotune::cli::main()
}
