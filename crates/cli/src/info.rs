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
    for ordinal in 0..count {
        // The safe layer already knows how to describe a device.
        let ctx = Context::with_driver(*loaded, ordinal)?;
        print_device(loaded, ctx.info());
    }
    print_peers(loaded, count)
}

/// Which device can map which other's memory (`cuDeviceCanAccessPeer`), as
/// one line per device that has a peer.
fn print_peers(loaded: &LoadedDriver, count: i32) -> Result<(), driver::Error> {
    if count < 2 {
        println!("peer access:     none (one device)");
        return Ok(());
    }
    let d = loaded.table;
    let mut devices = Vec::with_capacity(count as usize);
    for ordinal in 0..count {
        let mut device = 0;
        // SAFETY: writes one CUdevice through a valid out-pointer; `ordinal`
        // is below the count the driver reported.
        d.check(unsafe { (d.cuDeviceGet)(&mut device, ordinal) })?;
        devices.push(device);
    }
    let mut any = false;
    for (i, &from) in devices.iter().enumerate() {
        let mut peers = Vec::new();
        for (j, &to) in devices.iter().enumerate() {
            if i == j {
                continue;
            }
            let mut can = 0;
            // SAFETY: writes one int through a valid out-pointer; both
            // devices came from cuDeviceGet.
            d.check(unsafe { (d.cuDeviceCanAccessPeer)(&mut can, from, to) })?;
            if can != 0 {
                peers.push(j.to_string());
            }
        }
        if !peers.is_empty() {
            any = true;
            println!("peer access:     device {i} -> {}", peers.join(", "));
        }
    }
    if !any {
        println!("peer access:     none between the {count} devices");
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
             set CUDA_STREAMS_SOFT_CAPACITY_MB to change it)"
        );
    }
}
