// A captured operation's id has a type of its own: an eager operation
// cannot be made to depend on it (it would name an unrelated operation).
use cuda_streams_engine::OperationGraph;
use cuda_streams_engine::driver::{Context, Stream};

fn main() {
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let graph = OperationGraph::for_context(&ctx);
    let mut capture = graph.capture(&stream).unwrap();
    let captured = capture.op(&stream).run(|_, _| Ok(())).unwrap();
    capture.finish().unwrap();
    graph.op(&stream).after(&[captured]).run(|_| Ok(())).unwrap();
}
