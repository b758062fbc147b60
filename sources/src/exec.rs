//! `exec`: Flume's `ExecSource`. Runs a command through a shell and turns each line of its
//! standard output into an event (line endings removed, as Java's `readLine` does).
//!
//! Lines are put in batches of `batch_size`, or sooner when the oldest buffered line is
//! `batch_timeout` old. When the command exits, the buffered lines are put; with `restart`
//! the command is started again after `restart_throttle`. On shutdown the lines already read
//! are put and the command is stopped.
//!
//! The command runs in a process group of its own, so that stopping it reaches every process
//! of a pipeline such as `tail -F app.log | grep ERROR`, not only the shell: on shutdown the
//! group gets SIGTERM, and SIGKILL if it is still running after 5 seconds. (Flume only
//! destroys the shell.) The group also keeps a Ctrl-C at the terminal from reaching the
//! command before the agent has drained.
//!
//! Like Flume's, this source cannot resume: output produced while the agent is down, or read
//! but not yet put when the agent dies, is not read again. Use `taildir` for files.

use std::process::Stdio;
use std::time::Duration;

use ferry_core::{
    ComponentConfig, ConfigError, Event, Source, SourceContext, SourceError, async_trait,
};
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::lines::LineBuffer;

/// How long a stopped command may take to exit after SIGTERM before it gets SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Options of the `exec` source.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecConfig {
    /// The command to run, e.g. `tail -F /var/log/app.log`. Required. Flume: `command`.
    pub command: String,
    /// The shell the command is passed to, as program and arguments; the command is added as
    /// the last argument. Default `/bin/sh -c`. Flume: `shell` (Flume has no default and then
    /// splits the command on spaces).
    #[serde(default = "default_shell")]
    pub shell: String,
    /// Start the command again when it exits. Default `false`. Flume: `restart`.
    #[serde(default)]
    pub restart: bool,
    /// Wait before restarting. Default `10s`. Flume: `restartThrottle` (10000 ms).
    #[serde(
        default = "default_restart_throttle",
        with = "ferry_core::config::duration"
    )]
    pub restart_throttle: Duration,
    /// Log the command's standard error (at WARN); otherwise it is discarded.
    /// Default `false`. Flume: `logStdErr`.
    #[serde(default)]
    pub log_stderr: bool,
    /// Most lines per put. Default `20`. Flume: `batchSize`.
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Put a partial batch when its oldest line has waited this long. Default `3s`.
    /// Flume: `batchTimeout` (3000 ms).
    #[serde(
        default = "default_batch_timeout",
        with = "ferry_core::config::duration"
    )]
    pub batch_timeout: Duration,
}

fn default_shell() -> String {
    "/bin/sh -c".into()
}

fn default_restart_throttle() -> Duration {
    Duration::from_secs(10)
}

fn default_batch_size() -> usize {
    20
}

fn default_batch_timeout() -> Duration {
    Duration::from_secs(3)
}

/// The exec source.
#[derive(Debug)]
pub struct ExecSource {
    config: ExecConfig,
    shell: Vec<String>,
}

