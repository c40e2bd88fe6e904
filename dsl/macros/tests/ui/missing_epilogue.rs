use tessera_dsl::kernel;

fn main() {
    let _ = kernel! {
        matmul-w8a16(e, h, l) {
            x: input  f16        [e, l];
            w: weight i8sym:g32  [h, l];
            y: output f16        [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
        }
    };
}
