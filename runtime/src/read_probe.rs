//! The host's read bandwidth as a GEMV reads it: 8 weight rows at once
//! against one activation row, 256-bit loads where the CPU has AVX2. Every
//! "share of read bandwidth" the project reports divides by this probe,
//! measured in the same run: `tessera-bench`'s matmul columns and the
//! decode attention benchmark's (one probe, so a figure means the same
//! in both).

/// Row length of the bandwidth loop: a 16 KiB row like a K = 4096 layer.
pub const BANDWIDTH_ROW: usize = 4096;

/// Reads all of `weights` (rows of `BANDWIDTH_ROW`) as a GEMV would, split
/// over `threads` threads by rows; returns the sum of the outputs.
pub fn gemv_read(weights: &[f32], x: &[f32], threads: usize) -> f32 {
    let blocks = weights.len() / (8 * BANDWIDTH_ROW);
    let per_thread = blocks.div_ceil(threads.max(1)) * 8 * BANDWIDTH_ROW;
    if threads <= 1 || per_thread == 0 {
        return gemv_rows(weights, x);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = weights
            .chunks(per_thread)
            .map(|part| s.spawn(move || gemv_rows(part, x)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(f32::NAN))
            .sum()
    })
}

fn gemv_rows(weights: &[f32], x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the features the function is compiled for were detected.
        return unsafe { gemv_rows_avx2(weights, x) };
    }
    gemv_rows_plain(weights, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn gemv_rows_avx2(weights: &[f32], x: &[f32]) -> f32 {
    gemv_rows_plain(weights, x)
}

/// 8 rows at once, 8 lanes per row: plain Rust the compiler vectorizes.
#[inline(always)]
fn gemv_rows_plain(weights: &[f32], x: &[f32]) -> f32 {
    let k = BANDWIDTH_ROW;
    let mut total = 0.0;
    for block in weights.chunks_exact(8 * k) {
        let mut acc = [[0.0f32; 8]; 8];
        for c in (0..k).step_by(8) {
            let xv: &[f32; 8] = x[c..c + 8].try_into().expect("8 lanes");
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let w: &[f32; 8] = block[r * k + c..r * k + c + 8].try_into().expect("8 lanes");
                for l in 0..8 {
                    acc_r[l] += w[l] * xv[l];
                }
            }
        }
        total += acc.iter().flatten().sum::<f32>();
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemv_read_sums_every_row_once_whatever_the_thread_count() {
        let rows = 24;
        let weights: Vec<f32> = (0..rows * BANDWIDTH_ROW)
            .map(|i| (i % 7) as f32 * 0.25)
            .collect();
        let x = vec![1.0f32; BANDWIDTH_ROW];
        let want: f64 = weights.iter().map(|&v| f64::from(v)).sum();
        for t in 1..=3 {
            let got = f64::from(gemv_read(&weights, &x, t));
            assert!(
                (got - want).abs() / want < 1e-4,
                "{t} threads: {got} vs {want}"
            );
        }
    }
}
