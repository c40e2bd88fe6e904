#!/usr/bin/env python3
"""numpy (OpenBLAS) peer for tessera-bench: times y = x @ W.T, W [N, K] f32 C-contiguous.

Same method as tessera-bench (see bench/README.md): rotate through weight copies
totalling at least --total-mib so no call is served from L3, one untimed warm-up
call per block, time calls one by one, report the median; stop once
(reps >= min-reps and time >= min-time) or (reps >= 3 and time >= max-time);
sleep --sleep-ms between blocks (OpenBLAS threads spin after a call).

Run it as tessera-bench does, with OpenBLAS's overrides unset in this command only:
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python3 numpy_peer.py --n 4096 --k 4096 --m 1,8 --threads 1,2

Output: JSON lines on stdout: one "info" line (numpy and OpenBLAS version and kernel
as threadpoolctl reports them), then one line per (threads, m) block.
"""

import argparse
import json
import math
import sys
import time


def parse_list(text):
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad list {text!r}")
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"bad list {text!r}")
    return values


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--m", type=parse_list, required=True)
    ap.add_argument("--threads", type=parse_list, required=True)
    ap.add_argument("--total-mib", type=float, default=256.0)
    ap.add_argument("--min-reps", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.4)
    ap.add_argument("--max-time", type=float, default=1.5)
    ap.add_argument("--sleep-ms", type=int, default=150)
    args = ap.parse_args()
    if args.n <= 0 or args.k <= 0:
        ap.error("--n and --k must be positive")

    try:
        import numpy as np
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError as e:
        print(f"numpy_peer: {e}; install with: pip install numpy threadpoolctl", file=sys.stderr)
        return 3

    n, k = args.n, args.k
    rng = np.random.default_rng(0x7E55E7A)
    w0 = (rng.random((n, k), dtype=np.float32) * 2.0 - 1.0).astype(np.float32)
    w_bytes = w0.nbytes
    copies = max(2, math.ceil(args.total_mib * 1024 * 1024 / w_bytes))
    weights = [np.ascontiguousarray(w0.copy()) for _ in range(copies)]
    del w0

    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    detail = "; ".join(
        f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')} kernels"
        for i in blas
    ) or "no BLAS found by threadpoolctl"
    print(json.dumps({"info": "numpy", "detail": f"numpy {np.__version__}, {detail}"}), flush=True)

    for threads in args.threads:
        with threadpool_limits(limits=threads, user_api="blas"):
            for m in args.m:
                x = (rng.random((m, k), dtype=np.float32) * 2.0 - 1.0).astype(np.float32)
                y = np.empty((m, n), dtype=np.float32)
                # Warm-up, also the correctness check (3 rows of W, first and last row of x).
                np.matmul(x, weights[-1].T, out=y)
                rows = [0, n // 2, n - 1]
                ref = x[[0, m - 1]].astype(np.float64) @ weights[-1][rows].astype(np.float64).T
                got = y[[0, m - 1]][:, rows].astype(np.float64)
                scale = max(float(np.abs(ref).max()), math.sqrt(k) / 3.0)
                max_rel_err = float(np.abs(ref - got).max()) / scale

                times = []
                total = 0.0
                c = 0
                while True:
                    w = weights[c]
                    t0 = time.perf_counter()
                    np.matmul(x, w.T, out=y)
                    dt = time.perf_counter() - t0
                    times.append(dt)
                    total += dt
                    c = (c + 1) % copies
                    if (len(times) >= args.min_reps and total >= args.min_time) or (
                        len(times) >= 3 and total >= args.max_time
                    ):
                        break
                times.sort()
                reps = len(times)
                median = times[reps // 2] if reps % 2 else 0.5 * (times[reps // 2 - 1] + times[reps // 2])
                print(
                    json.dumps(
                        {
                            "impl": "numpy",
                            "n": n,
                            "k": k,
                            "m": m,
                            "threads": threads,
                            "median_s": median,
                            "min_s": times[0],
                            "reps": reps,
                            "copies": copies,
                            "weight_bytes": w_bytes,
                            "max_rel_err": max_rel_err,
                        }
                    ),
                    flush=True,
                )
                time.sleep(args.sleep_ms / 1000.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
