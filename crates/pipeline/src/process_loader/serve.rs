//! The worker's side: the loop a worker process runs, filling the slots the
//! GPU process hands it and handing them back.

use super::shared_slots::{REGION_NAME_PREFIX, SharedSlots};
use super::wire::{
    ChannelSpec, ENV_CHANNEL, ENV_WORKER, EXIT_BAD_CHANNEL, EXIT_BAD_JOB, EXIT_UNKNOWN_FILL, Job,
};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// A fill: write batch `batch` into `out` (`batch_len` elements, holding
/// whatever the slot's previous batch left there).
///
/// It runs in a worker process: it may read files, decode and augment, and
/// it shares nothing with the GPU process but the slot. A panic ends the
/// worker, and the loader reports it as a dead worker naming the batch.
pub type Fill = fn(batch: u64, out: &mut [f32]);

/// Serve as a loader's worker if this process was started as one, else
/// return at once.
///
/// Call it first thing in `main` (before the program opens any file) with
/// every fill the program offers, by name; a
/// [`ProcessLoader`](super::ProcessLoader) names the one its workers run.
/// In a worker this never returns: it fills the slots it is handed until
/// the GPU process closes the connection (or dies), then exits the process
/// with status 0. A worker whose program has no fill of the name asked for
/// exits with status 3, one that cannot open the loader's region or socket
/// with 4, one whose socket fails with 5; the loader's error says which.
///
/// ```standalone_crate
/// fn ramp(batch: u64, out: &mut [f32]) {
///     for (i, value) in out.iter_mut().enumerate() {
///         *value = (batch * 10 + i as u64) as f32;
///     }
/// }
///
/// fn main() {
///     cuda_streams_pipeline::serve_if_worker(&[("ramp", ramp)]);
///     // Not a worker: the program goes on (and may start a ProcessLoader).
/// }
/// ```
pub fn serve_if_worker(fills: &[(&str, Fill)]) {
    let Some(name) = std::env::var_os(ENV_WORKER) else {
        return;
    };
    let code = match serve(&name.to_string_lossy(), fills) {
        Ok(()) => 0,
        Err(code) => code,
    };
    std::process::exit(code);
}

/// The worker loop; `Err` is the exit status.
fn serve(name: &str, fills: &[(&str, Fill)]) -> Result<(), i32> {
    let spec = std::env::var(ENV_CHANNEL)
        .ok()
        .and_then(|text| ChannelSpec::parse(&text))
        .ok_or(EXIT_BAD_CHANNEL)?;
    let fill = fills
        .iter()
        .find(|(fill_name, _)| *fill_name == name)
        .map(|&(_, fill)| fill)
        .ok_or(EXIT_UNKNOWN_FILL)?;
    let region = inherited_region(spec.region_fd).ok_or(EXIT_BAD_CHANNEL)?;
    let mut socket = UnixStream::from(inherited(spec.socket_fd).ok_or(EXIT_BAD_CHANNEL)?);
    let slots =
        SharedSlots::attach(region, spec.slots, spec.slot_len).map_err(|_| EXIT_BAD_CHANNEL)?;
    let mut frame = [0; Job::BYTES];
    loop {
        match socket.read_exact(&mut frame) {
            Ok(()) => {}
            // The GPU process closed the connection (or died): done.
            Err(err) if err.kind() == ErrorKind::UnexpectedEof => return Ok(()),
            Err(_) => return Err(EXIT_BAD_JOB),
        }
        let job = Job::decode(frame);
        let slot = usize::try_from(job.slot)
            .ok()
            .filter(|&slot| slot < slots.slots())
            .ok_or(EXIT_BAD_JOB)?;
        // SAFETY: the slot lies in this process's mapping (checked above);
        // the GPU process hands a slot to one worker at a time and touches
        // it only after this worker's reply, so nothing else reads or
        // writes it until the reply below. The mapping holds initialised
        // `f32`s (a memfd starts zeroed; every bit pattern is an `f32`).
        let out = unsafe { std::slice::from_raw_parts_mut(slots.slot_ptr(slot), slots.slot_len()) };
        fill(job.batch, out);
        if socket.write_all(&job.encode()).is_err() {
            // The GPU process is gone: nobody wants the batch.
            return Ok(());
        }
    }
}

/// A descriptor of our own for descriptor `fd`, inherited from the loader:
/// a duplicate (close-on-exec), so the number itself is never owned or
/// closed here, whatever else in the process may hold it.
fn inherited(fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: `fcntl(F_DUPFD_CLOEXEC)` makes a new descriptor for the same
    // file, or fails (EBADF for a number that is not open); it touches no
    // memory of ours.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return None;
    }
    // SAFETY: `dup` was just made by the call above, and nothing else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(dup) })
}

/// The loader's region, inherited as descriptor `fd`: only a memfd the
/// loader named (`SharedSlots::create`), so that a forged environment can
/// never make this process map, and write into, some other memory of its own.
fn inherited_region(fd: RawFd) -> Option<OwnedFd> {
    let owned = inherited(fd)?;
    let target = std::fs::read_link(format!("/proc/self/fd/{}", owned.as_raw_fd())).ok()?;
    target
        .to_string_lossy()
        .starts_with(&format!("/memfd:{REGION_NAME_PREFIX}"))
        .then_some(owned)
}
