//! Links the release `agent` with its start-up code together.
//!
//! `startup.order` (written by `scripts/startup-order`) names the functions an agent runs from
//! its start until it idles with the shipped pipeline. The kernel maps a program's code 64 KiB
//! around each page it touches, so start-up code scattered over the 27 MB of code keeps about
//! half of it resident; laid out first and together, the idle agent keeps a fifth
//! (BENCHMARKS.md, "Issue 27 (fourth part)"). Only lld reads the file: Rust's own, the default
//! linker for x86_64 Linux since Rust 1.90. With another linker, an older Rust or another
//! target the order is left out (the same code, laid out as the linker likes). Names the build
//! does not have (the file is from an older build) are skipped without a warning.

use std::env;
use std::path::Path;
use std::process::Command;

fn main() {
    let order =
        Path::new(&env::var("CARGO_MANIFEST_DIR").expect("set by cargo")).join("startup.order");
    println!("cargo:rerun-if-changed={}", order.display());
    println!("cargo:rerun-if-env-changed=FERRY_NO_STARTUP_ORDER");
    if env::var("PROFILE").as_deref() != Ok("release")
        || env::var_os("FERRY_NO_STARTUP_ORDER").is_some()
    {
        return;
    }
    match default_lld() {
        Ok(()) => {
            println!(
                "cargo:rustc-link-arg-bin=agent=-Wl,--symbol-ordering-file={}",
                order.display()
            );
            println!("cargo:rustc-link-arg-bin=agent=-Wl,--no-warn-symbol-ordering");
        }
        Err(why) => println!(
            "cargo:warning=the agent is linked without its start-up order ({why}): an idle agent keeps more of its code resident"
        ),
    }
}

/// Whether this build links with Rust's own lld, which reads a symbol order.
fn default_lld() -> Result<(), String> {
    let target = env::var("TARGET").unwrap_or_default();
    if target != "x86_64-unknown-linux-gnu" {
        return Err(format!("target {target}, whose default linker is not lld"));
    }
    if env::var_os("RUSTC_LINKER").is_some() {
        return Err("a linker is configured".into());
    }
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    for flag in flags.split('\x1f') {
        let other_ld = flag.contains("fuse-ld=") && !flag.contains("fuse-ld=lld");
        if other_ld || flag.contains("linker") || flag.contains("link-self-contained") {
            return Err(format!("RUSTFLAGS has {flag}"));
        }
    }
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(&rustc)
        .arg("--version")
        .output()
        .map_err(|e| format!("{rustc} --version: {e}"))?;
    let version = String::from_utf8_lossy(&version.stdout);
    let minor = version
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.split('.').nth(1))
        .and_then(|m| m.parse::<u32>().ok());
    match minor {
        Some(minor) if version.starts_with("rustc 1.") && minor >= 90 => Ok(()),
        _ => Err(format!(
            "{}, before Rust 1.90 made lld the default",
            version.trim()
        )),
    }
}
