//! The rolling writer shared by `file_roll` and `s3` (being written).

mod format;
mod parquet;
mod path;

pub use format::{Compression, Format};
