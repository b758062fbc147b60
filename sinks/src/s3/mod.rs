//! `s3`: objects in S3 and S3-compatible stores (being written).

mod config;

pub use config::S3Config;
