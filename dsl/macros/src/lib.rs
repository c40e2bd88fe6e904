//! The `kernel!` proc macro (filled by the DSL front-end issue).
