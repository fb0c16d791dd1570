"""A rank of a "tbverbs" job dies (SIGKILL) in the middle of a stream of all_reduces: every other
rank must raise, with tbverbs' message, well within the process group's timeout (run_job.sh kill).
Each survivor prints "rank R: raised after S s at all_reduce I: MESSAGE" and leaves at once."""
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import tbverbs_torch  # noqa: F401

TIMEOUT_S = 20


def say(line):
    """One write per line: the ranks share the launcher's stdout, and print() may split a line."""
    os.write(1, (line + "\n").encode())


def main():
    dist.init_process_group("tbverbs", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank, world = dist.get_rank(), dist.get_world_size()
    victim = world - 2
    t = torch.ones(1 << 18)
    for i in range(100000):
        if rank == victim and i == 20:
            say(f"rank {rank}: killing myself at all_reduce {i}")
            os.kill(os.getpid(), signal.SIGKILL)
        start = time.monotonic()
        try:
            dist.all_reduce(t)
        except RuntimeError as e:
            elapsed = time.monotonic() - start
            message = " ".join(str(e).split())
            say(f"rank {rank}: raised after {elapsed:.3f} s at all_reduce {i}: {message}")
            if elapsed >= TIMEOUT_S:
                say(f"rank {rank}: raised only after the timeout")
            os._exit(3)  # the job is broken: leave without the teardown
        t.fill_(1)
    say(f"rank {rank}: never raised")
    return 1


if __name__ == "__main__":
    sys.exit(main())
