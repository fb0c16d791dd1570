"""Every collective of the "tbverbs" torch.distributed backend, on every dtype, checked against
this rank's own arithmetic. Run by torchrun on the emulated fabric (run_job.sh); each rank prints
"rank R: ok: N checks" or raises.

Values are small integers (products: powers of two), so that every sum, product, minimum and
maximum is exact in float16 and bfloat16 too, whatever the order the ranks combine in.
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

import tbverbs_torch  # noqa: F401  (registers "tbverbs")

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.int8, torch.uint8]
# By name: ReduceOp values do not compare with == in torch 1.13.
OPS = ["SUM", "PRODUCT", "MIN", "MAX"]
COUNTS = [int(c) for c in os.environ.get("CHECK_COUNTS", "1,7,4099").split(",")]


def say(line):
    """One write per line: the ranks share the launcher's stdout, and print() may split a line."""
    os.write(1, (line + "\n").encode())


def values(rank, count, dtype, salt=0, op=None):
    """Rank `rank`'s input: 1..4, or 1..2 for products (powers of two stay exact)."""
    idx = torch.arange(count, dtype=torch.int64)
    span = 2 if op == "PRODUCT" else 4
    return ((idx * 3 + rank + salt) % span + 1).to(dtype)


def combined(world, count, dtype, op, salt=0):
    """What every rank should hold after an all_reduce of values(r, ...) over the ranks."""
    parts = [values(r, count, torch.float64, salt, op) for r in range(world)]
    out = parts[0].clone()
    for p in parts[1:]:
        if op == "SUM":
            out += p
        elif op == "PRODUCT":
            out *= p
        elif op == "MIN":
            out = torch.minimum(out, p)
        else:
            out = torch.maximum(out, p)
    return out.to(dtype)


