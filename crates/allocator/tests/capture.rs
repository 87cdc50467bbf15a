//! A stream being captured into a CUDA graph gets no stream-ordered memory:
//! the allocation would be recorded as a node of the graph. The refusal is
//! clear, leaves the capture usable, and the allocator serves other streams.

mod common;

use common::{backends, ctx};
use cuda_streams_allocator::StreamOrderedAllocator;
use cuda_streams_allocator::driver::Stream;

#[test]
fn a_capturing_stream_is_refused_and_the_capture_still_works() {
    let ctx = ctx();
    for backend in backends(&ctx) {
        let allocator = StreamOrderedAllocator::with_backend(&ctx, backend).unwrap();
        let (capturing, other) = (Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap());
        let before = allocator.allocate_for_stream(&capturing, 4096).unwrap();
        let mut capture = capturing.begin_capture().unwrap();

        let err = allocator.allocate_for_stream(&capturing, 4096).unwrap_err();
        assert!(
            err.to_string().contains("Capture::alloc"),
            "{backend:?}: {err}"
        );
        let err = allocator.free_for_stream(&capturing).unwrap_err();
        assert!(
            err.to_string().contains("free_for_stream"),
            "{backend:?}: {err}"
        );
        let err = before.record_stream(&capturing).unwrap_err();
        assert!(
            err.to_string().contains("record_stream"),
            "{backend:?}: {err}"
        );
        // Other streams are served as usual meanwhile.
        let elsewhere = allocator.allocate_for_stream(&other, 4096).unwrap();
        elsewhere.memset_u32_async(7).unwrap();

        let scratch = capture.alloc::<u32>(1024).unwrap();
        capture.memset_u8(&capturing, &scratch, 1).unwrap();
        let exec = capture.end().unwrap().instantiate().unwrap();
        exec.launch(&capturing).unwrap();
        assert_eq!(scratch.to_vec(&capturing).unwrap(), vec![0x0101_0101; 1024]);
        drop((before, elsewhere));
        other.synchronize().unwrap();
        assert_eq!(allocator.stats().live_allocations, 0, "{backend:?}");
    }
}
