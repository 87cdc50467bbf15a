//! The QoS pool: service classes on a partition and priorities, the urgent
//! size from `CUDA_STREAMS_URGENT_SMS` (bad values named), and urgent work
//! that does not wait for the background (a gate, not timing). One test
//! changes the environment; the others never read it.

mod support;

use cuda_streams_stream_pool::driver::{DeviceBuffer, KernelArg, LaunchConfig, Module};
use cuda_streams_stream_pool::{
    DEFAULT_URGENT_SMS, Error, QosPool, QosSettings, ServiceClass, URGENT_SMS_ENV,
};
use std::time::Duration;
use test_support::Gate;

#[test]
fn classes_map_onto_a_partition_and_priorities() {
    let ctx = support::ctx();
    let (_, granularity) = ctx.partitionable_sms().unwrap();
    let pool = QosPool::new(
        &ctx,
        QosSettings {
            urgent_sms: granularity + 1,
            streams_per_class: 2,
        },
    )
    .unwrap();
    assert_eq!(pool.urgent_sms(), Some(2 * granularity));
    let range = ctx.priority_range();
    let urgent = pool.stream(ServiceClass::Urgent);
    assert_eq!(urgent.priority().unwrap(), range.greatest);
    assert_eq!(urgent.partition().unwrap().sms(), 2 * granularity);
    let background = pool.stream(ServiceClass::Background);
    assert_eq!(background.priority().unwrap(), range.least);
    assert_eq!(
        background.partition().map(|p| p.sms()),
        pool.rest_sms(),
        "the background runs on the rest"
    );
    let normal = pool.stream(ServiceClass::Normal);
    assert_eq!(
        normal.priority().unwrap(),
        range.value(cuda_streams_stream_pool::StreamPriority::Normal)
    );
    // Round robin within a class.
    let again = pool.stream(ServiceClass::Urgent);
    assert_ne!(urgent.id(), again.id());
    assert_eq!(pool.stream(ServiceClass::Urgent).id(), urgent.id());

    // Priorities only.
    let plain = QosPool::new(
        &ctx,
        QosSettings {
            urgent_sms: 0,
            streams_per_class: 1,
        },
    )
    .unwrap();
    assert_eq!(plain.urgent_sms(), None);
    assert!(plain.stream(ServiceClass::Urgent).partition().is_none());
    assert_eq!(
        plain.stream(ServiceClass::Urgent).priority().unwrap(),
        range.greatest
    );

    assert!(matches!(
        QosPool::new(
            &ctx,
            QosSettings {
                urgent_sms: 8,
                streams_per_class: 0
            }
        ),
        Err(Error::EmptyPool)
    ));
    let err = QosPool::new(
        &ctx,
        QosSettings {
            urgent_sms: 100_000,
            streams_per_class: 1,
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("100000 SMs"), "{err}");
}

#[test]
fn urgent_work_does_not_wait_for_the_background() {
    let ctx = support::ctx();
    if ctx.is_gpu()
        && test_support::skip_under_sanitizer("it serialises kernels, so every partition waits")
    {
        return;
    }
    let pool = QosPool::new(&ctx, QosSettings::default()).unwrap();
    let urgent = pool.stream(ServiceClass::Urgent);
    let background = pool.stream(ServiceClass::Background);
    let fill = Module::load(&ctx, &kernels::ELEMENTWISE)
        .unwrap()
        .function("fill_f32")
        .unwrap();
    // Loaded before the background starts: on a GPU loading waits for the
    // device, so a first launch that loads would wait for the gate.
    pool.load(&fill).unwrap();
    let mut out = DeviceBuffer::<f32>::new_async(&urgent, 32).unwrap();
    let gate = Gate::close_within(&background, Duration::from_secs(3));
    let args = [KernelArg::from(32u64), 5.0f32.into(), (&mut out).into()];
    urgent
        .launch(&fill, LaunchConfig::for_num_elems(32), &args)
        .unwrap();
    let seen = out.to_vec(&urgent).unwrap();
    assert!(gate.still_held(), "urgent work waited for the background");
    assert_eq!(seen, vec![5.0; 32]);
    gate.open();
    background.synchronize().unwrap();
}

#[test]
fn the_urgent_size_comes_from_the_environment_and_bad_values_are_named() {
    // SAFETY: no other test in this binary reads the environment.
    unsafe { std::env::set_var(URGENT_SMS_ENV, "24") };
    assert_eq!(QosSettings::from_env().unwrap().urgent_sms, 24);
    // SAFETY: as above.
    unsafe { std::env::set_var(URGENT_SMS_ENV, "lots") };
    let err = QosSettings::from_env().unwrap_err();
    assert!(
        err.to_string().contains(URGENT_SMS_ENV) && err.to_string().contains("lots"),
        "{err}"
    );
    // SAFETY: as above.
    unsafe { std::env::remove_var(URGENT_SMS_ENV) };
    assert_eq!(
        QosSettings::from_env().unwrap().urgent_sms,
        DEFAULT_URGENT_SMS
    );
}
