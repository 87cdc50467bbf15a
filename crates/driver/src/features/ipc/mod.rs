//! Device memory and events shared between processes.
//!
//! **The mechanism, and why.** A buffer is physical memory made with
//! `cuMemCreate` for POSIX file descriptors (the virtual memory management
//! API), mapped at addresses each process reserves for it
//! (`cuMemAddressReserve`, `cuMemMap`, `cuMemSetAccess`). The exporter turns
//! it into a file descriptor (`cuMemExportToShareableHandle`) and passes the
//! descriptor over a Unix socket (`SCM_RIGHTS`); the importer turns it back
//! into a handle (`cuMemImportFromShareableHandle`) and maps it. Chosen over
//! `cuIpcGetMemHandle` because the kernel and the driver count references to
//! the memory: it lives until every process has released it, so an exporter
//! that frees first cannot pull memory from under an importer, and a process
//! that dies (killed mid-batch) gives its share back without anyone's help.
//! The legacy handle is a name, not a reference: the importer's mapping dies
//! with the exporter's allocation, and nothing tells it so. The descriptor
//! also authenticates by construction: only a process the socket reached
//! can hold one.
//!
//! Events have no descriptor path: an event is made with
//! `CU_EVENT_INTERPROCESS` and handed over as a `cuIpcGetEventHandle`
//! handle, opened with `cuIpcOpenEventHandle`.
//!
//! The channel ([`IpcListener`], [`IpcChannel`]) checks the peer twice: the
//! kernel's credentials (`SO_PEERCRED`, the same user) and a random
//! [`IpcToken`] that every frame carries; each step ends at one deadline.
//! What crosses it is checked before anything is mapped or opened: the
//! element size, the device (by UUID, which is the same in every process),
//! and the descriptor itself (the driver refuses one that is not exported
//! memory, and a mapping of another size than the exporter's).
//!
//! These entry points are optional (`sys::optional::ipc`): on a driver
//! without them every constructor fails with
//! [`Error::IpcUnsupported`](crate::Error::IpcUnsupported) naming what is
//! missing. The software driver has them: its physical memory is a memfd
//! and an interprocess event's state a shared page, so two real processes
//! share both (`docs/host-memory.md`).

mod buffer;
mod channel;
mod event;
mod token;
mod transfer;

#[cfg(test)]
mod tests;

pub use buffer::SharedDeviceBuffer;
pub use channel::{IpcChannel, IpcListener};
pub use event::SharedEvent;
pub use token::IpcToken;
