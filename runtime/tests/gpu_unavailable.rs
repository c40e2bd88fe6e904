//! A GPU backend that cannot run here is a clear `Err` from
//! `Device::open`, never a panic: CUDA without the `cuda` feature, without
//! a driver or without a device; on a machine with a CUDA device, the
//! missing piece (decode attention) is refused by name instead.

use std::sync::Arc;

use tessera_runtime::{
    Attention, Backend, Device, DeviceOptions, KvFormat, Linear, RuntimeError, WeightFormat,
    Weights,
};

#[test]
fn cuda_is_a_clear_error_or_a_working_linear() {
    match Device::open(Backend::Cuda, DeviceOptions::default()) {
        Err(RuntimeError::Unavailable { backend, why }) => {
            assert_eq!(backend, "cuda");
            let why = why.to_lowercase();
            assert!(
                why.contains("cuda")
                    && (why.contains("driver")
                        || why.contains("feature")
                        || why.contains("device")),
                "{why}"
            );
            if cfg!(not(feature = "cuda")) {
                assert!(why.contains("`cuda` feature"), "{why}");
            }
        }
        Ok(dev) => {
            let dev = Arc::new(dev);
            assert!(dev.is_gpu());
            let e = Attention::new(&dev, 4, 2, 16, KvFormat::F16).unwrap_err();
            assert!(e.to_string().contains("attention"), "{e}");
            let e = Linear::new(
                &dev,
                WeightFormat::W4A8,
                Weights::F32(&[0.0; 64]),
                4,
                16,
                None,
            )
            .unwrap_err();
            assert!(e.to_string().contains("f16 activations"), "{e}");
        }
        Err(e) => panic!("unexpected error kind: {e}"),
    }
}

#[test]
fn unknown_backend_names_are_errors_listing_the_valid_ones() {
    let e = "tpu".parse::<Backend>().unwrap_err();
    assert!(e.to_string().contains("opencl, cuda"), "{e}");
}
