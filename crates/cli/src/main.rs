//! `cuda-streams`: the command-line tool.
//!
//! Exit codes: 0 on success, 1 when a command fails (one line on stderr
//! names the cause), 2 for a command line that does not parse (one line on
//! stderr; `--help` explains).

mod bench;
mod dag;
mod demo;
mod demo_sizes;
mod info;
mod progress;
mod qos;
mod steps;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, Subcommand};
use driver::sys::env::Setting;
use std::error::Error;
use std::process::ExitCode;

/// The environment, shown after every command's help.
const ENVIRONMENT: &str = "\
Environment:
  CUDA_STREAMS_DRIVER=cuda|soft|auto  the driver (default auto: the GPU when one
                                      answers, otherwise the software driver)
  CUDA_STREAMS_LOG (or RUST_LOG)      the libraries' log on stderr, e.g. `info` or
                                      `cuda_streams_driver=debug` (default: warn)
  `cuda-streams info` lists every setting read from the environment, its value
  and where it came from.";

/// Streams, events, stream-ordered memory and a GPU-timed profiler, on
/// NVIDIA's driver or the software driver.
#[derive(Parser)]
#[command(
    name = "cuda-streams",
    version,
    propagate_version = true,
    arg_required_else_help = true,
    after_help = ENVIRONMENT
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The environment variables in effect (value and where it came from),
    /// the driver in use and every device: name, compute capability, SMs,
    /// memory, copy engines, stream priorities, peer access.
    #[command(after_help = ENVIRONMENT)]
    Info,
    /// A triple-buffered pipeline and an operation DAG, profiled on the
    /// stream timeline, every result checked against the CPU (a sample of
    /// each, or every element with --verify-all); prints what ran, what the
    /// pipeline's streams overlapped, and writes the timeline as a Chrome
    /// trace for https://ui.perfetto.dev (--verbose: the engine's
    /// diagnostics and every stream's operations).
    #[command(after_help = ENVIRONMENT)]
    Demo(demo::DemoArgs),
    /// A quick run of the key ratios: ours against the driver baseline, both
    /// measured in this run (the careful figures are the criterion benches).
    /// On the software driver they only show that the code runs.
    #[command(after_help = ENVIRONMENT)]
    Bench(bench::BenchArgs),
    /// Urgent kernels under a saturating background: p50/p99 with stream
    /// priorities only and with SMs kept for them (an SM partition, sized
    /// by --urgent-sms or CUDA_STREAMS_URGENT_SMS), and the background's
    /// throughput in both. On the software driver it only shows the code runs.
    #[command(after_help = ENVIRONMENT)]
    Qos(qos::QosArgs),
    /// Print a completion script for a shell, e.g.
    /// `cuda-streams completions bash > /etc/bash_completion.d/cuda-streams`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

impl Command {
    fn name(&self) -> &'static str {
        match self {
            Command::Info => "info",
            Command::Demo(_) => "demo",
            Command::Bench(_) => "bench",
            Command::Qos(_) => "qos",
            Command::Completions { .. } => "completions",
        }
    }
}

/// The CLI's own setting: the log filter, `CUDA_STREAMS_LOG` or `RUST_LOG`.
const LOG_SETTING: Setting = Setting {
    name: "CUDA_STREAMS_LOG",
    aliases: &["RUST_LOG"],
    default: "warn",
    about: "the libraries' log on stderr (a tracing filter)",
};

/// Send the libraries' `tracing` events to stderr, filtered by
/// `CUDA_STREAMS_LOG` (ours wins) or `RUST_LOG`; warnings by default. A
/// filter that does not parse is reported and the default used.
fn install_log() {
    use tracing_subscriber::EnvFilter;
    let (variable, spec) = match LOG_SETTING.from_env() {
        Ok(Some(found)) => (found.var, found.value),
        Ok(None) => (LOG_SETTING.name, String::new()),
        Err(err) => {
            eprintln!("cuda-streams: ignoring {err}");
            (err.var, String::new())
        }
    };
    let filter = if spec.trim().is_empty() {
        EnvFilter::new("warn")
    } else {
        EnvFilter::try_new(&spec).unwrap_or_else(|err| {
            eprintln!("cuda-streams: ignoring {variable}={spec:?}: {err}");
            EnvFilter::new("warn")
        })
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true)
        .init();
}

/// An error and its sources on one line: `cause: its cause: ...`.
fn one_line(err: &dyn Error) -> String {
    let mut line = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A command line that does not parse: clap's first line (what is wrong),
/// without its usage block, and exit code 2.
fn usage_error(err: &clap::Error) -> ExitCode {
    let rendered = err.render().to_string();
    let first = rendered
        .lines()
        .find(|line| !line.trim().is_empty())
        .unwrap_or("invalid command line");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    eprintln!("cuda-streams: {first} (see `cuda-streams --help`)");
    ExitCode::from(2)
}

/// Output into a closed pipe (`cuda-streams info | head -1`) ends the tool
/// quietly, as it does other command-line tools, instead of making
/// `println!` panic: Rust starts programs with SIGPIPE ignored.
fn default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: sets one signal's disposition back to the default, first thing
    // in `main` while no other thread exists; no Rust handler is installed.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    default_sigpipe();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => match err.kind() {
            ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => err.exit(),
            _ => return usage_error(&err),
        },
    };
    install_log();
    let name = cli.command.name();
    let result = match cli.command {
        Command::Info => info::run(),
        Command::Demo(args) => demo::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Qos(args) => qos::run(&args),
        Command::Completions { shell } => {
            let mut command = Cli::command();
            clap_complete::generate(shell, &mut command, "cuda-streams", &mut std::io::stdout());
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("cuda-streams {name}: {}", one_line(err.as_ref()));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn errors_fit_on_one_line() {
        let err = std::io::Error::other("first\nsecond");
        assert_eq!(one_line(&err), "first second");
    }
}
