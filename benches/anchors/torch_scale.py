"""PyTorch anchors for the multigpu bench's table by device count.

Run on the same machine, in the same call as the Rust bench, once per device
count (CUDA_VISIBLE_DEVICES picks the devices):
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
        torchrun --nproc-per-node=N benches/anchors/torch_scale.py
Prints, for N processes (one per GPU):
- all_reduce bus bandwidth at 16 MiB, 256 MiB and 1 GiB (NCCL's convention:
  bytes * 2 * (n - 1) / n / time);
- 8-byte all_reduce latency;
- all_to_all_single bus bandwidth at 256 MiB (bytes * (n - 1) / n / time);
- from rank 0 only, after the collectives: the peer-copy matrix,
  `tensor.copy_` of 1 GiB from every device to every other (bytes / time).
Each figure is the median of timed iterations after warm-ups, timed with CUDA
events. Lines start with "torch" so that a log can be grepped.
"""
import os
import statistics

import torch
import torch.distributed as dist


def timed(fn, iters=20, warmup=5, stream=None):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def collectives(rank, n):
    for size in (16 << 20, 256 << 20, 1 << 30):
        x = torch.ones(size // 4, dtype=torch.float32, device="cuda")
        t = timed(lambda: dist.all_reduce(x))
        if rank == 0:
            bus = size * 2 * (n - 1) / n / t / 1e9
            print(f"torch n={n} all_reduce {size >> 20} MiB: bus {bus:.1f} GB/s")
        del x
    tiny = torch.ones(2, dtype=torch.float32, device="cuda")
    t = timed(lambda: dist.all_reduce(tiny), iters=200, warmup=20)
    if rank == 0:
        print(f"torch n={n} all_reduce 8 B: {t * 1e6:.1f} us")
    size = 256 << 20
    x = torch.ones(size // 4, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    t = timed(lambda: dist.all_to_all_single(y, x))
    if rank == 0:
        print(f"torch n={n} all_to_all_single 256 MiB: bus {size * (n - 1) / n / t / 1e9:.1f} GB/s")
    del x, y
    torch.cuda.synchronize()


def peer_matrix(n):
    size = 1 << 30
    bufs = [torch.ones(size // 4, dtype=torch.float32, device=f"cuda:{d}") for d in range(n)]
    for src in range(n):
        row = []
        for dst in range(n):
            if src == dst:
                row.append("   -  ")
                continue
            dst_buf = torch.empty_like(bufs[src], device=f"cuda:{dst}")
            # Timed on the destination's current stream, as copy_ enqueues there.
            with torch.cuda.device(dst):
                stream = torch.cuda.current_stream(dst)
                t = timed(lambda: dst_buf.copy_(bufs[src], non_blocking=True), iters=10, warmup=2,
                          stream=stream)
            row.append(f"{size / t / 1e9:6.1f}")
            del dst_buf
        print(f"torch n={n} copy_ 1 GiB from {src}: " + " ".join(row) + " GB/s")


def main():
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    collectives(rank, n)
    dist.barrier(device_ids=[torch.cuda.current_device()])
    if rank == 0:
        peer_matrix(n)
    dist.barrier(device_ids=[torch.cuda.current_device()])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
