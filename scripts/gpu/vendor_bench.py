#!/usr/bin/env python3
"""Vendor baselines (cuBLAS through torch, torch SDPA) and a report against Tessera's timings.

  vendor_bench.py measure --out vendor.jsonl [--only bandwidth,linear,attention,prefill]
  vendor_bench.py report --ours ours.jsonl --vendor vendor.jsonl --out report.md

Timing method (measure):
  * Bandwidth: read = best of 20 timed single calls of a pure read reduction
    (torch.sum and torch.amax, best of both) over a float32 buffer of up to 4 GiB,
    GB/s = bytes / s / 1e9.  Copy = best of 20 dst.copy_(src) over 2 GiB, counting
    read + write bytes.
  * Linear / attention: one shape's weights (or K/V) fit in the 50-60 MB L2, so we
    allocate enough distinct copies that together they exceed 4x the L2 size (at
    least 2, at most 8 GiB per shape) and rotate through them, call i using copy
    i % copies, so every timed call reads its operands from DRAM.  After a warm-up,
    a batch of 20-200 calls (sized to about 4 ms) is captured in a CUDA graph (so
    Python launch overhead does not count; eager launches if capture fails, see the
    "timing" field), the batch is timed with torch.cuda.Event(enable_timing=True)
    and divided by the call count; the batch is repeated 7 times and the median
    per-call time is reported in microseconds.
  * Prefill: torch SDPA with is_causal=True on f16 q [1, hq, t, d] and k, v
    [1, kvh, t, d] (GQA by enable_gqa where torch has it, else K/V expanded before
    timing), the same graph-batched median; operands stay in the L2 (compute-bound),
    TFLOP/s counts the causal half: 4·hq·d·t(t+1)/2.
  * A failing measurement writes {"kind":"error",...} and the run goes on.
"""
import argparse, json, math, statistics, sys, time

LLAMA_SHAPES = [(4096, 4096), (11008, 4096), (4096, 11008), (12288, 4096)]  # (N, K)
MS = [1, 2, 4, 8, 16, 32, 64, 128, 512, 2048]
CTXS = [4096, 8192, 16384, 32768]
HQ, KVH, HD = 32, 32, 128
PREFILL_HEADS = [("llama2-7b", 32, 32, 128), ("qwen2-1.5b", 12, 2, 128)]
PROMPTS = [128, 512, 2048]
GiB = 1 << 30
CAP_BYTES = 8 * GiB
BATCH_TARGET_US, MIN_CALLS, MAX_CALLS, REPEATS = 4000.0, 20, 200, 7


def log(*a):
    print("[vendor_bench]", *a, file=sys.stderr, flush=True)


# ----------------------------------------------------------------- measure

