#!/usr/bin/env bash
# Tessera's one test command (the README's, and what .ci/run calls).
#
# 1. Makes sure what the tests need is installed, idempotently, on a fresh
#    Debian machine: every `ensure_*` function checks first and installs only
#    what is missing, so a second run installs nothing.
# 2. Runs the checks: rustfmt, clippy and rustdoc (warnings are errors),
#    every test.
# 3. Prints one summary line per check and a total test count.
#
# Later issues add their toolchains by calling the ready `ensure_*` functions
# below from `install_requirements` (qemu-user for aarch64 tests,
# gcc-aarch64-linux-gnu as the linker, PoCL for OpenCL, ptxas for PTX).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }

# --- installers: each checks before it installs -----------------------------

# Runs a command as root (directly when root, else through sudo).
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif have sudo; then
        sudo "$@"
    else
        die "need root (or sudo) to run: $*"
    fi
}

APT_UPDATED=0
# Installs the Debian packages among "$@" that are not installed yet.
ensure_apt_packages() {
    local missing=() pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$pkg")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    have apt-get || die "apt-get not found; install by hand: ${missing[*]}"
    if [ "$APT_UPDATED" -eq 0 ]; then
        log "apt-get update"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        APT_UPDATED=1
    fi
    log "apt-get install ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}"
}

# cargo and rustc come with the machine (rustup, stable); a missing toolchain
# cannot be installed from here, so say so plainly.
ensure_rust() {
    have cargo && have rustc && return 0
    die "cargo/rustc not found: install the stable Rust toolchain with rustup (Tessera needs Rust >= 1.95)"
}

# A C compiler and linker for Rust's host builds and build scripts.
ensure_c_toolchain() {
    have cc || ensure_apt_packages gcc libc6-dev
}

# rustfmt and clippy, added through rustup only when missing.
ensure_rust_components() {
    local component missing=()
    cargo fmt --version >/dev/null 2>&1 || missing+=(rustfmt)
    cargo clippy --version >/dev/null 2>&1 || missing+=(clippy)
    [ "${#missing[@]}" -eq 0 ] && return 0
    have rustup || die "missing ${missing[*]} and rustup is not available to add them"
    for component in "${missing[@]}"; do
        log "rustup component add $component"
        rustup component add "$component"
    done
}

# Optional: a faster test runner. Nothing here requires it.
ensure_cargo_nextest() {
    have cargo-nextest || cargo install --locked cargo-nextest
}

# aarch64 NEON tests: run aarch64 test binaries under qemu-aarch64 -cpu max.
ensure_qemu_user() {
    have qemu-aarch64 || ensure_apt_packages qemu-user
}

# aarch64 NEON tests: the cross linker and libc for aarch64-unknown-linux-gnu,
# plus the Rust standard library for that target.
ensure_aarch64_cross() {
    have aarch64-linux-gnu-gcc || ensure_apt_packages gcc-aarch64-linux-gnu libc6-dev-arm64-cross
    if have rustup && ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
        log "rustup target add aarch64-unknown-linux-gnu"
        rustup target add aarch64-unknown-linux-gnu
    fi
}

# Listing cross-checks: llvm-mc assembles and disassembles emitted code.
ensure_llvm_mc() {
    have llvm-mc || ensure_apt_packages llvm
}

# OpenCL tests: PoCL, a CPU OpenCL implementation, with the ICD loader.
ensure_pocl() {
    ensure_apt_packages pocl-opencl-icd ocl-icd-libopencl1 ocl-icd-opencl-dev clinfo
}

# OpenCL C syntax checks of the native-half kernels PoCL cannot build.
ensure_clang() {
    have clang || ensure_apt_packages clang
}

