//! Tessera's C API: the runtime's [`Device`], [`Linear`], [`Attention`] and
//! [`KvCache`] behind a stable C ABI, for engines written in C or C++.
//!
//! `include/tessera.h` is generated from this file by cbindgen (`build.rs`;
//! the `header` test fails when the committed copy differs), so every doc
//! comment here is what a C programmer reads.
//!
//! How the boundary is kept safe:
//! - Handles are plain 64-bit ids into one process-wide registry, never
//!   pointers: a handle used after its close (or a handle of the wrong kind)
//!   is looked up, not found, and reported as `TESSERA_STATUS_INVALID_HANDLE`.
//! - Every entry point runs inside `std::panic::catch_unwind`; a Rust panic
//!   becomes `TESSERA_STATUS_PANIC` with its message and never unwinds into C.
//! - Pointers are checked non-null and aligned, and every length the caller
//!   passes is checked against the shape before a slice is built.
//! - Enumerations the caller passes in (backend, format, ...) are plain
//!   `uint32_t` values checked here, since an out-of-range C enum value
//!   would be undefined behaviour in a Rust enum.
//! - Buffers this crate allocates with a size from the caller are allocated
//!   fallibly (`try_reserve`), so a huge request is
//!   `TESSERA_STATUS_OUT_OF_MEMORY`, as is a KV cache the runtime cannot
//!   allocate (it reserves fallibly too). The runtime's own
//!   working buffers (packed weights, per-call scratch) are sized like the
//!   buffers the caller already holds and are allocated as Rust normally
//!   does.
//! - Prebuilt kernel sets come as the directory `tessera-kernels-gen gen`
//!   wrote (`TesseraDeviceOptions::prebuilt_dir`), read at run time by
//!   `tessera_runtime::manifest::Manifest::load_prebuilt` (generator and
//!   per-file hashes checked), for engines that must not JIT.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use half::f16;
use tessera_dsl::ir::Format;
use tessera_dsl::library;
use tessera_dsl::quant::{QuantTensor, groups_per_row};
use tessera_runtime::record::{RecordError, TuningRecord};
use tessera_runtime::{
    Attention, Backend, Device, DeviceOptions, Input, KvCache, KvCapacity, KvFormat, Linear,
    Output, RuntimeError, SharedInput, WeightFormat, Weights,
};

// --- status and errors ---------------------------------------------------------

/// What every call returns. `TESSERA_STATUS_OK` is 0; on anything else
/// `tessera_last_error()` says what was wrong.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TesseraStatus {
    /// Success.
    Ok = 0,
    /// A required pointer (or handle) was NULL (or 0).
    NullArgument = 1,
    /// An argument is out of range or inconsistent (an unknown format, a
    /// shape the kernel cannot take, a misaligned pointer, ...).
    InvalidArgument = 2,
    /// A buffer length does not match the shape (the message names both).
    BadLength = 3,
    /// The handle is not open: closed already, never opened, or a handle of
    /// another kind.
    InvalidHandle = 4,
    /// The backend does not support this operation or format.
    Unsupported = 5,
    /// The backend cannot run on this machine or in this build.
    Unavailable = 6,
    /// No kernel exists for this format/shape on this device (e.g. a
    /// prebuilt set without it).
    NoKernel = 7,
    /// The KV cache is full (fixed capacity).
    CacheFull = 8,
    /// A tuning record is malformed, from another schema, or not for this
    /// device, backend or generator.
    Record = 9,
    /// A file could not be read.
    Io = 10,
    /// The caller's output buffer is too small; the call says how much is
    /// needed.
    BufferTooSmall = 11,
    /// An allocation sized by the arguments failed.
    OutOfMemory = 12,
    /// The GPU driver reported an error.
    Device = 13,
    /// A kernel could not be prepared or run (JIT, quantization).
    Kernel = 14,
    /// A bug inside Tessera panicked; the message says where. The objects
    /// the call touched may be inconsistent: close them.
    Panic = 15,
}

/// The status of a failed call and its message.
#[derive(Debug)]
struct Error {
    status: TesseraStatus,
    message: String,
}

type Result<T> = std::result::Result<T, Error>;

fn err<T>(status: TesseraStatus, message: impl Into<String>) -> Result<T> {
    Err(Error {
        status,
        message: message.into(),
    })
}

impl From<RuntimeError> for Error {
    fn from(e: RuntimeError) -> Error {
        let status = match &e {
            RuntimeError::Unavailable { .. } => TesseraStatus::Unavailable,
            RuntimeError::Unsupported { .. } => TesseraStatus::Unsupported,
            RuntimeError::Shape { .. } | RuntimeError::UnknownFormat(_) => {
                TesseraStatus::InvalidArgument
            }
            RuntimeError::NoKernel { .. } => TesseraStatus::NoKernel,
            RuntimeError::CacheFull { .. } => TesseraStatus::CacheFull,
            RuntimeError::OutOfMemory { .. } => TesseraStatus::OutOfMemory,
            RuntimeError::Record(_) => TesseraStatus::Record,
            RuntimeError::Gpu { .. } => TesseraStatus::Device,
            RuntimeError::Quant(_) => TesseraStatus::InvalidArgument,
            RuntimeError::Host(_) | RuntimeError::Attention(_) | RuntimeError::Library(_) => {
                TesseraStatus::Kernel
            }
        };
        Error {
            status,
            message: e.to_string(),
        }
    }
}

impl From<tessera_runtime::manifest::ManifestError> for Error {
    fn from(e: tessera_runtime::manifest::ManifestError) -> Error {
        use tessera_runtime::manifest::ManifestError;
        let status = match e {
            ManifestError::Io { .. } => TesseraStatus::Io,
            ManifestError::Stale { .. } | ManifestError::Corrupt { .. } => {
                TesseraStatus::Unavailable
            }
            _ => TesseraStatus::InvalidArgument,
        };
        Error {
            status,
            message: format!("prebuilt kernels: {e}"),
        }
    }
}

impl From<RecordError> for Error {
    fn from(e: RecordError) -> Error {
        let status = match e {
            RecordError::Io { .. } => TesseraStatus::Io,
            _ => TesseraStatus::Record,
        };
        Error {
            status,
            message: e.to_string(),
        }
    }
}

thread_local! {
    /// The last failed call's message on this thread ("" after a success).
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // Interior NULs would cut the C string short; show them as spaces.
    let clean = CString::new(message.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = clean);
}

/// Run one entry point: clear the last error, catch panics, turn an `Err`
/// into its status and message (prefixed with the function's name).
fn ffi(name: &str, body: impl FnOnce() -> Result<()>) -> TesseraStatus {
    set_last_error("");
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => TesseraStatus::Ok,
        Ok(Err(e)) => {
            set_last_error(&format!("{name}: {}", e.message));
            e.status
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("{name}: internal panic: {what}"));
            TesseraStatus::Panic
        }
    }
}

// --- handles --------------------------------------------------------------------

/// An open device (backend, thread pool, tuning record, prepared kernels).
/// `id == 0` is the null handle. Copy it freely; close it once.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TesseraDevice {
    pub id: u64,
}

/// A linear layer (weights packed once). `id == 0` is the null handle.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TesseraLinear {
    pub id: u64,
}

/// A multi-head (GQA) attention operator. `id == 0` is the null handle.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TesseraAttention {
    pub id: u64,
}

/// One layer's KV cache, appended in place. `id == 0` is the null handle.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TesseraKvCache {
    pub id: u64,
}

/// A loaded tuning record. `id == 0` is the null handle.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TesseraRecord {
    pub id: u64,
}

/// What a live handle refers to. Objects are shared (`Arc`) so a call runs
/// outside the registry lock and a close during it only drops the
/// registry's reference.
enum Object {
    Device(Arc<Device>),
    Linear(Arc<Linear>),
    Attention(Arc<Attention>),
    KvCache(Arc<Mutex<KvCache>>),
    Record(Arc<TuningRecord>),
}

impl Object {
    fn kind(&self) -> &'static str {
        match self {
            Object::Device(_) => "device",
            Object::Linear(_) => "linear",
            Object::Attention(_) => "attention",
            Object::KvCache(_) => "KV cache",
            Object::Record(_) => "record",
        }
    }
}

/// Live handles by id. Ids count up from 1 and are never reused, so a
/// stale id can never name a newer object.
struct Registry {
    next: u64,
    live: BTreeMap<u64, Object>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next: 1,
    live: BTreeMap::new(),
});

