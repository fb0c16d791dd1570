"""tbverbs_torch: a torch.distributed process-group backend over tbverbs' RDMA collectives.

Importing it registers the backend "tbverbs":

    import torch.distributed as dist
    import tbverbs_torch  # registers "tbverbs"
    dist.init_process_group("tbverbs")  # under torchrun: RANK, WORLD_SIZE, MASTER_ADDR/PORT

CPU tensors (contiguous) of float32, float64, float16, bfloat16, int8, uint8, int32, int64 and
bool: all_reduce (SUM, PRODUCT, MIN, MAX, AVG) and all_reduce_coalesced, all_gather,
all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, broadcast, reduce, gather, scatter,
all_to_all, all_to_all_single (equal or uneven splits), send/recv, batch_isend_irecv, barrier;
every op asynchronous; new_group is a subgroup of the default group's communicator. Devices,
memory mode and transport come from the environment as for any tbverbs program (TBVERBS_* and
JACCL_IBV_DEVICES; docs/pytorch.md).
"""

import torch.distributed as _dist

from . import _C

__all__ = ["BACKEND_NAME", "create_process_group"]

#: The name to give init_process_group.
BACKEND_NAME = "tbverbs"


#: The backend's constructor: (store, rank, world_size, timeout, global_ranks=[]).
create_process_group = _C.create_process_group


def _create(dist_backend_opts, backend_options=None):
    """torch.distributed's extended creator: a subgroup (new_group) gets its ranks in the default
    group, and becomes a subgroup of the default group's communicator (no new rendezvous or link)."""
    o = dist_backend_opts
    return create_process_group(o.store, o.group_rank, o.group_size, o.timeout, list(o.global_ranks_in_group))


def _register():
    """Registered once per interpreter (a second import of the module is the same module object).
    torch 2.x is told the backend's device (CPU); 1.13 has no such argument."""
    if BACKEND_NAME.upper() in getattr(_dist.Backend, "_plugins", {}):
        return
    try:
        _dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])
    except TypeError:  # torch 1.13: no `devices`
        _dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True)


_register()
