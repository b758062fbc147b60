//! Flume path escapes (stub: being written).
