/* Bad calls through the C API: each returns its status and a message,
 * never crashes. Usage: bad_calls DIR, where DIR holds foreign_record.json
 * (a tuning record measured on another device) and not_a_record.json. */
#include <stdint.h>

#include "common.h"

static int failures = 0;

/* Expect `status` to be `want` with a message containing `needle`. */
static void expect(const char *what, TesseraStatus status, TesseraStatus want, const char *needle) {
    const char *message = tessera_last_error();
    if (status != want || message == NULL || strstr(message, needle) == NULL) {
        fprintf(stderr, "FAIL %s: got %s \"%s\", want %s containing \"%s\"\n", what,
                tessera_status_name((uint32_t)status), message ? message : "(null)",
                tessera_status_name((uint32_t)want), needle);
        failures++;
    } else {
        printf("ok   %s: %s: %s\n", what, tessera_status_name((uint32_t)status), message);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    char path[4096];
    enum { N = 8, K = 32 };
    float w[N * K], x[2 * K], y[2 * N];
    for (int i = 0; i < N * K; i++) w[i] = (float)(i % 7) / 7.0f - 0.5f;
    for (int i = 0; i < 2 * K; i++) x[i] = (float)(i % 5) / 5.0f;

    TesseraDeviceOptions options;
    CHECK(tessera_device_options_default(&options));
    options.threads = 1;
    TesseraDevice dev;
    CHECK(tessera_device_open(&options, &dev));
    if (strcmp(tessera_last_error(), "") != 0) {
        fprintf(stderr, "FAIL: last error not empty after a success\n");
        failures++;
    }

    /* Null pointers and null handles. */
    expect("open with NULL out", tessera_device_open(&options, NULL),
           TESSERA_STATUS_NULL_ARGUMENT, "out is NULL");
    TesseraLinear lin;
    expect("NULL weights", tessera_linear_create_f32(dev, TESSERA_FORMAT_F32, NULL, N * K, N, K, NULL, 0, &lin),
           TESSERA_STATUS_NULL_ARGUMENT, "w is NULL");
    TesseraDevice null_dev = {0};
    expect("null device handle", tessera_linear_create_f32(null_dev, TESSERA_FORMAT_F32, w, N * K, N, K, NULL, 0, &lin),
           TESSERA_STATUS_NULL_ARGUMENT, "device handle is null");
    TesseraLinear null_lin = {0};
    expect("null linear handle", tessera_linear_forward(null_lin, x, K, 1, y, N),
           TESSERA_STATUS_NULL_ARGUMENT, "linear handle is null");

    /* Wrong lengths and arguments. */
    expect("short weights", tessera_linear_create_f32(dev, TESSERA_FORMAT_F32, w, N * K - 1, N, K, NULL, 0, &lin),
           TESSERA_STATUS_BAD_LENGTH, "w_len");
    expect("short bias", tessera_linear_create_f32(dev, TESSERA_FORMAT_F32, w, N * K, N, K, w, N - 1, &lin),
           TESSERA_STATUS_BAD_LENGTH, "bias_len");
    expect("unknown format", tessera_linear_create_f32(dev, 99, w, N * K, N, K, NULL, 0, &lin),
           TESSERA_STATUS_INVALID_ARGUMENT, "unknown format 99");
    CHECK(tessera_linear_create_f32(dev, TESSERA_FORMAT_F32, w, N * K, N, K, NULL, 0, &lin));
    expect("x too long for m", tessera_linear_forward(lin, x, 2 * K, 1, y, N),
           TESSERA_STATUS_BAD_LENGTH, "x_len");
    expect("y too short", tessera_linear_forward(lin, x, 2 * K, 2, y, N),
           TESSERA_STATUS_BAD_LENGTH, "y_len");
    expect("NULL y", tessera_linear_forward(lin, x, 2 * K, 2, NULL, 2 * N),
           TESSERA_STATUS_NULL_ARGUMENT, "y is NULL");
    CHECK(tessera_linear_forward(lin, x, 2 * K, 2, y, 2 * N));
    CHECK(tessera_linear_forward(lin, NULL, 0, 0, NULL, 0)); /* m = 0 does nothing */

    /* Layers sharing one input: every length is checked before any runs. */
    TesseraLinear narrow;
    CHECK(tessera_linear_create_f32(dev, TESSERA_FORMAT_F32, w, N * K, 2 * N, K / 2, NULL, 0, &narrow));
    TesseraLinear pair[2] = {lin, lin}, mixed[2] = {lin, narrow};
    float y2[2 * N];
    void *ys[2] = {y, y2};
    size_t lens[2] = {2 * N, 2 * N - 1};
    expect("shared: NULL linears", tessera_linear_forward_shared(NULL, 2, x, 2 * K, 2, ys, lens),
           TESSERA_STATUS_NULL_ARGUMENT, "linears is NULL");
    expect("shared: y_lens[1] short", tessera_linear_forward_shared(pair, 2, x, 2 * K, 2, ys, lens),
           TESSERA_STATUS_BAD_LENGTH, "y_lens[1]");
    lens[1] = 2 * N;
    expect("shared: two k", tessera_linear_forward_shared(mixed, 2, x, 2 * K, 2, ys, lens),
           TESSERA_STATUS_INVALID_ARGUMENT, "one k and one dtype");
    CHECK(tessera_linear_forward_shared(pair, 2, x, 2 * K, 2, ys, lens));
    CHECK(tessera_linear_forward_shared(NULL, 0, NULL, 0, 0, NULL, NULL)); /* no layers */
    CHECK(tessera_linear_close(narrow));

    /* Handles of the wrong kind, and after close. */
    TesseraLinear not_a_linear = {dev.id};
    expect("device used as linear", tessera_linear_forward(not_a_linear, x, K, 1, y, N),
           TESSERA_STATUS_INVALID_HANDLE, "not a linear");
    CHECK(tessera_linear_close(lin));
    expect("forward after close", tessera_linear_forward(lin, x, K, 1, y, N),
           TESSERA_STATUS_INVALID_HANDLE, "not open");
    expect("close twice", tessera_linear_close(lin), TESSERA_STATUS_INVALID_HANDLE, "not open");
    CHECK(tessera_linear_close(null_lin)); /* closing the null handle is a no-op */

    /* Quantized weights. */
    TesseraQuantLayout layout;
    expect("quantized f32", tessera_quant_layout(TESSERA_FORMAT_F32, N, K, &layout),
           TESSERA_STATUS_UNSUPPORTED, "not quantized");
    CHECK(tessera_quant_layout(TESSERA_FORMAT_W4A8, N, K, &layout));
    uint8_t codes[N * K];
    float scales[N * K], offsets[N * K];
    memset(codes, 3, sizeof codes);
    for (int i = 0; i < N * K; i++) scales[i] = 0.1f, offsets[i] = -0.5f;
    codes[5] = 16; /* out of range for uint4 */
    TesseraQuantWeights q = {codes, layout.codes_len, scales, layout.scales_len, offsets, layout.offsets_len};
    expect("uint4 code 16", tessera_linear_create_quantized(dev, TESSERA_FORMAT_W4A8, &q, N, K, NULL, 0, &lin),
           TESSERA_STATUS_INVALID_ARGUMENT, "out of range");
    q.scales_len = layout.scales_len + 1;
    expect("scales length", tessera_linear_create_quantized(dev, TESSERA_FORMAT_W4A8, &q, N, K, NULL, 0, &lin),
           TESSERA_STATUS_BAD_LENGTH, "scales_len");

    /* Attention and the KV cache. */
    TesseraAttention att;
    expect("hq not a multiple of kvh", tessera_attention_create(dev, 3, 2, 16, TESSERA_KV_F16, &att),
           TESSERA_STATUS_INVALID_ARGUMENT, "multiple");
    CHECK(tessera_attention_create(dev, 2, 1, 16, TESSERA_KV_F16, &att));
    TesseraKvCache cache;
    CHECK(tessera_kv_cache_create(dev, TESSERA_KV_F16, 1, 16, 1, TESSERA_KV_GROWTH_FIXED, &cache));
    uint16_t qh[2 * 16] = {0}, oh[2 * 16];
    expect("decode an empty cache", tessera_attention_decode(att, cache, qh, 32, oh, 32),
           TESSERA_STATUS_INVALID_ARGUMENT, "at least 1");
    float kv[2 * 16] = {0};
    expect("append short k", tessera_kv_cache_append(cache, kv, 15, kv, 16, 1),
           TESSERA_STATUS_BAD_LENGTH, "keys elements");
    CHECK(tessera_kv_cache_append(cache, kv, 16, kv, 16, 1));
    expect("append past a fixed capacity", tessera_kv_cache_append(cache, kv, 16, kv, 16, 1),
           TESSERA_STATUS_CACHE_FULL, "full");
    expect("decode short o", tessera_attention_decode(att, cache, qh, 32, oh, 31),
           TESSERA_STATUS_BAD_LENGTH, "o elements");
    CHECK(tessera_attention_decode(att, cache, qh, 32, oh, 32));
    TesseraKvCache huge;
    expect("impossible capacity", tessera_kv_cache_create(dev, TESSERA_KV_F16, 1, 64, (size_t)1 << 40, TESSERA_KV_GROWTH_FIXED, &huge),
           TESSERA_STATUS_OUT_OF_MEMORY, "cannot allocate");
    CHECK(tessera_kv_cache_close(cache));
    expect("decode a closed cache", tessera_attention_decode(att, cache, qh, 32, oh, 32),
           TESSERA_STATUS_INVALID_HANDLE, "KV cache handle");
    CHECK(tessera_attention_close(att));

    /* Device options and records. */
    TesseraDeviceOptions bad = options;
    bad.struct_size = 8;
    TesseraDevice other;
    expect("options struct_size", tessera_device_open(&bad, &other),
           TESSERA_STATUS_INVALID_ARGUMENT, "struct_size");
    bad = options;
    bad.backend = 42;
    expect("unknown backend", tessera_device_open(&bad, &other),
           TESSERA_STATUS_INVALID_ARGUMENT, "unknown backend");
    TesseraRecord rec;
    snprintf(path, sizeof path, "%s/no-such-record.json", dir);
    expect("missing record file", tessera_record_load(path, &rec), TESSERA_STATUS_IO, "no-such-record.json");
    snprintf(path, sizeof path, "%s/not_a_record.json", dir);
    expect("malformed record", tessera_record_load(path, &rec), TESSERA_STATUS_RECORD, "not a tuning record");
    snprintf(path, sizeof path, "%s/foreign_record.json", dir);
    bad = options;
    bad.record_path = path;
    expect("record for another device", tessera_device_open(&bad, &other),
           TESSERA_STATUS_RECORD, "differ");
    CHECK(tessera_record_load(path, &rec));
    size_t entries = 0;
    CHECK(tessera_record_entries(rec, &entries));
    bad = options;
    bad.record = rec;
    expect("record handle for another device", tessera_device_open(&bad, &other),
           TESSERA_STATUS_RECORD, "differ");
    bad.record_path = path;
    expect("both record and record_path", tessera_device_open(&bad, &other),
           TESSERA_STATUS_INVALID_ARGUMENT, "at most one");
    CHECK(tessera_record_close(rec));
    bad = options;
    bad.record = rec;
    expect("closed record handle", tessera_device_open(&bad, &other),
           TESSERA_STATUS_INVALID_HANDLE, "record handle");

    /* Fingerprint buffer. */
    char small[4];
    size_t needed = 0;
    expect("fingerprint into 4 bytes", tessera_device_fingerprint(dev, small, sizeof small, &needed),
           TESSERA_STATUS_BUFFER_TOO_SMALL, "needs");
    if (needed <= sizeof small) {
        fprintf(stderr, "FAIL: fingerprint needed %zu bytes\n", needed);
        failures++;
    }

    CHECK(tessera_device_close(dev));
    expect("device after close", tessera_device_threads(dev, &needed),
           TESSERA_STATUS_INVALID_HANDLE, "not open");
    expect("close device twice", tessera_device_close(dev), TESSERA_STATUS_INVALID_HANDLE, "not open");
    if (strcmp(tessera_status_name(999), "TESSERA_STATUS_UNKNOWN") != 0) failures++;

    if (failures) {
        fprintf(stderr, "bad_calls: %d FAILED\n", failures);
        return 1;
    }
    printf("bad_calls: OK (%zu record entries)\n", entries);
    return 0;
}
