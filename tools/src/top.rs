//! `agent top`: the numbers of a running agent in a terminal, for SSH sessions. It reads the
//! agent's HTTP API (`agent.http`): `/api/pipeline` for the sources, channels and sinks and,
//! when the agent runs the bundled broker (or is `agent broker` with `http`), `/api/broker`
//! for its topics and consumer groups. Rates are the change of each component's main counter
//! between two reads, divided by the time between them.
//!
//! In a terminal it redraws every `--interval` until `q` (or Esc, or Ctrl-C) is pressed; with
//! `--once`, or when standard output is not a terminal, it prints one view and exits (the
//! rates of that view are measured over one interval).

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use serde_json::Value;

use super::runtime;

/// Flags of `agent top`.
#[derive(Args, Debug)]
pub struct TopArgs {
    /// The agent's HTTP address (its `agent.http`, or `http` of `agent broker`).
    #[arg(long, default_value = "127.0.0.1:8048", value_name = "HOST:PORT")]
    address: String,
    /// Time between two reads.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// Print one view and exit.
    #[arg(long)]
    once: bool,
}

/// One read of the agent's API.
struct Snapshot {
    at: Instant,
    pipeline: Value,
    broker: Option<Value>,
}

impl Snapshot {
    /// The counter each rate is taken of, per component: `KIND.name` → value.
    fn totals(&self) -> HashMap<String, u64> {
        let mut totals = HashMap::new();
        for component in components(&self.pipeline) {
            let kind = component["kind"].as_str().unwrap_or_default();
            let counter = match kind {
                "source" => "EventAcceptedCount",
                "channel" => "EventPutSuccessCount",
                _ => "EventDrainSuccessCount",
            };
            totals.insert(key(component), counter_of(component, counter));
        }
        if let Some(broker) = &self.broker {
            for topic in array(broker, "topics") {
                let name = topic["topic"].as_str().unwrap_or_default();
                totals.insert(
                    format!("topic.{name}"),
                    topic["records_in"].as_u64().unwrap_or(0),
                );
            }
        }
        totals
    }
}

fn components(pipeline: &Value) -> impl Iterator<Item = &Value> {
    array(pipeline, "components")
}

fn array<'a>(value: &'a Value, field: &str) -> impl Iterator<Item = &'a Value> {
    value[field].as_array().into_iter().flatten()
}

fn key(component: &Value) -> String {
    format!(
        "{}.{}",
        component["kind"].as_str().unwrap_or_default(),
        component["name"].as_str().unwrap_or_default()
    )
}

fn counter_of(component: &Value, counter: &str) -> u64 {
    component["counters"][counter].as_u64().unwrap_or(0)
}

/// Reads `path` of the agent at `address`; `None` for a 404 (an agent without a broker).
async fn get(client: &reqwest::Client, address: &str, path: &str) -> anyhow::Result<Option<Value>> {
    let url = format!("http://{address}{path}");
    let response = client
        .get(&url)
        .send()
        .await
        .with_context(|| format!("cannot read {url} (is agent.http set on that agent?)"))?;
    if response.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !response.status().is_success() {
        bail!("{url} answered {}", response.status());
    }
    let text = response
        .text()
        .await
        .with_context(|| format!("reading {url}"))?;
    let value = serde_json::from_str(&text).with_context(|| format!("{url} is not JSON"))?;
    Ok(Some(value))
}

async fn read(client: &reqwest::Client, address: &str) -> anyhow::Result<Snapshot> {
    let pipeline = get(client, address, "/api/pipeline")
        .await?
        .with_context(|| format!("http://{address}/api/pipeline is not served"))?;
    let broker = get(client, address, "/api/broker").await?;
    Ok(Snapshot {
        at: Instant::now(),
        pipeline,
        broker,
    })
}

/// Runs `agent top`.
pub fn run(args: TopArgs) -> anyhow::Result<()> {
    let runtime = runtime()?;
    ferry_core::install_tls_provider();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .context("making the HTTP client")?;
    let fetch = || runtime.block_on(read(&client, &args.address));
    let mut previous = fetch()?;
    let interactive = !args.once && std::io::stdout().is_terminal();
    if !interactive {
        std::thread::sleep(args.interval);
        let current = fetch()?;
        print!("{}", render(&args.address, &previous, &current));
        return Ok(());
    }
    let _screen = Screen::enter()?;
    loop {
        let deadline = Instant::now() + args.interval;
        // Wait for the next read, answering keys meanwhile.
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if crossterm::event::poll(left)? && quits(&crossterm::event::read()?) {
                return Ok(());
            }
        }
        let current = match fetch() {
            Ok(current) => current,
            Err(e) => {
                draw(&format!("agent top: {e:#}\r\n(retrying; q quits)\r\n"))?;
                continue;
            }
        };
        draw(&render(&args.address, &previous, &current).replace('\n', "\r\n"))?;
        previous = current;
    }
}

fn quits(event: &crossterm::event::Event) -> bool {
    use crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
    match event {
        Event::Key(key) if key.kind != KeyEventKind::Release => {
            matches!(key.code, KeyCode::Char('q') | KeyCode::Esc)
                || (key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL))
        }
        _ => false,
    }
}

