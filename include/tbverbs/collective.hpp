/// @file collective.hpp
/// The collectives layer: `Communicator` (all_reduce, all_gather, reduce_scatter, broadcast,
/// send, recv, barrier over typed spans) and `CommunicatorOptions` (settable in code, or from the
/// launchers' environment). Optional, like link.hpp: the core umbrella does not include it.
/// docs/collectives.md is its guide; the parts under collective/ are for backend authors:
///
/// | header | what |
/// |---|---|
/// | collective/types.hpp | DType, float16, bfloat16, ReduceOp, the reduction kernels |
/// | collective/launcher.hpp | rank, size and coordinator from mlx.launch, torchrun, Open MPI, PMI, Slurm |
/// | collective/device_file.hpp | JACCL device files and mlx.distributed_config hostfiles |
/// | collective/options.hpp | CommunicatorOptions and from_env() |
/// | collective/network.hpp | the devices, links and scratch memory of one rank |
/// | collective/engine.hpp | the progress loop and the in-band credits every algorithm runs on |
/// | collective/algorithms.hpp | ring, latency, mesh, broadcast chain and pair schedules |
/// | collective/choice.hpp | the measured table that picks an algorithm |
/// | collective/registration_cache.hpp | user buffers registered once, found by address range |
/// | collective/communicator.hpp | Communicator |
#pragma once

#include "collective/communicator.hpp"
