//! The batch transfer planner: the decision for the spec's three sizes, the
//! byte-balanced assignment, environment overrides, and real batch uploads.

mod common;

use common::{ctx, spin, spin_kernel};
use cuda_streams_pipeline::{ArraySpec, BatchUploader, Error, PlannerConfig, plan_transfers};
use driver::{PinnedBuffer, Stream};
use std::time::Duration;

const MIB: u64 = 1024 * 1024;

/// A raw volume and a two-class target of the same shape, float32.
fn arrays(d: usize, h: usize, w: usize) -> Vec<ArraySpec> {
    vec![
        ArraySpec::f32("raw", &[d, h, w]),
        ArraySpec::f32("gt", &[2, d, h, w]),
    ]
}

#[test]
fn the_three_example_sizes() {
    let config = PlannerConfig::default();
    // 64×64×32 = 131,072 voxels; raw 512 KiB + gt 1 MiB = 1.5 MiB per
    // sample; 16 samples = 24 MiB < 100 MiB: one stream.
    let small = plan_transfers(&arrays(64, 64, 32), 16, &config);
    assert_eq!(small.batch_bytes, 24 * MIB);
    assert!(!small.use_streams);
    assert_eq!(
        (small.streams, small.stream_of("raw"), small.stream_of("gt")),
        (1, Some(0), Some(0))
    );
    assert!(
        small.to_string().starts_with("CUDA streams disabled"),
        "{small}"
    );
    // 256×256×64 = 4,194,304 voxels; 16 MiB + 32 MiB = 48 MiB per sample;
    // × 16 = 768 MiB ≥ 100 MiB: streams, gt (512 MiB) then raw (256 MiB).
    let medium = plan_transfers(&arrays(256, 256, 64), 16, &config);
    assert_eq!(medium.batch_bytes, 768 * MIB);
    assert_eq!(medium.batch_mb(), 768.0);
    assert!(medium.use_streams);
    assert_eq!(medium.streams, 2, "two keys need two streams at most");
    assert_eq!(
        (medium.stream_of("gt"), medium.stream_of("raw")),
        (Some(0), Some(1))
    );
    assert_eq!(medium.stream_bytes, [512 * MIB, 256 * MIB]);
    assert!(
        medium
            .to_string()
            .contains("enabled: 2 stream(s), batch_size=16, memory=768.0MB"),
        "{medium}"
    );
    // 512×512×128 = 33,554,432 voxels; 128 MiB + 256 MiB = 384 MiB per
    // sample; × 16 = 6144 MiB.
    let large = plan_transfers(&arrays(512, 512, 128), 16, &config);
    assert_eq!(large.batch_bytes, 6144 * MIB);
    assert!(large.use_streams);
    // The same bytes in a batch of 4 (< 8 samples): one stream.
    let few = plan_transfers(&arrays(512, 512, 128), 4, &config);
    assert!(
        !few.use_streams && few.reason.contains("batch size 4 < 8"),
        "{}",
        few.reason
    );
}

#[test]
fn keys_are_balanced_by_bytes_largest_first() {
    // Per-sample sizes 7, 5, 4, 3, 3, 2 (units of 1 MiB), 16 samples, 3 streams.
    let specs: Vec<ArraySpec> = [("a", 7), ("b", 5), ("c", 4), ("d", 3), ("e", 3), ("f", 2)]
        .iter()
        .map(|&(name, mib)| ArraySpec {
            name: name.into(),
            shape: vec![mib, 1024, 1024],
            element_size: 1,
        })
        .collect();
    let config = PlannerConfig {
        max_streams: 3,
        ..PlannerConfig::default()
    };
    let plan = plan_transfers(&specs, 16, &config);
    assert!(plan.use_streams);
    // a→0 (7), b→1 (5), c→2 (4), d→2 (7), e→1 (8), f→0 (9), ×16 MiB.
    let streams: Vec<usize> = plan.assignment.iter().map(|(_, s)| *s).collect();
    assert_eq!(streams, [0, 1, 2, 2, 1, 0]);
    assert_eq!(
        plan.stream_bytes,
        [9 * 16 * MIB, 8 * 16 * MIB, 7 * 16 * MIB]
    );
}

