//! The autotuner (filled by the autotune issue).
