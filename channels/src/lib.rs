//! Built-in channels.

use ferry_core::Registry;

pub mod file;
pub mod memory;

pub use file::{FileChannel, FileChannelConfig};
pub use memory::{MemoryChannel, MemoryChannelConfig};

/// Registers every built-in channel type.
pub fn register(registry: &mut Registry) {
    file::register(registry);
    memory::register(registry);
}
