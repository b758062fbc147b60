//! `type: process` as an interceptor: each batch goes to the program, which answers with the
//! events to put (changed, fewer or more). Interceptors cannot fail a put, so when the program
//! fails (dies, writes a malformed line, answers the wrong batch) the error is logged with the
//! plugin's name, the batch passes through unchanged, and the program is started again for the
//! next batch.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

use ferry_core::{ComponentConfig, ConfigError, Event, Interceptor};

use crate::{Incoming, MAX_LINE, PROTOCOL, ProcessConfig, batch_message, events_of, truncate};

/// An interceptor implemented by a program.
pub struct ProcessInterceptor {
    name: String,
    config: ProcessConfig,
    running: Mutex<Option<Running>>,
}

struct Running {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl std::fmt::Debug for ProcessInterceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessInterceptor")
            .field("name", &self.name)
            .field("command", &self.config.command)
            .finish()
    }
}

impl ProcessInterceptor {
    /// Validates the options; the program starts with the first batch.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            name: cfg.name().to_owned(),
            config: ProcessConfig::parse(cfg)?,
            running: Mutex::new(None),
        })
    }

    fn start(&self) -> Result<Running, String> {
        let mut child = Command::new(&self.config.command[0])
            .args(&self.config.command[1..])
            .envs(&self.config.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", self.config.command))?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("no pipes to the program".into());
        };
        let name = self.name.clone();
        std::thread::spawn(move || {
            let mut stderr = BufReader::new(stderr);
            let mut line = Vec::new();
            loop {
                line.clear();
                match (&mut stderr).take(16 << 10).read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line);
                        tracing::warn!(plugin = %name, "{}", text.trim_end());
                    }
                }
            }
        });
        let mut running = Running {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            next_id: 0,
        };
        let hello = serde_json::json!({
            "type": "hello",
            "protocol": PROTOCOL,
            "role": "interceptor",
            "name": self.name,
            "config": self.config.config.clone().unwrap_or(serde_json::Value::Null),
        });
        match exchange(&mut running, &hello)? {
            Incoming::Hello { protocol } if protocol == PROTOCOL => Ok(running),
            other => Err(format!("answered the hello with {other:?}")),
        }
    }

    fn try_intercept(
        &self,
        running: &mut Option<Running>,
        events: &[Event],
    ) -> Result<Vec<Event>, String> {
        if running.is_none() {
            *running = Some(self.start()?);
        }
        let Some(process) = running.as_mut() else {
            return Err("not running".into());
        };
        process.next_id += 1;
        let id = process.next_id;
        match exchange(process, &batch_message(id, events))? {
            Incoming::Batch {
                id: got, events, ..
            } if got == id => events_of(&self.name, events).map_err(|e| e.to_string()),
            other => Err(format!("answered batch {id} with {other:?}")),
        }
    }
}

/// Writes a message and reads the answer line.
fn exchange(process: &mut Running, message: &serde_json::Value) -> Result<Incoming, String> {
    let mut line = message.to_string();
    line.push('\n');
    process
        .stdin
        .write_all(line.as_bytes())
        .and_then(|()| process.stdin.flush())
        .map_err(|e| format!("cannot write to it: {e}"))?;
    let mut answer = Vec::new();
    let limit = MAX_LINE as u64 + 1;
    match (&mut process.stdout)
        .take(limit)
        .read_until(b'\n', &mut answer)
    {
        Ok(0) => Err("it exited".into()),
        Ok(_) if !answer.ends_with(b"\n") => Err(format!(
            "a line longer than {MAX_LINE} bytes or cut short: {}",
            truncate(&String::from_utf8_lossy(&answer[..answer.len().min(500)]))
        )),
        Ok(_) => serde_json::from_slice(&answer).map_err(|e| {
            format!(
                "malformed line ({e}): {}",
                truncate(String::from_utf8_lossy(&answer).trim_end())
            )
        }),
        Err(e) => Err(format!("cannot read from it: {e}")),
    }
}

impl Interceptor for ProcessInterceptor {
    fn intercept(&self, events: Vec<Event>) -> Vec<Event> {
        let run = || {
            let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            match self.try_intercept(&mut running, &events) {
                Ok(out) => out,
                Err(error) => {
                    tracing::error!(plugin = %self.name, %error, "interceptor failed; the batch passes unchanged and the program is restarted");
                    *running = None;
                    events.clone()
                }
            }
        };
        // Talking to the program blocks: let the async runtime move its other tasks away.
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(run),
            _ => run(),
        }
    }
}
