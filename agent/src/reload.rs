//! What asks a running agent to reload its pipeline file: a change of the file (watched with
//! `notify`: inotify on Linux) and SIGHUP.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::pipeline::{Loader, Reloads};

/// How long the file must stay quiet after a change before it is read: an editor saving it
/// writes it in several steps (or renames a new file over it).
const SETTLE: Duration = Duration::from_millis(300);

/// Starts watching `file` and SIGHUP; each change (once the file settled) or signal asks for
/// one reload.
pub(crate) fn watch(file: &Path, loader: Loader) -> anyhow::Result<Reloads> {
    let (requests, receiver) = mpsc::unbounded_channel();
    let (changes, mut changed) = mpsc::unbounded_channel::<()>();
    let path = absolute(file);
    let name = path.file_name().map(|n| n.to_owned());
    let dir = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    // The directory is watched, not the file: editors often replace the file by renaming a new
    // one over it, which would end a watch on the old file.
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event
            && !event.kind.is_access()
            && event
                .paths
                .iter()
                .any(|p| p.file_name().map(|n| n.to_owned()) == name)
        {
            let _ = changes.send(());
        }
    })
    .context("watching the pipeline file")?;
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .with_context(|| format!("watching {}", dir.display()))?;
    let on_change = requests.clone();
    tokio::spawn(async move {
        let _watcher = watcher;
        while changed.recv().await.is_some() {
            // Wait until the file has been quiet for a while, then ask once.
            while let Ok(Some(())) = tokio::time::timeout(SETTLE, changed.recv()).await {}
            if on_change.send("the file changed".to_owned()).is_err() {
                return;
            }
        }
    });
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            if requests.send("SIGHUP".to_owned()).is_err() {
                return;
            }
        }
    });
    Ok(Reloads {
        loader,
        requests: receiver,
    })
}

fn absolute(file: &Path) -> PathBuf {
    std::path::absolute(file).unwrap_or_else(|_| file.to_owned())
}