# PTX checks: ptxas from NVIDIA's pip wheel (no GPU needed to assemble),
# installed into Tessera's cache folder, not system-wide. Exports PTXAS with
# its path (the PTX tests read it) and puts it on PATH.
PTXAS_PREFIX="${XDG_CACHE_HOME:-$HOME/.cache}/tessera/nvcc"
ensure_ptxas() {
    local bin="$PTXAS_PREFIX/nvidia/cuda_nvcc/bin"
    if ! have ptxas && [ ! -x "$bin/ptxas" ]; then
        have python3 || ensure_apt_packages python3 python3-pip
        python3 -m pip --version >/dev/null 2>&1 || ensure_apt_packages python3-pip
        log "pip install nvidia-cuda-nvcc-cu12 into $PTXAS_PREFIX"
        python3 -m pip install --quiet --target "$PTXAS_PREFIX" nvidia-cuda-nvcc-cu12
        [ -x "$bin/ptxas" ] || die "ptxas not found in nvidia-cuda-nvcc-cu12 under $PTXAS_PREFIX"
    fi
    [ -x "$bin/ptxas" ] && export PATH="$bin:$PATH"
    PTXAS=$(command -v ptxas)
    export PTXAS
}

# The ggml oracle: llama.cpp's own numpy quantizers (PyPI `gguf`), installed
# into Tessera's cache folder, not system-wide. Exports
# TESSERA_GGUF_PYTHONPATH (the dsl oracle test reads it).
GGUF_PREFIX="${XDG_CACHE_HOME:-$HOME/.cache}/tessera/gguf"
ensure_gguf() {
    if [ ! -d "$GGUF_PREFIX/gguf" ]; then
        have python3 || ensure_apt_packages python3 python3-pip
        python3 -m pip --version >/dev/null 2>&1 || ensure_apt_packages python3-pip
        log "pip install gguf into $GGUF_PREFIX"
        python3 -m pip install --quiet --target "$GGUF_PREFIX" gguf
        [ -d "$GGUF_PREFIX/gguf" ] || die "gguf not found under $GGUF_PREFIX after pip install"
    fi
    TESSERA_GGUF_PYTHONPATH="$GGUF_PREFIX"
    export TESSERA_GGUF_PYTHONPATH
}

# C API tests (capi/tests/c_examples.rs): the C++ compiler for the C++
# example, pkg-config to find the library the way an engine does, valgrind
# for the memory checks (AddressSanitizer comes with gcc), strip for the
# debug-info-free copies the examples link.
ensure_capi_tools() {
    have c++ || ensure_apt_packages g++
    have pkg-config || ensure_apt_packages pkg-config
    have valgrind || ensure_apt_packages valgrind
    have strip || ensure_apt_packages binutils
}

# Remote tuning tests: an sshd the test starts on loopback, and the clients.
ensure_openssh() {
    { have ssh && have scp && have ssh-keygen; } || ensure_apt_packages openssh-client
    [ -x /usr/sbin/sshd ] || ensure_apt_packages openssh-server
}

# What the tests need today. Later issues add their ensure_* calls here.
install_requirements() {
    ensure_rust
    ensure_c_toolchain
    ensure_rust_components
    ensure_llvm_mc
    ensure_qemu_user
    ensure_aarch64_cross
    ensure_pocl
    ensure_clang
    ensure_ptxas
    ensure_gguf
    ensure_capi_tools
    ensure_openssh
}

# The cranelift (host) backend's aarch64 code paths and the NEON prefill,
# natively under qemu-aarch64 -cpu max (.cargo/config.toml sets the linker
# and runner): only these tests, whose sizes are small, so this stays
# within minutes. `--workspace` in every aarch64 build (here, in
# scripts/test-aarch64.sh and the remote tuning test's cross-build): the
# same features each time, so cranelift, the emitters and the runtime are
# compiled for aarch64 once.
run_aarch64_clif_tests() {
    cargo test --workspace --target aarch64-unknown-linux-gnu \
        --test clif_matmul --test clif_attention --test clif_listing --test neon_attention_prefill
}

