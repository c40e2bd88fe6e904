use tessera_dsl::kernel;

fn main() {
    let _ = kernel! {
        attention-decode-kv8(t = 1, hq, kvh, d, s) {
            q: input  f16       [t, hq, d];
            k: cache  i8asym:g32 [s, kvh, d];
            v: cache  fp8e4m3   [s, kvh, d];
            o: output f16       [t, hq, d];
            o[t, hq, d] = attention(q[t, hq, d], k[s, kvh, d], v[s, kvh, d]) decode;
        }
    };
}