impl ExecSource {
    /// Validates the options.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        let config: ExecConfig = cfg.parse()?;
        if config.command.trim().is_empty() {
            return Err(cfg.error_at("command", "`command` must not be empty"));
        }
        let shell: Vec<String> = config.shell.split_whitespace().map(String::from).collect();
        if shell.is_empty() {
            return Err(cfg.error_at("shell", "`shell` must name a program, e.g. `/bin/sh -c`"));
        }
        if config.batch_size == 0 {
            return Err(cfg.error_at("batch_size", "`batch_size` must be at least 1"));
        }
        Ok(Self { config, shell })
    }

    fn spawn(&self) -> Result<RunningCommand, SourceError> {
        let (program, args) = self
            .shell
            .split_first()
            .ok_or_else(|| SourceError::Other("exec source: empty shell".into()))?;
        let mut command = Command::new(program);
        #[cfg(unix)]
        command.process_group(0);
        command
            .args(args)
            .arg(&self.config.command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(if self.config.log_stderr {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                SourceError::io(
                    format!(
                        "starting `{}` with `{}`",
                        self.config.command, self.config.shell
                    ),
                    e,
                )
            })
            .map(|child| RunningCommand { child })
    }

    /// Runs the command once, until its output ends or shutdown. Returns whether shutdown
    /// was signalled.
    async fn run_once(&self, ctx: &SourceContext) -> Result<bool, SourceError> {
        let command = &self.config.command;
        let mut running = self.spawn()?;
        let child = &mut running.child;
        tracing::info!(source = ctx.name(), command, "command started");
        let mut stdout = child
            .stdout
            .take()
            .ok_or_else(|| SourceError::Other(format!("`{command}`: no standard output")))?;
        if let Some(stderr) = child.stderr.take() {
            let name = ctx.name().to_owned();
            let command = command.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::warn!(
                        source = name,
                        command,
                        stderr = line,
                        "command wrote to stderr"
                    );
                }
            });
        }
        let size = self.config.batch_size.min(crate::transaction_capacity(ctx));
        let mut lines = LineBuffer::new(true);
        let mut pending: Vec<Event> = Vec::new();
        let mut deadline: Option<Instant> = None;
        let shut_down = loop {
            let timeout = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = ctx.shutdown().wait() => break true,
                _ = timeout => {
                    ctx.send(std::mem::take(&mut pending), None).await?;
                    deadline = None;
                }
                read = lines.fill(&mut stdout) => {
                    let read = read
                        .map_err(|e| SourceError::io(format!("reading the output of `{command}`"), e))?;
                    pending.extend(std::iter::from_fn(|| lines.next_line()).map(Event::from_body));
                    if read == 0 {
                        break false;
                    }
                    while pending.len() >= size {
                        let batch: Vec<Event> = pending.drain(..size).collect();
                        ctx.send(batch, None).await?;
                        deadline = None;
                    }
                    if pending.is_empty() {
                        deadline = None;
                    } else if deadline.is_none() {
                        deadline = Some(Instant::now() + self.config.batch_timeout);
                    }
                }
            }
        };
        if shut_down {
            running.stop(ctx.name(), command).await;
        } else {
            pending.extend(lines.take_rest().map(Event::from_body));
        }
        for batch in crate::chunks(pending, size) {
            ctx.send(batch, None).await?;
        }
        match running.child.wait().await {
            Ok(status) => tracing::info!(source = ctx.name(), command, %status, "command exited"),
            Err(error) => {
                tracing::warn!(source = ctx.name(), command, %error, "waiting for the command")
            }
        }
        Ok(shut_down)
    }
}

/// A started command. Dropping it (when the source fails) kills its process group.
struct RunningCommand {
    child: Child,
}

impl RunningCommand {
    /// Stops the command's processes: SIGTERM, then SIGKILL after [`STOP_GRACE`].
    async fn stop(&mut self, source: &str, command: &str) {
        #[cfg(unix)]
        {
            self.signal_group(nix::sys::signal::Signal::SIGTERM);
            if tokio::time::timeout(STOP_GRACE, self.child.wait())
                .await
                .is_ok()
            {
                return;
            }
            tracing::warn!(source, command, "command ignored SIGTERM; killing it");
            self.signal_group(nix::sys::signal::Signal::SIGKILL);
        }
        if let Err(error) = self.child.kill().await {
            tracing::warn!(source, command, %error, "killing the command");
        }
    }

    /// Signals every process of the command's group, while the command has not been reaped
    /// (after that its id, and so the group id, may belong to someone else).
    #[cfg(unix)]
    fn signal_group(&self, signal: nix::sys::signal::Signal) {
        let Some(id) = self.child.id().and_then(|id| i32::try_from(id).ok()) else {
            return;
        };
        // killpg of 0 or 1 would reach far more than the command.
        if id > 1 {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(id), signal);
        }
    }
}

impl Drop for RunningCommand {
    fn drop(&mut self) {
        #[cfg(unix)]
        self.signal_group(nix::sys::signal::Signal::SIGKILL);
    }
}

#[async_trait]
impl Source for ExecSource {
    fn max_batch_size(&self) -> Option<usize> {
        Some(self.config.batch_size)
    }

