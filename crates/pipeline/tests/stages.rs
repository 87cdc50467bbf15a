//! The stage manager: order validation, real multi-stage results with the
//! pipeline's lag, and statistics from timing events.

mod common;

use common::{XorShift, ctx, kernel, reference_compute, spin_kernel};
use cuda_streams_pipeline::{
    AsyncCoordinator, BufferId, Error, GpuPipelineStage, PipelineStageManager, StageArg, StageId,
};
use driver::{Kernel, LaunchConfig};

fn manager(n: usize) -> (PipelineStageManager, Kernel) {
    let ctx = ctx();
    let kernel = kernel(&ctx, &kernels::COMPUTE, "compute");
    let coordinator = AsyncCoordinator::new(&ctx).unwrap();
    (PipelineStageManager::new(coordinator, n).unwrap(), kernel)
}

fn stage(name: &str, kernel: &Kernel, input: usize, output: usize) -> GpuPipelineStage {
    GpuPipelineStage::compute(
        name,
        kernel.clone(),
        LaunchConfig::for_num_elems(64),
        2,
        input,
        output,
    )
}

#[test]
fn unknown_and_duplicate_indices_are_errors() {
    let (mut pipeline, kernel) = manager(64);
    pipeline.set_inputs(vec![0]);
    let a = pipeline.add_stage(stage("a", &kernel, 0, 1));
    let err = pipeline.set_order(vec![a, StageId(5)]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnknownStage {
                stage: StageId(5),
                stages: 1
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("stage 5 does not exist"), "{err}");
    let err = pipeline.set_order(vec![a, a]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::DuplicateStage {
                stage: StageId(0),
                ..
            }
        ),
        "{err}"
    );
    assert!(
        pipeline.order().is_none(),
        "a failed set_order changes nothing"
    );
    assert!(matches!(pipeline.execute_iteration(), Err(Error::NoOrder)));
}

#[test]
fn reading_a_buffer_before_it_is_written_is_an_error() {
    let (mut pipeline, kernel) = manager(64);
    pipeline.set_inputs(vec![0]);
    let a = pipeline.add_stage(stage("a", &kernel, 0, 1));
    let b = pipeline.add_stage(stage("b", &kernel, 1, 2));
    // b before a: b reads buffer 1, which only a writes.
    let err = pipeline.set_order(vec![b, a]).unwrap_err();
    match &err {
        Error::ReadBeforeWrite {
            stage,
            name,
            buffer,
        } => {
            assert_eq!((*stage, name.as_str(), *buffer), (b, "b", BufferId(1)));
        }
        other => panic!("expected ReadBeforeWrite, got {other:?}"),
    }
    // A stage reading a buffer nobody writes and that is not an input.
    let c = pipeline.add_stage(stage("c", &kernel, 7, 8));
    let err = pipeline.set_order(vec![a, c]).unwrap_err();
    assert!(err.to_string().contains("reads buffer 7"), "{err}");
    pipeline.set_order(vec![a, b]).unwrap();
    assert_eq!(pipeline.order(), Some(&[a, b][..]));
}

