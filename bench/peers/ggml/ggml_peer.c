// ggml peer for tessera-bench: times ggml_mul_mat (y = x·Wᵀ, W [N, K] quantized)
// through the CPU backend, the way llama.cpp runs a linear layer:
//   q4_0: weights in the CPU_REPACK buffer type (repacked 8x8 on AVX2),
//   q8_0: weights in the plain CPU buffer (no x86 repack exists for Q8_0).
// x is f32; ggml quantizes it to Q8_0 inside every call, so that is timed too.
//
// Method (same as tessera-bench, see bench/README.md): rotate through weight
// copies totalling at least --total-mib so no call is served from L3, one
// untimed warm-up call per block, time calls one by one, report the median;
// stop once (reps >= min-reps and time >= min-time) or (reps >= 3 and time >=
// max-time); sleep --sleep-ms between blocks.
//
// Output: one JSON object per line on stdout (an "info" line, then one line
// per (threads, m) block). Errors go to stderr with a non-zero exit.
//
// Usage: ggml_peer --type q4_0|q8_0 --n N --k K --m 1,8,64 --threads 1,2
//                  [--total-mib 256] [--min-reps 5] [--min-time 0.4]
//                  [--max-time 1.5] [--sleep-ms 150] [--repack yes|no]
// (--repack no keeps Q4_0 in the plain CPU buffer, for comparison.)
#define _POSIX_C_SOURCE 200809L
#define PEER_NAME "ggml_peer"
#include "peer_common.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

struct options {
    enum ggml_type type;
    const char *type_name;
    int64_t n, k;
    int ms[MAX_LIST], n_ms;
    int threads[MAX_LIST], n_threads;
    struct timing t;
    int no_repack;
};

static struct options parse_args(int argc, char **argv) {
    struct options o = {0};
    o.t = timing_defaults();
    o.type_name = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) die("missing value for", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--type")) {
            if (!strcmp(v, "q4_0")) o.type = GGML_TYPE_Q4_0;
            else if (!strcmp(v, "q8_0")) o.type = GGML_TYPE_Q8_0;
            else die("unknown --type (q4_0|q8_0)", v);
            o.type_name = v;
        } else if (!strcmp(a, "--n")) o.n = (int64_t) parse_num(v);
        else if (!strcmp(a, "--k")) o.k = (int64_t) parse_num(v);
        else if (!strcmp(a, "--m")) o.n_ms = parse_list(v, o.ms, 1L << 20);
        else if (!strcmp(a, "--threads")) o.n_threads = parse_list(v, o.threads, 1L << 20);
        else if (parse_timing_option(a, v, &o.t)) {}
        else if (!strcmp(a, "--repack")) {
            if (!strcmp(v, "yes")) o.no_repack = 0;
            else if (!strcmp(v, "no")) o.no_repack = 1;
            else die("--repack takes yes|no", v);
        }
        else die("unknown option", a);
    }
    if (!o.type_name) die("--type is required", NULL);
    if (o.n <= 0 || o.k <= 0) die("--n and --k are required and positive", NULL);
    if (o.k % 32 != 0) die("K must be a multiple of 32 for Q4_0/Q8_0", NULL);
    if (o.n_ms == 0 || o.n_threads == 0) die("--m and --threads are required", NULL);
    return o;
}

static ggml_backend_buffer_type_t find_repack_buft(ggml_backend_t backend) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get_extra =
        (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (!get_extra) return NULL;
    for (ggml_backend_buffer_type_t *b = get_extra(dev); b && *b; b++) {
        if (!strcmp(ggml_backend_buft_name(*b), "CPU_REPACK")) return *b;
    }
    return NULL;
}

