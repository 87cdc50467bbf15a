"""PyTorch anchors for the multigpu bench's send/recv and all-to-all rows.

Run on the same machine, in the same call as the Rust bench:
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
        torchrun --nproc-per-node=2 benches/anchors/torch_p2p.py
Prints, per size (16 MiB, 256 MiB, 1 GiB): send/recv bandwidth (rank 0 ->
rank 1, bytes / time) and all_to_all_single bus bandwidth (NCCL's
convention: bytes * (n - 1) / n / time), each the median of 20 timed
iterations after 5 warm-ups, timed with CUDA events; and 8-byte all-reduce
latency, eager and captured in a CUDA graph.
"""
import os
import statistics

import torch
import torch.distributed as dist


def timed(fn, iters=20, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main():
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    for size in (16 << 20, 256 << 20, 1 << 30):
        x = torch.ones(size // 4, dtype=torch.float32, device="cuda")
        y = torch.empty_like(x)

        def p2p():
            ops = []
            if rank == 0:
                ops.append(dist.P2POp(dist.isend, x, 1))
            elif rank == 1:
                ops.append(dist.P2POp(dist.irecv, y, 0))
            if ops:
                for req in dist.batch_isend_irecv(ops):
                    req.wait()
            dist.barrier(device_ids=[torch.cuda.current_device()])

        def a2a():
            dist.all_to_all_single(y, x)

        t_p2p = timed(p2p)
        t_a2a = timed(a2a)
        if rank == 0:
            print(f"torch send/recv {size >> 20} MiB: {size / t_p2p / 1e9:.1f} GB/s")
            print(f"torch all_to_all_single {size >> 20} MiB: bus {size * (n - 1) / n / t_a2a / 1e9:.1f} GB/s")
    tiny = torch.ones(2, dtype=torch.float32, device="cuda")
    eager = timed(lambda: dist.all_reduce(tiny), iters=200, warmup=20)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            dist.all_reduce(tiny)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        dist.all_reduce(tiny)
    captured = timed(graph.replay, iters=200, warmup=20)
    if rank == 0:
        print(f"torch all_reduce 8 B eager: {eager * 1e6:.1f} us, captured: {captured * 1e6:.1f} us")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
