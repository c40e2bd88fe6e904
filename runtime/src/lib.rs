//! The thin runtime (filled by the runtime issue).
