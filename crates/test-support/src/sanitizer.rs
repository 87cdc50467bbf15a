//! Whether a test runs under compute-sanitizer.

/// True (and says why on stderr) when the test runs under compute-sanitizer,
/// whose instrumentation changes what the test looks at: it serialises
/// kernels, so work behind a gate holds every stream. The GPU bundle's
/// `run.sh` sets `CUDA_STREAMS_SANITIZER` to the tool's name when it runs one.
pub fn skip_under_sanitizer(why: &str) -> bool {
    match std::env::var("CUDA_STREAMS_SANITIZER") {
        Ok(tool) if !tool.is_empty() => {
            eprintln!("skipped under compute-sanitizer ({tool}): {why}");
            true
        }
        _ => false,
    }
}
