use tessera_dsl::kernel;

fn main() {
    // Plain multi-head attention still needs a KV-heads axis of its own.
    let _ = kernel! {
        attention-prefill-f16(t, h, d, s) {
            q: input  f16 [t, h, d];
            k: cache  f16 [s, h, d];
            v: cache  f16 [s, h, d];
            o: output f16 [t, h, d];
            o[t, h, d] = attention(q[t, h, d], k[s, h, d], v[s, h, d]) prefill;
        }
    };
}
