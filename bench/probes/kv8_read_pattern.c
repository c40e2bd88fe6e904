/*
 * The x86 decode attention's memory access pattern for int8 keys and fp8
 * values, without its arithmetic: how fast that pattern alone reads, set
 * beside one linear stream over the same bytes. It tells how much of a
 * kv8 call's time the reads themselves take, apart from the score, softmax
 * and P·V instructions (docs/PERFORMANCE.md cites it).
 *
 * The pattern (as `x86/attention` walks a call's keys): super-blocks of
 * 256 keys; per block of 16 keys, per KV head, its 16 K rows (d bytes of
 * each token row of kvh·d) and their scales and offsets, the rows
 * prefetched `ahead` bytes on; then per block of 32 keys, per KV head, its
 * V rows, likewise prefetched. Enough copies of the cache rotate (1 GiB)
 * that every call reads DRAM, as `attention_bench` does. With ORDER `rows`
 * each block's whole token rows are read in address order instead (every
 * KV head's part of a row, then the next row): what a head-by-head walk of
 * a token-major cache gives up. With ORDER `whole` the reads are the
 * `heads` order's, but the first KV head's pass over a block prefetches
 * every KV head's lines of each row (the whole token row, in address
 * order) and the later heads' passes prefetch nothing: whether the
 * prefetch stream's order, not the demand loads', is what costs.
 *
 *   gcc -O2 -mavx512f kv8_read_pattern.c -o kv8_read_pattern
 *   ./kv8_read_pattern KEYS [KV_HEADS=2] [D=128] [AHEAD_BYTES=8192] [ORDER=heads|rows|whole]
 *
 * Prints the median µs a call and GB/s of the pattern and of the linear
 * read, over 7 rounds of every copy once. Needs AVX-512F.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int kvh = 2, d = 128, whole_rows = 0, whole_prefetch = 0;
static __m512i sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct {
    uint8_t *k, *v;
    float *scale, *offset;
} Cache;

/* d bytes of every row from `row0`, rows `stride` apart, keys [j0, j1).
   Per line read, the line `ahead` bytes on is prefetched; or, with
   `span` > 0, per row the `span` bytes from `span0` on (`ahead` bytes on),
   and with `span` < 0 nothing. */
static __m512i rows_spanned(__m512i x, const uint8_t *row0, size_t stride, int j0, int j1, int ahead,
                            const uint8_t *span0, int span) {
    for (int j = j0; j < j1; j++) {
        const uint8_t *r = row0 + (size_t)j * stride;
        for (int b = 0; b < d; b += 64) {
            x = _mm512_add_epi32(x, _mm512_loadu_si512(r + b));
            if (ahead && span == 0)
                _mm_prefetch((const char *)r + ahead + b, _MM_HINT_T0);
        }
        if (ahead && span > 0)
            for (int b = 0; b < span; b += 64)
                _mm_prefetch((const char *)span0 + (size_t)j * stride + ahead + b, _MM_HINT_T0);
    }
    return x;
}

static __m512i rows(__m512i x, const uint8_t *row0, size_t stride, int j0, int j1, int ahead) {
    return rows_spanned(x, row0, stride, j0, j1, ahead, row0, 0);
}

/* KV head t's part of the rows [j0, j1) of `cache`, prefetched per the
   ORDER (`heads`: its own lines; `whole`: head 0 every head's). */
static __m512i head_rows(__m512i x, const uint8_t *cache, int t, int j0, int j1, int ahead) {
    size_t stride = (size_t)kvh * d;
    int span = whole_prefetch ? (t == 0 ? (int)stride : -1) : 0;
    return rows_spanned(x, cache + t * d, stride, j0, j1, ahead, cache, span);
}