fn registry() -> MutexGuard<'static, Registry> {
    // A panic while holding the lock leaves the map itself consistent
    // (every mutation is one insert or remove), so poisoning is ignored.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

fn insert(object: Object) -> u64 {
    let mut reg = registry();
    let id = reg.next;
    reg.next += 1;
    reg.live.insert(id, object);
    id
}

/// The object behind `id` if it is live and of kind `want`.
fn lookup<T>(id: u64, want: &str, pick: impl FnOnce(&Object) -> Option<T>) -> Result<T> {
    if id == 0 {
        return err(
            TesseraStatus::NullArgument,
            format!("the {want} handle is null (id 0)"),
        );
    }
    let reg = registry();
    match reg.live.get(&id) {
        None => err(
            TesseraStatus::InvalidHandle,
            format!("{want} handle {id} is not open (closed already, or never opened)"),
        ),
        Some(object) => match pick(object) {
            Some(t) => Ok(t),
            None => err(
                TesseraStatus::InvalidHandle,
                format!("handle {id} is a {}, not a {want}", object.kind()),
            ),
        },
    }
}

fn get_device(h: TesseraDevice) -> Result<Arc<Device>> {
    lookup(h.id, "device", |o| match o {
        Object::Device(d) => Some(Arc::clone(d)),
        _ => None,
    })
}

fn get_linear(h: TesseraLinear) -> Result<Arc<Linear>> {
    lookup(h.id, "linear", |o| match o {
        Object::Linear(l) => Some(Arc::clone(l)),
        _ => None,
    })
}

fn get_attention(h: TesseraAttention) -> Result<Arc<Attention>> {
    lookup(h.id, "attention", |o| match o {
        Object::Attention(a) => Some(Arc::clone(a)),
        _ => None,
    })
}

fn get_kv_cache(h: TesseraKvCache) -> Result<Arc<Mutex<KvCache>>> {
    lookup(h.id, "KV cache", |o| match o {
        Object::KvCache(c) => Some(Arc::clone(c)),
        _ => None,
    })
}

fn get_record(h: TesseraRecord) -> Result<Arc<TuningRecord>> {
    lookup(h.id, "record", |o| match o {
        Object::Record(r) => Some(Arc::clone(r)),
        _ => None,
    })
}

/// Remove `id` if it is live and of kind `want`; the null handle is a no-op
/// (like `free(NULL)`), so cleanup paths need no checks.
fn close(id: u64, want: &str, is: impl FnOnce(&Object) -> bool) -> Result<()> {
    if id == 0 {
        return Ok(());
    }
    let removed = {
        let mut reg = registry();
        match reg.live.get(&id) {
            None => {
                return err(
                    TesseraStatus::InvalidHandle,
                    format!("{want} handle {id} is not open (closed already, or never opened)"),
                );
            }
            Some(o) if !is(o) => {
                return err(
                    TesseraStatus::InvalidHandle,
                    format!("handle {id} is a {}, not a {want}", o.kind()),
                );
            }
            Some(_) => reg.live.remove(&id),
        }
    };
    // Dropped outside the lock: a device's drop joins its thread pool.
    drop(removed);
    Ok(())
}

fn lock_cache(cache: &Mutex<KvCache>) -> MutexGuard<'_, KvCache> {
    cache.lock().unwrap_or_else(|e| e.into_inner())
}

// --- arguments -------------------------------------------------------------------

/// A shared slice from a C pointer and element count: NULL is allowed only
/// for an empty buffer.
///
/// # Safety
/// When `len > 0`, `ptr` must point to `len` initialized `T`s that stay
/// valid and unmodified by others for the returned lifetime.
unsafe fn slice<'a, T>(ptr: *const T, len: usize, what: &str) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    check_ptr(ptr, len, what)?;
    // SAFETY: non-null, aligned and not larger than isize::MAX bytes
    // (checked above); the caller guarantees `len` readable elements.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// A mutable slice from a C pointer and element count (see [`slice`]).
///
/// # Safety
/// When `len > 0`, `ptr` must point to `len` writable `T`s that nothing
/// else reads or writes for the returned lifetime.
unsafe fn slice_mut<'a, T>(ptr: *mut T, len: usize, what: &str) -> Result<&'a mut [T]> {
    if len == 0 {
        return Ok(&mut []);
    }
    check_ptr(ptr.cast_const(), len, what)?;
    // SAFETY: as in `slice`, and the caller guarantees exclusive access.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

fn check_ptr<T>(ptr: *const T, len: usize, what: &str) -> Result<()> {
    if ptr.is_null() {
        return err(
            TesseraStatus::NullArgument,
            format!("{what} is NULL but its length is {len}"),
        );
    }
    if !ptr.is_aligned() {
        return err(
            TesseraStatus::InvalidArgument,
            format!(
                "{what} is not aligned to {} bytes",
                std::mem::align_of::<T>()
            ),
        );
    }
    if len > isize::MAX as usize / std::mem::size_of::<T>().max(1) {
        return err(
            TesseraStatus::BadLength,
            format!("{what}: length {len} is larger than any buffer"),
        );
    }
    Ok(())
}

/// A required output pointer, checked non-null and aligned.
///
/// # Safety
/// A non-null `ptr` points to a writable `T` the caller owns for `'a`.
unsafe fn out_ptr<'a, T>(ptr: *mut T, what: &str) -> Result<&'a mut T> {
    if ptr.is_null() {
        return err(TesseraStatus::NullArgument, format!("{what} is NULL"));
    }
    if !ptr.is_aligned() {
        return err(
            TesseraStatus::InvalidArgument,
            format!("{what} is misaligned"),
        );
    }
    // SAFETY: non-null and aligned (checked above); writable and owned by
    // the caller (this function's contract).
    Ok(unsafe { &mut *ptr })
}

/// A NUL-terminated path (UTF-8).
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string valid for the call.
unsafe fn c_str<'a>(ptr: *const c_char, what: &str) -> Result<&'a str> {
    if ptr.is_null() {
        return err(TesseraStatus::NullArgument, format!("{what} is NULL"));
    }
    // SAFETY: non-null; the caller guarantees a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(ptr) };
    s.to_str().or_else(|_| {
        err(
            TesseraStatus::InvalidArgument,
            format!("{what} is not valid UTF-8"),
        )
    })
}

/// `Err(BadLength)` unless `got == expected`.
fn expect_len(what: &str, formula: &str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        err(
            TesseraStatus::BadLength,
            format!("{what}: expected {formula} = {expected} elements, got {got}"),
        )
    }
}

fn mul(what: &str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| Error {
        status: TesseraStatus::InvalidArgument,
        message: format!("{what} overflows ({a} · {b})"),
    })
}

/// A vector of `len` elements allocated fallibly.
fn try_vec<T>(len: usize, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error {
        status: TesseraStatus::OutOfMemory,
        message: format!("cannot allocate {len} elements for {what}"),
    })?;
    Ok(v)
}

// --- enumerations passed in ----------------------------------------------------------

/// Which backend a device runs on (`TESSERA_BACKEND_*`).
pub type TesseraBackend = u32;
/// The fastest host backend here: x86 AVX2 (AVX-512 where present), else
/// NEON, else the cranelift JIT.
pub const TESSERA_BACKEND_BEST_HOST: TesseraBackend = 0;
/// x86-64 AVX2/FMA machine code (AVX-512 kernels where the CPU has them).
pub const TESSERA_BACKEND_X86: TesseraBackend = 1;
/// The portable cranelift JIT (x86-64 or aarch64).
pub const TESSERA_BACKEND_HOST_JIT: TesseraBackend = 2;
/// aarch64 NEON machine code.
pub const TESSERA_BACKEND_NEON: TesseraBackend = 3;
/// OpenCL (f16-activation formats; the KV cache lives on the device).
pub const TESSERA_BACKEND_OPENCL: TesseraBackend = 4;
/// CUDA (only in builds with the runtime's `cuda` feature).
pub const TESSERA_BACKEND_CUDA: TesseraBackend = 5;

