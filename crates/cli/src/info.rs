//! `cuda-streams info`: what driver answered and what each device is.
//!
//! Driver version and device count come from the raw table (the safe layer
//! has no call for them); each device is described by its `Context`.

use driver::{Context, DeviceInfo, DriverChoice, DriverKind, LoadedDriver};

pub(crate) fn run() -> Result<(), Box<dyn std::error::Error>> {
    let choice = DriverChoice::from_env()?;
    // Asked for the GPU and there is none: a failure (exit code 1, the cause
    // on stderr), as `CUDA_STREAMS_DRIVER=cuda` promises no silent fallback.
    let loaded = driver::select(choice)?;
    if choice == DriverChoice::Auto && loaded.kind == DriverKind::Soft {
        println!(
            "No GPU answered (libcuda.so.1 did not load or found no device); using the software driver."
        );
    }
    print(&loaded)?;
    Ok(())
}

fn print(loaded: &LoadedDriver) -> Result<(), driver::Error> {
    let d = loaded.table;
    let (mut version, mut count) = (0, 0);
    // SAFETY: cuInit takes flags only; the other two write one int each
    // through valid out-pointers.
    unsafe {
        d.check((d.cuInit)(0))?;
        d.check((d.cuDriverGetVersion)(&mut version))?;
        d.check((d.cuDeviceGetCount)(&mut count))?;
    }
    println!("driver:          {} (version {version})", loaded.name());
    println!("devices:         {count}");
    let mut contexts = Vec::new();
    for ordinal in 0..count {
        // The safe layer already knows how to describe a device.
        let ctx = Context::with_driver(*loaded, ordinal)?;
        print_device(loaded, ctx.info());
        contexts.push(ctx);
    }
    print_peers(&contexts)
}

/// Which ordered pairs of devices can access each other's memory
/// (`cuDeviceCanAccessPeer`), one line per device.
fn print_peers(contexts: &[std::sync::Arc<Context>]) -> Result<(), driver::Error> {
    if contexts.len() < 2 {
        println!("peer access:     none (one device)");
        return Ok(());
    }
    println!("peer access:");
    for from in contexts {
        let peers = contexts
            .iter()
            .filter(|to| to.ordinal() != from.ordinal())
            .map(|to| {
                let can = from.can_access_peer(to)?;
                Ok(format!(
                    "{} {}",
                    to.ordinal(),
                    if can { "yes" } else { "no" }
                ))
            })
            .collect::<Result<Vec<_>, driver::Error>>()?;
        println!("  device {} -> {}", from.ordinal(), peers.join(", "));
    }
    Ok(())
}

fn print_device(loaded: &LoadedDriver, info: &DeviceInfo) {
    let (major, minor) = info.compute_capability;
    let range = info.priority_range;
    let total = info.total_memory;
    println!("device {}:        {}", info.ordinal, info.name);
    println!("  compute capability: {major}.{minor}");
    println!("  multiprocessors:    {}", info.multiprocessor_count);
    println!(
        "  memory:             {:.1} GiB ({total} bytes)",
        total as f64 / (1u64 << 30) as f64
    );
    println!("  async copy engines: {}", info.async_engine_count);
    println!(
        "  stream priorities:  {} (least) to {} (greatest)",
        range.least, range.greatest
    );
    let pools = if info.memory_pools_supported {
        "supported"
    } else {
        "not supported"
    };
    println!("  memory pools:       {pools}");
    let managed = if info.concurrent_managed_access {
        "concurrent access"
    } else {
        "no concurrent access"
    };
    println!("  managed memory:     {managed}");
    if loaded.kind == DriverKind::Soft {
        println!(
            "  (software driver: device memory is host memory, capped at the capacity above; \
             set CUDA_STREAMS_SOFT_CAPACITY_MB to change it, CUDA_STREAMS_SOFT_DEVICES for the \
             number of devices)"
        );
    }
}
