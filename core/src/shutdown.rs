//! The shutdown signal every component watches.

use tokio_util::sync::CancellationToken;

/// Tells components to stop: sources stop reading and return; sinks drain and stop.
///
/// ```
/// # tokio_test_block_on(async {
/// let shutdown = ferry_core::Shutdown::new();
/// let watcher = shutdown.clone();
/// shutdown.trigger();
/// watcher.wait().await;
/// assert!(watcher.is_triggered());
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Shutdown(CancellationToken);

impl Shutdown {
    /// A signal that has not fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires the signal for every clone.
    pub fn trigger(&self) {
        self.0.cancel();
    }

    /// Whether the signal fired.
    pub fn is_triggered(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Waits until the signal fires.
    pub async fn wait(&self) {
        self.0.cancelled().await;
    }

    /// A signal that fires when this one does, and can also be fired on its own.
    pub fn child(&self) -> Self {
        Self(self.0.child_token())
    }
}
