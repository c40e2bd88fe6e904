use tessera_dsl::kernel;

fn main() {
    let _ = kernel! {
        matmul-f16(e, h, l) {
            tile e by ep, h by hp, l by lp;
            x: input  f16 [e, l] layout [e/hp, l/lp, ep, lp];
            w: weight f16 [h, l] layout [h/hp, l/lp, hp, lp];
            y: output f16 [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
        }
    };
}