#[test]
fn a_cycle_is_reported_as_a_cycle() {
    let (mut pipeline, kernel) = manager(64);
    pipeline.set_inputs(vec![0]);
    let a = pipeline.add_stage(GpuPipelineStage {
        input_buffers: vec![BufferId(0), BufferId(2)],
        ..stage("a", &kernel, 0, 1)
    });
    let b = pipeline.add_stage(stage("b", &kernel, 1, 2));
    for order in [vec![a, b], vec![b, a]] {
        let err = pipeline.set_order(order).unwrap_err();
        assert!(matches!(err, Error::StageCycle { .. }), "{err}");
        assert!(
            err.to_string().contains(r#"0 "a" -> 1 "b" -> 0 "a""#),
            "{err}"
        );
    }
    // In-place stages on one buffer in sequence are not a cycle.
    let (mut pipeline, _) = manager(64);
    let fill = common::kernel(
        pipeline.coordinator().context(),
        &kernels::ELEMENTWISE,
        "fill_f32",
    );
    pipeline.set_inputs(vec![0]);
    let in_place = |name: &str, value: f32| GpuPipelineStage {
        name: name.into(),
        input_buffers: vec![BufferId(0)],
        output_buffers: vec![BufferId(0)],
        kernel: fill.clone(),
        config: LaunchConfig::for_num_elems(64),
        args: vec![StageArg::Len, StageArg::F32(value), StageArg::buffer(0)],
    };
    let x = pipeline.add_stage(in_place("x", 1.0));
    let y = pipeline.add_stage(in_place("y", 2.0));
    pipeline.set_order(vec![x, y]).unwrap();
    pipeline.execute_iteration().unwrap();
    pipeline.drain().unwrap();
    assert_eq!(pipeline.output(0).unwrap(), &[2.0; 64], "y ran after x");
}

#[test]
fn an_undeclared_kernel_buffer_is_an_error() {
    let (mut pipeline, kernel) = manager(64);
    pipeline.set_inputs(vec![0]);
    let a = pipeline.add_stage(GpuPipelineStage {
        args: vec![
            StageArg::Len,
            StageArg::U32(1),
            StageArg::buffer(0),
            StageArg::buffer(3),
        ],
        ..stage("a", &kernel, 0, 1)
    });
    let err = pipeline.set_order(vec![a]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::UndeclaredBuffer {
                stage: StageId(0),
                buffer: BufferId(3),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("passes buffer 3"), "{err}");
}

#[test]
fn batches_flow_through_every_stage_with_a_two_step_lag() {
    let n = 10_000;
    let (mut pipeline, kernel) = manager(n);
    let cfg = LaunchConfig::for_num_elems(n as u32);
    let a = pipeline.add_stage(GpuPipelineStage::compute("a", kernel.clone(), cfg, 3, 0, 1));
    let b = pipeline.add_stage(GpuPipelineStage::compute("b", kernel, cfg, 2, 1, 2));
    pipeline.set_inputs(vec![0]);
    pipeline.set_order(vec![a, b]).unwrap();
    let mut rng = XorShift::new(99);
    let batches: Vec<Vec<f32>> = (0..7).map(|_| rng.f32s(n)).collect();
    let expected: Vec<Vec<f32>> = batches
        .iter()
        .map(|x| reference_compute(2, &reference_compute(3, x)))
        .collect();
    let mut seen = Vec::new();
    for (k, batch) in batches.iter().enumerate() {
        pipeline.input_mut(0).unwrap().copy_from_slice(batch);
        let report = pipeline.execute_iteration().unwrap();
        assert_eq!(report.uploaded, Some(k as u64));
        assert_eq!(report.computed, k.checked_sub(1).map(|v| v as u64));
        if let Some(done) = report.downloaded {
            assert_eq!(done + 2, k as u64, "results lag two steps");
            let got = pipeline.output(2).unwrap();
            let which = expected.iter().position(|e| e[..] == got[..]);
            assert_eq!(
                which,
                Some(done as usize),
                "step {k}: output of batch {done}"
            );
            seen.push(done);
        }
    }
    // Draining queues the last two downloads; output() then shows the last.
    for report in pipeline.drain().unwrap() {
        assert_eq!(report.uploaded, None);
        seen.push(report.downloaded.unwrap());
    }
    assert_eq!(pipeline.output(2).unwrap(), &expected[6][..]);
    assert_eq!(seen, (0..7).collect::<Vec<_>>());
    let stats = pipeline.get_stats().unwrap();
    assert_eq!(stats.iterations, 7);
    assert!(
        stats.avg_iteration_ms > 0.0 && stats.throughput > 0.0,
        "{stats:?}"
    );
    assert!(
        stats.gpu_utilization > 0.0 && stats.gpu_utilization <= 1.0,
        "{stats:?}"
    );
    assert!(stats.compute_busy <= stats.wall, "{stats:?}");
    pipeline.reset_stats();
    assert_eq!(pipeline.get_stats().unwrap().iterations, 0);
}

#[test]
fn utilisation_is_measured_not_assumed() {
    // A stage that spins 20 ms per batch with nothing else to do keeps the
    // compute stream busy almost all the time; utilisation must say so, and
    // must be far lower when the stage is tiny and the host is slow.
    let ctx = ctx();
    let spin = spin_kernel(&ctx);
    let mut pipeline = PipelineStageManager::new(AsyncCoordinator::new(&ctx).unwrap(), 16).unwrap();
    let s = pipeline.add_stage(GpuPipelineStage {
        name: "spin".into(),
        input_buffers: vec![],
        output_buffers: vec![BufferId(0)],
        kernel: spin,
        config: LaunchConfig::for_num_elems(1),
        args: vec![StageArg::U64(20_000_000)],
    });
    pipeline.set_order(vec![s]).unwrap();
    for _ in 0..6 {
        pipeline.execute_iteration().unwrap();
    }
    pipeline.drain().unwrap();
    let busy = pipeline.get_stats().unwrap();
    assert_eq!(busy.iterations, 6);
    assert!(busy.gpu_utilization > 0.6, "{busy:?}");
    assert!(busy.avg_iteration_ms >= 19.0, "{busy:?}");
}

#[test]
fn a_pipeline_can_be_drained_and_resumed() {
    let n = 1000;
    let (mut pipeline, kernel) = manager(n);
    let cfg = LaunchConfig::for_num_elems(n as u32);
    let a = pipeline.add_stage(GpuPipelineStage::compute("a", kernel, cfg, 1, 0, 1));
    pipeline.set_inputs(vec![0]);
    pipeline.set_order(vec![a]).unwrap();
    let mut rng = XorShift::new(5);
    let mut batch = 0u64;
    for run in 0..3 {
        let mut last = Vec::new();
        for _ in 0..(2 + run) {
            last = rng.f32s(n);
            pipeline.input_mut(0).unwrap().copy_from_slice(&last);
            assert_eq!(pipeline.execute_iteration().unwrap().uploaded, Some(batch));
            batch += 1;
        }
        let reports = pipeline.drain().unwrap();
        assert_eq!(
            reports.last().unwrap().downloaded,
            Some(batch - 1),
            "run {run}"
        );
        assert_eq!(
            pipeline.output(1).unwrap(),
            &reference_compute(1, &last)[..],
            "run {run}"
        );
    }
    assert_eq!(pipeline.get_stats().unwrap().iterations, 2 + 3 + 4);
}
