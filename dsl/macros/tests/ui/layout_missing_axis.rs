use tessera_dsl::kernel;

fn main() {
    let _ = kernel! {
        matmul-f16(e, h, l) {
            tile h by hp, l by lp;
            x: input  f16 [e, l];
            w: weight f16 [h, l] layout [h/hp, hp, lp];
            y: output f16 [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
        }
    };
}
