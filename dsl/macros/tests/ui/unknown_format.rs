use tessera_dsl::kernel;

fn main() {
    let _ = kernel! {
        matmul-w4a8(e, h, l) {
            x: input  i8dyn [e, l];
            w: weight u4    [h, l];
            y: output f32   [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
            epilogue scale, zero_point;
        }
    };
}
