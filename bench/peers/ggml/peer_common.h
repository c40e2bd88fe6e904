// Helpers shared by the ggml peer harnesses (ggml_peer.c, ggml_attention_peer.c):
// argument parsing, the clock, the input generator, the timing median and a
// quiet ggml log. Each harness defines PEER_NAME before including this.
#ifndef TESSERA_PEER_COMMON_H
#define TESSERA_PEER_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml.h"

#define MAX_LIST 64

static void die(const char *msg, const char *arg) {
    fprintf(stderr, PEER_NAME ": %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    exit(2);
}

// A comma-separated list of positive ints (at most MAX_LIST, each ≤ max).
static int parse_list(const char *s, int *out, long max) {
    int count = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v <= 0 || v > max) die("bad list", s);
        if (count == MAX_LIST) die("list too long", s);
        out[count++] = (int) v;
        p = end;
        if (*p == ',') p++;
        else if (*p) die("bad list", s);
    }
    if (count == 0) die("empty list", s);
    return count;
}

static double parse_num(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= 0)) die("bad number", s);
    return v;
}

// The timing rule's options, shared by every harness (bench/README.md):
// rotate copies totalling total_mib; stop a block once (reps >= min_reps and
// time >= min_time) or (reps >= 3 and time >= max_time); sleep between blocks.
struct timing {
    double total_mib, min_time, max_time;
    int min_reps, sleep_ms;
};

static struct timing timing_defaults(void) {
    struct timing t = {256, 0.4, 1.5, 5, 150};
    return t;
}

// Takes option `a` with value `v` if it is a timing option (1), else 0.
static int parse_timing_option(const char *a, const char *v, struct timing *t) {
    if (!strcmp(a, "--total-mib")) t->total_mib = parse_num(v);
    else if (!strcmp(a, "--min-reps")) {
        const int reps = (int) parse_num(v);
        t->min_reps = reps < 1 ? 1 : reps;
    }
    else if (!strcmp(a, "--min-time")) t->min_time = parse_num(v);
    else if (!strcmp(a, "--max-time")) t->max_time = parse_num(v);
    else if (!strcmp(a, "--sleep-ms")) t->sleep_ms = (int) parse_num(v);
    else return 0;
    return 1;
}

// Whether a block of `reps` timings totalling `total` seconds is done.
static int block_done(const struct timing *t, int reps, double total) {
    return (reps >= t->min_reps && total >= t->min_time) || (reps >= 3 && total >= t->max_time);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long) (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float uniform_pm1(void) {  // splitmix64 → [-1, 1)
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float) ((double) (z >> 40) / (double) (1ull << 23) - 1.0);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

// The median of `reps` timings (sorts them).
static double median_of(double *times, int reps) {
    qsort(times, (size_t) reps, sizeof(double), cmp_double);
    return reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2]);
}

// Keep ggml's informational chatter (one "repack" line per tensor) off stderr.
static void quiet_log(enum ggml_log_level level, const char *text, void *user_data) {
    (void) user_data;
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

#endif
