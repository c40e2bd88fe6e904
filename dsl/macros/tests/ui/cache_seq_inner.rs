use tessera_dsl::kernel;

fn main() {
    let _ = kernel! {
        attention-decode-f16(t = 1, hq, kvh, d, s) {
            q: input  f16 [t, hq, d];
            k: cache  f16 [s, kvh, d] layout [kvh, s, d];
            v: cache  f16 [s, kvh, d];
            o: output f16 [t, hq, d];
            o[t, hq, d] = attention(q[t, hq, d], k[s, kvh, d], v[s, kvh, d]) decode;
        }
    };
}
