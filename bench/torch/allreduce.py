"""Times a float32 SUM all_reduce of BYTES through torch.distributed, on the "tbverbs" backend and
on Gloo, in one torchrun job (bench/torch/compare.sh). Rank 0 prints, per backend,
"torch BACKEND: BYTES B, T us, busbw B GB/s": the slowest rank's mean time per call over ITERS
calls after 2 warm-ups (nccl-tests' convention, as tests/collective/comm_check --bench)."""
import os
import sys
import time

import torch
import torch.distributed as dist

import tbverbs_torch  # noqa: F401


def main():
    size = int(os.environ.get("BENCH_BYTES", str(64 << 20)))
    iters = int(os.environ.get("BENCH_ITERS", "10"))
    backends = os.environ.get("BENCH_BACKENDS", "tbverbs,gloo").split(",")
    dist.init_process_group("tbverbs")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"tbverbs": None}
    if "gloo" in backends:
        groups["gloo"] = dist.new_group(backend="gloo")
    t = torch.ones(size // 4, dtype=torch.float32)
    for name in backends:
        group = groups[name]
        for _ in range(2):
            dist.all_reduce(t, group=group)
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, group=group)
        mean = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
        dist.all_reduce(mean, op=dist.ReduceOp.MAX)
        us = mean.item() * 1e6
        busbw = t.numel() * 4 / us / 1e3 * 2 * (world - 1) / world
        if rank == 0:
            os.write(1, f"torch {name}: {t.numel() * 4} B, {us:.1f} us, busbw {busbw:.3f} GB/s\n".encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
