//! Which order policies each driver accepts, and what a switch keeps: on the
//! software driver no policy lets two stream workers touch conflicting bytes
//! unordered (`off` and `report` are refused, from `set_ordering` and from
//! `CUDA_STREAMS_ORDERING`), and switching between `check` and `auto` keeps
//! the work in flight in view.

mod support;

use cuda_streams_driver::{Context, DeviceBuffer, DriverKind, Error, OrderPolicy, Stream};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};
use support::{GATE_LIMIT, Gate};

/// The tests switch device 0's shared context's policy: one at a time.
static POLICY: Mutex<()> = Mutex::new(());

fn turn() -> MutexGuard<'static, ()> {
    POLICY.lock().unwrap_or_else(|p| p.into_inner())
}

const N: usize = 256;

/// A buffer of zeros, written and seen complete by the host. Plain, not
/// stream-ordered: a stream-ordered buffer's first use on another stream
/// waits for its home stream, which would order the races below.
fn zeros(stream: &Stream) -> DeviceBuffer<u32> {
    let mut data = DeviceBuffer::new(stream.context(), N).unwrap();
    stream.memset_u32_async(&mut data, 0).unwrap();
    stream.synchronize().unwrap();
    data
}

fn streams<const K: usize>(ctx: &Arc<Context>) -> [Arc<Stream>; K] {
    std::array::from_fn(|_| Stream::new(ctx).unwrap())
}

#[test]
fn the_software_driver_refuses_off_and_report_and_keeps_its_policy() {
    let _turn = turn();
    let ctx = Context::new(0).unwrap();
    let before = ctx.ordering();
    if ctx.is_gpu() {
        // A GPU takes every policy: a race there is a wrong result, not a
        // data race on host memory.
        for policy in [OrderPolicy::Off, OrderPolicy::Report] {
            ctx.set_ordering(policy).unwrap();
            assert_eq!(ctx.ordering(), policy);
        }
        ctx.set_ordering(before).unwrap();
        return;
    }
    for kept in [OrderPolicy::Check, OrderPolicy::Auto] {
        ctx.set_ordering(kept).unwrap();
        for refused in [OrderPolicy::Off, OrderPolicy::Report] {
            let err = ctx.set_ordering(refused).unwrap_err();
            let Error::OrderPolicyRefused {
                policy,
                driver,
                ref from_env,
            } = err
            else {
                panic!("expected the policy to be refused, got {err}");
            };
            assert_eq!(
                (policy, driver, from_env),
                (refused, DriverKind::Soft, &None)
            );
            let message = err.to_string();
            assert!(
                message.starts_with(&format!(
                    "ordering policy {refused} is refused on the software driver: "
                )),
                "{message}"
            );
            assert!(message.contains("data race"), "{message}");
            assert_eq!(ctx.ordering(), kept, "a refused switch changes nothing");
        }
    }
    // Still checking: a racing write is refused before it runs.
    ctx.set_ordering(OrderPolicy::Check).unwrap();
    let [a, b] = streams(&ctx);
    let mut data = zeros(&a);
    let gate = Gate::close_within(&a, GATE_LIMIT);
    a.memset_u32_async(&mut data, 1).unwrap();
    let refused = b.memset_u32_async(&mut data, 2);
    assert!(
        matches!(refused, Err(Error::UnorderedAccess(_))),
        "{refused:?}"
    );
    gate.open();
    assert_eq!(data.to_vec(&a).unwrap(), [1; N]);
    ctx.set_ordering(before).unwrap();
}

/// The observation, on the policies the software driver accepts: a
/// write in flight when the policy changes is still known afterwards, so a
/// racing write is made to wait under `auto` and refused under `check`.
#[test]
fn switching_between_check_and_auto_keeps_the_work_in_flight() {
    let _turn = turn();
    let ctx = Context::new(0).unwrap();
    let before = ctx.ordering();
    ctx.set_ordering(OrderPolicy::Check).unwrap();
    let [a, b, c] = streams(&ctx);
    let mut data = zeros(&a);
    let gate = Gate::close_within(&a, GATE_LIMIT);
    a.memset_u32_async(&mut data, 1).unwrap();

    ctx.set_ordering(OrderPolicy::Auto).unwrap();
    let waits = ctx.ordering_stats().inserted_waits;
    b.memset_u32_async(&mut data, 2).unwrap();
    assert_eq!(
        ctx.ordering_stats().inserted_waits,
        waits + 1,
        "b's write waits for a's, in flight since before the switch"
    );
    if gate.still_held() {
        assert!(!b.query().unwrap(), "b's write went ahead of a's");
    }

    ctx.set_ordering(OrderPolicy::Check).unwrap();
    let Err(Error::UnorderedAccess(race)) = c.memset_u32_async(&mut data, 3) else {
        panic!("c's racing write was accepted after the switch back to check");
    };
    assert_eq!(race.earlier.stream, b.id(), "{race}");

    gate.open();
    assert_eq!(data.to_vec(&b).unwrap(), [2; N]);
    ctx.set_ordering(before).unwrap();
}

/// Set by [`ordering_from_the_environment_is_checked_against_the_driver`]
/// for its child processes.
const CHILD: &str = "ORDERING_POLICY_TEST_CHILD";

/// `CUDA_STREAMS_ORDERING` is read once per process, so each value is tried
/// in a process of its own: this test binary again, running
/// [`child_makes_a_context_under_the_environments_policy`].
#[test]
fn ordering_from_the_environment_is_checked_against_the_driver() {
    let exe = std::env::current_exe().unwrap();
    for value in ["off", " Report ", "auto"] {
        let out = Command::new(&exe)
            .args([
                "--exact",
                "child_makes_a_context_under_the_environments_policy",
                "--ignored",
                "--nocapture",
            ])
            .env("CUDA_STREAMS_ORDERING", value)
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        // A child that ran no test would exit 0 too.
        assert!(
            out.status.success()
                && stdout.contains("child_makes_a_context_under_the_environments_policy ... ok"),
            "CUDA_STREAMS_ORDERING={value:?}: the child failed\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
#[ignore = "run in a child process by ordering_from_the_environment_is_checked_against_the_driver"]
fn child_makes_a_context_under_the_environments_policy() {
    assert!(
        std::env::var_os(CHILD).is_some(),
        "run by ordering_from_the_environment_is_checked_against_the_driver"
    );
    let value = std::env::var("CUDA_STREAMS_ORDERING").unwrap();
    let asked = OrderPolicy::parse(&value).unwrap();
    let kind = cuda_streams_driver::driver().unwrap().kind;
    let made = Context::new(0);
    if kind == DriverKind::Soft && matches!(asked, OrderPolicy::Off | OrderPolicy::Report) {
        let err = made.expect_err("the software driver refuses the policy");
        let message = err.to_string();
        let Error::OrderPolicyRefused {
            policy,
            driver,
            from_env,
        } = err
        else {
            panic!("expected the policy to be refused, got {message}");
        };
        assert_eq!(
            (policy, driver, from_env.as_deref()),
            (asked, DriverKind::Soft, Some(value.as_str()))
        );
        let expected = format!(
            "CUDA_STREAMS_ORDERING={value:?} asks for ordering policy {asked}, which the software driver refuses: "
        );
        assert!(message.starts_with(&expected), "{message}");
        // The refusal holds for every later context, not just the first.
        assert!(Context::new(0).is_err());
    } else {
        assert_eq!(made.unwrap().ordering(), asked);
    }
}
