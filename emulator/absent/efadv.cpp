// libefa.so.1 for the emulated fabric: EFA direct verbs are not modelled (see mlx5dv.cpp:
// perftest links the library and asks it only about EFA devices, which the fabric has none of).
#include <infiniband/efadv.h>

#include <cerrno>

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

EMU_EXPORT int efadv_query_device(ibv_context*, efadv_device_attr*, uint32_t) { return EOPNOTSUPP; }
EMU_EXPORT ibv_qp* efadv_create_qp_ex(ibv_context*, ibv_qp_init_attr_ex*, efadv_qp_init_attr*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