def measure(out_path, only=None):
    want = lambda what: not only or what in only
    import torch
    import torch.nn.functional as F
    assert torch.cuda.is_available(), "no CUDA device"
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = int(getattr(props, "L2_cache_size", 0) or 50 * (1 << 20))
    gpu = torch.cuda.get_device_name(dev)
    t_start = time.time()
    out = open(out_path, "w")

    def emit(rec):
        out.write(json.dumps(rec) + "\n")
        out.flush()

    def sync():
        torch.cuda.synchronize()

    def event_us(fn):  # one timed call, microseconds
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize()
        return s.elapsed_time(e) * 1e3

    def copies_for(nbytes):
        return max(2, min(math.ceil(4 * l2 / nbytes) + 1, CAP_BYTES // nbytes))

    def time_rotated(call, ncopies):
        """call(i) launches one call on copy i % ncopies. Returns (median µs, mode)."""
        for i in range(max(3, ncopies)):
            call(i)
        sync()
        def loop(count):  # keeps no outputs alive (a list of 200 outputs could be GBs)
            for i in range(count):
                call(i)
        est = event_us(lambda: loop(ncopies)) / ncopies
        calls = int(min(MAX_CALLS, max(MIN_CALLS, BATCH_TARGET_US / max(est, 1e-3))))
        batch = lambda: loop(calls)
        run, mode, graph = batch, "eager", None
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for i in range(3):
                    call(i)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                batch()
            run, mode = graph.replay, "graph"
        except Exception as ex:  # fall back to eager launches
            log(f"  graph capture failed ({type(ex).__name__}: {ex}); timing eager")
            graph = None
            try:
                sync()
            except Exception:
                pass
        run(); sync()
        per_call = [event_us(run) / calls for _ in range(REPEATS)]
        del graph
        return statistics.median(per_call), mode, calls

    def guarded(what, fn):
        try:
            fn()
        except Exception as ex:
            log(f"ERROR {what}: {type(ex).__name__}: {ex}")
            emit({"kind": "error", "what": what, "error": f"{type(ex).__name__}: {ex}"})
        finally:
            try:
                sync(); torch.cuda.empty_cache()
            except Exception:
                pass

    log(f"{gpu}: {props.multi_processor_count} SMs, L2 {l2 / 2**20:.0f} MiB")

    # -- bandwidth
    def bandwidth():
        free, _ = torch.cuda.mem_get_info()
        nbytes = min(4 * GiB, (free // 4) // (1 << 20) * (1 << 20))
        x = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
        best = 0.0
        for red in (torch.sum, torch.amax):
            for _ in range(3):
                red(x)
            sync()
            best = max(best, max(nbytes / (event_us(lambda: red(x)) * 1e-6) / 1e9 for _ in range(20)))
        del x
        torch.cuda.empty_cache()
        half = nbytes // 2
        src = torch.ones(half // 4, dtype=torch.float32, device=dev)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        sync()
        copy = max(2 * half / (event_us(lambda: dst.copy_(src)) * 1e-6) / 1e9 for _ in range(20))
        rec = {"kind": "bandwidth", "read_gbs": round(best, 1), "copy_gbs": round(copy, 1),
               "gpu": gpu, "l2_bytes": l2, "sms": props.multi_processor_count,
               "buffer_bytes": nbytes}
        emit(rec)
        log(f"bandwidth: read {best:.0f} GB/s, copy {copy:.0f} GB/s")

    if want("bandwidth"):
        guarded("bandwidth", bandwidth)

    # -- cuBLAS f16 linear
    for n, k in (LLAMA_SHAPES if want("linear") else []):
        wbytes = n * k * 2
        state = {}

        def alloc():
            nc = copies_for(wbytes)
            w0 = torch.randn(n, k, dtype=torch.float16, device=dev) * 0.02
            state["ws"] = [w0] + [w0.clone() for _ in range(nc - 1)]
            log(f"linear N={n} K={k}: {nc} weight copies ({nc * wbytes / 2**20:.0f} MiB)")

        guarded(f"linear alloc n={n} k={k}", alloc)
        if "ws" not in state:
            continue
        ws = state["ws"]
        for m in MS:
            def one(m=m):
                x = torch.randn(m, k, dtype=torch.float16, device=dev)
                us, mode, calls = time_rotated(lambda i: F.linear(x, ws[i % len(ws)]), len(ws))
                emit({"kind": "linear", "vendor": "cublas-f16", "m": m, "n": n, "k": k,
                      "us": round(us, 3), "weight_bytes": wbytes, "copies": len(ws),
                      "calls": calls, "timing": mode})
                log(f"  M={m:5d}: {us:9.2f} us ({mode})")
            guarded(f"linear m={m} n={n} k={k}", one)
        del ws, state["ws"]
        torch.cuda.empty_cache()

    # -- torch SDPA decode attention
    for s_ctx in (CTXS if want("attention") else []):
        def attn(s_ctx=s_ctx):
            kv_bytes = 2 * s_ctx * KVH * HD * 2
            nc = copies_for(kv_bytes)
            q = torch.randn(1, HQ, 1, HD, dtype=torch.float16, device=dev)
            k0 = torch.randn(1, KVH, s_ctx, HD, dtype=torch.float16, device=dev)
            v0 = torch.randn(1, KVH, s_ctx, HD, dtype=torch.float16, device=dev)
            kvs = [(k0, v0)] + [(k0.clone(), v0.clone()) for _ in range(nc - 1)]
            sdpa = F.scaled_dot_product_attention

            def call(i):
                kk, vv = kvs[i % nc]
                return sdpa(q, kk, vv)
            us, mode, calls = time_rotated(call, nc)
            emit({"kind": "attention", "vendor": "torch-sdpa", "ctx": s_ctx, "hq": HQ, "kvh": KVH,
                  "d": HD, "us": round(us, 3), "kv_bytes": kv_bytes, "copies": nc,
                  "calls": calls, "timing": mode})
            log(f"attention ctx={s_ctx}: {us:.2f} us ({mode}, {nc} KV copies)")
        guarded(f"attention ctx={s_ctx}", attn)

    # -- torch SDPA causal prefill
    for heads, hq, kvh, hd in (PREFILL_HEADS if want("prefill") else []):
        for t in PROMPTS:
            def pre(heads=heads, hq=hq, kvh=kvh, hd=hd, t=t):
                q = torch.randn(1, hq, t, hd, dtype=torch.float16, device=dev) * 0.09
                k = torch.randn(1, kvh, t, hd, dtype=torch.float16, device=dev)
                v = torch.randn(1, kvh, t, hd, dtype=torch.float16, device=dev)
                sdpa = F.scaled_dot_product_attention
                try:
                    sdpa(q, k, v, is_causal=True, enable_gqa=True)
                    call = lambda i: sdpa(q, k, v, is_causal=True, enable_gqa=True)
                    gqa = "enable_gqa"
                except TypeError:
                    ke = k.repeat_interleave(hq // kvh, dim=1)
                    ve = v.repeat_interleave(hq // kvh, dim=1)
                    call = lambda i: sdpa(q, ke, ve, is_causal=True)
                    gqa = "expanded"
                us, mode, calls = time_rotated(call, 1)
                flops = 4 * hq * hd * t * (t + 1) // 2
                emit({"kind": "prefill", "vendor": "torch-sdpa", "heads": heads, "t": t, "hq": hq,
                      "kvh": kvh, "d": hd, "us": round(us, 3), "flops": flops, "gqa": gqa,
                      "calls": calls, "timing": mode})
                log(f"prefill {heads} t={t}: {us:.2f} us ({flops / us / 1e6:.1f} TFLOP/s, {mode})")
            guarded(f"prefill {heads} t={t}", pre)

    out.close()
    log(f"done in {time.time() - t_start:.1f} s -> {out_path}")


# ----------------------------------------------------------------- report

def load(path):
    recs = []
    if not path:
        return recs
    try:
        lines = open(path).read().splitlines()
    except OSError as ex:
        log(f"cannot read {path}: {ex}")
        return recs
    for no, line in enumerate(lines, 1):
        if line.strip():
            try:
                rec = json.loads(line)
                if isinstance(rec, dict):
                    recs.append(rec)
            except ValueError:
                log(f"{path}:{no}: not JSON, skipped")
    return recs


def fmt_order(names, preferred):
    return [f for f in preferred if f in names] + sorted(set(names) - set(preferred))


def f1(v, nd=1, suffix=""):
    return "—" if v is None else f"{v:.{nd}f}{suffix}"


def report(ours_path, vendor_path, out_path):
    ours, vendor = load(ours_path), load(vendor_path)
    bw = next((r for r in vendor if r.get("kind") == "bandwidth"), {})

    def num(r, key):
        v = r.get(key)
        return float(v) if isinstance(v, (int, float)) and v > 0 else None
    read_bw, l2 = num(bw, "read_gbs"), num(bw, "l2_bytes")

    def valid(r):  # a timing line with positive "us" and integer shape fields
        keys = {"linear": ("n", "k", "m"), "attention": ("ctx",)}.get(r.get("kind"))
        return keys and num(r, "us") and all(isinstance(r.get(q), int) and r[q] > 0 for q in keys)

    # ours_lin[(fmt, n, k, m)] = {variant: (us, weight_bytes)}; duplicates keep the fastest
    ours_lin, ours_att, cub, sdpa = {}, {}, {}, {}
    for r in filter(valid, ours):
        us = r["us"]
        if r["kind"] == "linear":
            d = ours_lin.setdefault((str(r.get("format", "?")), r["n"], r["k"], r["m"]), {})
            var = str(r.get("variant", "?"))
            if var not in d or us < d[var][0]:
                d[var] = (us, num(r, "weight_bytes") or r["n"] * r["k"] * 2)  # f16 bytes if absent
        else:
            key = (str(r.get("kv", "?")), r["ctx"])
            if key not in ours_att or us < ours_att[key][0]:
                ours_att[key] = (us, num(r, "kv_bytes") or 2 * r["ctx"] * KVH * HD * 2)
    for r in filter(valid, vendor):
        table, key = (cub, (r["n"], r["k"], r["m"])) if r["kind"] == "linear" else (sdpa, r["ctx"])
        table[key] = min(r["us"], table.get(key, math.inf))

    def best(fmt, n, k, m, prefer=None):
        d = ours_lin.get((fmt, n, k, m))
        if not d:
            return None
        var = prefer if prefer in d else min(d, key=lambda v: (d[v][0], v))
        return (var,) + d[var]

    gbs = lambda nbytes, us: nbytes / us / 1e3 if nbytes and us else None
    pct = lambda g: 100 * g / read_bw if g is not None and read_bw else None
    tflops = lambda m, n, k, us: 2 * m * n * k / us / 1e6
    ratio = lambda a, b: a / b if a is not None and b is not None else None

    L = ["# Tessera vs vendor (cuBLAS f16 / torch SDPA)", ""]
    L += [f"- GPU: {bw.get('gpu', '—')}, SMs: {bw.get('sms', '—')}, L2: "
          + f1(l2 and l2 / 2**20, 0, " MiB"),
          f"- Measured DRAM read bandwidth: {f1(read_bw, 0, ' GB/s')}; "
          f"device copy (read+write): {f1(num(bw, 'copy_gbs'), 0, ' GB/s')}",
          "- Speedup = cuBLAS µs / our µs (> 1 means Tessera is faster). "
          "M ≤ 16: GB/s of weights and % of measured read bandwidth; M > 16: TFLOP/s.", ""]

    shapes = set((n, k) for (_, n, k, _) in ours_lin) | set((n, k) for (n, k, _) in cub)
    shapes = [s for s in LLAMA_SHAPES if s in shapes] + sorted(shapes - set(LLAMA_SHAPES))
    fmts = fmt_order({f for (f, _, _, _) in ours_lin}, ["w4a16", "w8a16", "f16"])
    L += ["## Linear y[M,N] = x[M,K] · W[N,K]ᵀ", ""]
    for n, k in shapes:
        ms = sorted({m for (f, nn, kk, m) in ours_lin if (nn, kk) == (n, k)}
                    | {m for (nn, kk, m) in cub if (nn, kk) == (n, k)})
        L += [f"### N={n}, K={k} (f16 weights {n * k * 2 / 2**20:.0f} MiB)", ""]
        head = ["M", "cuBLAS µs", "cuBLAS rate"]
        for f in fmts:
            head += [f"{f} µs (variant)", f"{f} rate", f"{f} speedup"]
        L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for m in ms:
            cu = cub.get((n, k, m))

            def rate(us, nbytes):
                if us is None:
                    return "—"
                if m <= 16:
                    g = gbs(nbytes, us)
                    return f"{g:.0f} GB/s ({f1(pct(g), 0, '%')})"
                return f"{tflops(m, n, k, us):.1f} TFLOP/s"
            row = [str(m), f1(cu, 2), rate(cu, n * k * 2)]
            for f in fmts:
                b = best(f, n, k, m)
                if b is None:
                    row += ["—", "—", "—"]
                else:
                    row += [f"{b[1]:.2f} ({b[0]})", rate(b[1], b[2]), f1(ratio(cu, b[1]), 2, "×")]
            L.append("| " + " | ".join(row) + " |")
        L.append("")

    pre_ours, pre_sdpa = {}, {}
    for r in ours + vendor:
        if r.get("kind") != "prefill" or not num(r, "us") or not isinstance(r.get("t"), int):
            continue
        if "vendor" in r:
            pre_sdpa[(r.get("heads"), r["t"])] = r
        else:
            pre_ours[(r.get("heads"), r.get("kv"), r["t"])] = r
    if pre_ours or pre_sdpa:
        L += ["## Causal prefill (p = 0, d = 128; TFLOP/s of the causal half)", ""]
        head = ["heads", "t", "SDPA µs (TFLOP/s)", "f16 µs (TFLOP/s)", "f16 vs SDPA",
                "kv8 µs (TFLOP/s)", "per-token path µs (f16 speedup)"]
        L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        tf = lambda r: f"{r['us']:.1f} ({r['flops'] / r['us'] / 1e6:.1f})" if r else "—"
        for hk, t in sorted({(h, t) for (h, _, t) in pre_ours} | set(pre_sdpa)):
            sd, f, k8 = pre_sdpa.get((hk, t)), pre_ours.get((hk, "f16", t)), pre_ours.get((hk, "kv8", t))
            ptok = num(f, "per_token_us") if f else None
            L.append("| " + " | ".join([
                str(hk), str(t), tf(sd), tf(f),
                f1(ratio(sd["us"] if sd else None, f["us"] if f else None), 2, "×"), tf(k8),
                f"{ptok:.0f} ({ptok / f['us']:.1f}×)" if ptok else "—"]) + " |")
        L.append("")

    L += ["## Decode attention (1 query token, hq=32, kvh=32, d=128)", ""]
    kvf = fmt_order({f for (f, _) in ours_att}, ["f16", "kv8"])
    ctxs = sorted({c for (_, c) in ours_att} | set(sdpa))
    head = ["ctx", "SDPA µs", "SDPA GB/s (%BW)"]
    for f in kvf:
        head += [f"{f} µs", f"{f} GB/s (%BW)", f"{f} speedup"]
    L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in ctxs:
        su = sdpa.get(c)
        sg = gbs(2 * c * KVH * HD * 2, su)
        row = [str(c), f1(su, 2), f"{f1(sg, 0)} ({f1(pct(sg), 0, '%')})"]
        for f in kvf:
            o = ours_att.get((f, c))
            if o is None:
                row += ["—", "—", "—"]
            else:
                g = gbs(o[1], o[0])
                row += [f"{o[0]:.2f}", f"{f1(g, 0)} ({f1(pct(g), 0, '%')})", f1(ratio(su, o[0]), 2, "×")]
        L.append("| " + " | ".join(row) + " |")
    L.append("")

    # -- targets
    L += ["## Targets", ""]
    tally = [0, 0]

    def target(label, ok, detail):
        tally[1] += 1
        tally[0] += int(ok is True)
        status = "met" if ok is True else ("NOT met (missing data)" if ok is None else "NOT met")
        L.append(f"- {label}: **{status}** — {detail}")

    L.append("(a) W4A16 GEMV, M=1: ≥ 80% of read bandwidth and ≥ 2.5× cuBLAS f16")
    for n, k in LLAMA_SHAPES:
        b, cu = best("w4a16", n, k, 1, prefer="gemv"), cub.get((n, k, 1))
        if b is None:
            target(f"N={n} K={k}", None, f"ours —, cuBLAS {f1(cu, 2, ' µs')}")
            continue
        p, sp = pct(gbs(b[2], b[1])), ratio(cu, b[1])
        ok = None if p is None or sp is None else (p >= 80 and sp >= 2.5)
        target(f"N={n} K={k}", ok, f"ours {b[1]:.2f} µs ({b[0]}), {gbs(b[2], b[1]):.0f} GB/s = "
               f"{f1(p, 1, '%')} of read BW, cuBLAS {f1(cu, 2, ' µs')}, speedup {f1(sp, 2, '×')}")
    L += ["", "(b) flat GEMM W4A16, M=2..16: ≥ 2× cuBLAS f16 at the same M"]
    ms_b = sorted({m for (f, _, _, m) in ours_lin if f == "w4a16" and 2 <= m <= 16}
                  | {m for (_, _, m) in cub if 2 <= m <= 16}) or [2, 4, 8, 16]
    for n, k in LLAMA_SHAPES:
        for m in ms_b:
            b, cu = best("w4a16", n, k, m, prefer="flat"), cub.get((n, k, m))
            sp = ratio(cu, b[1]) if b else None
            ok = None if sp is None else sp >= 2.0
            ours_s = f"{b[1]:.2f} µs ({b[0]})" if b else "—"
            target(f"N={n} K={k} M={m}", ok, f"ours {ours_s}, cuBLAS {f1(cu, 2, ' µs')}, "
                   f"speedup {f1(sp, 2, '×')}")
    L += ["", "(c) decode attention, f16 KV, ctx 4096–32768: ≥ 80% of read bandwidth"]
    ctx_c = sorted({c for (f, c) in ours_att if f == "f16" and 4096 <= c <= 32768}
                   | set(CTXS))
    for c in ctx_c:
        o = ours_att.get(("f16", c))
        g = gbs(o[1], o[0]) if o else None
        p = pct(g)
        target(f"ctx={c}", None if p is None else p >= 80,
               f"ours {f1(o[0] if o else None, 2, ' µs')}, {f1(g, 0, ' GB/s')}, {f1(p, 1, '%')} of read BW")
    L += ["", f"**{tally[0]} of {tally[1]} targets met.**", ""]

    checks = [r for r in ours if r.get("kind") == "check"]
    if checks:
        L += ["## Correctness checks", ""]
        for r in sorted(checks, key=lambda r: str(r.get("name"))):
            L.append(f"- {r.get('name', '?')}: **{r.get('status', '?')}**"
                     + (f" — {r['detail']}" if r.get("detail") else ""))
        L.append("")
    errors = [r for r in ours + vendor if r.get("kind") == "error"]
    if errors:
        L += ["## Measurement errors", ""]
        L += [f"- {r.get('what', '?')}: {r.get('error', '?')}" for r in errors] + [""]

    text = "\n".join(L).rstrip("\n") + "\n"
    print(text, end="")
    if out_path:
        with open(out_path, "w") as fh:
            fh.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="time cuBLAS f16 linear and torch SDPA on this GPU")
    m.add_argument("--out", required=True)
    m.add_argument("--only", help="comma-separated: bandwidth, linear, attention, prefill")
    r = sub.add_parser("report", help="merge our timings with the vendor ones into Markdown")
    r.add_argument("--ours", required=True)
    r.add_argument("--vendor", required=True)
    r.add_argument("--out")
    a = ap.parse_args()
    if a.cmd == "measure":
        measure(a.out, set(a.only.split(",")) if a.only else None)
    else:
        report(a.ours, a.vendor, a.out)


if __name__ == "__main__":
    main()
