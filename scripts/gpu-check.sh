#!/usr/bin/env bash
# The GPU check, in two halves, for an NVIDIA machine that has no Rust
# toolchain and no network.
#
#   scripts/gpu-check.sh build [--profile P] [DIR]   on a machine with the toolchain
#   bash DIR/gpu-check.sh run [RESULTS]              on the GPU machine
#
# `build` compiles the CUDA tests of the runtime (every PTX kernel — GEMV,
# flat GEMM, GEMM, decode attention — against the reference interpreter on
# random shapes with tails; the resident Linear, Attention and KV cache;
# launches on a caller's stream) and the GPU benchmark (`cuda_bench`,
# profile P, release by default) into DIR (default target/gpu-check), with
# the vendor side (`vendor_bench.py`: read bandwidth, cuBLAS f16 through
# PyTorch, PyTorch SDPA) and this script. Copy DIR to the GPU machine.
#
# `run` (x86-64 Linux with the CUDA driver; python3 with PyTorch for the
# vendor side) runs the tests, then the benchmark and the vendor timings,
# and writes to RESULTS (default DIR/results): tests.log, bench.log,
# ours.jsonl, vendor.jsonl and report.md (GB/s of weights at M <= 16,
# TFLOP/s above, % of the measured read bandwidth, ratios to the vendor,
# and the targets), and all of them again in results.tar.gz. It exits
# non-zero if a test failed or was skipped.
set -euo pipefail

usage() {
    sed -n '5,6p' "$0" >&2
    exit 2
}

build() {
    local profile=release dir=""
    while [ $# -gt 0 ]; do
        case "$1" in
        --profile) profile=${2:?--profile needs a value}; shift 2 ;;
        -*) usage ;;
        *) dir=$1; shift ;;
        esac
    done
    local root
    root=$(cd "$(dirname "$0")/.." && pwd)
    dir=${dir:-$root/target/gpu-check}
    rm -rf "$dir"
    mkdir -p "$dir/tests"
    cd "$root"
    local tests
    # `--workspace` with the runtime's `cuda` feature in every cargo call
    # here: one feature set, so the tests and the bench share their
    # dependencies' builds (and those of scripts/test.sh's CUDA tests).
    tests=$(cargo test --workspace --features tessera-runtime/cuda --no-run --message-format=json \
        --test cuda_matmul --test cuda_attention --test cuda_device |
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
')
    [ "$(echo "$tests" | wc -l)" -eq 3 ] || { echo "expected 3 CUDA test binaries, got: $tests" >&2; exit 1; }
    while read -r name exe; do
        cp "$exe" "$dir/tests/$name"
    done <<<"$tests"
    local bench
    # `cargo build`, not `cargo test --no-run`: the latter builds the
    # example under the test harness, whose main runs no benchmark.
    bench=$(cargo build --workspace --features tessera-runtime/cuda --profile "$profile" \
        --example cuda_bench --message-format=json |
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cuda_bench":
        print(m["executable"])
')
    [ -n "$bench" ] || { echo "cuda_bench was not built" >&2; exit 1; }
    cp "$bench" "$dir/cuda_bench"
    strip "$dir/cuda_bench" "$dir"/tests/* 2>/dev/null || true
    cp scripts/gpu/vendor_bench.py "$0" "$dir/"
    echo "GPU check built in $dir ($(du -sh "$dir" | cut -f1)); on the GPU machine: bash $dir/gpu-check.sh run"
}

run() {
    local dir
    dir=$(cd "$(dirname "$0")" && pwd)
    [ -x "$dir/cuda_bench" ] && [ -d "$dir/tests" ] || {
        echo "run from a folder made by 'scripts/gpu-check.sh build'" >&2
        exit 2
    }
    local out=${1:-$dir/results}
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    local ours=$out/ours.jsonl failed=0
    : >"$ours"
    : >"$out/tests.log"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
        --format=csv >>"$out/tests.log" 2>&1 || true
    for t in "$dir"/tests/*; do
        local name status detail
        name=$(basename "$t")
        echo "== $name" >>"$out/tests.log"
        if (cd "$dir" && "$t" --test-threads=1 --nocapture) >"$out/$name.tmp" 2>&1; then
            status=pass
        else
            status=fail
            failed=1
        fi
        # With a GPU nothing may skip: a SKIP means the device was not used.
        if grep 'SKIP' "$out/$name.tmp" | grep -qv 'driver is installed\|a driver exists'; then
            status=skip
            failed=1
        fi
        detail=$(grep -E '^test result|panicked|SKIP' "$out/$name.tmp" | head -3 | tr '"\\\n' "'/ " || true)
        cat "$out/$name.tmp" >>"$out/tests.log"
        rm -f "$out/$name.tmp"
        echo "{\"kind\":\"check\",\"name\":\"$name\",\"status\":\"$status\",\"detail\":\"$detail\"}" >>"$ours"
        echo "$name: $status"
    done
    if "$dir/cuda_bench" >>"$ours" 2>"$out/bench.log"; then
        echo "cuda_bench: done"
    else
        echo "cuda_bench failed (bench.log):" && tail -5 "$out/bench.log"
        failed=1
    fi
    python3 "$dir/vendor_bench.py" measure --out "$out/vendor.jsonl" 2>>"$out/bench.log" ||
        echo "vendor timings failed (bench.log)"
    python3 "$dir/vendor_bench.py" report --ours "$ours" --vendor "$out/vendor.jsonl" \
        --out "$out/report.md" >/dev/null || echo "report failed"
    # One archive beside the files: a runner that brings back only a few
    # files per call (the device tool: 8) still gets every log.
    local archive
    archive=$(mktemp)
    if tar czf "$archive" -C "$out" --exclude results.tar.gz . && mv "$archive" "$out/results.tar.gz"; then
        chmod 644 "$out/results.tar.gz"
    else
        echo "results.tar.gz failed"
    fi
    echo "results in $out (report.md; all of them in results.tar.gz)"
    return $failed
}

case "${1:-}" in
build) shift; build "$@" ;;
run) shift; run "$@" ;;
*) usage ;;
esac
