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
when one answers, otherwise the software driver).
";

fn main() -> ExitCode {
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
