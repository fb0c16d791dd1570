"""tbverbs_torch: a torch.distributed process-group backend over tbverbs' RDMA collectives.

Importing it registers the backend "tbverbs":

    import torch.distributed as dist
    import tbverbs_torch  # registers "tbverbs"
    dist.init_process_group("tbverbs")  # under torchrun: RANK, WORLD_SIZE, MASTER_ADDR/PORT

CPU tensors (contiguous) of float32, float64, int32, int64, float16 and bfloat16: all_reduce (SUM,
PRODUCT, MIN, MAX), all_gather, all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor,
broadcast, send/recv, barrier. Devices, memory mode and transport come from the environment as
for any tbverbs program (TBVERBS_* and JACCL_IBV_DEVICES; docs/pytorch.md).
"""

import torch.distributed as _dist

from . import _C

__all__ = ["BACKEND_NAME", "create_process_group"]

#: The name to give init_process_group.
BACKEND_NAME = "tbverbs"


#: The backend's constructor, as torch.distributed calls it: (store, rank, world_size, timeout).
create_process_group = _C.create_process_group


# Registered once per interpreter (a second import of the module is the same module object).
if BACKEND_NAME.upper() not in getattr(_dist.Backend, "_plugins", {}):
    _dist.Backend.register_backend(BACKEND_NAME, create_process_group)
