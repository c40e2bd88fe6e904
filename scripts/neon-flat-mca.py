#!/usr/bin/env python3
"""llvm-mca of the NEON flat-GEMM inner loop against the GEMM inner loop.

Emits each kernel with `tessera-kernels-gen emit`, cuts the steady-state
loop body out of the listing (from its `// steady state` comment to the
back branch), and asks llvm-mca (LLVM 14) for the cycles of one iteration.
Prints a markdown table: per loop, lp-steps and rows per iteration, cycles
per iteration, cycles per useful MAC row-step at M = 8, weight bytes per
cycle. Usage: scripts/neon-flat-mca.py [path/to/tessera-kernels-gen]
"""
import re
import subprocess
import sys

GEN = sys.argv[1] if len(sys.argv) > 1 else "target/debug/tessera-kernels-gen"
MCA = "llvm-mca-14"
MCA15 = "llvm-mca-15"
M = 8

# (label, target, kernel, llvm-mca, mcpu, mattr). LLVM 14 schedules every
# big Arm core (A72, A76, N1, N2) with its Cortex-A57 model; LLVM 15 has a
# Neoverse N2 model, used for the second set of rows.
CASES = [
    ("W4A8 g32 sdot", "aarch64-dotprod", "matmul-w4a8", MCA, "cortex-a76", "+dotprod"),
    ("W8A8 sdot", "aarch64-dotprod", "matmul-w8a8", MCA, "cortex-a76", "+dotprod"),
    ("W4A8 g32 smmla", "aarch64-i8mm", "matmul-w4a8", MCA, "neoverse-n1", "+i8mm,+dotprod"),
    ("W4A8 g32 smull", "aarch64-neon", "matmul-w4a8", MCA, "cortex-a72", ""),
    ("F32 fmla .4s", "aarch64-neon", "matmul-f32", MCA, "cortex-a76", ""),
    ("F16 fmla .8h", "aarch64-fp16", "matmul-f16", MCA, "cortex-a76", "+fullfp16"),
    ("W4A8 g32 sdot", "aarch64-dotprod", "matmul-w4a8", MCA15, "neoverse-n2", "+dotprod"),
    ("W4A8 g32 smmla", "aarch64-i8mm", "matmul-w4a8", MCA15, "neoverse-n2", "+i8mm,+dotprod"),
    ("F32 fmla .4s", "aarch64-neon", "matmul-f32", MCA15, "neoverse-n2", ""),
    ("F16 fmla .8h", "aarch64-fp16", "matmul-f16", MCA15, "neoverse-n2", "+fullfp16"),
]


def emit(target, kernel, variant, tile=None):
    cmd = [GEN, "emit", "--target", target, "--kernel", kernel, "--variant", variant]
    if tile:
        cmd += ["--tile", ",".join(map(str, tile))]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def tile_of(listing):
    m = re.search(r"tile ep=(\d+) hp=(\d+) lp=(\d+)", listing)
    return tuple(int(x) for x in m.groups())


def loop(listing, marker, after=None):
    """The loop body after the first comment containing `marker` (past the
    line containing `after`, if given), up to and including its back
    branch; and the lp-steps per iteration."""
    lines = listing.splitlines()
    first = 0
    if after:
        first = next(i for i, l in enumerate(lines) if after in l)
    start = next(i for i, l in enumerate(lines) if i > first and marker in l)
    body = []
    for l in lines[start + 1:]:
        s = l.strip()
        if s.startswith("//") or s.endswith(":"):
            continue
        body.append(s)
        if s.startswith("b."):
            break
    m = re.search(r"(\d+) l[p]?-step", lines[start])
    return body, int(m.group(1)) if m else 1


def row_counts(listing):
    return [int(x) for x in re.findall(r"// (\d+) row\(s\)", listing)]


def mca(body, tool, mcpu, mattr):
    # Branch targets need a label: loop back to the top.
    text = "top:\n" + "\n".join(re.sub(r"\.L\d+", "top", b) for b in body) + "\n"
    cmd = [tool, "-mtriple=aarch64", f"-mcpu={mcpu}", "-iterations=200"]
    if mattr:
        cmd.append(f"-mattr={mattr}")
    out = subprocess.run(cmd, input=text, check=True, capture_output=True, text=True).stdout
    cycles = int(re.search(r"Total Cycles:\s+(\d+)", out).group(1))
    rthr = float(re.search(r"Block RThroughput:\s+([\d.]+)", out).group(1))
    return cycles / 200.0, rthr


