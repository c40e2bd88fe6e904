// Decode and prefill attention over a KV cache through the C API from C++,
// checked against reference outputs the Rust test computed with Tessera's
// reference interpreter.
//
// Usage: decode DIR. DIR holds attention.txt ("hq kvh d steps t"), per step
// the token's k_<s>.f32 / v_<s>.f32 [kvh, d] and query q_<s>.f16 [hq, d],
// the references o_<kv>_<s>.f32 [hq, d] for kv in f16 and kv8, and for
// prefill over the last t tokens q_prefill.f16 / o_prefill.f32 [t, hq, d].
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common.h"

namespace {

// Owns one handle and closes it when it goes out of scope.
template <typename H, TesseraStatus (*Close)(H)>
struct Owned {
    H h{};
    Owned() = default;
    Owned(const Owned &) = delete;
    Owned &operator=(const Owned &) = delete;
    ~Owned() { Close(h); }
};

template <typename T>
std::vector<T> read_vec(const char *dir, const std::string &name, size_t count) {
    void *raw = read_file(dir, name.c_str(), count * sizeof(T));
    const T *p = static_cast<const T *>(raw);
    std::vector<T> v(p, p + count);
    free(raw);
    return v;
}

std::vector<float> widen(const std::vector<uint16_t> &h) {
    std::vector<float> out(h.size());
    for (size_t i = 0; i < h.size(); i++) out[i] = half_to_float(h[i]);
    return out;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    size_t hq = 0, kvh = 0, d = 0, steps = 0, t = 0;
    {
        std::string path = std::string(dir) + "/attention.txt";
        FILE *meta = std::fopen(path.c_str(), "r");
        if (!meta || std::fscanf(meta, "%zu %zu %zu %zu %zu", &hq, &kvh, &d, &steps, &t) != 5) {
            std::fprintf(stderr, "bad %s\n", path.c_str());
            return 1;
        }
        std::fclose(meta);
    }

    TesseraDeviceOptions options;
    CHECK(tessera_device_options_default(&options));
    options.backend = TESSERA_BACKEND_HOST_JIT;
    options.threads = 2;
    Owned<TesseraDevice, tessera_device_close> dev;
    CHECK(tessera_device_open(&options, &dev.h));

    bool ok = true;
    const struct {
        TesseraKvFormat format;
        const char *name;
    } formats[] = {{TESSERA_KV_F16, "f16"}, {TESSERA_KV_KV8, "kv8"}};
    for (const auto &f : formats) {
        Owned<TesseraAttention, tessera_attention_close> att;
        CHECK(tessera_attention_create(dev.h, hq, kvh, d, f.format, &att.h));
        // Chunks of 2 tokens: the cache grows (in place between growths).
        Owned<TesseraKvCache, tessera_kv_cache_close> cache;
        CHECK(tessera_kv_cache_create(dev.h, f.format, kvh, d, 2, TESSERA_KV_GROWTH_CHUNKED,
                                      &cache.h));
        for (size_t s = 0; s < steps; s++) {
            const std::string id = std::to_string(s);
            auto k = read_vec<float>(dir, "k_" + id + ".f32", kvh * d);
            auto v = read_vec<float>(dir, "v_" + id + ".f32", kvh * d);
            auto q = read_vec<uint16_t>(dir, "q_" + id + ".f16", hq * d);
            auto want = read_vec<float>(dir, std::string("o_") + f.name + "_" + id + ".f32", hq * d);
            CHECK(tessera_kv_cache_append(cache.h, k.data(), k.size(), v.data(), v.size(), 1));
            std::vector<uint16_t> o(hq * d);
            CHECK(tessera_attention_decode(att.h, cache.h, q.data(), q.size(), o.data(), o.size()));
            const std::string what = std::string("decode ") + f.name + " step " + id;
            ok &= close_enough(what.c_str(), widen(o).data(), want.data(), o.size(), 4e-3f) != 0;
        }
        size_t len = 0;
        CHECK(tessera_kv_cache_len(cache.h, &len));
        ok &= len == steps;
        if (f.format == TESSERA_KV_F16) {
            auto q = read_vec<uint16_t>(dir, "q_prefill.f16", t * hq * d);
            auto want = read_vec<float>(dir, "o_prefill.f32", t * hq * d);
            std::vector<uint16_t> o(t * hq * d);
            CHECK(tessera_attention_prefill(att.h, cache.h, q.data(), q.size(), t, o.data(),
                                            o.size()));
            ok &= close_enough("prefill f16", widen(o).data(), want.data(), o.size(), 4e-3f) != 0;
        }
    }
    if (!ok) {
        std::fprintf(stderr, "decode: MISMATCH\n");
        return 1;
    }
    std::printf("decode: OK\n");
    return 0;
}