int main(int argc, char **argv) {
    struct options o = parse_args(argc, argv);
    const int64_t n = o.n, k = o.k;
    ggml_log_set(quiet_log, NULL);

    ggml_backend_t backend = ggml_backend_cpu_init();
    if (!backend) die("ggml_backend_cpu_init failed", NULL);

    ggml_backend_buffer_type_t wbuft = ggml_backend_cpu_buffer_type();
    if (o.type == GGML_TYPE_Q4_0 && !o.no_repack) {
        wbuft = find_repack_buft(backend);
        if (!wbuft) die("no CPU_REPACK buffer type in this ggml build", NULL);
    }

    // Quantize one copy of the weights; every copy gets the same bytes.
    const size_t row_bytes = ggml_row_size(o.type, k);
    const size_t w_bytes = row_bytes * (size_t) n;
    float *wf = malloc(sizeof(float) * (size_t) n * (size_t) k);
    void *wq = malloc(w_bytes);
    if (!wf || !wq) die("out of memory", NULL);
    for (int64_t i = 0; i < n * k; i++) wf[i] = uniform_pm1();
    ggml_quantize_chunk(o.type, wf, wq, 0, n, k, NULL);
    free(wf);

    int copies = (int) ceil(o.t.total_mib * 1024.0 * 1024.0 / (double) w_bytes);
    if (copies < 2) copies = 2;

    struct ggml_init_params wp = {ggml_tensor_overhead() * (size_t) (copies + 1), NULL, true};
    struct ggml_context *wctx = ggml_init(wp);
    struct ggml_tensor **w = calloc((size_t) copies, sizeof *w);
    for (int c = 0; c < copies; c++) w[c] = ggml_new_tensor_2d(wctx, o.type, k, n);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, wbuft);
    if (!wbuf) die("allocating the weight copies failed", NULL);
    ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (int c = 0; c < copies; c++) ggml_backend_tensor_set(w[c], wq, 0, w_bytes);

    printf("{\"info\":\"ggml-%s\",\"detail\":\"ggml %s (%s), weights in %s buffer, x quantized to Q8_0 per call\"}\n",
           o.type_name, ggml_version(), ggml_commit(), ggml_backend_buft_name(wbuft));
    fflush(stdout);

    const struct ggml_type_traits *traits = ggml_get_type_traits(o.type);
    float *wrow = malloc(sizeof(float) * (size_t) k);
    double *times = malloc(sizeof(double) * 100000);

    for (int ti = 0; ti < o.n_threads; ti++) {
        ggml_backend_cpu_set_n_threads(backend, o.threads[ti]);
        for (int mi = 0; mi < o.n_ms; mi++) {
            const int64_t m = o.ms[mi];
            struct ggml_init_params cp = {
                ggml_tensor_overhead() * (size_t) (2 * copies + 2) + ggml_graph_overhead_custom(4, false) * (size_t) copies + 1024,
                NULL, true};
            struct ggml_context *cctx = ggml_init(cp);
            struct ggml_tensor *x = ggml_new_tensor_2d(cctx, GGML_TYPE_F32, k, m);
            struct ggml_tensor **y = calloc((size_t) copies, sizeof *y);
            struct ggml_cgraph **g = calloc((size_t) copies, sizeof *g);
            for (int c = 0; c < copies; c++) {
                y[c] = ggml_mul_mat(cctx, w[c], x);
                g[c] = ggml_new_graph_custom(cctx, 4, false);
                ggml_build_forward_expand(g[c], y[c]);
            }
            // x and one output area shared by every copy's result tensor.
            const size_t align = 64;
            const size_t x_bytes = (ggml_nbytes(x) + align - 1) / align * align;
            const size_t y_bytes = ggml_nbytes(y[0]);
            ggml_backend_buffer_t abuf =
                ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(), x_bytes + y_bytes + 2 * align);
            if (!abuf) die("allocating activations failed", NULL);
            char *base = ggml_backend_buffer_get_base(abuf);
            base += (align - ((uintptr_t) base % align)) % align;
            ggml_backend_tensor_alloc(abuf, x, base);
            for (int c = 0; c < copies; c++) ggml_backend_tensor_alloc(abuf, y[c], base + x_bytes);
            float *xs = (float *) x->data;
            for (int64_t i = 0; i < m * k; i++) xs[i] = uniform_pm1();

            // Warm-up (also the correctness check) on the last copy.
            if (ggml_backend_graph_compute(backend, g[copies - 1]) != GGML_STATUS_SUCCESS) die("compute failed", NULL);
            const float *ys = (const float *) y[copies - 1]->data;
            double max_err = 0, max_ref = 0;
            const int64_t check_rows[3] = {0, n / 2, n - 1};
            const int64_t check_ms[2] = {0, m - 1};
            for (int ri = 0; ri < 3; ri++) {
                const int64_t r = check_rows[ri];
                traits->to_float((const char *) wq + (size_t) r * row_bytes, wrow, k);
                for (int mj = 0; mj < 2; mj++) {
                    const int64_t mm = check_ms[mj];
                    double ref = 0;
                    for (int64_t kk = 0; kk < k; kk++) ref += (double) wrow[kk] * (double) xs[mm * k + kk];
                    double err = fabs(ref - (double) ys[mm * n + r]);
                    if (err > max_err) max_err = err;
                    if (fabs(ref) > max_ref) max_ref = fabs(ref);
                }
            }
            // Typical |y| is ~sqrt(K)/3 for uniform data; normalise by that rather than
            // by a possibly tiny max_ref.
            const double scale = fmax(max_ref, sqrt((double) k) / 3.0);

            int reps = 0;
            double total = 0;
            int c = 0;
            while (reps < 100000) {
                const double t0 = now_s();
                ggml_backend_graph_compute(backend, g[c]);
                const double dt = now_s() - t0;
                times[reps++] = dt;
                total += dt;
                c = (c + 1) % copies;
                if (block_done(&o.t, reps, total)) break;
            }
            const double median = median_of(times, reps);
            printf("{\"impl\":\"ggml-%s\",\"n\":%lld,\"k\":%lld,\"m\":%lld,\"threads\":%d,\"median_s\":%.9g,"
                   "\"min_s\":%.9g,\"reps\":%d,\"copies\":%d,\"weight_bytes\":%zu,\"max_rel_err\":%.6g}\n",
                   o.type_name, (long long) n, (long long) k, (long long) m, o.threads[ti], median, times[0], reps,
                   copies, w_bytes, max_err / scale);
            fflush(stdout);

            ggml_backend_buffer_free(abuf);
            free(y);
            free(g);
            ggml_free(cctx);
            sleep_ms(o.t.sleep_ms);
        }
    }

    free(times);
    free(wrow);
    free(w);
    free(wq);
    ggml_backend_buffer_free(wbuf);
    ggml_free(wctx);
    ggml_backend_free(backend);
    return 0;
}
