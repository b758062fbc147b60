//! `type: process` as an interceptor: each batch goes to the program, which answers with the
//! events to put (changed, fewer or more) within `timeout`. Interceptors cannot fail a put, so
//! when the program fails (dies, hangs, writes a malformed line, answers the wrong batch) the
//! error is logged with the plugin's name, the program is stopped, and batches pass through
//! unchanged until it is started again after a backoff (100 ms doubling to 5 s).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use ferry_core::{ComponentConfig, ConfigError, Event, Interceptor};

use crate::{Incoming, MAX_LINE, PROTOCOL, ProcessConfig, batch_message, events_of, truncate};

/// An interceptor implemented by a program.
pub struct ProcessInterceptor {
    name: String,
    config: ProcessConfig,
    running: Mutex<State>,
}

#[derive(Default)]
struct State {
    process: Option<Running>,
    /// After a failure: when the program may be started again, and the current backoff.
    retry_at: Option<(Instant, Duration)>,
}

/// A running program: a thread writes its input and a thread reads its output, so that every
/// exchange can be given a deadline.
struct Running {
    child: Child,
    to_program: mpsc::Sender<Vec<u8>>,
    from_program: mpsc::Receiver<Result<Vec<u8>, String>>,
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

/// Reads one line of at most `max` bytes (the rest of a longer line is skipped); `None` at
/// the end of the output.
fn read_line(
    reader: &mut impl BufRead,
    max: usize,
) -> std::io::Result<Option<Result<Vec<u8>, Vec<u8>>>> {
    let mut line = Vec::new();
    if reader.take(max as u64 + 1).read_until(b'\n', &mut line)? == 0 {
        return Ok(None);
    }
    if line.ends_with(b"\n") {
        line.pop();
        return Ok(Some(Ok(line)));
    }
    if line.len() <= max {
        // The output ended without a newline.
        return Ok(Some(Ok(line)));
    }
    let mut rest = Vec::new();
    while reader.take(64 << 10).read_until(b'\n', &mut rest)? > 0 && !rest.ends_with(b"\n") {
        rest.clear();
    }
    line.truncate(500);
    Ok(Some(Err(line)))
}

impl ProcessInterceptor {
    /// Validates the options; the program starts with the first batch.
    pub fn build(cfg: &ComponentConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            name: cfg.name().to_owned(),
            config: ProcessConfig::parse(cfg)?,
            running: Mutex::new(State::default()),
        })
    }

    fn start(&self) -> Result<Running, String> {
        let mut child = Command::new(&self.config.command[0])
            .args(&self.config.command[1..])
            .envs(&self.config.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", self.config.command))?;
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("no pipes to the program".into());
        };
        let name = self.name.clone();
        std::thread::spawn(move || {
            let mut stderr = BufReader::new(stderr);
            while let Ok(Some(line)) = read_line(&mut stderr, 16 << 10) {
                match line {
                    Ok(line) => {
                        tracing::warn!(plugin = %name, "{}", String::from_utf8_lossy(&line))
                    }
                    Err(start) => {
                        tracing::warn!(plugin = %name, "{}... (line cut)", String::from_utf8_lossy(&start))
                    }
                }
            }
        });
        let (to_program, inbox) = mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || {
            for message in inbox {
                if stdin
                    .write_all(&message)
                    .and_then(|()| stdin.flush())
                    .is_err()
                {
                    break;
                }
            }
        });
        let (outbox, from_program) = mpsc::channel();
        std::thread::spawn(move || {
            let mut stdout = BufReader::new(stdout);
            loop {
                let line = match read_line(&mut stdout, MAX_LINE) {
                    Ok(Some(Ok(line))) => Ok(line),
                    Ok(Some(Err(start))) => Err(format!(
                        "a line longer than {MAX_LINE} bytes: {}",
                        truncate(&String::from_utf8_lossy(&start))
                    )),
                    Ok(None) => Err("it exited".to_owned()),
                    Err(e) => Err(format!("cannot read from it: {e}")),
                };
                let end = line.is_err();
                if outbox.send(line).is_err() || end {
                    break;
                }
            }
        });
        let mut running = Running {
            child,
            to_program,
            from_program,
            next_id: 0,
        };
        let hello = serde_json::json!({
            "type": "hello",
            "protocol": PROTOCOL,
            "role": "interceptor",
            "name": self.name,
            "config": self.config.config.clone().unwrap_or(serde_json::Value::Null),
        });
        match exchange(&mut running, &hello, self.config.timeout)? {
            Incoming::Hello { protocol } if protocol == PROTOCOL => Ok(running),
            other => Err(format!("answered the hello with {other:?}")),
        }
    }

    fn try_intercept(&self, state: &mut State, events: &[Event]) -> Result<Vec<Event>, String> {
        if state.process.is_none() {
            state.process = Some(self.start()?);
        }
        let Some(process) = state.process.as_mut() else {
            return Err("not running".into());
        };
        process.next_id += 1;
        let id = process.next_id;
        match exchange(process, &batch_message(id, events), self.config.timeout)? {
            Incoming::Batch {
                id: got, events, ..
            } if got == id => events_of(&self.name, events).map_err(|e| e.to_string()),
            other => Err(format!("answered batch {id} with {other:?}")),
        }
    }
}

/// Writes a message and waits up to `timeout` for the answer line.
fn exchange(
    process: &mut Running,
    message: &serde_json::Value,
    timeout: Duration,
) -> Result<Incoming, String> {
    let mut line = message.to_string().into_bytes();
    line.push(b'\n');
    process
        .to_program
        .send(line)
        .map_err(|_| "it no longer reads its input".to_owned())?;
    let answer = match process.from_program.recv_timeout(timeout) {
        Ok(answer) => answer?,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            return Err(format!("no answer within {timeout:?}"));
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => return Err("it exited".into()),
    };
    serde_json::from_slice(&answer).map_err(|e| {
        format!(
            "malformed line ({e}): {}",
            truncate(&String::from_utf8_lossy(&answer))
        )
    })
}

impl Interceptor for ProcessInterceptor {
    fn intercept(&self, events: Vec<Event>) -> Vec<Event> {
        let run = || {
            let mut state = self.running.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((at, _)) = state.retry_at
                && Instant::now() < at
            {
                // Backing off after a failure: the batch passes unchanged.
                return events.clone();
            }
            match self.try_intercept(&mut state, &events) {
                Ok(out) => {
                    state.retry_at = None;
                    out
                }
                Err(error) => {
                    let backoff = state
                        .retry_at
                        .map_or(MIN_BACKOFF, |(_, b)| (b * 2).min(MAX_BACKOFF));
                    tracing::error!(plugin = %self.name, %error, ?backoff, "interceptor failed; batches pass unchanged until the program is started again");
                    state.process = None;
                    state.retry_at = Some((Instant::now() + backoff, backoff));
                    events.clone()
                }
            }
        };
        // Talking to the program blocks: let the async runtime move its other tasks away.
        ferry_core::blocking(run)
    }
}

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
