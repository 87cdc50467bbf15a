//! `cuda-streams`: the command-line tool.

mod bench;
mod dag;
mod demo;
mod info;
mod progress;

use std::process::ExitCode;

const HELP: &str = "\
cuda-streams <command>

Commands:
  info     the driver in use and each device: name, compute capability, SMs,
           memory, copy engines, stream priority range
  demo     a triple-buffered pipeline and an operation DAG, profiled on the GPU
           timeline, every result verified; prints the report and writes
           trace.json for https://ui.perfetto.dev (--trace PATH to change it)
  bench    a quick run of the key ratios (ours vs the driver baseline, measured
           in the same run), printed as a table
  help     print this text

The driver is chosen by CUDA_STREAMS_DRIVER=cuda|soft|auto (default auto: the GPU
when one answers, otherwise the software driver). The libraries' log goes to
stderr at the level CUDA_STREAMS_LOG (or else RUST_LOG) sets, e.g. `info` or
`cuda_streams_driver=debug` (default: warnings and errors).
";

/// Send the libraries' `tracing` events to stderr, filtered by
/// `CUDA_STREAMS_LOG` (ours wins) or `RUST_LOG`; warnings by default. A
/// filter that does not parse is reported and the default used.
fn install_log() {
    use tracing_subscriber::EnvFilter;
    let (variable, spec) = match std::env::var("CUDA_STREAMS_LOG") {
        Ok(spec) => ("CUDA_STREAMS_LOG", spec),
        Err(_) => ("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_default()),
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

fn main() -> ExitCode {
    install_log();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = args.first().cloned().unwrap_or_else(|| "help".to_string());
    let rest = args.get(1..).unwrap_or_default();
    let result = match command.as_str() {
        "info" => info::run(),
        "demo" => demo::run(rest),
        "bench" => bench::run(rest),
        "help" | "--help" | "-h" => {
            print!("{HELP}");
            Ok(())
        }
        other => Err(format!("unknown command `{other}`\n\n{HELP}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("cuda-streams {command}: {message}");
            ExitCode::FAILURE
        }
    }
}
