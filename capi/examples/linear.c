/* A linear layer through the C API, checked against reference outputs the
 * Rust test computed with Tessera's reference interpreter.
 *
 * Usage: linear DIR. DIR holds linear.txt ("n k count m1 m2 ..."), the f32
 * weights w.f32 [n, k], their f16 bits w.f16, bias.f32 [n], the W4A8
 * quantized weights (wq.codes, wq.scales, wq.offsets), and per M the input
 * x_m<M>.f32 [M, k] and the references y_<format>_m<M>.f32 [M, n]. */
#include <stdint.h>

#include "common.h"

enum { MAX_MS = 16 };

/* `count` layers of the same weights on each reference input: one through
 * tessera_linear_forward, several through tessera_linear_forward_shared
 * (x quantized once for all); every output matches the reference. */
static int run_layers(const char *dir, const char *label, const TesseraLinear *layers,
                      size_t count, size_t n, size_t k, const size_t *ms, size_t m_count,
                      const char *ref) {
    enum { MAX_LAYERS = 4 };
    int ok = 1;
    for (size_t i = 0; i < m_count; i++) {
        size_t m = ms[i];
        char name[256], what[256];
        snprintf(name, sizeof name, "x_m%zu.f32", m);
        float *x = read_file(dir, name, m * k * sizeof(float));
        snprintf(name, sizeof name, "y_%s_m%zu.f32", ref, m);
        float *want = read_file(dir, name, m * n * sizeof(float));
        void *ys[MAX_LAYERS];
        size_t lens[MAX_LAYERS];
        for (size_t l = 0; l < count; l++) {
            ys[l] = calloc(m * n, sizeof(float));
            lens[l] = m * n;
        }
        if (count == 1) {
            CHECK(tessera_linear_forward(layers[0], x, m * k, m, ys[0], m * n));
        } else {
            CHECK(tessera_linear_forward_shared(layers, count, x, m * k, m, ys, lens));
        }
        float scale = 0.0f;
        for (size_t j = 0; j < m * n; j++) scale = fmaxf(scale, fabsf(want[j]));
        for (size_t l = 0; l < count; l++) {
            snprintf(what, sizeof what, "%s m=%zu (layer %zu)", label, m, l);
            ok &= close_enough(what, ys[l], want, m * n, 1e-4f * (1.0f + scale));
            free(ys[l]);
        }
        free(x);
        free(want);
    }
    return ok;
}

static int run_layer(const char *dir, const char *label, TesseraLinear lin, size_t n, size_t k,
                     const size_t *ms, size_t count, const char *ref) {
    return run_layers(dir, label, &lin, 1, n, k, ms, count, ref);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    char path[4096];
    snprintf(path, sizeof path, "%s/linear.txt", dir);
    FILE *meta = fopen(path, "r");
    size_t n = 0, k = 0, count = 0, ms[MAX_MS];
    if (!meta || fscanf(meta, "%zu %zu %zu", &n, &k, &count) != 3 || count > MAX_MS) {
        fprintf(stderr, "bad %s\n", path);
        return 1;
    }
    for (size_t i = 0; i < count; i++) {
        if (fscanf(meta, "%zu", &ms[i]) != 1) return 1;
    }
    fclose(meta);

    float *w = read_file(dir, "w.f32", n * k * sizeof(float));
    uint16_t *wh = read_file(dir, "w.f16", n * k * sizeof(uint16_t));
    float *bias = read_file(dir, "bias.f32", n * sizeof(float));

    TesseraDeviceOptions options;
    CHECK(tessera_device_options_default(&options));
    options.threads = 2;
    TesseraDevice dev;
    CHECK(tessera_device_open(&options, &dev));

    size_t needed = 0;
    if (tessera_device_fingerprint(dev, NULL, 0, &needed) != TESSERA_STATUS_BUFFER_TOO_SMALL) {
        fprintf(stderr, "fingerprint size query did not say BUFFER_TOO_SMALL\n");
        return 1;
    }
    char *fp = malloc(needed);
    CHECK(tessera_device_fingerprint(dev, fp, needed, &needed));
    printf("tessera %s, fingerprint %.60s...\n", tessera_version(), fp);
    free(fp);

    int ok = 1;
    TesseraLinear lin;

    /* f32 weights, f32 format. */
    CHECK(tessera_linear_create_f32(dev, TESSERA_FORMAT_F32, w, n * k, n, k, bias, n, &lin));
    size_t got_n = 0, got_k = 0;
    CHECK(tessera_linear_shape(lin, &got_n, &got_k));
    ok &= got_n == n && got_k == k;
    ok &= run_layer(dir, "f32", lin, n, k, ms, count, "f32");
    CHECK(tessera_linear_close(lin));

    /* f32 weights quantized to W4A8 by Tessera. */
    CHECK(tessera_linear_create_f32(dev, TESSERA_FORMAT_W4A8, w, n * k, n, k, bias, n, &lin));
    ok &= run_layer(dir, "w4a8 (from f32)", lin, n, k, ms, count, "w4a8");
    TesseraLinear twin;
    CHECK(tessera_linear_create_f32(dev, TESSERA_FORMAT_W4A8, w, n * k, n, k, bias, n, &twin));
    TesseraLinear pair[2] = {lin, twin};
    ok &= run_layers(dir, "w4a8 (one input, two layers)", pair, 2, n, k, ms, count, "w4a8");
    CHECK(tessera_linear_close(twin));
    CHECK(tessera_linear_close(lin));

    /* f16 weights, quantized to W4A8. */
    CHECK(tessera_linear_create_f16(dev, TESSERA_FORMAT_W4A8, wh, n * k, n, k, bias, n, &lin));
    ok &= run_layer(dir, "w4a8 (from f16)", lin, n, k, ms, count, "w4a8_f16w");
    CHECK(tessera_linear_close(lin));

    /* Already-quantized W4A8 weights, as a model file would hold them. */
    TesseraQuantLayout layout;
    CHECK(tessera_quant_layout(TESSERA_FORMAT_W4A8, n, k, &layout));
    TesseraQuantWeights q;
    q.codes = read_file(dir, "wq.codes", layout.codes_len);
    q.codes_len = layout.codes_len;
    q.scales = read_file(dir, "wq.scales", layout.scales_len * sizeof(float));
    q.scales_len = layout.scales_len;
    q.offsets = read_file(dir, "wq.offsets", layout.offsets_len * sizeof(float));
    q.offsets_len = layout.offsets_len;
    CHECK(tessera_linear_create_quantized(dev, TESSERA_FORMAT_W4A8, &q, n, k, bias, n, &lin));
    ok &= run_layer(dir, "w4a8 (quantized)", lin, n, k, ms, count, "w4a8");
    CHECK(tessera_linear_close(lin));
    free((void *)q.codes);
    free((void *)q.scales);
    free((void *)q.offsets);

    CHECK(tessera_device_close(dev));

    /* One packed copy of the weights: the same answers. */
    options.one_weight_copy = 1;
    CHECK(tessera_device_open(&options, &dev));
    CHECK(tessera_linear_create_f32(dev, TESSERA_FORMAT_W4A8, w, n * k, n, k, bias, n, &lin));
    ok &= run_layer(dir, "w4a8 (one weight copy)", lin, n, k, ms, count, "w4a8");
    CHECK(tessera_linear_close(lin));
    CHECK(tessera_device_close(dev));

    free(w);
    free(wh);
    free(bias);
    if (!ok) {
        fprintf(stderr, "linear: MISMATCH\n");
        return 1;
    }
    printf("linear: OK\n");
    return 0;
}