def main():
    timeout = datetime.timedelta(seconds=int(os.environ.get("CHECK_TIMEOUT_S", "60")))
    dist.init_process_group("tbverbs", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "tbverbs", dist.get_backend()
    checks = 0

    def expect(what, got, want):
        nonlocal checks
        if got.dtype != want.dtype or not torch.equal(got, want):
            bad = (got != want).nonzero()
            first = bad[0].item() if len(bad) else -1
            raise AssertionError(
                f"rank {rank}: {what}: {len(bad)} of {want.numel()} elements wrong, first at {first}: "
                f"got {got.flatten()[first].item() if first >= 0 else got.dtype}, "
                f"want {want.flatten()[first].item() if first >= 0 else want.dtype}")
        checks += 1

    for dtype in DTYPES:
        for count in COUNTS:
            tag = f"{dtype} x {count}"
            for op in OPS:
                t = values(rank, count, dtype, op=op)
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
                expect(f"all_reduce {op} {tag}", t, combined(world, count, dtype, op))
            if dtype.is_floating_point:  # AVG: the sum divided by the ranks once (integers: refused below)
                t = values(rank, count, dtype)
                dist.all_reduce(t, op=dist.ReduceOp.AVG)
                expect(f"all_reduce AVG {tag}", t, (combined(world, count, torch.float64, "SUM") / world).to(dtype))
            # async: the Work completes with the collective
            t = values(rank, count, dtype, salt=1)
            work = dist.all_reduce(t, async_op=True)
            work.wait()
            expect(f"all_reduce async {tag}", t, combined(world, count, dtype, "SUM", salt=1))

            mine = values(rank, count, dtype, salt=2)
            outs = [torch.full((count,), -1).to(dtype) for _ in range(world)]
            dist.all_gather(outs, mine)
            for r in range(world):
                expect(f"all_gather [{r}] {tag}", outs[r], values(r, count, dtype, salt=2))
            flat = torch.full((world * count,), -1).to(dtype)
            dist.all_gather_into_tensor(flat, mine)
            expect(f"all_gather_into_tensor {tag}", flat,
                   torch.cat([values(r, count, dtype, salt=2) for r in range(world)]))

            for op in ("SUM", "MAX"):
                ins = [values(rank, count, dtype, salt=10 + b, op=op) for b in range(world)]
                out = torch.full((count,), -1).to(dtype)
                dist.reduce_scatter(out, ins, op=getattr(dist.ReduceOp, op))
                expect(f"reduce_scatter {op} {tag}", out, combined(world, count, dtype, op, salt=10 + rank))
                out = torch.full((count,), -1).to(dtype)
                dist.reduce_scatter_tensor(out, torch.cat(ins), op=getattr(dist.ReduceOp, op))
                expect(f"reduce_scatter_tensor {op} {tag}", out, combined(world, count, dtype, op, salt=10 + rank))

            for root in sorted({0, world - 1}):
                t = values(rank, count, dtype, salt=20) if rank == root else torch.full((count,), -1).to(dtype)
                dist.broadcast(t, src=root)
                expect(f"broadcast from {root} {tag}", t, values(root, count, dtype, salt=20))

            # reduce, gather and scatter to and from the first and the last rank: the others'
            # tensors are left as they were (reduce) or not touched (gather's, scatter's lists).
            for root in sorted({0, world - 1}):
                for op in ["SUM", "MAX"] + (["AVG"] if dtype.is_floating_point else []):
                    t = values(rank, count, dtype, salt=50)
                    dist.reduce(t, dst=root, op=getattr(dist.ReduceOp, op))
                    if op == "AVG":
                        want = (combined(world, count, torch.float64, "SUM", salt=50) / world).to(dtype)
                    else:
                        want = combined(world, count, dtype, op, salt=50)
                    expect(f"reduce {op} to {root} {tag}", t, want if rank == root else values(rank, count, dtype, salt=50))
                mine = values(rank, count, dtype, salt=60)
                outs = [torch.full((count,), -1).to(dtype) for _ in range(world)] if rank == root else None
                dist.gather(mine, gather_list=outs, dst=root)
                if rank == root:
                    for r in range(world):
                        expect(f"gather [{r}] to {root} {tag}", outs[r], values(r, count, dtype, salt=60))
                ins = [values(r, count, dtype, salt=70) for r in range(world)] if rank == root else None
                got = torch.full((count,), -1).to(dtype)
                dist.scatter(got, scatter_list=ins, src=root)
                expect(f"scatter from {root} {tag}", got, values(rank, count, dtype, salt=70))
            # all_to_all_single, equal splits: block q of the output is rank q's block `rank`.
            send = torch.cat([values(rank * world + q, count, dtype, salt=80) for q in range(world)])
            recv = torch.full((world * count,), -1).to(dtype)
            dist.all_to_all_single(recv, send)
            expect(f"all_to_all_single {tag}", recv, torch.cat([values(q * world + rank, count, dtype, salt=80) for q in range(world)]))

            # send/recv round the ring, even ranks sending first (a send may wait for its recv).
            right, left = (rank + 1) % world, (rank - 1) % world
            got = torch.full((count,), -1).to(dtype)
            out = values(rank, count, dtype, salt=30)
            if rank % 2 == 0:
                dist.send(out, right)
                dist.recv(got, left)
            else:
                dist.recv(got, left)
                dist.send(out, right)
            expect(f"send/recv from {left} {tag}", got, values(left, count, dtype, salt=30))
            # isend/irecv between pairs (0, 1), (2, 3), ...
            peer = rank ^ 1
            if peer < world:
                got = torch.full((count,), -1).to(dtype)
                reqs = ([dist.isend(values(rank, count, dtype, salt=40), peer), dist.irecv(got, peer)]
                        if rank < peer else
                        [dist.irecv(got, peer), dist.isend(values(rank, count, dtype, salt=40), peer)])
                for req in reqs:
                    req.wait()
                expect(f"isend/irecv from {peer} {tag}", got, values(peer, count, dtype, salt=40))
        dist.barrier()

    # Several in flight: six all_reduces started, waited in reverse.
    bufs = [values(rank, 1000 * (k + 1), torch.float32, salt=90 + k) for k in range(6)]
    works = [dist.all_reduce(b, async_op=True) for b in bufs]
    for k in reversed(range(6)):
        works[k].wait()
        expect(f"all_reduce {k} of six in flight", bufs[k], combined(world, 1000 * (k + 1), torch.float32, "SUM", salt=90 + k))

    # Symmetric exchanges, 1 MiB each way (far past the credits: a send cannot finish before its
    # peer's receive is posted): isend before irecv on both ranks of a pair, and batch_isend_irecv
    # to both neighbours round the ring.
    n = 1 << 18
    peer = rank ^ 1
    if peer < world:
        got = torch.full((n,), -1.0)
        reqs = [dist.isend(values(rank, n, torch.float32, salt=100), peer), dist.irecv(got, peer)]
        for req in reqs:
            req.wait()
        expect(f"isend then irecv with {peer}", got, values(peer, n, torch.float32, salt=100))
    if world > 1:
        right, left = (rank + 1) % world, (rank - 1) % world
        from_left, from_right = torch.full((n,), -1.0), torch.full((n,), -1.0)
        ops = [dist.P2POp(dist.isend, values(rank, n, torch.float32, salt=110), right),
               dist.P2POp(dist.isend, values(rank, n, torch.float32, salt=120), left),
               dist.P2POp(dist.irecv, from_left, left), dist.P2POp(dist.irecv, from_right, right)]
        if world == 2:  # one neighbour both ways: one send and one receive each
            ops = [ops[0], ops[2]]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        expect("batch_isend_irecv from the left", from_left, values(left, n, torch.float32, salt=110))
        if world > 2:
            expect("batch_isend_irecv from the right", from_right, values(right, n, torch.float32, salt=120))

    # all_to_all_single with uneven splits: rank r sends rank q (r + 2q) % 3 + 1 rows of 5.
    def rows(r, q):
        return (r + 2 * q) % 3 + 1
    in_splits = [rows(rank, q) for q in range(world)]
    out_splits = [rows(q, rank) for q in range(world)]
    send = torch.cat([torch.full((rows(rank, q), 5), float(100 * rank + q)) for q in range(world)])
    recv = torch.full((sum(out_splits), 5), -1.0)
    dist.all_to_all_single(recv, send, out_splits, in_splits)
    expect("all_to_all_single, uneven splits", recv, torch.cat([torch.full((rows(q, rank), 5), float(100 * q + rank)) for q in range(world)]))
    # all_to_all on lists.
    outs = [torch.full((3,), -1) for _ in range(world)]
    dist.all_to_all(outs, [torch.full((3,), 10 * rank + q) for q in range(world)])
    for q in range(world):
        expect(f"all_to_all [{q}]", outs[q], torch.full((3,), 10 * q + rank))

    # bool: SUM is any, PRODUCT all (the results stay 0 or 1).
    flags = torch.tensor([rank == 0, True, False, rank == world - 1])
    t = flags.clone()
    dist.all_reduce(t)
    expect("all_reduce SUM of bool (any)", t, torch.tensor([True, True, False, True]))
    t = flags.clone()
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    expect("all_reduce PRODUCT of bool (all)", t, torch.tensor([world == 1, True, False, world == 1]))

    # Subgroups: five rounds of pairs (0, 1), (2, 3), ... and halves, all alive at once with the
    # default group. Each is a subgroup of the default group's communicator: no queue pair of its
    # own (ten communicators that each connected would need more than the emulated Thunderbolt
    # device's 10 queue pairs).
    half = (world + 1) // 2
    pair_ranks = [p for p in (rank - rank % 2, rank - rank % 2 + 1) if p < world]
    alive = []
    for k in range(5):
        pairs = [dist.new_group([p, p + 1] if p + 1 < world else [p]) for p in range(0, world, 2)]
        halves = [dist.new_group(list(range(half))), dist.new_group(list(range(half, world)))] if world > 1 else []
        alive.append((pairs, halves))
    for k, (pairs, halves) in enumerate(alive):
        mine_pair = pairs[rank // 2]
        t = torch.full((77,), float(rank + 1))
        dist.all_reduce(t, group=mine_pair)
        expect(f"all_reduce on the pair, round {k}", t, torch.full((77,), float(sum(p + 1 for p in pair_ranks))))
        if halves:
            group, members = (halves[0], range(half)) if rank < half else (halves[1], range(half, world))
            if len(members) > 0:
                t = torch.full((33,), float(rank + 1))
                w = dist.all_reduce(t, group=group, async_op=True)
                u = torch.full((5,), float(rank))
                dist.all_reduce(u)
                w.wait()
                expect(f"all_reduce on the half, round {k}", t, torch.full((33,), float(sum(p + 1 for p in members))))
                expect(f"all_reduce on the default group between, round {k}", u, torch.full((5,), float(world * (world - 1) / 2)))
                outs = [torch.zeros(2) for _ in members]
                dist.all_gather(outs, torch.full((2,), float(rank)), group=group)
                expect(f"all_gather on the half, round {k}", torch.cat(outs), torch.cat([torch.full((2,), float(p)) for p in members]))

    # What the backend refuses, with an exception naming tbverbs, and nothing broken after it.
    def refused(what, call, needle, torch_says=None):
        """`call` raises tbverbs' error containing `needle` (or torch's own containing `torch_says`:
        torch 2.x refuses some calls before they reach a backend)."""
        nonlocal checks
        try:
            call()
        except (RuntimeError, ValueError) as e:
            if torch_says and torch_says in str(e):
                checks += 1
                return
            if "tbverbs" not in str(e) or needle not in str(e):
                raise AssertionError(f"rank {rank}: {what}: the error does not say why: {e}")
            checks += 1
            return
        raise AssertionError(f"rank {rank}: {what} was accepted")

    refused("an int16 tensor", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16)), "not supported")
    refused("AVG of int32", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.AVG), "avg")
    # A coalesced list refused as a whole, before anything starts: its tensors are left as they were.
    if hasattr(dist, "all_reduce_coalesced"):
        kept = [torch.full((4,), rank + 1, dtype=torch.int32) for _ in range(2)]
        refused("AVG of a coalesced int32 list", lambda: dist.all_reduce_coalesced(kept, op=dist.ReduceOp.AVG), "avg")
        for t in kept:
            expect("a coalesced list's tensor after the refusal", t, torch.full((4,), rank + 1, dtype=torch.int32))
    refused("a non-contiguous tensor", lambda: dist.all_reduce(torch.ones(4, 4).t()), "not contiguous")
    refused("the bitwise AND", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.BAND),
            "only SUM, PRODUCT, MIN, MAX and AVG")
    refused("a wrong output size",
            lambda: dist.all_gather_into_tensor(torch.zeros(world * 4 + 1), torch.zeros(4)), "elements")
    refused("a send to this rank", lambda: dist.send(torch.ones(2), rank), "not another rank",
            torch_says="should not be the same as the rank of the current process")
    refused("all_to_all_single with splits that do not add up",
            lambda: dist.all_to_all_single(torch.zeros(2 * world), torch.zeros(2 * world), [3] * world, [2] * world), "add up")
    t = values(rank, 5, torch.float32)
    dist.all_reduce(t)
    expect("all_reduce after the refusals", t, combined(world, 5, torch.float32, "SUM"))

    dist.barrier()
    say(f"rank {rank}: ok: {checks} checks")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
