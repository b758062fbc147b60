//! Built-in channels.

use ferry_core::Registry;

pub mod memory;

pub use memory::{MemoryChannel, MemoryChannelConfig};

/// Registers every built-in channel type.
pub fn register(registry: &mut Registry) {
    memory::register(registry);
}
