// ggml attention peer: times ggml_flash_attn_ext through the CPU backend for
// one query token (decode) or a causal prompt of --rows tokens (prefill), the
// way llama.cpp runs a layer's attention with flash attention on: the KV
// cache laid out token-major like llama.cpp's (and Tessera's) — one row of
// kvh·d values per token, each head a strided 3-d view of it — q in f32
// (ggml converts it for the dot products), scale 1/√d. Decode has no mask
// (every cached key is visible); prefill's f16 mask lets query row i of r
// see keys 0 .. ctx − r + i, llama.cpp's causal mask.
//
// Method (as ggml_peer.c and tessera-bench): rotate through cache copies
// totalling at least --total-mib so no step is served from L3, one untimed
// warm-up step per block (also checked against a double-precision reference
// of head 0 and the last head), time steps one by one, report the median.
//
// Output: one JSON object per line on stdout (an "info" line, then one line
// per (threads, ctx) block). Errors go to stderr with a non-zero exit.
//
// Usage: ggml_attention_peer --kv f16|q8_0 --hq 32 --kvh 32 --d 128
//                            --ctx 4096,32768 --threads 1,2 [--rows 1]
//                            [--total-mib 256] [--min-reps 5] [--min-time 0.4]
//                            [--max-time 1.5] [--sleep-ms 150]
#define _POSIX_C_SOURCE 200809L
#define PEER_NAME "ggml_attention_peer"
#include "peer_common.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

struct options {
    enum ggml_type kv;
    const char *kv_name;
    int64_t hq, kvh, d, rows;
    int ctxs[MAX_LIST], n_ctxs;
    int threads[MAX_LIST], n_threads;
    struct timing t;
};

static struct options parse_args(int argc, char **argv) {
    struct options o = {0};
    o.t = timing_defaults();
    o.rows = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) die("missing value for", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--kv")) {
            if (!strcmp(v, "f16")) o.kv = GGML_TYPE_F16;
            else if (!strcmp(v, "q8_0")) o.kv = GGML_TYPE_Q8_0;
            else die("unknown --kv (f16|q8_0)", v);
            o.kv_name = v;
        } else if (!strcmp(a, "--hq")) o.hq = (int64_t) parse_num(v);
        else if (!strcmp(a, "--kvh")) o.kvh = (int64_t) parse_num(v);
        else if (!strcmp(a, "--d")) o.d = (int64_t) parse_num(v);
        else if (!strcmp(a, "--rows")) o.rows = (int64_t) parse_num(v);
        else if (!strcmp(a, "--ctx")) o.n_ctxs = parse_list(v, o.ctxs, 1L << 24);
        else if (!strcmp(a, "--threads")) o.n_threads = parse_list(v, o.threads, 1L << 20);
        else if (parse_timing_option(a, v, &o.t)) {}
        else die("unknown option", a);
    }
    if (!o.kv_name) die("--kv is required", NULL);
    if (o.hq <= 0 || o.kvh <= 0 || o.d <= 0) die("--hq, --kvh and --d are required and positive", NULL);
    if (o.rows <= 0) die("--rows must be positive", NULL);
    if (o.hq % o.kvh) die("--hq must be a multiple of --kvh", NULL);
    if (o.kv == GGML_TYPE_Q8_0 && o.d % 32) die("q8_0 rows need d a multiple of 32", NULL);
    if (o.n_ctxs == 0 || o.n_threads == 0) die("--ctx and --threads are required", NULL);
    return o;
}

// Attention of query head h of the last query row (which sees every key)
// over the cache rows (as stored, dequantized), in double: the reference the
// warm-up step is checked against. q is [d, rows, hq], the result [d, hq, rows].
static double check_head(const struct options *o, int64_t ctx, int64_t h, const float *qs, const float *kf,
                         const float *vf, const float *outs) {
    const float *q = qs + ((h + 1) * o->rows - 1) * o->d;
    const float *out = outs + (o->rows - 1) * o->hq * o->d;
    const int64_t d = o->d, kvh = o->kvh, g = o->hq / o->kvh, kh = h / g;
    double *p = malloc(sizeof(double) * (size_t) ctx);
    if (!p) die("out of memory", NULL);
    double mx = -INFINITY;
    for (int64_t t = 0; t < ctx; t++) {
        double s = 0;
        for (int64_t i = 0; i < d; i++) s += (double) q[i] * (double) kf[(t * kvh + kh) * d + i];
        p[t] = s / sqrt((double) d);
        if (p[t] > mx) mx = p[t];
    }
    double den = 0;
    for (int64_t t = 0; t < ctx; t++) den += (p[t] = exp(p[t] - mx));
    double err = 0;
    for (int64_t i = 0; i < d; i++) {
        double o_i = 0;
        for (int64_t t = 0; t < ctx; t++) o_i += p[t] * (double) vf[(t * kvh + kh) * d + i];
        o_i /= den;
        // The result is [d, hq, 1]: head h's d values are contiguous.
        err = fmax(err, fabs(o_i - (double) out[h * d + i]));
    }
    free(p);
    return err;
}

