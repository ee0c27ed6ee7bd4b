//! walbridge's PostgreSQL source.

pub mod pgoutput;
mod reader;

pub use reader::ReadError;
pub mod wire;
pub mod assembler;
pub mod spill;
