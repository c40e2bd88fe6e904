//! Tessera's code generation: targets, the tile solver and backends.
