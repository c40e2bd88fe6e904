//! Tuning another device (placeholder).
