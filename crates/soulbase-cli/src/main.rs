//! `soulbase`: the Soulbase command line.
//!
//! A thin dispatcher: every subcommand group lives in its own module (`skills`, …)
//! with its own clap `Args` and a `run` function returning the process exit code.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod evidence;
mod skills;

/// Soulbase: governed tool execution for LLM agents.
#[derive(Debug, Parser)]
#[command(name = "soulbase", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate, list and inspect a skills directory.
    Skills(skills::SkillsArgs),
    /// Query and replay recorded evidence.
    Evidence(evidence::EvidenceArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Skills(args) => skills::run(args),
        Command::Evidence(args) => evidence::run(args),
    }
}