static void pattern(const Cache *c, int s, int ahead) {
    __m512i x = sink;
    for (int sb = 0; sb < s; sb += 256) {
        int end = sb + 256 < s ? sb + 256 : s;
        for (int jb = sb; jb < end; jb += 16)
            for (int t = 0; t < kvh; t++) {
                int j1 = jb + 16 < end ? jb + 16 : end;
                if (whole_rows && t > 0)
                    continue;
                if (whole_rows)
                    x = rows(x, c->k, d, jb * kvh, j1 * kvh, ahead);
                else
                    x = head_rows(x, c->k, t, jb, j1, ahead);
                /* The block's scales and offsets: 16·kvh floats each (all KV
                   heads' at once in `rows` order). */
                for (int i = jb * kvh; i < j1 * kvh; i += 16) {
                    x = _mm512_add_epi32(x, _mm512_castps_si512(_mm512_loadu_ps(c->scale + i)));
                    x = _mm512_add_epi32(x, _mm512_castps_si512(_mm512_loadu_ps(c->offset + i)));
                }
            }
        for (int jb = sb; jb < end; jb += 32) {
            int j1 = jb + 32 < end ? jb + 32 : end;
            if (whole_rows)
                x = rows(x, c->v, d, jb * kvh, j1 * kvh, ahead);
            else
                for (int t = 0; t < kvh; t++)
                    x = head_rows(x, c->v, t, jb, j1, ahead);
        }
    }
    sink = x;
}

static void linear(const Cache *c, int s) {
    __m512i x = sink;
    size_t n = (size_t)s * kvh * d, p = (size_t)s * kvh;
    for (size_t i = 0; i < n; i += 64)
        x = _mm512_add_epi32(x, _mm512_loadu_si512(c->k + i));
    for (size_t i = 0; i < p; i += 16) {
        x = _mm512_add_epi32(x, _mm512_castps_si512(_mm512_loadu_ps(c->scale + i)));
        x = _mm512_add_epi32(x, _mm512_castps_si512(_mm512_loadu_ps(c->offset + i)));
    }
    for (size_t i = 0; i < n; i += 64)
        x = _mm512_add_epi32(x, _mm512_loadu_si512(c->v + i));
    sink = x;
}

static int by_time(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s KEYS [KV_HEADS] [D] [AHEAD_BYTES] [heads|rows|whole]\n", argv[0]);
        return 2;
    }
    int s = atoi(argv[1]);
    if (argc > 2) kvh = atoi(argv[2]);
    if (argc > 3) d = atoi(argv[3]);
    int ahead = argc > 4 ? atoi(argv[4]) : 8192;
    const char *order = argc > 5 ? argv[5] : "heads";
    whole_rows = strcmp(order, "rows") == 0;
    whole_prefetch = strcmp(order, "whole") == 0;
    if (!whole_rows && !whole_prefetch && strcmp(order, "heads") != 0) {
        fprintf(stderr, "ORDER is heads, rows or whole\n");
        return 2;
    }
    if (s < 16 || s % 16 || kvh < 1 || d < 64 || d % 64) {
        fprintf(stderr, "KEYS a multiple of 16, D a multiple of 64\n");
        return 2;
    }
    size_t kv = (size_t)s * kvh * d, params = (size_t)s * kvh * sizeof(float) + 64;
    size_t per = 2 * kv + 2 * params;
    int copies = (int)((1ull << 30) / per + 1);
    Cache *caches = calloc(copies, sizeof(Cache));
    if (!caches) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (int i = 0; i < copies; i++) {
        caches[i].k = aligned_alloc(64, kv);
        caches[i].v = aligned_alloc(64, kv);
        caches[i].scale = aligned_alloc(64, params);
        caches[i].offset = aligned_alloc(64, params);
        if (!caches[i].k || !caches[i].v || !caches[i].scale || !caches[i].offset) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        memset(caches[i].k, 1, kv);
        memset(caches[i].v, 2, kv);
        memset(caches[i].scale, 3, params);
        memset(caches[i].offset, 4, params);
    }
    double bytes = 2.0 * kv + 2.0 * s * kvh * sizeof(float), median[2];
    for (int mode = 0; mode < 2; mode++) {
        double t[7];
        for (int round = 0; round < 7; round++) {
            double t0 = now();
            for (int i = 0; i < copies; i++) {
                if (mode == 0)
                    pattern(&caches[i], s, ahead);
                else
                    linear(&caches[i], s);
            }
            t[round] = (now() - t0) / copies;
        }
        qsort(t, 7, sizeof t[0], by_time);
        median[mode] = t[3];
    }
    printf("keys %d, %d KV heads x %d, %s order: pattern %.1f us (%.1f GB/s), linear %.1f us (%.1f GB/s)\n", s,
           kvh, d, order, median[0] * 1e6, bytes / median[0] / 1e9, median[1] * 1e6, bytes / median[1] / 1e9);
    return 0;
}
