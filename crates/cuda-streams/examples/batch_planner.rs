//! Batch transfer planning: decide once whether a multi-stream upload pays,
//! then upload batches with one copy per key on the planned streams, and
//! check the bytes that arrived.
//!
//! `cargo run -p cuda-streams --example batch_planner`

use cuda_streams::prelude::*;

fn refs(samples: &[Vec<u8>]) -> Vec<&[u8]> {
    samples.iter().map(Vec::as_slice).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The decision for three volume sizes, 16 samples per batch, default thresholds.
    let defaults = PlannerConfig::default();
    for shape in [[64, 64, 32], [256, 256, 64], [512, 512, 128]] {
        let plan = plan_transfers(&[ArraySpec::f32("raw", &shape)], 16, &defaults);
        println!("{shape:?}: {plan}");
    }

    // A small batch with thresholds low enough that streams are used.
    let ctx = Context::new(0)?;
    let arrays = [
        ArraySpec::f32("raw", &[32, 32]),
        ArraySpec::f32("labels", &[2, 32, 32]),
        ArraySpec::f32("mask", &[32, 32]),
    ];
    let config = PlannerConfig {
        min_batch_size: 2,
        min_batch_mb: 0.0,
        max_streams: 2,
    };
    let mut uploader = BatchUploader::new(&ctx, &arrays, 4, config)?;
    assert!(uploader.plan().use_streams);
    for (key, stream) in &uploader.plan().assignment {
        println!("key {key:>6} -> stream {stream}");
    }

    let consumer = Stream::new(&ctx)?;
    for batch in 0u8..3 {
        let sample = |key: u8, bytes: usize, i: u8| vec![batch ^ key ^ i; bytes];
        let raw: Vec<Vec<u8>> = (0..4).map(|i| sample(1, 32 * 32 * 4, i)).collect();
        let labels: Vec<Vec<u8>> = (0..4).map(|i| sample(2, 2 * 32 * 32 * 4, i)).collect();
        let mask: Vec<Vec<u8>> = (0..4).map(|i| sample(3, 32 * 32 * 4, i)).collect();
        let (raw_refs, label_refs, mask_refs) = (refs(&raw), refs(&labels), refs(&mask));
        uploader.upload_batch(&[
            ("raw", &raw_refs),
            ("labels", &label_refs),
            ("mask", &mask_refs),
        ])?;
        uploader.wait_all(&consumer)?; // the consumer stream waits on the GPU
        for (key, samples) in [("raw", &raw), ("labels", &labels), ("mask", &mask)] {
            let arrived = uploader
                .device_buffer(key)
                .expect("a planned key")
                .to_vec(&consumer)?;
            assert_eq!(arrived, samples.concat(), "batch {batch}, key {key}");
        }
    }
    println!(
        "{} batches uploaded and checked byte for byte",
        uploader.batches()
    );
    Ok(())
}
