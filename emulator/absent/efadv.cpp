// libefa.so.1 for the emulated fabric: EFA direct verbs are not modelled (see mlx5dv.cpp).
// perftest links the library and asks it only about EFA devices, of which the fabric has
// none; pyverbs' EFA module (which rdma-core's Python tests import) needs these entry points.
#include <infiniband/efadv.h>

#include <cerrno>

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

EMU_EXPORT ibv_qp* efadv_create_driver_qp(ibv_pd*, ibv_qp_init_attr*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int efadv_query_device(ibv_context*, efadv_device_attr*, uint32_t) { return EOPNOTSUPP; }
EMU_EXPORT ibv_qp* efadv_create_qp_ex(ibv_context*, ibv_qp_init_attr_ex*, efadv_qp_init_attr*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int efadv_query_ah(ibv_ah*, efadv_ah_attr*, uint32_t) { return EOPNOTSUPP; }
EMU_EXPORT ibv_cq_ex* efadv_create_cq(ibv_context*, ibv_cq_init_attr_ex*, efadv_cq_init_attr*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}
// Only a CQ made by efadv_create_cq has the EFA view, and none can be made.
EMU_EXPORT efadv_cq* efadv_cq_from_ibv_cq_ex(ibv_cq_ex*) { return nullptr; }
