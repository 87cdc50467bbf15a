//! The refusals of the channel and of what crosses it, with both ends in
//! one process (the two-process behaviour is `tests/ipc_processes.rs`).

use super::channel::{Kind, PAYLOAD};
use super::transfer::device_uuid;
use super::*;
use crate::{Context, Error, Stream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(30);

/// A connected pair: the listener's end and the connecting end.
fn pair(name: &str) -> (IpcChannel, IpcChannel) {
    let path = std::env::temp_dir().join(format!("cs-ipc-unit-{name}-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let token = IpcToken::random().unwrap();
    let listener = IpcListener::bind(&path, token).unwrap();
    let connecting = std::thread::spawn(move || IpcChannel::connect(&path, token, DEADLINE));
    let accepted = listener.accept(DEADLINE).unwrap();
    (accepted, connecting.join().unwrap().unwrap())
}

/// A buffer frame's payload, as `send_buffer` writes it.
fn buffer_payload(len: u64, elem: u64, mapped: u64, ctx: &Context) -> Vec<u8> {
    let mut payload = Vec::with_capacity(PAYLOAD);
    payload.extend(len.to_le_bytes());
    payload.extend(elem.to_le_bytes());
    payload.extend(mapped.to_le_bytes());
    payload.extend(ctx.ordinal().to_le_bytes());
    payload.extend(device_uuid(ctx).unwrap());
    payload
}

fn reason(err: Error) -> String {
    match err {
        Error::Ipc { reason } => reason,
        other => panic!("not an IPC refusal: {other}"),
    }
}

#[test]
fn a_buffer_crosses_the_channel_and_both_mappings_see_one_memory() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let (mut exporter, mut importer) = pair("roundtrip");
    let mut mine = SharedDeviceBuffer::<u32>::new(&ctx, 100).unwrap();
    stream.copy_from_host(&mut mine, &[5; 100]).unwrap();
    exporter.send_buffer(&mine).unwrap();
    let mut theirs = importer.receive_buffer::<u32>(&ctx).unwrap();
    assert_ne!(theirs.as_device_ptr(), mine.as_device_ptr());
    assert_eq!(theirs.to_vec(&stream).unwrap(), vec![5; 100]);
    stream.copy_from_host(&mut theirs, &[9; 100]).unwrap();
    assert_eq!(mine.to_vec(&stream).unwrap(), vec![9; 100]);
    // The exporter's buffer goes first; the imported one keeps the memory.
    drop(mine);
    assert_eq!(theirs.to_vec(&stream).unwrap(), vec![9; 100]);
}

#[test]
fn a_peer_with_a_wrong_token_is_refused() {
    let path = std::env::temp_dir().join(format!("cs-ipc-unit-token-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = IpcListener::bind(&path, IpcToken::random().unwrap()).unwrap();
    let forger = IpcToken::random().unwrap();
    let connecting = std::thread::spawn(move || IpcChannel::connect(&path, forger, DEADLINE));
    let refused = reason(listener.accept(DEADLINE).unwrap_err());
    assert!(refused.contains("wrong token"), "{refused}");
    // The forger learns nothing but that the listener hung up.
    let closed = reason(connecting.join().unwrap().unwrap_err());
    assert!(closed.contains("closed the channel"), "{closed}");
}

#[test]
fn a_descriptor_that_is_not_exported_memory_is_refused() {
    let ctx = Context::new(0).unwrap();
    let (mut exporter, mut importer) = pair("forged-fd");
    let file = std::fs::File::open("/proc/self/exe").unwrap();
    let fd = OwnedFd::from(file);
    let payload = buffer_payload(16, 4, 4096, &ctx);
    exporter
        .send(Kind::Buffer, &payload, Some(fd.as_raw_fd()))
        .unwrap();
    let refused = reason(importer.receive_buffer::<u32>(&ctx).unwrap_err());
    assert!(refused.starts_with("importing descriptor"), "{refused}");
    assert!(refused.contains("a forged handle"), "{refused}");
}

#[test]
fn a_size_other_than_the_exporters_is_refused() {
    let ctx = Context::new(0).unwrap();
    let (mut exporter, mut importer) = pair("size");
    let real = SharedDeviceBuffer::<u32>::new(&ctx, 16).unwrap();
    let fd = real.export_fd().unwrap();
    let larger = (real.mapped_bytes() * 2) as u64;
    let payload = buffer_payload(16, 4, larger, &ctx);
    exporter
        .send(Kind::Buffer, &payload, Some(fd.as_raw_fd()))
        .unwrap();
    let refused = reason(importer.receive_buffer::<u32>(&ctx).unwrap_err());
    assert!(
        refused.contains(&format!("mapping {larger} bytes")),
        "{refused}"
    );
}

#[test]
fn elements_of_another_size_are_refused() {
    let ctx = Context::new(0).unwrap();
    let (mut exporter, mut importer) = pair("elem");
    exporter
        .send_buffer(&SharedDeviceBuffer::<u32>::new(&ctx, 16).unwrap())
        .unwrap();
    let refused = reason(importer.receive_buffer::<u64>(&ctx).unwrap_err());
    assert!(
        refused.contains("elements of 4 bytes, not of 8 (u64)"),
        "{refused}"
    );
}

#[test]
fn a_buffer_of_another_device_is_refused() {
    if Context::device_count().unwrap() < 2 {
        eprintln!("skipped: needs two devices");
        return;
    }
    let (zero, one) = (Context::new(0).unwrap(), Context::new(1).unwrap());
    let (mut exporter, mut importer) = pair("device");
    exporter
        .send_buffer(&SharedDeviceBuffer::<u32>::new(&zero, 16).unwrap())
        .unwrap();
    let refused = reason(importer.receive_buffer::<u32>(&one).unwrap_err());
    assert!(refused.contains("a handle for another device"), "{refused}");
    assert!(refused.contains("device 0"), "{refused}");
}

#[test]
fn a_forged_or_stale_event_handle_is_refused() {
    let ctx = Context::new(0).unwrap();
    let (mut exporter, mut importer) = pair("event");
    let mut payload = Vec::new();
    payload.extend(ctx.ordinal().to_le_bytes());
    payload.extend(device_uuid(&ctx).unwrap());
    payload.extend([0x5au8; 64]);
    exporter.send(Kind::Event, &payload, None).unwrap();
    let forged = reason(importer.receive_event(&ctx).unwrap_err());
    assert!(forged.contains("stale or forged"), "{forged}");

    let event = SharedEvent::new(&ctx).unwrap();
    exporter.send_event(&event).unwrap();
    drop(event);
    let stale = reason(importer.receive_event(&ctx).unwrap_err());
    assert!(stale.contains("stale or forged"), "{stale}");
}

#[test]
fn an_event_opened_from_its_handle_orders_another_stream() {
    let ctx = Context::new(0).unwrap();
    if ctx.is_gpu() {
        eprintln!(
            "skipped: CUDA does not open an event handle in the process that made it; \
             tests/ipc_processes.rs opens one in another process"
        );
        return;
    }
    let (a, b) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
    let (mut exporter, mut importer) = pair("event-order");
    let event = SharedEvent::new(&ctx).unwrap();
    exporter.send_event(&event).unwrap();
    let opened = importer.receive_event(&ctx).unwrap();
    let (gate, held) = std::sync::mpsc::channel::<()>();
    a.add_callback(move || held.recv().unwrap()).unwrap();
    event.record(&a).unwrap();
    // The record was made through the other handle: the opened one sees it.
    assert!(!opened.query().unwrap());
    opened.wait_on(&b).unwrap();
    gate.send(()).unwrap();
    opened.synchronize().unwrap();
    assert!(event.query().unwrap());
    b.synchronize().unwrap();
}

#[test]
fn signals_cross_and_a_silent_peer_meets_the_deadline() {
    let path =
        std::env::temp_dir().join(format!("cs-ipc-unit-deadline-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let token = IpcToken::random().unwrap();
    let listener = IpcListener::bind(&path, token).unwrap();
    let short = Duration::from_millis(200);
    let connecting = std::thread::spawn(move || IpcChannel::connect(&path, token, short));
    let mut accepted = listener.accept(short).unwrap();
    let mut connected = connecting.join().unwrap().unwrap();
    accepted.send_signal(41).unwrap();
    assert_eq!(connected.receive_signal().unwrap(), 41);
    let timed_out = reason(connected.receive_signal().unwrap_err());
    assert!(
        timed_out.contains("deadline of 200ms passed"),
        "{timed_out}"
    );
}
