//! Minimal entry point of the `exec` branch: only the hidden `gpuq shim`
//! subcommand, so the executor's tests can run real shims. The full CLI lives
//! elsewhere and gets this same subcommand.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "gpuq")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Parent of one task's process (started by the agent).
    #[command(hide = true)]
    Shim {
        #[arg(long)]
        task_dir: PathBuf,
    },
}

fn main() {
    match Cli::parse().command {
        Cmd::Shim { task_dir: dir } => std::process::exit(gpuq::agent::exec::shim_main(&dir)),
    }
}