fn backend_of(b: TesseraBackend) -> Result<Backend> {
    Ok(match b {
        TESSERA_BACKEND_BEST_HOST => Backend::best_host(),
        TESSERA_BACKEND_X86 => Backend::HostX86,
        TESSERA_BACKEND_HOST_JIT => Backend::HostClif,
        TESSERA_BACKEND_NEON => Backend::Neon,
        TESSERA_BACKEND_OPENCL => Backend::OpenCl,
        TESSERA_BACKEND_CUDA => Backend::Cuda,
        other => {
            return err(
                TesseraStatus::InvalidArgument,
                format!("unknown backend {other} (valid: 0..=5, TESSERA_BACKEND_*)"),
            );
        }
    })
}

/// A linear layer's weight/activation format (`TESSERA_FORMAT_*`).
pub type TesseraFormat = u32;
/// f32 weights and activations, f32 output.
pub const TESSERA_FORMAT_F32: TesseraFormat = 0;
/// f16 weights and activations, f16 output.
pub const TESSERA_FORMAT_F16: TesseraFormat = 1;
/// int8 per-row symmetric weights, dynamic int8 activations (given as
/// f32), f32 output.
pub const TESSERA_FORMAT_W8A8: TesseraFormat = 2;
/// uint4 asymmetric weights in groups of 32, dynamic int8 activations
/// (given as f32), f32 output.
pub const TESSERA_FORMAT_W4A8: TesseraFormat = 3;
/// uint4 asymmetric weights, f16 activations, f32 output (GPU family).
pub const TESSERA_FORMAT_W4A16: TesseraFormat = 4;
/// int8 per-row symmetric weights, f16 activations, f32 output (GPU family).
pub const TESSERA_FORMAT_W8A16: TesseraFormat = 5;
/// E0M4 4-bit weights in groups of 32, f16 activations, f32 output (GPU
/// family).
pub const TESSERA_FORMAT_E0M4A16: TesseraFormat = 6;
/// ggml's Q4_0 blocks (`u4sym:g32:f16`: uint4 with zero point 8, one f16
/// scale per 32 weights), dynamic int8 activations (given as f32), f32
/// output.
pub const TESSERA_FORMAT_Q4_0: TesseraFormat = 7;
/// ggml's Q4_1 blocks (`u4asym:g32:f16`: f16 scale and min per 32), dynamic
/// int8 activations (given as f32), f32 output.
pub const TESSERA_FORMAT_Q4_1: TesseraFormat = 8;
/// ggml's Q8_0 blocks (`i8sym:g32:f16`), dynamic int8 activations (given as
/// f32), f32 output.
pub const TESSERA_FORMAT_Q8_0: TesseraFormat = 9;
/// ggml's Q4_0 blocks with f16 activations and f32 output (the GPU family:
/// OpenCL and CUDA read the blocks' f16 scales as stored).
pub const TESSERA_FORMAT_Q4_0A16: TesseraFormat = 10;
/// ggml's Q4_1 blocks with f16 activations and f32 output (GPU family).
pub const TESSERA_FORMAT_Q4_1A16: TesseraFormat = 11;
/// ggml's Q8_0 blocks with f16 activations and f32 output (GPU family).
pub const TESSERA_FORMAT_Q8_0A16: TesseraFormat = 12;

fn format_of(f: TesseraFormat) -> Result<WeightFormat> {
    WeightFormat::ALL
        .get(f as usize)
        .copied()
        .ok_or_else(|| Error {
            status: TesseraStatus::InvalidArgument,
            message: format!(
                "unknown format {f} (valid: 0..={}, TESSERA_FORMAT_*)",
                WeightFormat::ALL.len() - 1
            ),
        })
}

/// An element type of activations and outputs (`TESSERA_DTYPE_*`).
pub type TesseraDType = u32;
/// 32-bit IEEE float (`float`).
pub const TESSERA_DTYPE_F32: TesseraDType = 0;
/// 16-bit IEEE half, passed as its bits (`uint16_t`).
pub const TESSERA_DTYPE_F16: TesseraDType = 1;

fn dtype_of(f: Format) -> TesseraDType {
    match f {
        Format::F16 => TESSERA_DTYPE_F16,
        _ => TESSERA_DTYPE_F32,
    }
}

/// A KV cache's storage format (`TESSERA_KV_*`).
pub type TesseraKvFormat = u32;
/// Keys and values stored as f16.
pub const TESSERA_KV_F16: TesseraKvFormat = 0;
/// Keys int8 (asymmetric, per row), values fp8 e4m3.
pub const TESSERA_KV_KV8: TesseraKvFormat = 1;

fn kv_format_of(f: TesseraKvFormat) -> Result<KvFormat> {
    match f {
        TESSERA_KV_F16 => Ok(KvFormat::F16),
        TESSERA_KV_KV8 => Ok(KvFormat::Kv8),
        other => err(
            TesseraStatus::InvalidArgument,
            format!("unknown KV format {other} (valid: TESSERA_KV_F16, TESSERA_KV_KV8)"),
        ),
    }
}

/// How a KV cache allocates (`TESSERA_KV_GROWTH_*`).
pub type TesseraKvGrowth = u32;
/// Allocated once for `capacity` tokens; appending more is
/// `TESSERA_STATUS_CACHE_FULL`.
pub const TESSERA_KV_GROWTH_FIXED: TesseraKvGrowth = 0;
/// Allocated in chunks of `capacity` tokens, growing (at least doubling)
/// without limit; a growth is the only time the buffer moves.
pub const TESSERA_KV_GROWTH_CHUNKED: TesseraKvGrowth = 1;

// --- library information --------------------------------------------------------------

/// The last failed call's message on the calling thread, or "" when the
/// last call succeeded. Never NULL. The string is owned by Tessera and
/// stays valid until the next Tessera call on the same thread; copy it to
/// keep it.
#[unsafe(no_mangle)]
pub extern "C" fn tessera_last_error() -> *const c_char {
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|slot| slot.borrow().as_ptr())
            .unwrap_or(c"".as_ptr())
    })
    .unwrap_or(c"".as_ptr())
}

/// A static name for a status value (`"TESSERA_STATUS_BAD_LENGTH"`), or
/// `"TESSERA_STATUS_UNKNOWN"`. Never NULL; never freed.
#[unsafe(no_mangle)]
pub extern "C" fn tessera_status_name(status: u32) -> *const c_char {
    let name: &'static CStr = match status {
        0 => c"TESSERA_STATUS_OK",
        1 => c"TESSERA_STATUS_NULL_ARGUMENT",
        2 => c"TESSERA_STATUS_INVALID_ARGUMENT",
        3 => c"TESSERA_STATUS_BAD_LENGTH",
        4 => c"TESSERA_STATUS_INVALID_HANDLE",
        5 => c"TESSERA_STATUS_UNSUPPORTED",
        6 => c"TESSERA_STATUS_UNAVAILABLE",
        7 => c"TESSERA_STATUS_NO_KERNEL",
        8 => c"TESSERA_STATUS_CACHE_FULL",
        9 => c"TESSERA_STATUS_RECORD",
        10 => c"TESSERA_STATUS_IO",
        11 => c"TESSERA_STATUS_BUFFER_TOO_SMALL",
        12 => c"TESSERA_STATUS_OUT_OF_MEMORY",
        13 => c"TESSERA_STATUS_DEVICE",
        14 => c"TESSERA_STATUS_KERNEL",
        15 => c"TESSERA_STATUS_PANIC",
        _ => c"TESSERA_STATUS_UNKNOWN",
    };
    name.as_ptr()
}

/// This library's version (`"0.1.0"`), static. Never NULL; never freed.
#[unsafe(no_mangle)]
pub extern "C" fn tessera_version() -> *const c_char {
    static VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => c"unknown",
        };
    VERSION.as_ptr()
}

/// The dtypes a format's `tessera_linear_forward` takes (`*input`) and
/// writes (`*output`). Either pointer may be NULL to skip it.
///
/// # Safety
/// `input` and `output` are NULL or point to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_format_dtypes(
    format: TesseraFormat,
    input: *mut TesseraDType,
    output: *mut TesseraDType,
) -> TesseraStatus {
    ffi("tessera_format_dtypes", || {
        let f = format_of(format)?;
        if !input.is_null() {
            // SAFETY: a writable output parameter (this function's contract).
            *unsafe { out_ptr(input, "input") }? = dtype_of(f.input());
        }
        if !output.is_null() {
            // SAFETY: a writable output parameter (this function's contract).
            *unsafe { out_ptr(output, "output") }? = dtype_of(f.output());
        }
        Ok(())
    })
}

