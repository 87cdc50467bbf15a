//! The stage manager over element types other than `f32`: real `u32`
//! kernels on every batch, `f64` and a `#[repr(C)]` struct through every
//! batch's upload and download, and kernels of the wrong element type
//! refused at `set_order`, naming the stage.

mod common;

use common::{XorShift, ctx, kernel, spin_kernel};
use cuda_streams_pipeline::driver::DeviceCopy;
use cuda_streams_pipeline::{
    AsyncCoordinator, BufferId, Error, GpuPipelineStage, ManagedGpuContext, PipelineStageManager,
    StageArg, StageId,
};
use driver::{Kernel, LaunchConfig};
use std::fmt::Debug;

const N: usize = 1_000;
const BATCHES: usize = 7;

/// `fill_u32(n, value, out)` over the first `count` elements of buffer 0, in place.
fn mark(fill: &Kernel, name: &str, count: u64, value: u32) -> GpuPipelineStage {
    GpuPipelineStage {
        name: name.into(),
        input_buffers: vec![BufferId(0)],
        output_buffers: vec![BufferId(0)],
        kernel: fill.clone(),
        config: LaunchConfig::for_num_elems(count as u32),
        args: vec![
            StageArg::U64(count),
            StageArg::U32(value),
            StageArg::buffer(0),
        ],
    }
}

/// What the two marking stages make of a batch: `b` over the first 200,
/// after `a` over the first 600, the rest as uploaded.
fn marked(batch: &[u32]) -> Vec<u32> {
    let mut out = batch.to_vec();
    out[..600].fill(0xAAAA_AAAA);
    out[..200].fill(0xBBBB_BBBB);
    out
}

fn u32_batches(seed: u64) -> Vec<Vec<u32>> {
    let mut rng = XorShift::new(seed);
    (0..BATCHES)
        .map(|_| (0..N).map(|_| rng.next_u64() as u32).collect())
        .collect()
}

#[test]
fn a_u32_pipeline_runs_real_kernels_on_every_batch() {
    let ctx = ctx();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let coordinator = AsyncCoordinator::new(&ctx).unwrap();
    let mut pipeline = PipelineStageManager::<u32>::new_typed(coordinator, N).unwrap();
    let a = pipeline.add_stage(mark(&fill, "a", 600, 0xAAAA_AAAA));
    let b = pipeline.add_stage(mark(&fill, "b", 200, 0xBBBB_BBBB));
    assert_eq!((a, b), (StageId(0), StageId(1)));
    pipeline.set_inputs([BufferId(0)]);
    pipeline.set_order([a, b]).unwrap();
    assert_eq!(pipeline.order(), Some(&[a, b][..]));
    assert_eq!(pipeline.stage(b).unwrap().name, "b");

    let batches = u32_batches(15);
    let mut checked = Vec::new();
    for (k, batch) in batches.iter().enumerate() {
        pipeline.input_mut(0).unwrap().copy_from_slice(batch);
        let report = pipeline.execute_iteration().unwrap();
        assert_eq!(report.uploaded, Some(k as u64));
        if let Some(done) = report.downloaded {
            let got = pipeline.output_of(done, 0).unwrap();
            assert_eq!(got, &marked(&batches[done as usize])[..], "batch {done}");
            checked.push(done);
        }
    }
    for report in pipeline.drain().unwrap() {
        checked.push(report.downloaded.unwrap());
    }
    // After the drain the last three batches are all still readable.
    for done in BATCHES as u64 - 3..BATCHES as u64 {
        let got = pipeline.output_of(done, BufferId(0)).unwrap();
        assert_eq!(got, &marked(&batches[done as usize])[..], "batch {done}");
    }
    assert_eq!(checked, (0..BATCHES as u64).collect::<Vec<_>>());
    assert_eq!(pipeline.get_stats().unwrap().iterations, BATCHES);

    // Errors name the buffer.
    let err = pipeline.output(5).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotAnOutput {
                buffer: BufferId(5)
            }
        ),
        "{err}"
    );
    assert_eq!(err.to_string(), "buffer 5 is not a pipeline output");
    let err = pipeline.fill_input(3, &[0; N]).unwrap_err();
    assert_eq!(err.to_string(), "buffer 3 is not a pipeline input");
    let err = pipeline.fill_input(0, &[0; N - 1]).unwrap_err();
    assert!(matches!(err, Error::LengthMismatch { .. }), "{err}");

    // The same step replayed as CUDA graphs, over u32 as well.
    pipeline.fill_input(0, &batches[0]).unwrap();
    let mut graph = pipeline.capture_graph().unwrap();
    for (step, batch) in batches.iter().enumerate() {
        graph.input_mut(0).unwrap().copy_from_slice(batch);
        graph.execute_iteration().unwrap();
        assert_eq!(
            graph.output(0).unwrap(),
            &marked(batch)[..],
            "replay {step}"
        );
    }
    let err = graph.output(1).unwrap_err();
    assert_eq!(err.to_string(), "buffer 1 is not a pipeline output");
}

