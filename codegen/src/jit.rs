//! Mapping emitted machine code executable.
//!
//! The bytes are copied into fresh anonymous memory that is writable but not
//! executable, then the mapping is switched to read+execute (W^X: never both
//! at once), and the instruction cache is synchronized where the
//! architecture needs it (aarch64). The mapping lives as long as [`JitCode`].

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
