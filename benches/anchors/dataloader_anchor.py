"""PyTorch anchor for the process_loader bench (benches/benches/process_loader.rs).

PyTorch's DataLoader(num_workers=N, pin_memory=True) doing the bench's work:
N worker processes each make a whole batch of f32 values i % 1024 + 7 * batch
(the Dataset returns one batch per index, batch_size=None), the loader's pin
thread copies it into pinned memory, and the main process uploads it
(non_blocking) and normalises it on the GPU, (x - 512) / 256.

Run on the same machine, in the same GPU call as the Rust bench:
    /opt/torch/.venv/bin/python benches/anchors/dataloader_anchor.py
LOADER_WORKERS (default 8) and LOADER_BATCH_MIB (default 64) match the
bench's settings. Prints the bench's FIGURE lines, "torch DataLoader" in
place of "process loader", and torch's own raw pinned H2D figure for scale:
the median over 3 windows of 32 batches after one window of warm-up, timed
on the host with a synchronize at each window's end, as the bench does.
"""
import os
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset

MEAN = 512.0
STD = 256.0
WINDOWS = 3
PER_WINDOW = 32


class Batches(Dataset):
    """Batch b: i % 1024 + 7 * b, as the bench's fill writes it.

    The i % 1024 pattern is made once (and shared with the workers by fork),
    so a worker's work per batch is one pass writing the batch, as the
    bench's fill is.
    """

    def __init__(self, count, length):
        self.count = count
        self.pattern = torch.arange(length, dtype=torch.int64).remainder_(1024).to(torch.float32)

    def __len__(self):
        return self.count

    def __getitem__(self, batch):
        return self.pattern + float(7 * batch)


def loader_seconds(workers, length):
    total = (WINDOWS + 1) * PER_WINDOW
    loader = DataLoader(Batches(total, length), batch_size=None, num_workers=workers,
                        pin_memory=True, prefetch_factor=2, persistent_workers=False)
    batches = iter(loader)
    windows = []
    checked = []
    delivered = 0
    for window in range(WINDOWS + 1):
        start = time.perf_counter()
        for _ in range(PER_WINDOW):
            host = next(batches)
            x = host.to("cuda", non_blocking=True)
            y = (x - MEAN) / STD
            if delivered % PER_WINDOW == 0:
                checked.append((delivered, y))  # looked at after the timing
            delivered += 1
        torch.cuda.synchronize()
        if window > 0:
            windows.append((time.perf_counter() - start) / PER_WINDOW)
    for index, y in checked:
        expected = (5 + 7 * index - MEAN) / STD
        assert y[5].item() == expected, (index, y[5].item(), expected)
    return statistics.median(windows)


def raw_pinned_seconds(nbytes):
    host = torch.ones(nbytes // 4, dtype=torch.float32).pin_memory()
    device = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    windows = []
    for window in range(WINDOWS + 1):
        start = time.perf_counter()
        for _ in range(PER_WINDOW):
            device.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        if window > 0:
            windows.append((time.perf_counter() - start) / PER_WINDOW)
    return statistics.median(windows)


def main():
    workers = int(os.environ.get("LOADER_WORKERS", "8"))
    mib = int(os.environ.get("LOADER_BATCH_MIB", "64"))
    nbytes = mib << 20
    torch.cuda.init()
    raw = raw_pinned_seconds(nbytes)
    ours = loader_seconds(workers, nbytes // 4)
    print(f"FIGURE torch DataLoader N={workers}, {mib} MiB f32 batches, normalised on the GPU: "
          f"{nbytes / ours / 1e9:.3f} GB/s")
    print(f"FIGURE torch H2D raw pinned, {mib} MiB copies: {nbytes / raw / 1e9:.3f} GB/s")
    print(f"RATIO torch DataLoader batch vs raw pinned H2D of the batch: ours {ours * 1e9:.0f} ns, "
          f"baseline {raw * 1e9:.0f} ns, {raw / ours:.2f}x")


if __name__ == "__main__":
    main()
