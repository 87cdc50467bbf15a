//! The longer wordings of [`Error`](super::error::Error)'s messages, built
//! where a variant's `#[error]` text needs more than its fields.

/// The one wording of a refused empty allocation: in elements, or for a
/// zero-sized element type, in neither (its size in bytes is 0 whatever
/// the length).
pub(super) fn zero_size_message(what: &str, len: usize, elem_size: usize) -> String {
    let size = if elem_size == 0 {
        "of a zero-sized element type".to_string()
    } else {
        format!("of {len} element(s)")
    };
    format!(
        "a {what} {size} would be empty: zero-length buffers are refused \
         (docs/architecture.md#empty-buffers)"
    )
}

/// What to do about a [`Error::DeviceMismatch`](super::error::Error::DeviceMismatch), by what did not match: a
/// kernel is loaded per device, memory is moved or used where it lives.
pub(super) fn device_mismatch_fix(what: &str, found_device: i32, stream_device: i32) -> String {
    if what.contains("kernel") {
        format!(
            "load the kernel's module in a context of device {stream_device} \
             (Module::load(&Context::new({stream_device})?, ..)) to launch it there, \
             or launch on a stream of device {found_device}"
        )
    } else if what.contains("buffer") || what.contains("slice") {
        format!(
            "enqueue the work on a stream of device {found_device}, where the memory lives, \
             or first copy the data to a buffer of device {stream_device} \
             (Stream::copy_peer_async)"
        )
    } else {
        format!(
            "use it with a stream of device {found_device}, or make one in a context of \
             device {stream_device}"
        )
    }
}

pub(super) fn detail_suffix(detail: &Option<String>) -> String {
    match detail {
        Some(detail) => format!(" ({detail})"),
        None => String::new(),
    }
}
