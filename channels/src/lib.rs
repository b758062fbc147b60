//! channels
