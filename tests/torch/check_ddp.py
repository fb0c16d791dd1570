"""A DistributedDataParallel step with the "tbverbs" backend gives the gradients Gloo gives, on
the same machine and data (run_job.sh ddp). Two copies of one model, one wrapped over the default
process group (tbverbs), one over a Gloo group; each rank feeds both its own batch. The gradients
must agree to float32 rounding (the two backends may add the ranks' gradients in another order),
differ from the rank's local gradient (the averaging happened), and so must the parameters after
an SGD step."""
import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import tbverbs_torch  # noqa: F401


def say(line):
    """One write per line: the ranks share the launcher's stdout, and print() may split a line."""
    os.write(1, (line + "\n").encode())


def main():
    dist.init_process_group("tbverbs")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")

    torch.manual_seed(0)  # the same initial model on every rank (DDP broadcasts rank 0's anyway)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    local = copy.deepcopy(model)
    ours = DDP(copy.deepcopy(model))
    theirs = DDP(copy.deepcopy(model), process_group=gloo)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.1)
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.1)

    torch.manual_seed(100 + rank)
    x, y = torch.randn(16, 32), torch.randn(16, 8)
    for net in (ours, theirs, local):
        nn.functional.mse_loss(net(x), y).backward()

    worst = 0.0
    for name, (a, b, c) in zip([n for n, _ in model.named_parameters()],
                               zip(ours.parameters(), theirs.parameters(), local.parameters())):
        diff = (a.grad - b.grad).abs().max().item()
        worst = max(worst, diff)
        if not torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7):
            raise AssertionError(f"rank {rank}: gradient of {name} differs from Gloo's by {diff}")
        if world > 1 and torch.equal(a.grad, c.grad):
            raise AssertionError(f"rank {rank}: gradient of {name} is the local one: nothing was averaged")
    opt_ours.step()
    opt_theirs.step()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        if not torch.allclose(a, b, rtol=1e-5, atol=1e-7):
            raise AssertionError(f"rank {rank}: parameters differ from Gloo's after the step")
    dist.barrier()
    say(f"rank {rank}: ok: DDP gradients equal Gloo's (largest difference {worst:.3g})")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
