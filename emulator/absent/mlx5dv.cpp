// libmlx5.so.1 for the emulated fabric: mlx5 direct verbs are not modelled.
//
// perftest links libmlx5 and libefa (every import must resolve at load), but it calls their
// functions only for features it found on the device. The real provider libraries bind to
// rdma-core's private ABI (IBVERBS_PRIVATE_34), which the emulator does not carry, so these
// stand in for them: each entry point reports the feature as absent, as on a non-mlx5 device.
#include <infiniband/mlx5dv.h>

#include <cerrno>

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

EMU_EXPORT ibv_context* mlx5dv_open_device(ibv_device*, mlx5dv_context_attr*) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT ibv_qp* mlx5dv_create_qp(ibv_context*, ibv_qp_init_attr_ex*, mlx5dv_qp_init_attr*) {
  errno = EOPNOTSUPP;
  return nullptr;
}
// Only a QP made by mlx5dv_create_qp has the mlx5 view, and none can be made.
EMU_EXPORT mlx5dv_qp_ex* mlx5dv_qp_ex_from_ibv_qp_ex(ibv_qp_ex*) { return nullptr; }
EMU_EXPORT int mlx5dv_devx_general_cmd(ibv_context*, const void*, size_t, void*, size_t) { return EOPNOTSUPP; }
EMU_EXPORT mlx5dv_mkey* mlx5dv_create_mkey(mlx5dv_mkey_init_attr*) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int mlx5dv_destroy_mkey(mlx5dv_mkey*) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_crypto_login(ibv_context*, mlx5dv_crypto_login_attr*) { return EOPNOTSUPP; }
EMU_EXPORT mlx5dv_dek* mlx5dv_dek_create(ibv_context*, mlx5dv_dek_init_attr*) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int mlx5dv_dek_destroy(mlx5dv_dek*) { return EOPNOTSUPP; }
