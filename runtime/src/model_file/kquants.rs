//! ggml's K-quants Q4_K and Q6_K, dequantized exactly as ggml does
//! (`dequantize_row_q4_K` / `dequantize_row_q6_K` in `ggml-quants.c`; the
//! same f32 operations in the same order, so every weight is ggml's bit for
//! bit). Tessera has no kernel for them: a loader requantizes the exact
//! values into a format it has and reports the error.
//!
//! Super-blocks of 256 weights:
//!
//! | type | bytes | layout |
//! |---|---|---|
//! | `Q4_K` | 144 | f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) × 8, 128 bytes of nibbles |
//! | `Q6_K` | 210 | 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8 scales, f16 d |
//!
//! Q4_K: weight = (d·sc_j)·q − (dmin·m_j) for sub-block j of 32; Q6_K:
//! weight = (d·sc_j)·(q − 32) for sub-block j of 16.

use half::f16;

use super::ggml_type::QK_K;

fn half(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Q4_K's packed 6-bit scale and min of sub-block `j` (ggml
/// `get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Append one Q4_K super-block's 256 weights.
pub fn dequantize_q4_k_block(block: &[u8], out: &mut Vec<f32>) {
    debug_assert_eq!(block.len(), 144);
    let d = half(block, 0);
    let min = half(block, 2);
    let scales = &block[4..16];
    let qs = &block[16..144];
    for chunk in 0..QK_K / 64 {
        let q = &qs[chunk * 32..chunk * 32 + 32];
        let (sc, m) = scale_min_k4(2 * chunk, scales);
        let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
        out.extend(q.iter().map(|&b| d1 * f32::from(b & 0x0F) - m1));
        let (sc, m) = scale_min_k4(2 * chunk + 1, scales);
        let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
        out.extend(q.iter().map(|&b| d2 * f32::from(b >> 4) - m2));
    }
}

/// Append one Q6_K super-block's 256 weights.
pub fn dequantize_q6_k_block(block: &[u8], out: &mut Vec<f32>) {
    debug_assert_eq!(block.len(), 210);
    let d = half(block, 208);
    let start = out.len();
    out.resize(start + QK_K, 0.0);
    let y = &mut out[start..];
    for half_block in 0..2 {
        let ql = &block[half_block * 64..half_block * 64 + 64];
        let qh = &block[128 + half_block * 32..128 + half_block * 32 + 32];
        let sc = &block[192 + half_block * 8..192 + half_block * 8 + 8];
        let y = &mut y[half_block * 128..half_block * 128 + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            let s = |i: usize| d * f32::from(sc[i] as i8);
            y[l] = s(is) * f32::from(q1);
            y[l + 32] = s(is + 2) * f32::from(q2);
            y[l + 64] = s(is + 4) * f32::from(q3);
            y[l + 96] = s(is + 6) * f32::from(q4);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block whose every field is set by hand: each weight checked
    /// against the formula in the module table, computed independently.
    #[test]
    fn q4_k_follows_its_layout() {
        let mut b = vec![0u8; 144];
        b[0..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        // sub-block j: scale j + 1 (6 bits), min 60 - j.
        let (sc, mn): (Vec<u8>, Vec<u8>) = (0..8u8).map(|j| (j + 1 + 48 * (j % 2), 60 - j)).unzip();
        for j in 0..4 {
            b[4 + j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
            b[4 + j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6);
            b[4 + j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4);
        }
        for (i, v) in b[16..].iter_mut().enumerate() {
            *v = (i * 7 % 256) as u8;
        }
        let mut out = Vec::new();
        dequantize_q4_k_block(&b, &mut out);
        assert_eq!(out.len(), 256);
        for (e, &got) in out.iter().enumerate() {
            let j = e / 32;
            let byte = b[16 + (e / 64) * 32 + e % 32];
            let q = if j % 2 == 0 { byte & 15 } else { byte >> 4 };
            let want = 0.5 * f32::from(sc[j]) * f32::from(q) - 0.25 * f32::from(mn[j]);
            assert_eq!(got, want, "weight {e}");
        }
    }

    #[test]
    fn q6_k_follows_its_layout() {
        let mut b = vec![0u8; 210];
        for (i, v) in b[..192].iter_mut().enumerate() {
            *v = (i * 13 % 256) as u8;
        }
        for j in 0..16 {
            b[192 + j] = (j as i32 * 9 - 70) as i8 as u8;
        }
        b[208..210].copy_from_slice(&f16::from_f32(0.125).to_le_bytes());
        let mut out = Vec::new();
        dequantize_q6_k_block(&b, &mut out);
        for (e, &got) in out.iter().enumerate() {
            // Weight e: half h, quarter t (which nibble / bit pair), lane l.
            let (h, t, l) = (e / 128, (e % 128) / 32, e % 32);
            let ql = b[h * 64 + l + 32 * (t % 2)];
            let low = if t < 2 { ql & 15 } else { ql >> 4 };
            let high = (b[128 + h * 32 + l] >> (2 * t)) & 3;
            let q = i32::from(low | (high << 4)) - 32;
            let scale = f32::from(b[192 + e / 16] as i8);
            assert_eq!(got, 0.125 * scale * q as f32, "weight {e}");
        }
    }
}
