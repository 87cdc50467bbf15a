//! A bad `CUDA_STREAMS_SOFT_CAPACITY_MB` is refused, naming the variable and
//! the value, instead of falling back to 16 GiB. The only test in this
//! binary: it sets the variable before the software driver first reads it,
//! and nothing else in the process reads the environment meanwhile.

use cuda_streams_soft_driver as soft;
use soft::sys::CUresult;

#[test]
fn a_bad_capacity_fails_cuinit_and_names_the_variable() {
    // SAFETY: this binary's only test, on one thread; nothing else in the
    // process reads or writes the environment while it is changed.
    unsafe { std::env::set_var(soft::CAPACITY_ENV, "abc") };

    let err = soft::check_env().unwrap_err();
    assert_eq!((err.var, err.value.as_str()), (soft::CAPACITY_ENV, "abc"));
    assert_eq!(
        err.to_string(),
        "environment variable CUDA_STREAMS_SOFT_CAPACITY_MB=\"abc\" is invalid: \
         expected a whole number from 1 to 17592186044415"
    );

    // Raw users of the table see it too: cuInit fails with the text as detail.
    // SAFETY: cuInit takes flags (0) and no pointers.
    let code = unsafe { (soft::driver().cuInit)(0) };
    assert_eq!(code, CUresult::CUDA_ERROR_INVALID_VALUE);
    let detail = soft::last_error_detail().expect("a detail for the failed cuInit");
    assert!(
        detail.contains("CUDA_STREAMS_SOFT_CAPACITY_MB=\"abc\""),
        "{detail}"
    );

    // The value stays refused for the process (it is read once), and later
    // corrections of the environment do not change what was read.
    // SAFETY: as above.
    unsafe { std::env::set_var(soft::CAPACITY_ENV, "64") };
    assert!(soft::check_env().is_err());
}
