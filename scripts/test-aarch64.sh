#!/usr/bin/env bash
# The NEON suite (and the runtime's NEON device) under qemu-aarch64 on three
# emulated CPUs: `max` (i8mm, dotprod, fp16), `cortex-a76` (dotprod and
# fp16, no i8mm) and `cortex-a72` (plain NEON), proving the run-time
# dispatch falls back. Needs the cross
# toolchain (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user and the
# rustup target aarch64-unknown-linux-gnu); scripts/test.sh installs them.
# `--workspace` everywhere: the features of the other aarch64 builds, so
# nothing is compiled twice.
set -euo pipefail
cd "$(dirname "$0")/.."
# insta finds the workspace root by forking `cargo metadata` unless told it;
# a fork from a multithreaded qemu-user guest can hang (a CI run sat in a
# snapshot test until the job's limit), so tell it.
export INSTA_WORKSPACE_ROOT="$PWD"
# A hung emulated test binary fails the run within this many seconds
# instead of holding CI to its limit (each run takes 1-3 minutes).
guard=(timeout --signal=KILL 1200)
for spec in max:aarch64-i8mm cortex-a76:aarch64-dotprod cortex-a72:aarch64-neon; do
    cpu=${spec%%:*}
    want=${spec#*:}
    echo "== qemu-aarch64 -cpu $cpu (expects $want)"
    # TESSERA_EMULATED: the llvm-mc cross-checks run on the host instead
    # (forking llvm-mc from a multithreaded guest can hang qemu-user).
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu $cpu -L /usr/aarch64-linux-gnu" \
        TESSERA_EXPECT_TARGET="$want" TESSERA_EMULATED=1 \
        "${guard[@]}" cargo test --workspace --target aarch64-unknown-linux-gnu --test neon_run --test neon_attention --test conformance
    # The runtime's NEON device (Linear, Attention decode and prefill, KV
    # cache) next to cranelift on the same CPU; model files (GGUF blocks
    # repacked for NEON, checked against llama.cpp's gguf) once, on max.
    runtime_tests=(--test runtime)
    [ "$cpu" = max ] && runtime_tests+=(--test model_file)
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu $cpu -L /usr/aarch64-linux-gnu" \
        "${guard[@]}" cargo test --workspace --target aarch64-unknown-linux-gnu "${runtime_tests[@]}"
done
