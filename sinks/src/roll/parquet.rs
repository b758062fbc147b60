//! Parquet files from staged events (stub: being written).