int main(int argc, char **argv) {
    struct options o = parse_args(argc, argv);
    const int64_t d = o.d, hq = o.hq, kvh = o.kvh;
    ggml_log_set(quiet_log, NULL);

    ggml_backend_t backend = ggml_backend_cpu_init();
    if (!backend) die("ggml_backend_cpu_init failed", NULL);
    const struct ggml_type_traits *traits = ggml_get_type_traits(o.kv);

    printf("{\"info\":\"ggml-fa-%s\",\"detail\":\"ggml %s (%s), ggml_flash_attn_ext on the CPU backend, "
           "token-major %s cache, %lld query row(s), causal\"}\n",
           o.kv_name, ggml_version(), ggml_commit(), o.kv_name, (long long) o.rows);
    fflush(stdout);

    double *times = malloc(sizeof(double) * 100000);
    if (!times) die("out of memory", NULL);
    for (int ci = 0; ci < o.n_ctxs; ci++) {
        const int64_t ctx = o.ctxs[ci];
        const int64_t row = kvh * d;  // values per token (all heads)
        const size_t row_bytes = ggml_row_size(o.kv, row);
        const size_t cache_bytes = 2 * row_bytes * (size_t) ctx;  // K and V
        int copies = (int) ceil(o.t.total_mib * 1024.0 * 1024.0 / (double) cache_bytes);
        if (copies < 2) copies = 2;

        // One copy's bytes (every copy holds the same), and their values
        // as ggml reads them back (the reference's input).
        float *src = malloc(sizeof(float) * (size_t) (row * ctx));
        void *kq = malloc(row_bytes * (size_t) ctx), *vq = malloc(row_bytes * (size_t) ctx);
        float *kf = malloc(sizeof(float) * (size_t) (row * ctx)), *vf = malloc(sizeof(float) * (size_t) (row * ctx));
        if (!src || !kq || !vq || !kf || !vf) die("out of memory", NULL);
        for (int pass = 0; pass < 2; pass++) {
            void *dst = pass ? vq : kq;
            float *back = pass ? vf : kf;
            for (int64_t i = 0; i < row * ctx; i++) src[i] = uniform_pm1();
            if (o.kv == GGML_TYPE_F16) ggml_fp32_to_fp16_row(src, dst, row * ctx);
            else ggml_quantize_chunk(o.kv, src, dst, 0, ctx, row, NULL);
            for (int64_t t = 0; t < ctx; t++) traits->to_float((const char *) dst + (size_t) t * row_bytes, back + t * row, row);
        }
        free(src);

        struct ggml_init_params cp = {ggml_tensor_overhead() * (size_t) (8 * copies + 4) +
                                          ggml_graph_overhead_custom(8, false) * (size_t) copies + 4096,
                                      NULL, true};
        struct ggml_context *cctx = ggml_init(cp);
        if (o.rows > ctx) die("--rows must not exceed the context", NULL);
        struct ggml_tensor *q = ggml_new_tensor_3d(cctx, GGML_TYPE_F32, d, o.rows, hq);
        struct ggml_tensor *mask = o.rows > 1 ? ggml_new_tensor_2d(cctx, GGML_TYPE_F16, ctx, o.rows) : NULL;
        struct ggml_tensor **kc = calloc((size_t) copies, sizeof *kc), **vc = calloc((size_t) copies, sizeof *vc);
        struct ggml_tensor **out = calloc((size_t) copies, sizeof *out);
        struct ggml_cgraph **g = calloc((size_t) copies, sizeof *g);
        if (!kc || !vc || !out || !g) die("out of memory", NULL);
        for (int c = 0; c < copies; c++) {
            kc[c] = ggml_new_tensor_2d(cctx, o.kv, row, ctx);
            vc[c] = ggml_new_tensor_2d(cctx, o.kv, row, ctx);
        }
        ggml_backend_buffer_t cbuf = ggml_backend_alloc_ctx_tensors(cctx, backend);
        if (!cbuf) die("allocating the cache copies failed", NULL);
        for (int c = 0; c < copies; c++) {
            ggml_backend_tensor_set(kc[c], kq, 0, row_bytes * (size_t) ctx);
            ggml_backend_tensor_set(vc[c], vq, 0, row_bytes * (size_t) ctx);
        }
        float *qs = (float *) q->data;
        for (int64_t i = 0; i < hq * d * o.rows; i++) qs[i] = uniform_pm1();
        if (mask) {
            ggml_fp16_t *m = (ggml_fp16_t *) mask->data;
            for (int64_t r = 0; r < o.rows; r++)
                for (int64_t j = 0; j < ctx; j++)
                    m[r * ctx + j] = ggml_fp32_to_fp16(j <= ctx - o.rows + r ? 0.0f : -INFINITY);
        }

        // Graphs: each head of a copy is a strided view of its token rows.
        struct ggml_context *gctx = ggml_init(cp);
        for (int c = 0; c < copies; c++) {
            const size_t head_bytes = ggml_row_size(o.kv, d);
            struct ggml_tensor *k = ggml_view_3d(gctx, kc[c], d, ctx, kvh, row_bytes, head_bytes, 0);
            struct ggml_tensor *v = ggml_view_3d(gctx, vc[c], d, ctx, kvh, row_bytes, head_bytes, 0);
            out[c] = ggml_flash_attn_ext(gctx, q, k, v, mask, 1.0f / sqrtf((float) d), 0.0f, 0.0f);
            g[c] = ggml_new_graph_custom(gctx, 8, false);
            ggml_build_forward_expand(g[c], out[c]);
        }
        ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend));

        for (int ti = 0; ti < o.n_threads; ti++) {
            ggml_backend_cpu_set_n_threads(backend, o.threads[ti]);
            // Warm-up and check on the last copy.
            if (!ggml_gallocr_alloc_graph(galloc, g[copies - 1])) die("allocating the graph failed", NULL);
            if (ggml_backend_graph_compute(backend, g[copies - 1]) != GGML_STATUS_SUCCESS) die("compute failed", NULL);
            const float *os = (const float *) out[copies - 1]->data;
            const double err = fmax(check_head(&o, ctx, 0, qs, kf, vf, os), check_head(&o, ctx, hq - 1, qs, kf, vf, os));

            int reps = 0, c = 0;
            double total = 0;
            while (reps < 100000) {
                if (!ggml_gallocr_alloc_graph(galloc, g[c])) die("allocating the graph failed", NULL);
                const double t0 = now_s();
                ggml_backend_graph_compute(backend, g[c]);
                const double dt = now_s() - t0;
                times[reps++] = dt;
                total += dt;
                c = (c + 1) % copies;
                if (block_done(&o.t, reps, total)) break;
            }
            const double median = median_of(times, reps);
            printf("{\"impl\":\"ggml-fa-%s\",\"hq\":%lld,\"kvh\":%lld,\"d\":%lld,\"ctx\":%lld,\"rows\":%lld,\"threads\":%d,"
                   "\"median_s\":%.9g,\"min_s\":%.9g,\"reps\":%d,\"copies\":%d,\"kv_bytes\":%zu,\"max_abs_err\":%.6g}\n",
                   o.kv_name, (long long) hq, (long long) kvh, (long long) d, (long long) ctx, (long long) o.rows,
                   o.threads[ti], median,
                   times[0], reps, copies, cache_bytes, err);
            fflush(stdout);
            sleep_ms(o.t.sleep_ms);
        }
        ggml_gallocr_free(galloc);
        ggml_free(gctx);
        ggml_backend_buffer_free(cbuf);
        ggml_free(cctx);
        free(kc); free(vc); free(out); free(g);
        free(kq); free(vq); free(kf); free(vf);
    }
    free(times);
    ggml_backend_free(backend);
    return 0;
}