# The CUDA host path is behind a non-default feature: lint it and run its
# tests, which print a visible SKIP where no CUDA driver exists; then the
# GPU check's build half (what scripts/gpu-check.sh carries to a GPU
# machine), in the dev profile so it reuses the tests' artifacts. The tests
# build with `--workspace` (as gpu-check.sh does): the workspace's features
# with `cuda` added, so only the runtime and what needs it are recompiled.
run_cuda_feature_checks() {
    cargo clippy -p tessera-runtime --features cuda --all-targets -- -D warnings &&
        cargo test --workspace --features tessera-runtime/cuda \
            --test cuda_matmul --test cuda_attention --test cuda_device -- --nocapture &&
        scripts/gpu-check.sh build --profile dev "${CARGO_TARGET_DIR:-target}/gpu-check-ci" &&
        for f in cuda_bench gpu-check.sh vendor_bench.py tests/cuda_matmul tests/cuda_attention tests/cuda_device; do
            [ -s "${CARGO_TARGET_DIR:-target}/gpu-check-ci/$f" ] || { echo "gpu-check build lacks $f" >&2; return 1; }
        done
}

# --- checks -------------------------------------------------------------------

FAILED=()
SUMMARY=()

# Runs one check, keeps going on failure, records the outcome.
check() {
    local name=$1
    shift
    log "$name: $*"
    local start=$SECONDS
    if "$@"; then
        SUMMARY+=("ok      $(printf '%5ss' $((SECONDS - start)))  $name")
    else
        SUMMARY+=("FAILED  $(printf '%5ss' $((SECONDS - start)))  $name")
        FAILED+=("$name")
    fi
}

run_tests() {
    local out status
    out=$(mktemp)
    set +e
    cargo test --workspace --no-fail-fast 2>&1 | tee "$out"
    status=${PIPESTATUS[0]}
    set -e
    # Sum cargo's per-binary "test result:" lines into one total.
    TOTALS=$(awk '/^test result:/ {
            for (i = 1; i <= NF; i++) {
                if ($(i+1) ~ /^passed/) p += $i
                if ($(i+1) ~ /^failed/) f += $i
                if ($(i+1) ~ /^ignored/) s += $i
            }
        } END { printf "%d passed, %d failed, %d skipped", p, f, s }' "$out")
    rm -f "$out"
    return "$status"
}

main() {
    local start=$SECONDS
    install_requirements
    # The toolchains are installed now: a check that cannot find its tool
    # fails naming it instead of printing SKIP (tessera_dsl::testing).
    export TESSERA_REQUIRE_TOOLS=1
    SUMMARY+=("ok      $(printf '%5ss' $((SECONDS - start)))  toolchains installed (idempotent)")

    TOTALS="0 passed, 0 failed, 0 skipped"
    check "rustfmt" cargo fmt --all -- --check
    check "clippy" cargo clippy --workspace --all-targets -- -D warnings
    check "rustdoc (broken and private intra-doc links are errors)" \
        env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
    check "tests (cargo test --workspace)" run_tests
    check "cuda feature (clippy; tests SKIP without a driver; GPU check build)" run_cuda_feature_checks
    check "prebuilt kernels example (build-time generation, no JIT, on PoCL)" \
        cargo run -p tessera-prebuilt-example
    check "aarch64 clif tests (qemu)" run_aarch64_clif_tests
    check "aarch64 NEON suite (qemu: max, cortex-a76, cortex-a72)" bash scripts/test-aarch64.sh
    check "remote tuning (aarch64 under qemu; ssh on loopback)" \
        cargo test --workspace --test remote -- --ignored
    check "bench probes compile (cc, warnings are errors)" \
        cc -O2 -Wall -Wextra -Werror -mavx512f -fsyntax-only bench/probes/kv8_read_pattern.c

    printf '\n==> summary\n'
    printf '  %s\n' "${SUMMARY[@]}"
    printf 'tests: %s\n' "$TOTALS"
    printf 'total: %ss\n' "$SECONDS"
    if [ "${#FAILED[@]}" -ne 0 ]; then
        printf 'failed checks: %s\n' "${FAILED[*]}" >&2
        exit 1
    fi
}

main "$@"
