pub mod asm;