    async fn run(self: Box<Self>, ctx: SourceContext) -> Result<(), SourceError> {
        loop {
            if self.run_once(&ctx).await? || !self.config.restart {
                return Ok(());
            }
            tokio::select! {
                _ = ctx.shutdown().wait() => return Ok(()),
                _ = tokio::time::sleep(self.config.restart_throttle) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_core::test_support::{TestChannel, config, context};

    fn build(yaml: &str) -> Box<ExecSource> {
        Box::new(ExecSource::build(&config("exec", yaml)).unwrap())
    }

    #[tokio::test]
    async fn puts_output_lines_in_batches_and_ends_with_the_command() {
        let channel = TestChannel::new(100, 100);
        let (ctx, _) = context(&channel);
        let source = build("command: printf 'a\\nb\\r\\nc\\nd\\ne'\nbatch_size: 2");
        assert_eq!(source.max_batch_size(), Some(2));
        source.run(ctx).await.unwrap();
        assert_eq!(channel.bodies(), ["a", "b", "c", "d", "e"]);
        assert_eq!(channel.batches(), 3);
    }

    #[tokio::test]
    async fn puts_a_partial_batch_after_the_timeout() {
        let channel = TestChannel::new(100, 100);
        let (ctx, shutdown) = context(&channel);
        let source = build("command: echo early; exec sleep 30\nbatch_timeout: 50ms");
        let task = tokio::spawn(source.run(ctx));
        channel.wait_for(1).await;
        assert_eq!(channel.bodies(), ["early"]);
        shutdown.trigger();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("shutdown does not wait for the command")
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn kills_the_command_on_shutdown() {
        let channel = TestChannel::new(100, 100);
        let (ctx, shutdown) = context(&channel);
        let source = build("command: echo $$; exec sleep 30\nbatch_timeout: 10ms");
        let task = tokio::spawn(source.run(ctx));
        channel.wait_for(1).await;
        let pid = channel.bodies()[0].clone();
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
        shutdown.trigger();
        task.await.unwrap().unwrap();
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} still exists"
        );
    }

    /// Whether process `pid` runs (a zombie waiting for its parent to reap it does not).
    fn alive(pid: &str) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| {
                let state = stat.rsplit(')').next().unwrap_or_default().trim_start();
                !state.starts_with('Z')
            })
            .unwrap_or(false)
    }

    #[tokio::test]
    async fn stops_every_process_of_the_command_on_shutdown() {
        let channel = TestChannel::new(100, 100);
        let (ctx, shutdown) = context(&channel);
        let source = build("command: sleep 30 & echo $!; wait\nbatch_timeout: 10ms");
        let task = tokio::spawn(source.run(ctx));
        channel.wait_for(1).await;
        let background = channel.bodies()[0].clone();
        assert!(alive(&background));
        shutdown.trigger();
        task.await.unwrap().unwrap();
        for _ in 0..200 {
            if !alive(&background) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("background process {background} of the command survived");
    }

    #[tokio::test]
    async fn restarts_after_the_throttle() {
        let channel = TestChannel::new(100, 100);
        let (ctx, shutdown) = context(&channel);
        let source = build("command: echo again\nrestart: true\nrestart_throttle: 10ms");
        let task = tokio::spawn(source.run(ctx));
        channel.wait_for(3).await;
        shutdown.trigger();
        task.await.unwrap().unwrap();
        assert!(channel.bodies().iter().all(|b| b == "again"));
    }

    #[tokio::test]
    async fn standard_error_is_not_an_event() {
        let channel = TestChannel::new(100, 100);
        let (ctx, _) = context(&channel);
        build("command: echo oops >&2; echo out\nlog_stderr: true")
            .run(ctx)
            .await
            .unwrap();
        assert_eq!(channel.bodies(), ["out"]);
    }

    #[tokio::test]
    async fn a_missing_shell_is_reported_with_the_command() {
        let channel = TestChannel::new(100, 100);
        let (ctx, _) = context(&channel);
        let err = build("command: echo hi\nshell: /no/such/shell -c")
            .run(ctx)
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("starting `echo hi` with `/no/such/shell -c`: "),
            "{err}"
        );
    }

    #[test]
    fn defaults_follow_flume() {
        let source = ExecSource::build(&config("exec", "command: date")).unwrap();
        assert_eq!(source.config.batch_size, 20);
        assert_eq!(source.config.batch_timeout, Duration::from_secs(3));
        assert_eq!(source.config.restart_throttle, Duration::from_secs(10));
        assert!(!source.config.restart && !source.config.log_stderr);
        assert_eq!(source.shell, ["/bin/sh", "-c"]);
    }
}
