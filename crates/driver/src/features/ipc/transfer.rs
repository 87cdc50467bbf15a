//! Sending shared buffers and events over an [`IpcChannel`]: what travels
//! beside the descriptor or handle (sizes, the device's UUID), and the
//! checks the receiver makes before it maps or opens anything.

use super::buffer::{SharedDeviceBuffer, ipc_of};
use super::channel::{IpcChannel, Kind, PAYLOAD};
use super::event::SharedEvent;
use crate::ground::error::{Error, Result};
use crate::objects::context::Context;
use crate::objects::memory::DeviceCopy;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use sys::{CUipcEventHandle, CUuuid};

fn refused(reason: String) -> Error {
    Error::Ipc { reason }
}

/// `ctx`'s device UUID: the same in every process, unlike ordinals (which
/// `CUDA_VISIBLE_DEVICES` renumbers).
pub(super) fn device_uuid(ctx: &Context) -> Result<[u8; 16]> {
    let ipc = ipc_of(ctx)?;
    let mut uuid = CUuuid::default();
    // SAFETY: writes one UUID through a valid pointer.
    ctx.check(unsafe { (ipc.cuDeviceGetUuid)(&mut uuid, ctx.device()) })?;
    Ok(uuid.bytes.map(|b| b as u8))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A little-endian writer and reader of a frame's payload.
struct Payload {
    bytes: [u8; PAYLOAD],
    at: usize,
}

impl Payload {
    fn new() -> Self {
        Self {
            bytes: [0; PAYLOAD],
            at: 0,
        }
    }

    fn of(bytes: [u8; PAYLOAD]) -> Self {
        Self { bytes, at: 0 }
    }

    fn put(&mut self, data: &[u8]) -> &mut Self {
        self.bytes[self.at..self.at + data.len()].copy_from_slice(data);
        self.at += data.len();
        self
    }

    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.bytes[self.at..self.at + N]);
        self.at += N;
        out
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }

    fn written(&self) -> &[u8] {
        &self.bytes[..self.at]
    }
}

/// The device a received object is on must be `ctx`'s.
fn check_device(ctx: &Context, what: &str, ordinal: i32, uuid: [u8; 16], from: u32) -> Result<()> {
    let mine = device_uuid(ctx)?;
    if mine != uuid {
        return Err(refused(format!(
            "the {what} from process {from} is on that process's device {ordinal} (UUID {}), but \
             context {} is on device {} (UUID {}): a handle for another device",
            hex(&uuid),
            ctx.id(),
            ctx.ordinal(),
            hex(&mine)
        )));
    }
    Ok(())
}

impl IpcChannel {
    /// Send `buffer`'s memory to the peer: a new descriptor for it goes
    /// beside its length, element size and device. The peer maps it with
    /// [`receive_buffer`](Self::receive_buffer).
    pub fn send_buffer<T: DeviceCopy>(&mut self, buffer: &SharedDeviceBuffer<T>) -> Result<()> {
        let fd = buffer.export_fd()?;
        let uuid = device_uuid(buffer.context())?;
        let mut payload = Payload::new();
        payload
            .put(&(buffer.len() as u64).to_le_bytes())
            .put(&(std::mem::size_of::<T>() as u64).to_le_bytes())
            .put(&(buffer.mapped_bytes() as u64).to_le_bytes())
            .put(&buffer.context().ordinal().to_le_bytes())
            .put(&uuid);
        // Our descriptor is closed when `fd` drops: the peer got its own.
        self.send(Kind::Buffer, payload.written(), Some(fd.as_raw_fd()))
    }

    /// Receive a buffer the peer sent with [`send_buffer`](Self::send_buffer)
    /// and map it in `ctx`, which must be on the same device. Refused, with
    /// an error naming the values: another element size than `T`'s, another
    /// device, a frame without a descriptor, a descriptor that is not
    /// exported device memory, or one whose size is not what the exporter
    /// said (forged or stale).
    pub fn receive_buffer<T: DeviceCopy>(
        &mut self,
        ctx: &Arc<Context>,
    ) -> Result<SharedDeviceBuffer<T>> {
        let frame = self.receive(Kind::Buffer)?;
        let from = self.peer_pid();
        let fd = frame.fd.ok_or_else(|| {
            refused(format!(
                "the buffer frame from process {from} carries no file descriptor"
            ))
        })?;
        let mut payload = Payload::of(frame.payload);
        let (len, elem_size, mapped) = (payload.u64(), payload.u64(), payload.u64());
        let ordinal = i32::from_le_bytes(payload.take());
        let uuid = payload.take::<16>();
        let mine = std::mem::size_of::<T>() as u64;
        if elem_size != mine {
            return Err(refused(format!(
                "the buffer from process {from} holds elements of {elem_size} bytes, not of {mine} \
                 ({})",
                std::any::type_name::<T>()
            )));
        }
        let bytes = len.checked_mul(elem_size).filter(|&b| b > 0 && b <= mapped);
        let (Some(_), Ok(len), Ok(mapped)) = (bytes, usize::try_from(len), usize::try_from(mapped))
        else {
            return Err(refused(format!(
                "the buffer from process {from} claims {len} elements of {elem_size} bytes in a \
                 mapping of {mapped} bytes"
            )));
        };
        check_device(ctx, "buffer", ordinal, uuid, from)?;
        let ipc = ipc_of(ctx)?;
        let handle = SharedDeviceBuffer::<T>::import_fd(ctx, ipc, fd)?;
        SharedDeviceBuffer::map(ctx, ipc, handle, len, mapped, Some(from))
    }

    /// Send `event` to the peer, which opens it with
    /// [`receive_event`](Self::receive_event).
    pub fn send_event(&mut self, event: &SharedEvent) -> Result<()> {
        let handle = event.handle()?;
        let uuid = device_uuid(event.context())?;
        let mut payload = Payload::new();
        payload
            .put(&event.context().ordinal().to_le_bytes())
            .put(&uuid);
        payload.put(&handle.reserved.map(|b| b as u8));
        self.send(Kind::Event, payload.written(), None)
    }

    /// Receive an event the peer sent with [`send_event`](Self::send_event)
    /// and open it in `ctx`, which must be on the same device.
    pub fn receive_event(&mut self, ctx: &Arc<Context>) -> Result<SharedEvent> {
        let frame = self.receive(Kind::Event)?;
        let from = self.peer_pid();
        let mut payload = Payload::of(frame.payload);
        let ordinal = i32::from_le_bytes(payload.take());
        let uuid = payload.take::<16>();
        let bytes = payload.take::<64>();
        check_device(ctx, "event", ordinal, uuid, from)?;
        let handle = CUipcEventHandle {
            reserved: bytes.map(|b| b as std::ffi::c_char),
        };
        SharedEvent::open(ctx, handle, from)
    }
}
