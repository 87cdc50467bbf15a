//! How a worker process is started: which program, with which arguments,
//! and the two descriptors it inherits.

use super::wire::{ChannelSpec, ENV_CHANNEL, ENV_WORKER};
use std::ffi::OsString;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The program a [`ProcessLoader`](super::ProcessLoader) runs as each worker.
///
/// The program must call [`serve_if_worker`](super::serve_if_worker) with
/// the fill the loader names, before it opens any file: that call is where a
/// worker process turns into a worker. By default the loader re-runs the
/// current executable ([`WorkerCommand::current_exe`]), so one binary is both
/// the GPU process and its workers:
///
/// ```
/// use cuda_streams_pipeline::WorkerCommand;
/// // A test binary re-runs itself with only the (ignored) test that serves
/// // the fill (see the guide, docs/host-memory.md):
/// let command = WorkerCommand::current_exe()?
///     .args(["loader_worker_entry", "--exact", "--ignored", "--quiet"])
///     .discard_stdout();
/// assert!(command.program().is_absolute());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct WorkerCommand {
    program: PathBuf,
    args: Vec<OsString>,
    discard_stdout: bool,
}

impl WorkerCommand {
    /// Run `program` (a path, or a name looked up in `PATH`) as each worker.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            discard_stdout: false,
        }
    }

    /// Re-run the current executable (`std::env::current_exe`) as each worker.
    pub fn current_exe() -> io::Result<Self> {
        Ok(Self::new(std::env::current_exe()?))
    }

    /// Add one argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Add arguments.
    pub fn args<I, A>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Send the workers' standard output to `/dev/null` (by default they
    /// share the GPU process's). Their standard error is always shared.
    /// A test binary run again as the workers prints its harness's lines
    /// there, which would read as the lines of the test run itself.
    pub fn discard_stdout(mut self) -> Self {
        self.discard_stdout = true;
        self
    }

    /// The program.
    pub fn program(&self) -> &std::path::Path {
        &self.program
    }

    /// Start one worker running the fill named `fill`: its environment names
    /// the fill and the channel, and the region's and the socket's
    /// descriptors (closed on exec everywhere else) stay open across its exec.
    pub(crate) fn spawn(&self, fill: &str, spec: ChannelSpec) -> io::Result<Child> {
        let keep = [spec.region_fd, spec.socket_fd];
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .env(ENV_WORKER, fill)
            .env(ENV_CHANNEL, spec.to_env())
            .stdin(Stdio::null());
        if self.discard_stdout {
            command.stdout(Stdio::null());
        }
        // SAFETY: the closure runs in the child between fork and exec, where
        // only async-signal-safe calls are allowed: it makes two `fcntl`
        // calls on descriptors it names by number, allocating nothing.
        unsafe {
            command.pre_exec(move || keep.iter().try_for_each(|&fd| keep_across_exec(fd)));
        }
        command.spawn()
    }
}

/// Clear `fd`'s close-on-exec flag (in the child, before its exec), so the
/// worker inherits it; every other descriptor of ours stays closed on exec.
fn keep_across_exec(fd: RawFd) -> io::Result<()> {
    // SAFETY: `fcntl` on a descriptor number; it reads and writes no memory
    // of ours. A number that is not open fails with EBADF, reported.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
