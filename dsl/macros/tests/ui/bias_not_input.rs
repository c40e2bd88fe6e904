use tessera_dsl::kernel;

fn main() {
    let _ = kernel! {
        matmul-f32(e, h, l) {
            x: input  f32 [e, l];
            w: weight f32 [h, l];
            b: weight f32 [h];
            y: output f32 [e, h];
            y[e, h] = sum(l) x[e, l] * w[h, l];
            epilogue bias(b);
        }
    };
}
