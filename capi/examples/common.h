/* Helpers the C and C++ examples share: read the binary inputs the test
 * wrote, compare against reference outputs, report Tessera errors. */
#ifndef TESSERA_EXAMPLES_COMMON_H
#define TESSERA_EXAMPLES_COMMON_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tessera.h"

/* Exit with the failed call's status name and message. */
#define CHECK(call)                                                            \
    do {                                                                       \
        TesseraStatus check_status_ = (call);                                  \
        if (check_status_ != TESSERA_STATUS_OK) {                              \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__,  \
                    #call, tessera_status_name((uint32_t)check_status_),       \
                    tessera_last_error());                                     \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

/* Read exactly `bytes` bytes of DIR/NAME into a new buffer (free it). */
static inline void *read_file(const char *dir, const char *name, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(1);
    }
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf || fread(buf, 1, bytes, f) != bytes) {
        fprintf(stderr, "cannot read %zu bytes from %s\n", bytes, path);
        exit(1);
    }
    fclose(f);
    return buf;
}

/* IEEE binary16 bits to float (normals, subnormals, inf/nan). */
static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    float v;
    if (exp == 0) {
        v = ldexpf((float)mant, -24);
    } else if (exp == 31) {
        v = mant ? NAN : INFINITY;
    } else {
        v = ldexpf((float)(mant | 0x400), (int)exp - 25);
    }
    return sign ? -v : v;
}

/* Max |got - want| over n values; fails (returns 0) above tol. */
static inline int close_enough(const char *what, const float *got, const float *want, size_t n,
                        float tol) {
    float worst = 0.0f;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        float e = fabsf(got[i] - want[i]);
        if (!(e <= worst)) {
            worst = e;
            at = i;
        }
    }
    if (!(worst <= tol)) {
        fprintf(stderr, "%s: element %zu is %g, reference %g (error %g > %g)\n", what, at,
                (double)got[at], (double)want[at], (double)worst, (double)tol);
        return 0;
    }
    printf("%s: max error %g (tolerance %g)\n", what, (double)worst, (double)tol);
    return 1;
}

#endif
