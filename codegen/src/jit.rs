//! Mapping emitted machine code executable.
//!
//! The bytes are copied into fresh anonymous memory that is writable but not
//! executable, then the mapping is switched to read+execute (W^X: never both
//! at once), and the instruction cache is synchronized where the
//! architecture needs it (aarch64). The mapping lives as long as [`JitCode`].
//!
//! Profiling: with `TESSERA_PERF_MAP` set, each mapping is announced to
//! Linux `perf` in `/tmp/perf-<pid>.map` (the file perf reads to name
//! samples in JIT code, as wasmtime's and LuaJIT's perf maps do), so
//! `perf report` shows which kernel the time went to; with the value
//! `code` its bytes also go to `/tmp/tessera-jit-<pid>-<start>.bin`, for
//! `objdump -D -b binary -m i386:x86-64` (or `-m aarch64`) whose offsets
//! added to the start are the samples' addresses.

use dynasmrt::mmap::{ExecutableBuffer, MutableBuffer};

use crate::artifact::{Arch, MachineCode};

/// Why code could not be mapped.
#[derive(Debug, thiserror::Error)]
pub enum JitError {
    #[error("machine code for {code:?} cannot run on this host ({host:?})")]
    WrongArch { code: Arch, host: Option<Arch> },
    #[error("empty machine code")]
    Empty,
    #[error("mapping executable memory failed: {0}")]
    Map(#[from] std::io::Error),
}

/// Executable machine code; entry at offset 0.
pub struct JitCode {
    buffer: ExecutableBuffer,
}

impl std::fmt::Debug for JitCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JitCode")
            .field("len", &self.buffer.len())
            .finish()
    }
}

impl JitCode {
    /// Map `code` executable. Refuses code for another architecture.
    pub fn map(code: &MachineCode) -> Result<JitCode, JitError> {
        let host = Arch::host();
        if host != Some(code.arch) {
            return Err(JitError::WrongArch {
                code: code.arch,
                host,
            });
        }
        if code.bytes.is_empty() {
            return Err(JitError::Empty);
        }
        let mut buffer = MutableBuffer::new(code.bytes.len())?;
        buffer.set_len(code.bytes.len());
        buffer.copy_from_slice(&code.bytes);
        dynasmrt::cache_control::synchronize_icache(&buffer);
        let buffer = buffer.make_exec()?;
        dynasmrt::cache_control::prepare_for_execution(&buffer);
        if let Some(mode) = std::env::var_os("TESSERA_PERF_MAP") {
            // perf looks in /tmp whatever TMPDIR says.
            let dir = std::path::Path::new("/tmp");
            let with_bytes = mode == "code";
            let start = buffer.as_ptr() as usize;
            if let Err(e) = announce(dir, std::process::id(), start, code, with_bytes) {
                eprintln!("TESSERA_PERF_MAP: {}: {e}", dir.display());
            }
        }
        Ok(JitCode { buffer })
    }

    /// Entry point. Callers transmute it to the kernel's documented ABI.
    pub fn entry(&self) -> *const u8 {
        self.buffer.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }
}

/// Append `code`, mapped at `start`, to `dir/perf-<pid>.map` as perf's JIT
/// symbol line (`start size name`, hex), named by the first line of its
/// listing; with `with_bytes` also write its bytes to
/// `dir/tessera-jit-<pid>-<start>.bin`. One `write` per line, so threads
/// mapping code at once do not interleave within a line (`O_APPEND`).
fn announce(
    dir: &std::path::Path,
    pid: u32,
    start: usize,
    code: &MachineCode,
    with_bytes: bool,
) -> std::io::Result<()> {
    use std::io::Write;
    let name = code
        .listing
        .lines()
        .map(|l| l.trim().trim_start_matches(['#', '/', ';']).trim())
        .find(|l| !l.is_empty())
        .unwrap_or("kernel");
    let name: String = name.chars().take(160).collect();
    let line = format!("{start:x} {:x} tessera {name}\n", code.bytes.len());
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("perf-{pid}.map")))?
        .write_all(line.as_bytes())?;
    if with_bytes {
        std::fs::write(
            dir.join(format!("tessera-jit-{pid}-{start:x}.bin")),
            &code.bytes,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(listing: &str, bytes: Vec<u8>) -> MachineCode {
        MachineCode {
            arch: Arch::X86_64,
            bytes,
            listing: listing.into(),
            head_dim_multiple: 1,
            whole_prefill: None,
            every_head_state: false,
        }
    }

    #[test]
    fn perf_map_lines_name_each_mapping_and_the_bytes_follow_on_request() {
        let dir =
            std::env::temp_dir().join(format!("tessera-perf-map-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let a = code("    # matmul gemv x f32\n    push rbx\n", vec![0x53, 0xc3]);
        let b = code("", vec![0xc3; 300]);
        announce(&dir, 7, 0x7f00_1000, &a, false).unwrap();
        announce(&dir, 7, 0x7f00_2000, &b, true).unwrap();
        let map = std::fs::read_to_string(dir.join("perf-7.map")).unwrap();
        assert_eq!(
            map,
            "7f001000 2 tessera matmul gemv x f32\n7f002000 12c tessera kernel\n"
        );
        assert!(!dir.join("tessera-jit-7-7f001000.bin").exists());
        assert_eq!(
            std::fs::read(dir.join("tessera-jit-7-7f002000.bin")).unwrap(),
            vec![0xc3; 300]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