fn draw(text: &str) -> anyhow::Result<()> {
    use crossterm::{cursor, terminal};
    let mut out = std::io::stdout().lock();
    crossterm::queue!(
        out,
        cursor::MoveTo(0, 0),
        terminal::Clear(terminal::ClearType::All)
    )?;
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// The terminal in raw mode on the alternate screen, restored when dropped (also on error).
struct Screen;

impl Screen {
    fn enter() -> anyhow::Result<Screen> {
        crossterm::terminal::enable_raw_mode().context("the terminal has no raw mode")?;
        let screen = Screen;
        crossterm::execute!(
            std::io::stdout(),
            crossterm::terminal::EnterAlternateScreen,
            crossterm::cursor::Hide
        )?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = crossterm::execute!(
            std::io::stdout(),
            crossterm::cursor::Show,
            crossterm::terminal::LeaveAlternateScreen
        );
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

/// The view: the pipeline's components with their rates, then the broker's topics and groups.
fn render(address: &str, previous: &Snapshot, current: &Snapshot) -> String {
    let seconds = current
        .at
        .duration_since(previous.at)
        .as_secs_f64()
        .max(1e-3);
    let before = previous.totals();
    let after = current.totals();
    let rate = |key: &str| {
        let (now, then) = (after.get(key).copied(), before.get(key).copied());
        now.unwrap_or(0).saturating_sub(then.unwrap_or(0)) as f64 / seconds
    };
    let mut out = format!("ferry agent top — {address} — every {seconds:.1} s — q quits\n\n");
    out.push_str(&format!(
        "{:<8} {:<24} {:<14} {:>12} {:>12} {:>7}  {}\n",
        "KIND", "NAME", "TYPE", "EVENTS/S", "TOTAL", "FILL", "LAST ERROR"
    ));
    for component in components(&current.pipeline) {
        let key = key(component);
        let fill = component["fill_percentage"]
            .as_f64()
            .map_or_else(String::new, |f| format!("{f:.1}%"));
        out.push_str(&format!(
            "{:<8} {:<24} {:<14} {:>12.0} {:>12} {:>7}  {}\n",
            component["kind"].as_str().unwrap_or_default(),
            component["name"].as_str().unwrap_or_default(),
            component["type"].as_str().unwrap_or_default(),
            rate(&key),
            after.get(&key).copied().unwrap_or(0),
            fill,
            component["last_error"].as_str().unwrap_or_default(),
        ));
    }
    let Some(broker) = &current.broker else {
        return out;
    };
    out.push_str(&format!(
        "\n{:<32} {:>10} {:>14} {:>12} {:>14}\n",
        "TOPIC", "PARTITIONS", "END OFFSETS", "RECORDS/S", "BYTES"
    ));
    for topic in array(broker, "topics") {
        let name = topic["topic"].as_str().unwrap_or_default();
        let partitions: Vec<&Value> = array(broker, "partitions")
            .filter(|p| p["topic"] == name)
            .collect();
        let end: i64 = partitions
            .iter()
            .map(|p| p["high_watermark"].as_i64().unwrap_or(0))
            .sum();
        let bytes: u64 = partitions
            .iter()
            .map(|p| p["size_bytes"].as_u64().unwrap_or(0))
            .sum();
        out.push_str(&format!(
            "{:<32} {:>10} {:>14} {:>12.0} {:>14}\n",
            name,
            partitions.len(),
            end,
            rate(&format!("topic.{name}")),
            bytes
        ));
    }
    out.push_str(&format!(
        "\n{:<32} {:<20} {:>8} {:>12}\n",
        "GROUP", "STATE", "MEMBERS", "LAG"
    ));
    for group in array(broker, "groups") {
        let lag: i64 = array(group, "offsets")
            .map(|o| o["lag"].as_i64().unwrap_or(0))
            .sum();
        out.push_str(&format!(
            "{:<32} {:<20} {:>8} {:>12}\n",
            group["group"].as_str().unwrap_or_default(),
            group["state"].as_str().unwrap_or_default(),
            array(group, "members").count(),
            lag
        ));
    }
    let open = array(broker, "transactions").count();
    out.push_str(&format!("\nopen transactions: {open}\n"));
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn snapshot(at: Instant, accepted: u64, records_in: u64) -> Snapshot {
        Snapshot {
            at,
            pipeline: json!({"components": [
                {"kind": "source", "name": "logs", "type": "taildir",
                 "counters": {"EventAcceptedCount": accepted}, "last_error": null},
                {"kind": "channel", "name": "buffer", "type": "memory",
                 "counters": {"EventPutSuccessCount": accepted}, "fill_percentage": 12.5},
                {"kind": "sink", "name": "out", "type": "kafka",
                 "counters": {"EventDrainSuccessCount": 0}, "last_error": "broker down"},
            ]}),
            broker: Some(json!({
                "topics": [{"topic": "app-logs", "records_in": records_in}],
                "partitions": [
                    {"topic": "app-logs", "partition": 0, "high_watermark": 60, "size_bytes": 600},
                    {"topic": "app-logs", "partition": 1, "high_watermark": 40, "size_bytes": 400},
                ],
                "groups": [{"group": "readers", "state": "Stable", "members": [{}],
                            "offsets": [{"lag": 7}, {"lag": 3}]}],
                "transactions": [],
            })),
        }
    }

    #[test]
    fn rates_are_the_change_over_the_time_between_reads() {
        let start = Instant::now();
        let view = render(
            "127.0.0.1:8048",
            &snapshot(start, 100, 10),
            &snapshot(start + Duration::from_secs(2), 300, 110),
        );
        let line = |prefix: &str| {
            view.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in\n{view}"))
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(line("source")[3..5], ["100", "300"]);
        assert_eq!(line("channel")[5], "12.5%");
        assert!(view.contains("broker down"), "{view}");
        // app-logs: 2 partitions, end offsets 100, 50 records/s, 1000 bytes.
        assert_eq!(line("app-logs")[1..], ["2", "100", "50", "1000"]);
        assert_eq!(line("readers")[1..], ["Stable", "1", "10"]);
    }
}
