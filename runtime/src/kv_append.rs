//! The device's own KV append kernel: the JIT NEON device's emitted one.
//! A build without the JIT has none (an uninhabited stand-in), and every
//! append goes through the cache's encoder.

#[cfg(feature = "jit")]
pub(crate) use tessera_codegen::neon::attention_append::{KvRowsMut, NeonKvAppend as AppendKernel};

#[cfg(not(feature = "jit"))]
pub(crate) use stub::{AppendKernel, KvRowsMut};

#[cfg(not(feature = "jit"))]
mod stub {
    use half::f16;

    /// No value exists: nothing can hold one without the JIT.
    #[derive(Debug)]
    pub enum AppendKernel {}

    /// The rows an append kernel writes (mirrors the JIT build's type;
    /// never read without one).
    #[allow(dead_code)]
    pub enum KvRowsMut<'a> {
        F16(&'a mut [f16]),
        Codes {
            codes: &'a mut [u8],
            scales: &'a mut [f32],
            offsets: &'a mut [f32],
        },
    }

    impl AppendKernel {
        #[allow(clippy::too_many_arguments)]
        pub fn run(
            &self,
            _k_new: &[f16],
            _v_new: &[f16],
            _k: KvRowsMut<'_>,
            _v: KvRowsMut<'_>,
            _pos: usize,
            _kvh: usize,
            _d: usize,
        ) -> Result<(), std::convert::Infallible> {
            match *self {}
        }
    }
}