#[test]
fn environment_overrides_and_their_errors() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |var: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
        }
    };
    let config = PlannerConfig::from_lookup(env(&[
        ("CUDA_STREAMS_MIN_BATCH_SIZE", "2"),
        ("CUDA_STREAMS_MIN_BATCH_MB", "12.5"),
        ("CUDA_STREAMS_MAX_STREAMS", " 6 "),
    ]))
    .unwrap();
    assert_eq!(
        (
            config.min_batch_size,
            config.min_batch_mb,
            config.max_streams
        ),
        (2, 12.5, 6)
    );
    // With the lowered thresholds the small example now uses streams.
    assert!(plan_transfers(&arrays(64, 64, 32), 16, &config).use_streams);
    for (pairs, needle) in [
        (
            &[("CUDA_STREAMS_MIN_BATCH_SIZE", "eight")][..],
            "CUDA_STREAMS_MIN_BATCH_SIZE=\"eight\" is invalid: expected a whole number",
        ),
        (
            &[("CUDA_STREAMS_MIN_BATCH_SIZE", "0")][..],
            "CUDA_STREAMS_MIN_BATCH_SIZE=\"0\" is invalid: expected a whole number, at least 1",
        ),
        (
            &[("CUDA_STREAMS_MIN_BATCH_MB", "-1")][..],
            "CUDA_STREAMS_MIN_BATCH_MB=\"-1\" is invalid",
        ),
        (
            &[("CUDA_STREAMS_MIN_BATCH_MB", "NaN")][..],
            "CUDA_STREAMS_MIN_BATCH_MB=\"NaN\"",
        ),
        (
            &[("CUDA_STREAMS_MAX_STREAMS", "0")][..],
            "CUDA_STREAMS_MAX_STREAMS=\"0\" is invalid: expected a whole number from 1 to 64",
        ),
        (
            &[("CUDA_STREAMS_MAX_STREAMS", "1000")][..],
            "CUDA_STREAMS_MAX_STREAMS=\"1000\"",
        ),
    ] {
        let pairs: &'static [(&'static str, &'static str)] = pairs;
        let err = PlannerConfig::from_lookup(env(pairs)).unwrap_err();
        assert!(matches!(err, Error::InvalidEnv(_)), "{err}");
        assert!(err.to_string().contains(needle), "{err}");
    }
}

#[test]
fn seed_004_names_are_accepted_and_ours_win_when_both_are_set() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |var: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
        }
    };
    // Only the specification's names.
    let seed = PlannerConfig::from_lookup(env(&[
        ("MIN_BATCH_SIZE_FOR_STREAMS", "3"),
        ("MIN_BATCH_MEMORY_FOR_STREAMS_MB", "7.5"),
        ("MAX_CONCURRENT_CUDA_STREAMS", "5"),
    ]))
    .unwrap();
    assert_eq!(
        (seed.min_batch_size, seed.min_batch_mb, seed.max_streams),
        (3, 7.5, 5)
    );
    // Both names for each: ours, whatever the order they are looked up in.
    let both = PlannerConfig::from_lookup(env(&[
        ("MIN_BATCH_SIZE_FOR_STREAMS", "3"),
        ("CUDA_STREAMS_MIN_BATCH_SIZE", "9"),
        ("MIN_BATCH_MEMORY_FOR_STREAMS_MB", "7.5"),
        ("CUDA_STREAMS_MIN_BATCH_MB", "1"),
        ("MAX_CONCURRENT_CUDA_STREAMS", "5"),
        ("CUDA_STREAMS_MAX_STREAMS", "2"),
    ]))
    .unwrap();
    assert_eq!(
        (both.min_batch_size, both.min_batch_mb, both.max_streams),
        (9, 1.0, 2)
    );
    // A bad value under the seed's name is named by that name.
    let err = PlannerConfig::from_lookup(env(&[("MAX_CONCURRENT_CUDA_STREAMS", "many")]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("MAX_CONCURRENT_CUDA_STREAMS=\"many\" is invalid"),
        "{err}"
    );
    // Ours set and valid: a bad seed value is not read at all.
    let ours = PlannerConfig::from_lookup(env(&[
        ("MAX_CONCURRENT_CUDA_STREAMS", "many"),
        ("CUDA_STREAMS_MAX_STREAMS", "2"),
    ]))
    .unwrap();
    assert_eq!(ours.max_streams, 2);
}