// --- records ------------------------------------------------------------------------------

/// Load a tuning record (JSON written by `tessera-autotune`) from `path`
/// into `*out`. `TESSERA_STATUS_IO` when the file cannot be read,
/// `TESSERA_STATUS_RECORD` when it is not a record of this schema. Whether
/// it fits a device is checked when a device is opened with it. Close with
/// `tessera_record_close`; devices opened with it keep their own copy.
///
/// # Safety
/// `path` is a NUL-terminated UTF-8 string; `out` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_record_load(
    path: *const c_char,
    out: *mut TesseraRecord,
) -> TesseraStatus {
    ffi("tessera_record_load", || {
        // SAFETY: a writable output parameter (this function's contract).
        let out = unsafe { out_ptr(out, "out") }?;
        // SAFETY: forwarded caller contract (a NUL-terminated string).
        let path = unsafe { c_str(path, "path") }?;
        let rec = TuningRecord::load(Path::new(path))?;
        *out = TesseraRecord {
            id: insert(Object::Record(Arc::new(rec))),
        };
        Ok(())
    })
}

/// How many device entries the record holds.
///
/// # Safety
/// `count` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_record_entries(
    record: TesseraRecord,
    count: *mut usize,
) -> TesseraStatus {
    ffi("tessera_record_entries", || {
        // SAFETY: a writable output parameter (this function's contract).
        let count = unsafe { out_ptr(count, "count") }?;
        *count = get_record(record)?.entries.len();
        Ok(())
    })
}

/// Close a record. The null handle is a no-op; closing twice is
/// `TESSERA_STATUS_INVALID_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn tessera_record_close(record: TesseraRecord) -> TesseraStatus {
    ffi("tessera_record_close", || {
        close(record.id, "record", |o| matches!(o, Object::Record(_)))
    })
}

// --- devices ------------------------------------------------------------------------------

/// How to open a device. Fill it with `tessera_device_options_default`
/// first, then change fields: `struct_size` lets later versions add fields
/// without breaking callers compiled against this header.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TesseraDeviceOptions {
    /// `sizeof(TesseraDeviceOptions)` as the caller was compiled with (set
    /// by `tessera_device_options_default`).
    pub struct_size: u32,
    /// `TESSERA_BACKEND_*`.
    pub backend: TesseraBackend,
    /// Worker threads including the caller; 0 = every available core (one
    /// on a GPU backend).
    pub threads: u32,
    /// Nonzero: on x86, keep to the AVX2 kernels where AVX-512 exists.
    pub x86_avx2_only: u32,
    /// A tuning record file to load, or NULL. Read during the call only.
    pub record_path: *const c_char,
    /// A record from `tessera_record_load`, or the null handle. At most one
    /// of `record_path` and `record` may be set.
    pub record: TesseraRecord,
    /// A directory written by `tessera-kernels-gen gen` (its
    /// `manifest.json` and kernel files), or NULL to compile kernels at run
    /// time. With it the device runs only those prebuilt kernels (no JIT
    /// compiler is used): the set must come from this library's generator
    /// and every file must match the manifest's hash. Read during the call
    /// only.
    pub prebuilt_dir: *const c_char,
    /// The generator target whose kernels to load from `prebuilt_dir`
    /// (`x86-avx2`, `host`, `aarch64-i8mm`, …), or NULL for the backend's
    /// own (`x86-avx2` for `TESSERA_BACKEND_X86`, `host` for
    /// `TESSERA_BACKEND_HOST_JIT`; NEON names its target). Read during the
    /// call only.
    pub prebuilt_target: *const c_char,
    /// Nonzero: every linear layer holds one packed copy of its weights
    /// (the GEMM's packing) instead of up to three, for devices where the
    /// copies do not fit; small-M calls may be slower.
    pub one_weight_copy: u32,
}

/// Fill `*options` with the defaults: best host backend, all cores, no
/// record.
///
/// # Safety
/// `options` points to writable memory for one `TesseraDeviceOptions`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_device_options_default(
    options: *mut TesseraDeviceOptions,
) -> TesseraStatus {
    ffi("tessera_device_options_default", || {
        // SAFETY: a writable output parameter (this function's contract).
        *unsafe { out_ptr(options, "options") }? = TesseraDeviceOptions {
            struct_size: std::mem::size_of::<TesseraDeviceOptions>() as u32,
            backend: TESSERA_BACKEND_BEST_HOST,
            threads: 0,
            x86_avx2_only: 0,
            record_path: std::ptr::null(),
            record: TesseraRecord::default(),
            prebuilt_dir: std::ptr::null(),
            prebuilt_target: std::ptr::null(),
            one_weight_copy: 0,
        };
        Ok(())
    })
}

/// The record a device opened with must serve: at least one entry for this
/// device's fingerprint, this generator and this backend. Otherwise the
/// runtime would silently fall back to solver defaults; through the C API
/// a record for another device is an error the engine sees.
fn check_record_fits(dev: &Device, rec: &TuningRecord) -> Result<()> {
    let mut why: Option<RecordError> = None;
    for format in WeightFormat::ALL {
        match rec.select(
            dev.fingerprint(),
            dev.generator(),
            dev.backend().record_name(),
            format.name(),
        ) {
            Ok(_) => return Ok(()),
            Err(e @ RecordError::Stale { .. }) => why = Some(e),
            Err(e) if why.is_none() => why = Some(e),
            Err(_) => {}
        }
    }
    let message = match why {
        Some(RecordError::NoEntry { available, .. }) => format!(
            "the record has no entry for backend `{}` (it has: {available})",
            dev.backend()
        ),
        Some(e) => e.to_string(),
        None => "the record has no entries".into(),
    };
    err(TesseraStatus::Record, message)
}

/// Open a device as `*options` says and store its handle in `*out`.
/// `options` may be NULL for the defaults. With a record (path or
/// handle), the record must hold an entry for this device's fingerprint,
/// this library's generator and the chosen backend, else
/// `TESSERA_STATUS_RECORD` says which field differs. A backend this
/// machine or build cannot run is `TESSERA_STATUS_UNAVAILABLE`.
///
/// Thread safety: a device may be used from any number of threads at once.
/// Closing it while layers made from it are alive is allowed: they keep
/// what they need.
///
/// # Safety
/// `options` is NULL or points to a `TesseraDeviceOptions` filled by
/// `tessera_device_options_default` (then edited); `record_path` in it is
/// NULL or a NUL-terminated string. `out` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_device_open(
    options: *const TesseraDeviceOptions,
    out: *mut TesseraDevice,
) -> TesseraStatus {
    ffi("tessera_device_open", || {
        // SAFETY: a writable output parameter (this function's contract).
        let out = unsafe { out_ptr(out, "out") }?;
        let mut opts = TesseraDeviceOptions {
            struct_size: std::mem::size_of::<TesseraDeviceOptions>() as u32,
            backend: TESSERA_BACKEND_BEST_HOST,
            threads: 0,
            x86_avx2_only: 0,
            record_path: std::ptr::null(),
            record: TesseraRecord::default(),
            prebuilt_dir: std::ptr::null(),
            prebuilt_target: std::ptr::null(),
            one_weight_copy: 0,
        };
        if !options.is_null() {
            if !options.is_aligned() {
                return err(TesseraStatus::InvalidArgument, "options is misaligned");
            }
            // SAFETY: non-null, aligned; read the size field first so a
            // caller compiled against a smaller struct is refused before
            // the whole struct is read.
            let size = unsafe { std::ptr::addr_of!((*options).struct_size).read() };
            if size as usize != std::mem::size_of::<TesseraDeviceOptions>() {
                return err(
                    TesseraStatus::InvalidArgument,
                    format!(
                        "options->struct_size is {size}, this library's is {} \
                         (fill options with tessera_device_options_default)",
                        std::mem::size_of::<TesseraDeviceOptions>()
                    ),
                );
            }
            // SAFETY: the caller's struct has this library's size, and
            // every field is plain data valid for any bit pattern.
            opts = unsafe { options.read() };
        }
        let backend = backend_of(opts.backend)?;
        let rec: Option<TuningRecord> = match (opts.record_path.is_null(), opts.record.id) {
            (true, 0) => None,
            (false, 0) => {
                // SAFETY: non-null; the caller guarantees a NUL-terminated
                // string (documented on the field).
                let path = unsafe { c_str(opts.record_path, "options->record_path") }?;
                Some(TuningRecord::load(Path::new(path))?)
            }
            (true, _) => Some(get_record(opts.record)?.as_ref().clone()),
            (false, _) => {
                return err(
                    TesseraStatus::InvalidArgument,
                    "set at most one of options->record_path and options->record",
                );
            }
        };
        let prebuilt = if opts.prebuilt_dir.is_null() {
            None
        } else {
            // SAFETY: non-null; the caller guarantees a NUL-terminated
            // string (documented on the field).
            let dir = unsafe { c_str(opts.prebuilt_dir, "options->prebuilt_dir") }?;
            let target = if opts.prebuilt_target.is_null() {
                match backend {
                    Backend::HostX86 => "x86-avx2",
                    Backend::HostClif => "host",
                    other => {
                        return err(
                            TesseraStatus::InvalidArgument,
                            format!(
                                "options->prebuilt_target is NULL: name the generator target for the {other:?} backend (e.g. aarch64-i8mm)"
                            ),
                        );
                    }
                }
            } else {
                // SAFETY: non-null; NUL-terminated by contract.
                unsafe { c_str(opts.prebuilt_target, "options->prebuilt_target") }?
            };
            Some(tessera_runtime::manifest::Manifest::load_prebuilt(
                Path::new(dir),
                target,
                &tessera_runtime::current_generator(),
            )?)
        };
        let dev = Device::open(
            backend,
            DeviceOptions {
                threads: (opts.threads > 0).then_some(opts.threads as usize),
                record: rec.clone(),
                x86_avx2_only: opts.x86_avx2_only != 0,
                one_weight_copy: opts.one_weight_copy != 0,
                prebuilt,
                ..Default::default()
            },
        )?;
        if let Some(rec) = &rec {
            check_record_fits(&dev, rec)?;
        }
        *out = TesseraDevice {
            id: insert(Object::Device(Arc::new(dev))),
        };
        Ok(())
    })
}

