//! `--delete` of `agent groups`: deletes groups and answers as Kafka's
//! `kafka-consumer-groups.sh` does.

use std::io::Write;

use anyhow::{Context, bail};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;

use super::super::{ClusterArgs, REQUEST_TIMEOUT, runtime};

/// Deletes `names`, answering as Kafka does: one line when all went, else each failure.
pub(super) fn delete(
    cluster: &ClusterArgs,
    names: &[String],
    out: &mut impl Write,
) -> anyhow::Result<()> {
    if names.is_empty() {
        bail!("there is no group to delete");
    }
    let admin: AdminClient<DefaultClientContext> = cluster
        .client_config(&[])?
        .create()
        .context("creating the admin client")?;
    let options = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut deleted = Vec::new();
    let mut failed = Vec::new();
    for result in runtime()?.block_on(admin.delete_groups(&refs, &options))? {
        match result {
            Ok(name) => deleted.push(format!("'{name}'")),
            Err((name, code)) => failed.push((name, code)),
        }
    }
    if failed.is_empty() {
        writeln!(
            out,
            "Deletion of requested consumer groups ({}) was successful.",
            deleted.join(", ")
        )?;
        return Ok(());
    }
    writeln!(out, "\nError: Deletion of some consumer groups failed:")?;
    for (name, code) in &failed {
        writeln!(out, "* Group '{name}' could not be deleted due to: {code}")?;
    }
    if !deleted.is_empty() {
        writeln!(
            out,
            "\nThese consumer groups were deleted successfully: {}",
            deleted.join(", ")
        )?;
    }
    out.flush()?;
    bail!(
        "{} of {} group(s) could not be deleted",
        failed.len(),
        names.len()
    )
}