#[test]
fn batches_are_stacked_and_uploaded_per_key() {
    let ctx = ctx();
    let specs = vec![
        ArraySpec {
            name: "raw".into(),
            shape: vec![8, 8],
            element_size: 1,
        },
        ArraySpec {
            name: "gt".into(),
            shape: vec![3, 8, 8],
            element_size: 1,
        },
    ];
    // Force streams on for a tiny batch.
    let config = PlannerConfig {
        min_batch_size: 1,
        min_batch_mb: 0.0,
        max_streams: 4,
    };
    let mut uploader = BatchUploader::new(&ctx, &specs, 3, config).unwrap();
    assert!(uploader.plan().use_streams);
    assert_eq!(uploader.streams().len(), 2);
    assert_ne!(
        uploader.stream_of("raw").unwrap().id(),
        uploader.stream_of("gt").unwrap().id()
    );
    for batch in 0..3u8 {
        let raw: Vec<Vec<u8>> = (0..3).map(|s| vec![batch * 10 + s; 64]).collect();
        let gt: Vec<Vec<u8>> = (0..3).map(|s| vec![100 + batch * 10 + s; 192]).collect();
        let raw_refs: Vec<&[u8]> = raw.iter().map(Vec::as_slice).collect();
        let gt_refs: Vec<&[u8]> = gt.iter().map(Vec::as_slice).collect();
        uploader
            .upload_batch(&[("raw", &raw_refs), ("gt", &gt_refs)])
            .unwrap();
        let reader = driver::Stream::new(&ctx).unwrap();
        uploader.wait_all(&reader).unwrap();
        let got = uploader
            .device_buffer("raw")
            .unwrap()
            .to_vec(&reader)
            .unwrap();
        assert_eq!(got, raw.concat(), "batch {batch}");
        let got = uploader
            .device_buffer("gt")
            .unwrap()
            .to_vec(&reader)
            .unwrap();
        assert_eq!(got, gt.concat(), "batch {batch}");
    }
    assert_eq!(uploader.batches(), 3);
    // Wrong sample count, wrong size, unknown key: clear errors.
    let s = [0u8; 64];
    let err = uploader
        .upload_batch(&[("raw", &[&s[..]]), ("gt", &[&s[..]])])
        .unwrap_err();
    assert!(err.to_string().contains("1 sample(s), expected 3"), "{err}");
    let err = uploader.upload_batch(&[("raw", &[&s[..]; 3])]).unwrap_err();
    assert!(
        err.to_string().contains("\"gt\": missing from the batch"),
        "{err}"
    );
    let g = [0u8; 192];
    let err = uploader
        .upload_batch(&[("raw", &[&s[..]; 3]), ("gt", &[&g[..]; 3]), ("extra", &[])])
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("\"extra\": not one of the planned arrays"),
        "{err}"
    );
}

/// A consumer still reading a key's previous batch (held by a slow kernel
/// before its copy) must see that batch, not the next one: the next upload of
/// the key waits for the streams that waited for the previous one.
#[test]
fn the_next_upload_waits_for_the_consumers_of_the_previous_batch() {
    let ctx = ctx();
    let spin_k = spin_kernel(&ctx);
    let specs = [ArraySpec {
        name: "raw".into(),
        shape: vec![4096],
        element_size: 1,
    }];
    for use_streams in [false, true] {
        let config = PlannerConfig {
            min_batch_size: if use_streams { 1 } else { 1000 },
            min_batch_mb: 0.0,
            max_streams: 2,
        };
        let mut uploader = BatchUploader::new(&ctx, &specs, 2, config).unwrap();
        let consumers = [Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap()];
        let mut seen: Vec<PinnedBuffer<u8>> = (0..2)
            .map(|_| PinnedBuffer::new(&ctx, 2 * 4096).unwrap())
            .collect();
        for batch in 0..4u8 {
            let samples: Vec<Vec<u8>> = (0..2).map(|s| vec![batch * 2 + s + 1; 4096]).collect();
            let refs: Vec<&[u8]> = samples.iter().map(Vec::as_slice).collect();
            // Batch `batch` overwrites what the consumers of `batch - 1` are
            // still reading (their kernels spin before their copies).
            uploader.upload_batch(&[("raw", &refs)]).unwrap();
            if batch > 0 {
                for (consumer, seen) in consumers.iter().zip(&seen) {
                    consumer.synchronize().unwrap();
                    let expected: Vec<u8> = (0..2)
                        .flat_map(|s| vec![(batch - 1) * 2 + s + 1; 4096])
                        .collect();
                    assert!(
                        seen.as_slice().unwrap() == &expected[..],
                        "use_streams {use_streams}: a consumer of batch {} saw the next batch's data",
                        batch - 1
                    );
                }
            }
            if batch == 3 {
                break;
            }
            for (i, (consumer, seen)) in consumers.iter().zip(&mut seen).enumerate() {
                if i == 0 {
                    uploader.wait_key("raw", consumer).unwrap();
                } else {
                    uploader.wait_all(consumer).unwrap();
                }
                spin(consumer, &spin_k, Duration::from_millis(100));
                consumer
                    .copy_to_host_async(seen, uploader.device_buffer("raw").unwrap())
                    .unwrap();
            }
        }
        uploader.synchronize().unwrap();
    }
}