/// Close a device. Layers and attention made from it stay usable until
/// they are closed. The null handle is a no-op; closing twice is
/// `TESSERA_STATUS_INVALID_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn tessera_device_close(device: TesseraDevice) -> TesseraStatus {
    ffi("tessera_device_close", || {
        close(device.id, "device", |o| matches!(o, Object::Device(_)))
    })
}

/// The worker threads the device splits work over (including the caller).
///
/// # Safety
/// `threads` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_device_threads(
    device: TesseraDevice,
    threads: *mut usize,
) -> TesseraStatus {
    ffi("tessera_device_threads", || {
        // SAFETY: a writable output parameter (this function's contract).
        let threads = unsafe { out_ptr(threads, "threads") }?;
        *threads = get_device(device)?.threads();
        Ok(())
    })
}

/// The device fingerprint (what tuning records are keyed by) as JSON,
/// written NUL-terminated into the caller's `buf` of `buf_len` bytes.
/// `*needed` (may be NULL) receives the length including the NUL. When
/// `buf_len` is too small nothing is written and the status is
/// `TESSERA_STATUS_BUFFER_TOO_SMALL`: call again with `*needed` bytes
/// (`buf` may be NULL when `buf_len` is 0, to ask for the size).
///
/// # Safety
/// `buf` points to `buf_len` writable bytes (or is NULL with `buf_len` 0);
/// `needed` is NULL or points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_device_fingerprint(
    device: TesseraDevice,
    buf: *mut c_char,
    buf_len: usize,
    needed: *mut usize,
) -> TesseraStatus {
    ffi("tessera_device_fingerprint", || {
        let dev = get_device(device)?;
        let json = serde_json::to_string(dev.fingerprint()).map_err(|e| Error {
            status: TesseraStatus::Kernel,
            message: format!("cannot serialize the fingerprint: {e}"),
        })?;
        let json = json.replace('\0', " ");
        let want = json.len() + 1;
        if !needed.is_null() {
            // SAFETY: a writable output parameter (this function's contract).
            *unsafe { out_ptr(needed, "needed") }? = want;
        }
        if buf_len < want {
            return err(
                TesseraStatus::BufferTooSmall,
                format!("buf has {buf_len} bytes, the fingerprint needs {want}"),
            );
        }
        // SAFETY: the caller guarantees `buf_len` writable bytes at `buf`,
        // and `want <= buf_len`.
        let dst = unsafe { slice_mut(buf.cast::<u8>(), buf_len, "buf") }?;
        dst[..json.len()].copy_from_slice(json.as_bytes());
        dst[json.len()] = 0;
        Ok(())
    })
}

// --- linear layers --------------------------------------------------------------------------

/// The logical layout of already-quantized weights for a format and
/// `[n, k]`, from `tessera_quant_layout`.
///
/// Codes are one per weight, row-major `[n, k]`, one byte each (4-bit codes
/// in the low nibble, signed codes as two's complement). Scales and offsets
/// are one per group, row-major `[n, groups_per_row]`; each weight is
/// `scale * v(code) + offset` (for uint4: v = code 0..15; for int8: the
/// signed code; for E0M4: 2 + code/8). Symmetric formats have no offsets.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TesseraQuantLayout {
    /// Columns per group along k (k itself for per-row formats).
    pub group_size: usize,
    /// Groups per row.
    pub groups_per_row: usize,
    /// n·k.
    pub codes_len: usize,
    /// n·groups_per_row.
    pub scales_len: usize,
    /// n·groups_per_row for asymmetric formats, else 0.
    pub offsets_len: usize,
}

/// Already-quantized weights as `tessera_quant_layout` describes them.
/// Tessera copies them during the call (`tessera_linear_create_quantized`);
/// the caller keeps ownership.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TesseraQuantWeights {
    pub codes: *const u8,
    pub codes_len: usize,
    pub scales: *const f32,
    pub scales_len: usize,
    /// NULL (with `offsets_len` 0) for symmetric formats.
    pub offsets: *const f32,
    pub offsets_len: usize,
}

/// The quantized weight format a matmul format's kernels read.
fn weight_format(format: WeightFormat) -> Result<Format> {
    let kernel = library::get(format.library_kernel()).map_err(|e| Error {
        status: TesseraStatus::Kernel,
        message: e.to_string(),
    })?;
    kernel
        .as_matmul()
        .and_then(|m| kernel.tensor(&m.w))
        .map(|t| t.format)
        .ok_or_else(|| Error {
            status: TesseraStatus::Kernel,
            message: format!("{} is not a matmul kernel", format.library_kernel()),
        })
}

fn quant_layout(format: WeightFormat, n: usize, k: usize) -> Result<(Format, TesseraQuantLayout)> {
    let wf = weight_format(format)?;
    let Some(group) = wf.group().filter(|_| wf.is_quantized()) else {
        return err(
            TesseraStatus::Unsupported,
            format!(
                "format {format} has {wf} weights, which are not quantized: \
                 use tessera_linear_create_f32 or _f16"
            ),
        );
    };
    let gpr = groups_per_row(group, k);
    let codes_len = mul("n·k", n, k)?;
    let scales_len = mul("n·groups", n, gpr)?;
    let layout = TesseraQuantLayout {
        group_size: group.len(k).max(1),
        groups_per_row: gpr,
        codes_len,
        scales_len,
        offsets_len: if wf.is_asymmetric() { scales_len } else { 0 },
    };
    Ok((wf, layout))
}

/// The quantized layout `tessera_linear_create_quantized` expects for
/// `format` and `[n, k]`. `TESSERA_STATUS_UNSUPPORTED` for the float
/// formats (f32, f16).
///
/// # Safety
/// `out` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_quant_layout(
    format: TesseraFormat,
    n: usize,
    k: usize,
    out: *mut TesseraQuantLayout,
) -> TesseraStatus {
    ffi("tessera_quant_layout", || {
        // SAFETY: a writable output parameter (this function's contract).
        let out = unsafe { out_ptr(out, "out") }?;
        *out = quant_layout(format_of(format)?, n, k)?.1;
        Ok(())
    })
}

/// Bias as a slice (NULL with length 0 means zeros).
///
/// # Safety
/// As [`slice`].
unsafe fn bias_slice<'a>(bias: *const f32, bias_len: usize, n: usize) -> Result<Option<&'a [f32]>> {
    if bias.is_null() && bias_len == 0 {
        return Ok(None);
    }
    expect_len("bias_len", "n", n, bias_len)?;
    // SAFETY: forwarded caller contract.
    Ok(Some(unsafe { slice(bias, bias_len, "bias") }?))
}

