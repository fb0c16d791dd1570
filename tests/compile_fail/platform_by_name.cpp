// Misuse: deciding a device's platform by its name (issue 18, finding 1). An rdma-core NIC may be
// called rdma_en1 and a Thunderbolt device anything: platform_of_device takes the device's
// transport type, so a name does not convert.
#include <tbverbs/device.hpp>

int main() {
#ifdef TBVERBS_COMPILE_FAIL_CONTROL
  const tbverbs::Platform p = tbverbs::platform_of_device(tbverbs::thunderbolt_transport, tbverbs::Platform::rdma_core);
#else
  const tbverbs::Platform p = tbverbs::platform_of_device("rdma_en1", tbverbs::Platform::rdma_core);
#endif
  return p == tbverbs::Platform::apple ? 0 : 1;
}
