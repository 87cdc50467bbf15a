//! `cuda-streams`: the command-line tool.

mod info;

use std::process::ExitCode;

const HELP: &str = "\
cuda-streams <command>

Commands:
  info     the driver in use and each device: name, compute capability, SMs,
           memory, copy engines, stream priority range
  help     print this text

The driver is chosen by CUDA_STREAMS_DRIVER=cuda|soft|auto (default auto: the GPU
when one answers, otherwise the software driver).
";

fn main() -> ExitCode {
    let command = std::env::args().nth(1).unwrap_or_else(|| "help".to_string());
    let result = match command.as_str() {
        "info" => info::run(),
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
