//! Test data that ends where an inaccessible page begins: a kernel that
//! reads one byte past it faults (and fails the test) instead of quietly
//! reading a neighbour's memory. (The codegen crate's tests include this
//! file by path.)

use half::f16;
use tessera_codegen::host_attention::KvCache;
use tessera_dsl::ir::Format;
use tessera_dsl::quant::QuantTensor;

pub struct Guarded {
    base: *mut u8,
    mapped: usize,
    offset: usize,
    len: usize,
}

impl Guarded {
    pub fn new(bytes: &[u8]) -> Guarded {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let data = bytes.len().div_ceil(page).max(1) * page;
        let mapped = data + page;
        // SAFETY: a fresh anonymous private mapping; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED, "mmap of {mapped} bytes");
        let base = base.cast::<u8>();
        // SAFETY: the last page lies inside the mapping just made.
        let rc = unsafe { libc::mprotect(base.add(data).cast(), page, libc::PROT_NONE) };
        assert_eq!(rc, 0, "mprotect of the guard page");
        let offset = data - bytes.len();
        // SAFETY: [offset, data) is inside the writable part of the mapping,
        // which no other value aliases.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(offset), bytes.len()) };
        Guarded {
            base,
            mapped,
            offset,
            len: bytes.len(),
        }
    }

    /// f16 values, likewise guarded.
    pub fn from_halves(values: &[f16]) -> Guarded {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Guarded::new(&bytes)
    }

    /// f32 values, likewise guarded.
    pub fn from_floats(values: &[f32]) -> Guarded {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Guarded::new(&bytes)
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping lives as long as self and holds these bytes.
        unsafe { std::slice::from_raw_parts(self.base.add(self.offset), self.len) }
    }

    pub fn floats(&self) -> &[f32] {
        assert!(
            self.offset.is_multiple_of(4) && self.len.is_multiple_of(4),
            "not f32 data"
        );
        // SAFETY: as `bytes`; the start is 4-aligned (a page less a
        // multiple of 4) and every bit pattern is an f32.
        unsafe { std::slice::from_raw_parts(self.base.add(self.offset).cast(), self.len / 4) }
    }

    pub fn halves(&self) -> &[f16] {
        assert!(
            self.offset.is_multiple_of(2) && self.len.is_multiple_of(2),
            "not f16 data"
        );
        // SAFETY: as `bytes`; the start is 2-aligned (a page less an even
        // count) and f16 has no invalid bit patterns.
        unsafe { std::slice::from_raw_parts(self.base.add(self.offset).cast(), self.len / 2) }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made; no slice of it
        // outlives self.
        unsafe { libc::munmap(self.base.cast(), self.mapped) };
    }
}

/// A K or V cache in guarded memory: f16 values, or quantized rows' codes,
/// scales and offsets each apart, so a kernel that reads past any of them
/// faults.
pub struct GuardedCache {
    quant: Option<(Format, usize, usize)>,
    data: Guarded,
    scales: Guarded,
    offsets: Guarded,
}

impl GuardedCache {
    pub fn quant(t: &QuantTensor) -> GuardedCache {
        GuardedCache {
            quant: Some((t.format, t.rows, t.cols)),
            data: Guarded::new(&t.codes),
            scales: Guarded::from_floats(&t.scales),
            offsets: Guarded::from_floats(&t.offsets),
        }
    }

    pub fn halves(values: &[f16]) -> GuardedCache {
        GuardedCache {
            quant: None,
            data: Guarded::from_halves(values),
            scales: Guarded::from_floats(&[]),
            offsets: Guarded::from_floats(&[]),
        }
    }

    /// As the host kernels read it.
    pub fn cache(&self) -> KvCache<'_> {
        match self.quant {
            Some((format, rows, cols)) => KvCache::QuantRows {
                format,
                rows,
                cols,
                codes: self.data.bytes(),
                scales: self.scales.floats(),
                offsets: self.offsets.floats(),
            },
            None => KvCache::F16(self.data.halves()),
        }
    }
}
