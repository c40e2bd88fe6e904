use tessera_dsl::kernel;

fn main() {
    let _ = kernel! {
        matmul-w8a8(e, h, l) {
            x: input  i8dyn     [e, l];
            w: weight i8sym:row [h, l] pair_transpose;
            y: output f32       [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
            epilogue scale;
        }
    };
}
