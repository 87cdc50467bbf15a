//! The triple buffer driven by hand: batch k uploads while batch k - 1
//! computes and batch k - 2 downloads, on three streams ordered by events,
//! with the slot state machine deciding which buffer each stage gets.
//!
//! `cargo run -p cuda-streams --example triple_buffer`

use cuda_streams::kernels::{self, reference};
use cuda_streams::prelude::*;

const N: usize = 1 << 16;
const BATCHES: usize = 12;
const ITERATIONS: u32 = 4;

fn batch(k: usize) -> Vec<f32> {
    (0..N).map(|i| (k * 31 + i % 101) as f32 * 0.125).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::new(0)?;
    let (up, comp, down) = (Stream::new(&ctx)?, Stream::new(&ctx)?, Stream::new(&ctx)?);
    let compute = Module::load(&ctx, &kernels::COMPUTE)?.function("compute")?;
    let cfg = LaunchConfig::for_num_elems(N as u32);

    let slots = GpuTripleBuffer::<f32>::new(&ctx, N)?;
    let mut outputs = (0..3)
        .map(|_| DeviceBuffer::<f32>::new(&ctx, N))
        .collect::<Result<Vec<_>, _>>()?;
    let mut host_in = (0..3)
        .map(|_| PinnedBuffer::<f32>::new(&ctx, N))
        .collect::<Result<Vec<_>, _>>()?;
    let mut host_out = (0..3)
        .map(|_| PinnedBuffer::<f32>::new(&ctx, N))
        .collect::<Result<Vec<_>, _>>()?;
    let event = || Event::plain(&ctx);
    let uploaded = [event()?, event()?, event()?];
    let computed = [event()?, event()?, event()?];
    let downloaded = [event()?, event()?, event()?];
    // Which batch each host output slot holds, checked before it is reused.
    let mut in_host_out: [Option<usize>; 3] = [None; 3];
    let mut verified = 0;
    let mut check =
        |slot: usize, batch_id: usize, host: &PinnedBuffer<f32>| -> Result<(), driver::Error> {
            let mut expected = vec![0.0; N];
            reference::compute(ITERATIONS, &batch(batch_id), &mut expected);
            assert_eq!(
                host.as_slice()?,
                &expected[..],
                "batch {batch_id} in slot {slot}"
            );
            verified += 1;
            Ok(())
        };

    for k in 0..BATCHES + 2 {
        if k < BATCHES {
            let mut slot = slots.get_upload_buffer().expect("a slot is free");
            let s = slot.slot();
            host_in[s].as_mut_slice()?.copy_from_slice(&batch(k)); // waits for its last upload
            up.wait_event(&computed[s])?; // the slot's previous batch has been read
            up.copy_from_host_async(&mut *slot, &host_in[s])?;
            uploaded[s].record(&up)?;
        }
        if (1..=BATCHES).contains(&k) {
            let slot = slots.get_process_buffer().expect("a batch was uploaded");
            let s = slot.slot();
            comp.wait_event(&uploaded[s])?;
            comp.wait_event(&downloaded[s])?; // outputs[s] has been copied out
            let args = [
                (N as u64).into(),
                ITERATIONS.into(),
                (&*slot).into(),
                (&mut outputs[s]).into(),
            ];
            comp.launch(&compute, cfg, &args)?;
            computed[s].record(&comp)?;
        }
        if k >= 2 {
            let slot = slots.get_download_buffer().expect("a batch was processed");
            let s = slot.slot();
            if let Some(previous) = in_host_out[s].take() {
                check(s, previous, &host_out[s])?;
            }
            down.wait_event(&computed[s])?;
            down.copy_to_host_async(&mut host_out[s], &outputs[s])?;
            downloaded[s].record(&down)?;
            in_host_out[s] = Some(k - 2);
            drop(slot);
            slots.advance()?; // Downloading -> Free
        }
        println!(
            "step {k:2}: slots {:?}",
            slots.get_states().map(|s| s.state)
        );
    }
    for (s, batch_id) in in_host_out.iter().enumerate() {
        if let Some(batch_id) = batch_id {
            check(s, *batch_id, &host_out[s])?;
        }
    }
    assert_eq!(verified, BATCHES);
    println!("{BATCHES} batches of {N} elements through three streams, every result verified");
    Ok(())
}