def main():
    print("| kernel | llvm-mca -mcpu | loop (tile; rows the loop computes) | M | lp-steps/iter | "
          "instrs/iter | cycles/iter | cycles per lp-step of the M rows | weight B per cycle |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, target, kernel, tool, mcpu, mattr in CASES:
        flat = emit(target, kernel, "flat-gemm")
        ft = tile_of(flat)
        gemm = emit(target, kernel, "gemm")
        gt = tile_of(gemm)
        same = emit(target, kernel, "gemm", ft)
        counts = row_counts(flat)
        wbits = 4 if "w4" in kernel else 8 if "w8" in kernel else 16 if "f16" in kernel else 32
        rows = []
        for m in (8, 2):
            c = next(c for c in counts if c >= min(m, ft[0]))
            blocks = -(-m // ft[0]) if m > ft[0] else 1
            rows.append((f"flat ({ft[0]}x{ft[1]}x{ft[2]}; {c})", flat, "steady state (flat)",
                         f"// {c} row(s)", ft, m, blocks))
            rows.append((f"gemm ({gt[0]}x{gt[1]}x{gt[2]}; {gt[0]})", gemm, "steady state: one", None,
                         gt, m, -(-m // gt[0])))
            rows.append((f"gemm at the flat tile ({ft[0]}x{ft[1]}x{ft[2]}; {ft[0]})", same,
                         "steady state: one", None, ft, m, -(-m // ft[0])))
        for name, listing, marker, after, t, m, blocks in rows:
            body, steps = loop(listing, marker, after)
            cyc, _ = mca(body, tool, mcpu, mattr)
            ep, hp, lp = t
            step_bytes = hp * lp * wbits // 8
            per_step = cyc / steps * blocks
            print(f"| {label} | {tool[-2:]} {mcpu} | {name} | {m} | {steps} | {len(body)} | {cyc:.2f} | "
                  f"{per_step:.2f} ({per_step / hp * 8:.2f} per 8 columns) | {step_bytes / per_step:.1f} |")


N = K = 4096  # Llama2-7B attention projections
L1 = 32 * 1024  # the smallest L1 data cache among the targets (Cortex-A72)

# (label, target, kernel, bits per weight, group (None: per row), asymmetric)
BYTES = [
    ("W4A8 g32 sdot", "aarch64-dotprod", "matmul-w4a8", 4, 32, True),
    ("W4A8 g32 smmla", "aarch64-i8mm", "matmul-w4a8", 4, 32, True),
    ("W8A8 sdot", "aarch64-dotprod", "matmul-w8a8", 8, None, False),
    ("F32", "aarch64-neon", "matmul-f32", 32, None, False),
    ("F16 .8h", "aarch64-fp16", "matmul-f16", 16, None, False),
]


def flat_plan(listing):
    m = re.search(r"flat: row block (\d+) x (\d+) per pass", listing)
    return int(m.group(1)), int(m.group(2))


def mb(b):
    return f"{b / 2**20:.2f}"


def bytes_table():
    print()
    print(f"Weight bytes per call at N = K = {N} (minimum = every weight and parameter byte once):")
    print()
    print("| format | M | minimum MB | flat: from memory MB | flat: re-read from L1 MB | flat rows computed | "
          "gemm: from memory MB | gemm: panel re-reads MB (from) | gemm rows computed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, target, kernel, bits, group, asym in BYTES:
        flat = emit(target, kernel, "flat-gemm")
        ep, blocks = flat_plan(flat)
        gemm = emit(target, kernel, "gemm")
        gep, ghp, _ = tile_of(gemm)
        weights = N * K * bits // 8
        params = 0 if bits >= 16 else N * (K // (group or K)) * 4 * (2 if asym else 1)
        total = weights + params
        gpanel = ghp * K * bits // 8
        where = "L1" if gpanel <= L1 else "L2"
        counts = row_counts(flat)
        for m in [1, 2, 4, 8, 12, 16]:
            passes = -(-m // (ep * blocks))
            fblocks = -(-m // ep)
            tail = m - (fblocks - 1) * ep
            frows = (fblocks - 1) * ep + next(c for c in counts if c >= tail)
            gblocks = -(-m // gep)
            print(f"| {label} | {m} | {mb(total)} | {mb(passes * total)} | {mb((fblocks - passes) * weights)} | "
                  f"{frows} | {mb(total)} | {mb((gblocks - 1) * weights)} ({where}, panel {gpanel // 1024} KiB) | "
                  f"{gblocks * gep} |")


if __name__ == "__main__":
    main()
    bytes_table()
