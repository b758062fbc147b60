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

/// Checks the limits every bounded channel has: both at least 1, a transaction no larger than
/// the channel, and a capacity the permit counter can hold.
fn check_capacities(
    cfg: &ferry_core::ComponentConfig,
    capacity: usize,
    transaction_capacity: usize,
) -> Result<(), ferry_core::ConfigError> {
    if capacity == 0 || capacity > tokio::sync::Semaphore::MAX_PERMITS {
        return Err(cfg.error_at(
            "capacity",
            format!(
                "`capacity` must be between 1 and {}",
                tokio::sync::Semaphore::MAX_PERMITS
            ),
        ));
    }
    if transaction_capacity == 0 || transaction_capacity > u32::MAX as usize {
        return Err(cfg.error_at(
            "transaction_capacity",
            format!("`transaction_capacity` must be between 1 and {}", u32::MAX),
        ));
    }
    if transaction_capacity > capacity {
        return Err(cfg.error_at(
            "transaction_capacity",
            format!(
                "`transaction_capacity` ({transaction_capacity}) is larger than `capacity` ({capacity})"
            ),
        ));
    }
    Ok(())
}
