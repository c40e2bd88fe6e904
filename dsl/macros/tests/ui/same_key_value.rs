use tessera_dsl::kernel;

fn main() {
    let _ = kernel! {
        attention-decode-f16(t = 1, hq, kvh, d, s) {
            q: input  f16 [t, hq, d];
            kv: cache f16 [s, kvh, d];
            o: output f16 [t, hq, d];
            o[t, hq, d] = attention(q[t, hq, d], kv[s, kvh, d], kv[s, kvh, d]) decode;
        }
    };
}
