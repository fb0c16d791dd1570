// tbverbs_torch._C: the backend's constructor, for torch.distributed.Backend.register_backend
// (tbverbs_torch/__init__.py registers it as "tbverbs", with the extended API: it passes the
// subgroup's global ranks).
#include "process_group.hpp"

#include <torch/extension.h>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

namespace py = pybind11;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tbverbs' torch.distributed backend (RDMA verbs collectives; docs/pytorch.md)";
  // torch passes (store, rank, world_size, timeout). The GIL is released: the rendezvous waits for
  // the other ranks.
  m.def(
      "create_process_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
         const std::vector<int>& global_ranks) {
        return tbverbs_torch::ProcessGroupTbverbs::create(store, rank, size, timeout, global_ranks);
      },
      py::arg("store"), py::arg("rank"), py::arg("world_size"), py::arg("timeout"), py::arg("global_ranks") = std::vector<int>{},
      py::call_guard<py::gil_scoped_release>(),
      "Connects this rank's tbverbs communicator through the store and returns its process group; "
      "with global_ranks (a subgroup's ranks in the default group), a subgroup of the default group's communicator.");
  m.attr("torch_version_built_against") = TORCH_VERSION;
}