fn new_linear(
    device: TesseraDevice,
    format: TesseraFormat,
    weights: Weights<'_>,
    n: usize,
    k: usize,
    bias: Option<&[f32]>,
    out: &mut TesseraLinear,
) -> Result<()> {
    let dev = get_device(device)?;
    let format = format_of(format)?;
    let lin = Linear::new(&dev, format, weights, n, k, bias)?;
    *out = TesseraLinear {
        id: insert(Object::Linear(Arc::new(lin))),
    };
    Ok(())
}

/// A linear layer `y[m, n] = x[m, k] · wᵀ + bias` from f32 weights `w`
/// (`[n, k]` row-major, `w_len == n*k`), converted or quantized once to
/// `format` and packed for the device's kernels. `bias` has `n` values, or
/// is NULL with `bias_len` 0 for none. Tessera copies what it needs during
/// the call: the caller may free `w` and `bias` afterwards.
///
/// # Safety
/// `w` points to `w_len` floats, `bias` to `bias_len` floats (or NULL);
/// `out` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_linear_create_f32(
    device: TesseraDevice,
    format: TesseraFormat,
    w: *const f32,
    w_len: usize,
    n: usize,
    k: usize,
    bias: *const f32,
    bias_len: usize,
    out: *mut TesseraLinear,
) -> TesseraStatus {
    ffi("tessera_linear_create_f32", || {
        // SAFETY: a writable output parameter (this function's contract).
        let out = unsafe { out_ptr(out, "out") }?;
        expect_len("w_len", "n·k", mul("n·k", n, k)?, w_len)?;
        // SAFETY: forwarded caller contract; length checked above.
        let w = unsafe { slice(w, w_len, "w") }?;
        // SAFETY: forwarded caller contract.
        let bias = unsafe { bias_slice(bias, bias_len, n) }?;
        new_linear(device, format, Weights::F32(w), n, k, bias, out)
    })
}

/// As `tessera_linear_create_f32`, from f16 weights given as their bits
/// (`uint16_t`, `[n, k]` row-major). They are widened to f32 (a temporary
/// copy of n·k floats) and then converted or quantized to `format`.
///
/// # Safety
/// `w` points to `w_len` `uint16_t`s, `bias` to `bias_len` floats (or
/// NULL); `out` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_linear_create_f16(
    device: TesseraDevice,
    format: TesseraFormat,
    w: *const u16,
    w_len: usize,
    n: usize,
    k: usize,
    bias: *const f32,
    bias_len: usize,
    out: *mut TesseraLinear,
) -> TesseraStatus {
    ffi("tessera_linear_create_f16", || {
        // SAFETY: a writable output parameter (this function's contract).
        let out = unsafe { out_ptr(out, "out") }?;
        expect_len("w_len", "n·k", mul("n·k", n, k)?, w_len)?;
        // SAFETY: forwarded caller contract; length checked above.
        let w = unsafe { slice(w, w_len, "w") }?;
        // SAFETY: forwarded caller contract.
        let bias = unsafe { bias_slice(bias, bias_len, n) }?;
        let mut wide: Vec<f32> = try_vec(w.len(), "the widened f16 weights")?;
        wide.extend(w.iter().map(|&b| f16::from_bits(b).to_f32()));
        new_linear(device, format, Weights::F32(&wide), n, k, bias, out)
    })
}

/// A linear layer from weights already quantized in the format's weight
/// format (e.g. repacked from a model file, no requantization), laid out
/// as `tessera_quant_layout` says. Codes are range-checked. Tessera copies
/// them during the call. `TESSERA_STATUS_UNSUPPORTED` for f32/f16.
///
/// # Safety
/// `weights` points to a `TesseraQuantWeights` whose pointers are valid for
/// their lengths (offsets may be NULL with length 0); `bias` as in
/// `tessera_linear_create_f32`; `out` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_linear_create_quantized(
    device: TesseraDevice,
    format: TesseraFormat,
    weights: *const TesseraQuantWeights,
    n: usize,
    k: usize,
    bias: *const f32,
    bias_len: usize,
    out: *mut TesseraLinear,
) -> TesseraStatus {
    ffi("tessera_linear_create_quantized", || {
        // SAFETY: a writable output parameter (this function's contract).
        let out = unsafe { out_ptr(out, "out") }?;
        let (wf, layout) = quant_layout(format_of(format)?, n, k)?;
        if weights.is_null() {
            return err(TesseraStatus::NullArgument, "weights is NULL");
        }
        if !weights.is_aligned() {
            return err(TesseraStatus::InvalidArgument, "weights is misaligned");
        }
        // SAFETY: non-null, aligned, plain-data struct the caller provides.
        let q = unsafe { weights.read() };
        expect_len("codes_len", "n·k", layout.codes_len, q.codes_len)?;
        expect_len(
            "scales_len",
            "n·groups_per_row",
            layout.scales_len,
            q.scales_len,
        )?;
        expect_len(
            "offsets_len",
            "n·groups_per_row (asymmetric) or 0",
            layout.offsets_len,
            q.offsets_len,
        )?;
        // SAFETY: forwarded caller contract; lengths checked above.
        let (codes, scales, offsets) = unsafe {
            (
                slice(q.codes, q.codes_len, "weights->codes")?,
                slice(q.scales, q.scales_len, "weights->scales")?,
                slice(q.offsets, q.offsets_len, "weights->offsets")?,
            )
        };
        // SAFETY: forwarded caller contract.
        let bias = unsafe { bias_slice(bias, bias_len, n) }?;
        let mut tensor = QuantTensor {
            format: wf,
            rows: n,
            cols: k,
            codes: try_vec(codes.len(), "the codes")?,
            scales: try_vec(scales.len(), "the scales")?,
            offsets: try_vec(offsets.len(), "the offsets")?,
        };
        tensor.codes.extend_from_slice(codes);
        tensor.scales.extend_from_slice(scales);
        tensor.offsets.extend_from_slice(offsets);
        tensor.validate().map_err(|e| Error {
            status: TesseraStatus::InvalidArgument,
            message: format!("quantized weights: {e}"),
        })?;
        new_linear(device, format, Weights::Quant(&tensor), n, k, bias, out)
    })
}

/// The layer's `n` (output channels) and `k` (input channels). Either
/// pointer may be NULL.
///
/// # Safety
/// `n` and `k` are NULL or point to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_linear_shape(
    linear: TesseraLinear,
    n: *mut usize,
    k: *mut usize,
) -> TesseraStatus {
    ffi("tessera_linear_shape", || {
        let lin = get_linear(linear)?;
        if !n.is_null() {
            // SAFETY: a writable output parameter (this function's contract).
            *unsafe { out_ptr(n, "n") }? = lin.n();
        }
        if !k.is_null() {
            // SAFETY: a writable output parameter (this function's contract).
            *unsafe { out_ptr(k, "k") }? = lin.k();
        }
        Ok(())
    })
}

/// `y[m, n] = x[m, k] · wᵀ + bias` for any `m` (0 does nothing), with the
/// kernel chosen by M (GEMV, flat GEMM, GEMM) as the device's record or
/// defaults say. `x` has `x_len == m*k` elements and `y` has
/// `y_len == m*n`, of the dtypes `tessera_format_dtypes` gives for the
/// layer's format (`float` for F32, `uint16_t` f16 bits for F16). Both
/// buffers stay the caller's; `y` is written during the call only.
///
/// Thread safety: one layer may run on several threads at once (each with
/// its own `y`).
///
/// # Safety
/// `x` points to `x_len` elements and `y` to `y_len` writable elements of
/// the format's dtypes, aligned for them, and they do not overlap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_linear_forward(
    linear: TesseraLinear,
    x: *const c_void,
    x_len: usize,
    m: usize,
    y: *mut c_void,
    y_len: usize,
) -> TesseraStatus {
    ffi("tessera_linear_forward", || {
        let lin = get_linear(linear)?;
        let (n, k) = (lin.n(), lin.k());
        expect_len("x_len", "m·k", mul("m·k", m, k)?, x_len)?;
        expect_len("y_len", "m·n", mul("m·n", m, n)?, y_len)?;
        let format = lin.format();
        // SAFETY (both blocks): forwarded caller contract, the element
        // type is the one the format documents, lengths checked above.
        let x = match dtype_of(format.input()) {
            TESSERA_DTYPE_F16 => Input::F16(unsafe { slice(x.cast::<f16>(), x_len, "x") }?),
            _ => Input::F32(unsafe { slice(x.cast::<f32>(), x_len, "x") }?),
        };
        let y = match dtype_of(format.output()) {
            TESSERA_DTYPE_F16 => Output::F16(unsafe { slice_mut(y.cast::<f16>(), y_len, "y") }?),
            _ => Output::F32(unsafe { slice_mut(y.cast::<f32>(), y_len, "y") }?),
        };
        lin.forward(x, m, y)?;
        Ok(())
    })
}

