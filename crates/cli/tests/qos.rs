//! `cuda-streams qos`: the three cases side by side, the urgent size from
//! the option or the environment, and a bad size refused in one line.

mod support;

use std::process::Command;
use support::{cli, text};

#[test]
fn qos_prints_the_three_cases_with_the_sms_kept() {
    let output = Command::new(cli())
        .args([
            "qos",
            "--urgent-sms",
            "12",
            "--samples",
            "3",
            "--background",
            "2",
        ])
        .env_remove("CUDA_STREAMS_URGENT_SMS")
        .output()
        .expect("the CLI runs");
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    for case in [
        "idle, greatest priority",
        "busy, priorities only",
        "busy, 16 SMs kept for urgent work",
        "p50 (µs)",
        "p99 (µs)",
    ] {
        assert!(stdout.contains(case), "{case} missing from:\n{stdout}");
    }
}

#[test]
fn the_urgent_size_comes_from_the_environment_and_a_bad_one_is_named() {
    let output = Command::new(cli())
        .args(["qos", "--samples", "2", "--background", "1"])
        .env("CUDA_STREAMS_URGENT_SMS", "8")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).contains("busy, 8 SMs kept"),
        "{}",
        text(&output.stdout)
    );

    let output = Command::new(cli())
        .args(["qos", "--urgent-sms", "100000", "--samples", "2"])
        .env_remove("CUDA_STREAMS_URGENT_SMS")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("100000 SMs") && stderr.lines().count() == 1,
        "{stderr}"
    );
}
