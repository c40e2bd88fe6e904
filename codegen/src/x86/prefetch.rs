//! How far ahead, and into which cache, the GEMV and flat loops prefetch
//! their weight stream. Both are facts of the memory system, not of the
//! instruction set, so they are the autotuner's choice per device
//! (`docs/AUTOTUNE.md`). Measured (`docs/PERFORMANCE.md`): on Zen 4 the
//! int8 loops read fastest 4 KiB ahead into L1 (M = 4 up to 1.25× faster
//! than 2 KiB); on a Sapphire Rapids-class Xeon 2 KiB ahead (5–20% more of
//! the bandwidth at M = 1–8), and the float loops 4 KiB ahead into L2
//! (the zmm f32 flat GEMM at M = 8 from about 70% of the read bandwidth to
//! about 84%, the f16 GEMV from about 74% to 91–98%). A prefetch into L1
//! holds one of the core's few fill buffers for the whole DRAM latency;
//! one into L2 does not wait there.

use std::fmt;

use super::asm::{Gp, X86Asm, mem};

/// The loops that prefetch alike: the int8 kernels' (quantized
/// activations) and the float kernels' (f32 or f16 activations) each have
/// one [`WeightPrefetch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightStream {
    Int8,
    Float,
}

impl WeightStream {
    /// The name records use.
    pub fn name(self) -> &'static str {
        match self {
            WeightStream::Int8 => "int8",
            WeightStream::Float => "float",
        }
    }

    /// The default prefetch and what the autotuner times, the default
    /// first.
    pub fn choices(self) -> &'static [WeightPrefetch] {
        match self {
            WeightStream::Int8 => &WeightPrefetch::INT8_CHOICES,
            WeightStream::Float => &WeightPrefetch::FLOAT_CHOICES,
        }
    }
}

/// The cache a software prefetch fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PrefetchLevel {
    /// `prefetcht0`: every level.
    L1,
    /// `prefetcht1`: L2 and the last level, not L1.
    L2,
}

/// A weight stream's software prefetch: `bytes` ahead of the loads, into
/// `level`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WeightPrefetch {
    bytes: u32,
    level: PrefetchLevel,
}

impl WeightPrefetch {
    /// The longest distance taken: past a few pages ahead the lines are
    /// evicted before use (and a displacement is an i32).
    pub const MAX_BYTES: u32 = 64 << 10;
    /// The int8 kernels' default (Zen 4's best): 4 KiB ahead into L1.
    pub const INT8: WeightPrefetch = WeightPrefetch {
        bytes: 4096,
        level: PrefetchLevel::L1,
    };
    /// What the autotuner times for the int8 kernels, the default first.
    /// On Zen 5 one core read 8 KiB ahead 8–11% faster at M = 1 and
    /// 16–18% at M = 4 than 4 KiB (Q4_0, eight Llama2/Qwen2 shapes), the
    /// same at two threads.
    pub const INT8_CHOICES: [WeightPrefetch; 3] = [
        WeightPrefetch::INT8,
        WeightPrefetch {
            bytes: 2048,
            level: PrefetchLevel::L1,
        },
        WeightPrefetch {
            bytes: 8192,
            level: PrefetchLevel::L1,
        },
    ];
    /// The float kernels' default: 1 KiB ahead into L1.
    pub const FLOAT: WeightPrefetch = WeightPrefetch {
        bytes: 1024,
        level: PrefetchLevel::L1,
    };
    /// What the autotuner times for the float kernels, the default first.
    pub const FLOAT_CHOICES: [WeightPrefetch; 2] = [
        WeightPrefetch::FLOAT,
        WeightPrefetch {
            bytes: 4096,
            level: PrefetchLevel::L2,
        },
    ];

    /// `bytes` ahead into `level`: a positive multiple of a 64-byte cache
    /// line, at most [`Self::MAX_BYTES`].
    pub fn new(bytes: u32, level: PrefetchLevel) -> Result<WeightPrefetch, String> {
        if bytes == 0 || !bytes.is_multiple_of(64) || bytes > Self::MAX_BYTES {
            return Err(format!(
                "weight prefetch distance {bytes} bytes: must be a positive multiple of 64, at most {}",
                Self::MAX_BYTES
            ));
        }
        Ok(WeightPrefetch { bytes, level })
    }

    pub fn bytes(self) -> u32 {
        self.bytes
    }

    pub fn level(self) -> PrefetchLevel {
        self.level
    }

    /// The prefetches of one loop iteration that advances `base` by
    /// `bytes`: one per 64-byte line, this distance ahead.
    pub(super) fn emit(self, a: &mut X86Asm, base: Gp, bytes: i32) {
        let ahead = self.bytes as i32;
        for line in (0..bytes).step_by(64) {
            let at = mem(base, ahead + line);
            match self.level {
                PrefetchLevel::L1 => a.prefetcht0(at),
                PrefetchLevel::L2 => a.prefetcht1(at),
            }
        }
    }
}

impl fmt::Display for WeightPrefetch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.level {
            PrefetchLevel::L1 => "L1",
            PrefetchLevel::L2 => "L2",
        };
        write!(f, "{} B ahead into {level}", self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances_are_whole_lines_within_the_limit() {
        for bad in [0, 100, WeightPrefetch::MAX_BYTES + 64] {
            let e = WeightPrefetch::new(bad, PrefetchLevel::L1).unwrap_err();
            assert!(e.contains("multiple of 64"), "{e}");
        }
        let p = WeightPrefetch::new(WeightPrefetch::MAX_BYTES, PrefetchLevel::L2).unwrap();
        assert_eq!((p.bytes(), p.level()), (65536, PrefetchLevel::L2));
        assert_eq!(p.to_string(), "65536 B ahead into L2");
    }

    #[test]
    fn one_prefetch_per_line_of_the_iteration() {
        let mut a = X86Asm::new();
        WeightPrefetch::new(2048, PrefetchLevel::L2).unwrap().emit(
            &mut a,
            super::super::asm::RSI,
            192,
        );
        let (_, listing) = a.finish().unwrap();
        let lines: Vec<&str> = listing.lines().filter(|l| l.contains("prefetch")).collect();
        assert_eq!(
            lines,
            [
                "    prefetcht1 byte ptr [rsi + 2048]",
                "    prefetcht1 byte ptr [rsi + 2112]",
                "    prefetcht1 byte ptr [rsi + 2176]",
            ]
        );
    }
}