/// `tessera_linear_forward` of `count` layers that read one input (the Q,
/// K and V projections; gate and up): `linears[i]` writes `ys[i]`, of
/// `y_lens[i] == m*n_i` elements. The layers must share k and the input
/// dtype. W8A8 and W4A8 layers quantize `x` once per distinct activation
/// quantizer instead of once each; every result equals the layer's own
/// `tessera_linear_forward` bit for bit. Every length is checked before
/// any layer runs.
///
/// # Safety
/// `linears`, `ys` and `y_lens` point to `count` elements (any may be NULL
/// when `count` is 0); `x` is as in `tessera_linear_forward`; each `ys[i]`
/// points to `y_lens[i]` writable elements of its layer's output dtype,
/// overlapping neither `x` nor another `ys[j]`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_linear_forward_shared(
    linears: *const TesseraLinear,
    count: usize,
    x: *const c_void,
    x_len: usize,
    m: usize,
    ys: *const *mut c_void,
    y_lens: *const usize,
) -> TesseraStatus {
    ffi("tessera_linear_forward_shared", || {
        // SAFETY (three blocks): forwarded caller contract, `count` elements.
        let handles = unsafe { slice(linears, count, "linears") }?;
        let outs = unsafe { slice(ys, count, "ys") }?;
        let lens = unsafe { slice(y_lens, count, "y_lens") }?;
        let lins = handles
            .iter()
            .map(|&h| get_linear(h))
            .collect::<Result<Vec<_>>>()?;
        let Some(first) = lins.first() else {
            return Ok(());
        };
        let (k, input) = (first.k(), first.format().input());
        for (i, lin) in lins.iter().enumerate() {
            if lin.k() != k || lin.format().input() != input {
                return err(
                    TesseraStatus::InvalidArgument,
                    format!(
                        "linears[{i}] takes rows of k = {} {}, linears[0] k = {k} {input}: \
                         a shared input needs one k and one dtype",
                        lin.k(),
                        lin.format().input()
                    ),
                );
            }
        }
        expect_len("x_len", "m·k", mul("m·k", m, k)?, x_len)?;
        for (i, (lin, &len)) in lins.iter().zip(lens).enumerate() {
            let what = format!("y_lens[{i}]");
            expect_len(&what, "m·n", mul("m·n", m, lin.n())?, len)?;
        }
        // SAFETY: forwarded caller contract, the element type is the one
        // the format documents, length checked above.
        let x = match dtype_of(input) {
            TESSERA_DTYPE_F16 => Input::F16(unsafe { slice(x.cast::<f16>(), x_len, "x") }?),
            _ => Input::F32(unsafe { slice(x.cast::<f32>(), x_len, "x") }?),
        };
        let shared = SharedInput::new(x, m);
        for ((lin, &y), &len) in lins.iter().zip(outs).zip(lens) {
            // SAFETY: as for x; each `ys[i]` is the caller's, unaliased,
            // and this slice ends before the next is made.
            let y = match dtype_of(lin.format().output()) {
                TESSERA_DTYPE_F16 => {
                    Output::F16(unsafe { slice_mut(y.cast::<f16>(), len, "ys[i]") }?)
                }
                _ => Output::F32(unsafe { slice_mut(y.cast::<f32>(), len, "ys[i]") }?),
            };
            lin.forward_shared(&shared, y)?;
        }
        Ok(())
    })
}

/// Close a linear layer. The null handle is a no-op; closing twice is
/// `TESSERA_STATUS_INVALID_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn tessera_linear_close(linear: TesseraLinear) -> TesseraStatus {
    ffi("tessera_linear_close", || {
        close(linear.id, "linear", |o| matches!(o, Object::Linear(_)))
    })
}

// --- attention and the KV cache ----------------------------------------------------------

/// A KV cache for one layer, `[tokens, kvh, d]` in `kv_format`, where the
/// device's attention reads it (device buffers on OpenCL, host memory
/// otherwise). `growth` is `TESSERA_KV_GROWTH_FIXED` (room for exactly
/// `capacity` tokens, allocated now) or `TESSERA_KV_GROWTH_CHUNKED` (grows
/// in chunks of `capacity` tokens).
///
/// Thread safety: calls on one cache are serialized by a lock inside it.
///
/// # Safety
/// `out` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_kv_cache_create(
    device: TesseraDevice,
    kv_format: TesseraKvFormat,
    kvh: usize,
    d: usize,
    capacity: usize,
    growth: TesseraKvGrowth,
    out: *mut TesseraKvCache,
) -> TesseraStatus {
    ffi("tessera_kv_cache_create", || {
        // SAFETY: a writable output parameter (this function's contract).
        let out = unsafe { out_ptr(out, "out") }?;
        let dev = get_device(device)?;
        let format = kv_format_of(kv_format)?;
        let mode = match growth {
            TESSERA_KV_GROWTH_FIXED => KvCapacity::Max(capacity),
            TESSERA_KV_GROWTH_CHUNKED => KvCapacity::Chunked(capacity),
            other => {
                return err(
                    TesseraStatus::InvalidArgument,
                    format!("unknown growth {other} (TESSERA_KV_GROWTH_FIXED or _CHUNKED)"),
                );
            }
        };
        // The runtime allocates fallibly: an impossible capacity is
        // RuntimeError::OutOfMemory, TESSERA_STATUS_OUT_OF_MEMORY here.
        let cache = KvCache::for_device(&dev, format, kvh, d, mode)?;
        *out = TesseraKvCache {
            id: insert(Object::KvCache(Arc::new(Mutex::new(cache)))),
        };
        Ok(())
    })
}

/// Append `tokens` tokens to the cache, in place: `k` and `v` are f32
/// `[tokens, kvh, d]` (`k_len == v_len == tokens*kvh*d`), stored in the
/// cache's format (quantized per row for KV8). Values must be finite. The
/// caller keeps `k` and `v`.
///
/// # Safety
/// `k` and `v` point to `k_len` / `v_len` floats.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_kv_cache_append(
    cache: TesseraKvCache,
    k: *const f32,
    k_len: usize,
    v: *const f32,
    v_len: usize,
    tokens: usize,
) -> TesseraStatus {
    ffi("tessera_kv_cache_append", || {
        let cache = get_kv_cache(cache)?;
        // SAFETY: forwarded caller contract.
        let (k, v) = unsafe { (slice(k, k_len, "k")?, slice(v, v_len, "v")?) };
        lock_cache(&cache)
            .append(k, v, tokens)
            .map_err(length_status)
    })
}

/// The number of tokens cached.
///
/// # Safety
/// `len` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_kv_cache_len(
    cache: TesseraKvCache,
    len: *mut usize,
) -> TesseraStatus {
    ffi("tessera_kv_cache_len", || {
        // SAFETY: a writable output parameter (this function's contract).
        let len = unsafe { out_ptr(len, "len") }?;
        let cache = get_kv_cache(cache)?;
        *len = lock_cache(&cache).len();
        Ok(())
    })
}

/// Forget every cached token, keeping the allocation (a new sequence).
#[unsafe(no_mangle)]
pub extern "C" fn tessera_kv_cache_clear(cache: TesseraKvCache) -> TesseraStatus {
    ffi("tessera_kv_cache_clear", || {
        let cache = get_kv_cache(cache)?;
        lock_cache(&cache).clear();
        Ok(())
    })
}

/// Close a KV cache. The null handle is a no-op; closing twice is
/// `TESSERA_STATUS_INVALID_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn tessera_kv_cache_close(cache: TesseraKvCache) -> TesseraStatus {
    ffi("tessera_kv_cache_close", || {
        close(cache.id, "KV cache", |o| matches!(o, Object::KvCache(_)))
    })
}