#[test]
fn a_kernel_of_another_element_type_is_refused_at_set_order() {
    let ctx = ctx();
    let compute = kernel(&ctx, &kernels::COMPUTE, "compute");
    let fill_u32 = kernel(&ctx, &kernels::ELEMENTWISE, "fill_u32");
    let cfg = LaunchConfig::for_num_elems(N as u32);

    // compute takes float*: not the buffers of a u32 pipeline.
    let coordinator = AsyncCoordinator::new(&ctx).unwrap();
    let mut pipeline = PipelineStageManager::<u32>::new_typed(coordinator, N).unwrap();
    let wrong = pipeline.add_stage(GpuPipelineStage::compute("smooth", compute, cfg, 1, 0, 1));
    pipeline.set_inputs(vec![0]);
    let err = pipeline.set_order(vec![wrong]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::StageArguments {
                stage: StageId(0),
                ..
            }
        ),
        "{err}"
    );
    let message = err.to_string();
    for says in ["stage 0", "\"smooth\"", "compute", "u32"] {
        assert!(message.contains(says), "{message:?} should say {says:?}");
    }
    assert!(
        pipeline.order().is_none(),
        "a refused order changes nothing"
    );
    assert!(matches!(pipeline.execute_iteration(), Err(Error::NoOrder)));
    // The manager stays usable: a u32 kernel is accepted and runs.
    let right = pipeline.add_stage(mark(&fill_u32, "mark", 600, 0xAAAA_AAAA));
    pipeline.set_order(vec![right]).unwrap();
    let batch = &u32_batches(3)[0];
    pipeline.fill_input(0, batch).unwrap();
    pipeline.execute_iteration().unwrap();
    pipeline.drain().unwrap();
    let mut expected = batch.clone();
    expected[..600].fill(0xAAAA_AAAA);
    assert_eq!(pipeline.output_of(0, 0).unwrap(), &expected[..]);

    // And the other way round: fill_u32 in an f32 pipeline.
    let coordinator = AsyncCoordinator::new(&ctx).unwrap();
    let mut pipeline = PipelineStageManager::new(coordinator, N).unwrap();
    let wrong = pipeline.add_stage(mark(&fill_u32, "mark", 600, 1));
    pipeline.set_inputs(vec![0]);
    let err = pipeline.set_order(vec![wrong]).unwrap_err();
    assert!(
        err.to_string().contains("stage 0 (\"mark\")") && err.to_string().contains("f32"),
        "{err}"
    );
    assert!(matches!(
        pipeline.fill_input(0, &[1.0; N]),
        Err(Error::NoOrder)
    ));
}

/// A particle as a C struct: 16 bytes, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
struct Particle {
    position: [f32; 3],
    id: u32,
}

// SAFETY: a `#[repr(C)]` struct of plain numbers without padding: every bit
// pattern is a valid value and it holds no pointers.
unsafe impl DeviceCopy for Particle {}

/// Batches of `T` made by `make(batch, index)` go up, past a stage that
/// reads buffer 0 (a kernel with no buffer parameters, so any `T` is fine),
/// and come back down, each batch intact in its own slot.
fn round_trip<T>(make: impl Fn(usize, usize) -> T)
where
    T: DeviceCopy + PartialEq + Debug,
{
    let ctx = ctx();
    let managed = ManagedGpuContext::new(&ctx, true).unwrap();
    let mut pipeline = managed.create_typed_pipeline_manager::<T>(N).unwrap();
    let stage = pipeline.add_stage(GpuPipelineStage {
        name: "observe".into(),
        input_buffers: vec![BufferId(0)],
        output_buffers: vec![],
        kernel: spin_kernel(&ctx),
        config: LaunchConfig::for_num_elems(1),
        args: vec![StageArg::U64(0)],
    });
    pipeline.set_inputs(vec![0]);
    pipeline.set_outputs(vec![0]);
    pipeline.set_order(vec![stage]).unwrap();
    let batches: Vec<Vec<T>> = (0..BATCHES)
        .map(|b| (0..N).map(|i| make(b, i)).collect())
        .collect();
    for (k, batch) in batches.iter().enumerate() {
        pipeline.input_mut(0).unwrap().copy_from_slice(batch);
        if let Some(done) = pipeline.execute_iteration().unwrap().downloaded {
            let got = pipeline.output_of(done, 0).unwrap();
            assert_eq!(got, &batches[done as usize][..], "step {k}: batch {done}");
        }
    }
    pipeline.drain().unwrap();
    for (done, batch) in batches.iter().enumerate().skip(BATCHES - 3) {
        let got = pipeline.output_of(done as u64, 0).unwrap();
        assert_eq!(got, &batch[..], "batch {done}");
    }
    assert_eq!(pipeline.output(0).unwrap(), &batches[BATCHES - 1][..]);
}

#[test]
fn f64_batches_travel_through_every_slot_intact() {
    round_trip(|batch, i| batch as f64 * 1e6 + i as f64 / 7.0);
}

#[test]
fn repr_c_struct_batches_travel_through_every_slot_intact() {
    round_trip(|batch, i| Particle {
        position: [batch as f32, i as f32, -(i as f32) / 3.0],
        id: (batch * N + i) as u32,
    });
}

#[test]
fn a_struct_buffer_cannot_be_passed_to_a_scalar_kernel() {
    let ctx = ctx();
    let fill = kernel(&ctx, &kernels::ELEMENTWISE, "fill_f32");
    let coordinator = AsyncCoordinator::new(&ctx).unwrap();
    let mut pipeline = PipelineStageManager::<Particle>::new_typed(coordinator, N).unwrap();
    let stage = pipeline.add_stage(GpuPipelineStage {
        name: "fill".into(),
        input_buffers: vec![],
        output_buffers: vec![BufferId(0)],
        kernel: fill,
        config: LaunchConfig::for_num_elems(N as u32),
        args: vec![StageArg::Len, StageArg::F32(1.0), StageArg::buffer(0)],
    });
    let err = pipeline.set_order(vec![stage]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::StageArguments {
                stage: StageId(0),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("non-scalar"), "{err}");
}
