//! Runs the broker alone, for trying clients against it and for the Python client tests:
//!
//! ```text
//! cargo run -p ferry-broker --example serve -- [--listen 127.0.0.1:9092] [--data-dir DIR]
//! ```
//!
//! Prints `listening on HOST:PORT` once ready; stops gracefully on Ctrl-C / SIGTERM.

use std::process::ExitCode;

use ferry_broker::{Broker, BrokerConfig};

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let mut config = BrokerConfig::default();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next();
        match (flag.as_str(), value) {
            ("--listen", Some(v)) => match v.parse() {
                Ok(addr) => config.listen = addr,
                Err(e) => {
                    eprintln!("--listen {v}: {e}");
                    return ExitCode::from(2);
                }
            },
            ("--data-dir", Some(v)) => config.data_dir = v.into(),
            (other, _) => {
                eprintln!(
                    "unknown or incomplete argument `{other}`; use --listen ADDR --data-dir DIR"
                );
                return ExitCode::from(2);
            }
        }
    }
    let broker = match Broker::start(config).await {
        Ok(broker) => broker,
        Err(e) => {
            eprintln!("cannot start the broker: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("listening on {}", broker.local_addr());
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            eprintln!("cannot watch SIGTERM: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    broker.shutdown().await;
    ExitCode::SUCCESS
}