/// Attention with `hq` query heads over `kvh` KV heads (`hq` a multiple of
/// `kvh`) of dimension `d`, reading caches in `kv_format`.
///
/// Thread safety: one operator may run on several threads at once.
///
/// # Safety
/// `out` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_attention_create(
    device: TesseraDevice,
    hq: usize,
    kvh: usize,
    d: usize,
    kv_format: TesseraKvFormat,
    out: *mut TesseraAttention,
) -> TesseraStatus {
    ffi("tessera_attention_create", || {
        // SAFETY: a writable output parameter (this function's contract).
        let out = unsafe { out_ptr(out, "out") }?;
        let dev = get_device(device)?;
        let att = Attention::new(&dev, hq, kvh, d, kv_format_of(kv_format)?)?;
        *out = TesseraAttention {
            id: insert(Object::Attention(Arc::new(att))),
        };
        Ok(())
    })
}

/// A runtime error about element counts is the caller's length mistake.
fn length_status(e: RuntimeError) -> Error {
    let mut e = Error::from(e);
    if e.status == TesseraStatus::InvalidArgument && e.message.contains(" elements") {
        e.status = TesseraStatus::BadLength;
    }
    e
}

/// Decode: one query token over every cached token. `q` and `o` are f16
/// bits `[hq, d]` (`q_len == o_len == hq*d`), `q` already scaled by
/// 1/sqrt(d). The cache must hold at least one token (append the new
/// token's K/V first). The caller keeps `q`; `o` is written during the
/// call only.
///
/// # Safety
/// `q` points to `q_len` `uint16_t`s and `o` to `o_len` writable ones, not
/// overlapping.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_attention_decode(
    attention: TesseraAttention,
    cache: TesseraKvCache,
    q: *const u16,
    q_len: usize,
    o: *mut u16,
    o_len: usize,
) -> TesseraStatus {
    ffi("tessera_attention_decode", || {
        let att = get_attention(attention)?;
        let cache = get_kv_cache(cache)?;
        // SAFETY: forwarded caller contract; f16 is a transparent u16.
        let (q, o) = unsafe {
            (
                slice(q.cast::<f16>(), q_len, "q")?,
                slice_mut(o.cast::<f16>(), o_len, "o")?,
            )
        };
        let c = lock_cache(&cache);
        att.decode(q, &c, o).map_err(length_status)?;
        Ok(())
    })
}

/// Prefill: the last `t` cached tokens as queries, causally (token i of t
/// sees the keys up to its own position). Append the prompt's K/V first.
/// `q` and `o` are f16 bits `[t, hq, d]` (`q_len == o_len == t*hq*d`).
///
/// # Safety
/// As `tessera_attention_decode`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tessera_attention_prefill(
    attention: TesseraAttention,
    cache: TesseraKvCache,
    q: *const u16,
    q_len: usize,
    t: usize,
    o: *mut u16,
    o_len: usize,
) -> TesseraStatus {
    ffi("tessera_attention_prefill", || {
        let att = get_attention(attention)?;
        let cache = get_kv_cache(cache)?;
        // SAFETY: forwarded caller contract; f16 is a transparent u16.
        let (q, o) = unsafe {
            (
                slice(q.cast::<f16>(), q_len, "q")?,
                slice_mut(o.cast::<f16>(), o_len, "o")?,
            )
        };
        let c = lock_cache(&cache);
        att.prefill(q, t, &c, o).map_err(length_status)?;
        Ok(())
    })
}

/// Close an attention operator. The null handle is a no-op; closing twice
/// is `TESSERA_STATUS_INVALID_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn tessera_attention_close(attention: TesseraAttention) -> TesseraStatus {
    ffi("tessera_attention_close", || {
        close(attention.id, "attention", |o| {
            matches!(o, Object::Attention(_))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C constants index `WeightFormat::ALL`: a reordering there must
    /// not silently change what a C caller's format number means.
    #[test]
    fn format_constants_name_their_formats() {
        let pairs = [
            (TESSERA_FORMAT_F32, WeightFormat::F32),
            (TESSERA_FORMAT_F16, WeightFormat::F16),
            (TESSERA_FORMAT_W8A8, WeightFormat::W8A8),
            (TESSERA_FORMAT_W4A8, WeightFormat::W4A8),
            (TESSERA_FORMAT_W4A16, WeightFormat::W4A16),
            (TESSERA_FORMAT_W8A16, WeightFormat::W8A16),
            (TESSERA_FORMAT_E0M4A16, WeightFormat::E0M4A16),
            (TESSERA_FORMAT_Q4_0, WeightFormat::Q4_0),
            (TESSERA_FORMAT_Q4_1, WeightFormat::Q4_1),
            (TESSERA_FORMAT_Q8_0, WeightFormat::Q8_0),
            (TESSERA_FORMAT_Q4_0A16, WeightFormat::Q4_0A16),
            (TESSERA_FORMAT_Q4_1A16, WeightFormat::Q4_1A16),
            (TESSERA_FORMAT_Q8_0A16, WeightFormat::Q8_0A16),
        ];
        assert_eq!(pairs.len(), WeightFormat::ALL.len());
        for (c, f) in pairs {
            assert_eq!(format_of(c).unwrap(), f, "TESSERA_FORMAT {c}");
        }
    }

    fn last_error() -> String {
        // SAFETY: tessera_last_error never returns NULL and the string
        // lives until this thread's next call.
        unsafe { CStr::from_ptr(tessera_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_a_status_with_its_message() {
        let status = ffi("tessera_test", || panic!("boom {}", 42));
        assert_eq!(status, TesseraStatus::Panic);
        assert!(
            last_error().contains("internal panic: boom 42"),
            "{}",
            last_error()
        );
        assert_eq!(ffi("tessera_test", || Ok(())), TesseraStatus::Ok);
        assert_eq!(last_error(), "");
    }

    #[test]
    fn the_last_error_belongs_to_its_thread() {
        let status = tessera_device_close(TesseraDevice { id: u64::MAX });
        assert_eq!(status, TesseraStatus::InvalidHandle);
        assert!(last_error().contains("not open"));
        let other = std::thread::spawn(last_error).join().unwrap();
        assert_eq!(other, "");
        assert!(last_error().contains("not open"));
    }

    #[test]
    fn one_layer_runs_on_several_threads_at_once() {
        let (n, k, m) = (24, 32, 3);
        let w: Vec<f32> = (0..n * k).map(|i| (i % 9) as f32 / 9.0 - 0.5).collect();
        let x: Vec<f32> = (0..m * k).map(|i| (i % 5) as f32 / 5.0).collect();
        let mut dev = TesseraDevice::default();
        let mut lin = TesseraLinear::default();
        // SAFETY: valid pointers and lengths for every call below.
        unsafe {
            assert_eq!(
                tessera_device_open(std::ptr::null(), &mut dev),
                TesseraStatus::Ok
            );
            assert_eq!(
                tessera_linear_create_f32(
                    dev,
                    TESSERA_FORMAT_F32,
                    w.as_ptr(),
                    w.len(),
                    n,
                    k,
                    std::ptr::null(),
                    0,
                    &mut lin
                ),
                TesseraStatus::Ok
            );
        }
        let forward = || {
            let mut y = vec![0.0f32; m * n];
            // SAFETY: x and y have the lengths passed.
            let s = unsafe {
                tessera_linear_forward(
                    lin,
                    x.as_ptr().cast(),
                    x.len(),
                    m,
                    y.as_mut_ptr().cast(),
                    y.len(),
                )
            };
            assert_eq!(s, TesseraStatus::Ok, "{}", last_error());
            y
        };
        let want = forward();
        std::thread::scope(|s| {
            let runs: Vec<_> = (0..4).map(|_| s.spawn(forward)).collect();
            for r in runs {
                assert_eq!(r.join().unwrap(), want);
            }
        });
        // Closing the device first is allowed: the layer keeps it alive.
        assert_eq!(tessera_device_close(dev), TesseraStatus::Ok);
        assert_eq!(forward(), want);
        assert_eq!(tessera_linear_close(lin), TesseraStatus::Ok);
        assert_eq!(tessera_linear_close(lin), TesseraStatus::InvalidHandle);
    }
}
