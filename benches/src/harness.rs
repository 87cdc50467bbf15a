//! The criterion set-up every bench file shares, in place of
//! `criterion_group!`/`criterion_main!`: each `main` runs its criterion
//! groups with [`run_criterion`], prints its `RATIO`/`FIGURE` lines, then
//! ends with [`criterion_summary`].

use criterion::Criterion;
use std::time::Duration;

/// Criterion as the benches configure it: short measurement and warm-up,
/// because GPU time is scarce (the command line can still override them).
pub fn criterion() -> Criterion {
    Criterion::default()
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
}

/// Run `targets` with [`criterion()`]'s settings and the command line's, as a
/// `criterion_group!` with that config would.
pub fn run_criterion(targets: &[fn(&mut Criterion)]) {
    let mut criterion = criterion().configure_from_args();
    for target in targets {
        target(&mut criterion);
    }
}

/// Criterion's closing summary; call it last in `main`.
pub fn criterion_summary() {
    Criterion::default().configure_from_args().final_summary();
}
