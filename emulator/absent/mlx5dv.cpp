// libmlx5.so.1 for the emulated fabric: mlx5 direct verbs are not modelled.
//
// perftest links libmlx5 and libefa, and pyverbs' mlx5 modules (which rdma-core's Python tests
// import through their shared helpers) need these entry points at load. The real provider
// libraries bind to rdma-core's private ABI (IBVERBS_PRIVATE_34), which the emulator does not
// carry, so these stand in for them: no fabric device is an mlx5 one, and each entry point says
// so (NULL with errno EOPNOTSUPP, EOPNOTSUPP, false), as the real library answers for a
// device of another vendor. The prototypes are those of rdma-core 44's <infiniband/mlx5dv.h>,
// which is included so that any mismatch fails to compile; mlx5dv.map gives each its
// version node.
#include <infiniband/mlx5dv.h>

#include <cerrno>

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

// The parameters keep the header's names for reading; none is used.
#pragma GCC diagnostic ignored "-Wunused-parameter"

EMU_EXPORT int _mlx5dv_mkey_check(struct mlx5dv_mkey *mkey, struct mlx5dv_mkey_err *err_info, size_t err_info_size) { return EOPNOTSUPP; }
EMU_EXPORT int _mlx5dv_query_port(struct ibv_context *context, uint32_t port_num, struct mlx5dv_port *info, size_t info_len) { return EOPNOTSUPP; }
EMU_EXPORT struct mlx5dv_var * mlx5dv_alloc_var(struct ibv_context *context, uint32_t flags) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct ibv_cq_ex * mlx5dv_create_cq(struct ibv_context *context, struct ibv_cq_init_attr_ex *cq_attr, struct mlx5dv_cq_init_attr *mlx5_cq_attr) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct ibv_flow * mlx5dv_create_flow(struct mlx5dv_flow_matcher *matcher, struct mlx5dv_flow_match_parameters *match_value, size_t num_actions, struct mlx5dv_flow_action_attr actions_attr[]) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct ibv_flow_action * mlx5dv_create_flow_action_packet_reformat(struct ibv_context *ctx, size_t data_sz, void *data, enum mlx5dv_flow_action_packet_reformat_type reformat_type, enum mlx5dv_flow_table_type ft_type) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_flow_matcher * mlx5dv_create_flow_matcher(struct ibv_context *context, struct mlx5dv_flow_matcher_attr *matcher_attr) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_mkey * mlx5dv_create_mkey(struct mlx5dv_mkey_init_attr *mkey_init_attr) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct ibv_qp * mlx5dv_create_qp(struct ibv_context *context, struct ibv_qp_init_attr_ex *qp_attr, struct mlx5dv_qp_init_attr *mlx5_qp_attr) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int mlx5dv_crypto_login(struct ibv_context *context, struct mlx5dv_crypto_login_attr *login_attr) { return EOPNOTSUPP; }
EMU_EXPORT struct mlx5dv_crypto_login_obj * mlx5dv_crypto_login_create(struct ibv_context *context, struct mlx5dv_crypto_login_attr_ex *login_attr) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int mlx5dv_crypto_login_destroy(struct mlx5dv_crypto_login_obj *crypto_login) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_crypto_login_query(struct mlx5dv_crypto_login_obj *crypto_login, struct mlx5dv_crypto_login_query_attr *query_attr) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_crypto_login_query_state(struct ibv_context *context, enum mlx5dv_crypto_login_state *state) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_crypto_logout(struct ibv_context *context) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_dci_stream_id_reset(struct ibv_qp *qp, uint16_t stream_id) { return EOPNOTSUPP; }
EMU_EXPORT struct mlx5dv_dek * mlx5dv_dek_create(struct ibv_context *context, struct mlx5dv_dek_init_attr *init_attr) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int mlx5dv_dek_destroy(struct mlx5dv_dek *dek) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_dek_query(struct mlx5dv_dek *dek, struct mlx5dv_dek_attr *attr) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_destroy_flow_matcher(struct mlx5dv_flow_matcher *matcher) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_destroy_mkey(struct mlx5dv_mkey *mkey) { return EOPNOTSUPP; }
EMU_EXPORT struct mlx5dv_devx_msi_vector * mlx5dv_devx_alloc_msi_vector(struct ibv_context *ibctx) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_devx_uar * mlx5dv_devx_alloc_uar(struct ibv_context *context, uint32_t flags) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_devx_eq * mlx5dv_devx_create_eq(struct ibv_context *ibctx, const void *in, size_t inlen, void *out, size_t outlen) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int mlx5dv_devx_destroy_eq(struct mlx5dv_devx_eq *eq) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_devx_free_msi_vector(struct mlx5dv_devx_msi_vector *msi) { return EOPNOTSUPP; }
EMU_EXPORT void mlx5dv_devx_free_uar(struct mlx5dv_devx_uar *devx_uar) {}
EMU_EXPORT int mlx5dv_devx_general_cmd(struct ibv_context *context, const void *in, size_t inlen, void *out, size_t outlen) { return EOPNOTSUPP; }
EMU_EXPORT struct mlx5dv_devx_obj * mlx5dv_devx_obj_create(struct ibv_context *context, const void *in, size_t inlen, void *out, size_t outlen) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int mlx5dv_devx_obj_destroy(struct mlx5dv_devx_obj *obj) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_devx_obj_modify(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, void *out, size_t outlen) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_devx_obj_query(struct mlx5dv_devx_obj *obj, const void *in, size_t inlen, void *out, size_t outlen) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_devx_query_eqn(struct ibv_context *context, uint32_t vector, uint32_t *eqn) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_devx_umem_dereg(struct mlx5dv_devx_umem *umem) { return EOPNOTSUPP; }
EMU_EXPORT struct mlx5dv_devx_umem * mlx5dv_devx_umem_reg(struct ibv_context *ctx, void *addr, size_t size, uint32_t access) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_devx_umem * mlx5dv_devx_umem_reg_ex(struct ibv_context *ctx, struct mlx5dv_devx_umem_in *umem_in) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT void * mlx5dv_dm_map_op_addr(struct ibv_dm *dm, uint8_t op) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_dr_action * mlx5dv_dr_action_create_default_miss(void) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_dr_action * mlx5dv_dr_action_create_dest_array(struct mlx5dv_dr_domain *domain, size_t num_dest, struct mlx5dv_dr_action_dest_attr *dests[]) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_dr_action * mlx5dv_dr_action_create_dest_devx_tir(struct mlx5dv_devx_obj *devx_obj) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_dr_action * mlx5dv_dr_action_create_dest_ib_port(struct mlx5dv_dr_domain *domain, uint32_t ib_port) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_dr_action * mlx5dv_dr_action_create_dest_ibv_qp(struct ibv_qp *ibqp) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_dr_action * mlx5dv_dr_action_create_dest_table(struct mlx5dv_dr_table *table) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_dr_action * mlx5dv_dr_action_create_dest_vport(struct mlx5dv_dr_domain *domain, uint32_t vport) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_dr_action * mlx5dv_dr_action_create_drop(void) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_dr_action * mlx5dv_dr_action_create_flow_counter(struct mlx5dv_devx_obj *devx_obj, uint32_t offset) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_dr_action * mlx5dv_dr_action_create_flow_sampler(struct mlx5dv_dr_flow_sampler_attr *attr) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_dr_action * mlx5dv_dr_action_create_modify_header(struct mlx5dv_dr_domain *domain, uint32_t flags, size_t actions_sz, __be64 actions[]) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_dr_action * mlx5dv_dr_action_create_packet_reformat(struct mlx5dv_dr_domain *domain, uint32_t flags, enum mlx5dv_flow_action_packet_reformat_type reformat_type, size_t data_sz, void *data) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_dr_action * mlx5dv_dr_action_create_pop_vlan(void) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_dr_action * mlx5dv_dr_action_create_push_vlan(struct mlx5dv_dr_domain *domain, __be32 vlan_hdr) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_dr_action * mlx5dv_dr_action_create_tag(uint32_t tag_value) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int mlx5dv_dr_action_destroy(struct mlx5dv_dr_action *action) { return EOPNOTSUPP; }
EMU_EXPORT void mlx5dv_dr_domain_allow_duplicate_rules(struct mlx5dv_dr_domain *domain, bool allow) {}
EMU_EXPORT struct mlx5dv_dr_domain * mlx5dv_dr_domain_create(struct ibv_context *ctx, enum mlx5dv_dr_domain_type type) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int mlx5dv_dr_domain_destroy(struct mlx5dv_dr_domain *domain) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_dr_domain_sync(struct mlx5dv_dr_domain *domain, uint32_t flags) { return EOPNOTSUPP; }
EMU_EXPORT struct mlx5dv_dr_matcher * mlx5dv_dr_matcher_create(struct mlx5dv_dr_table *table, uint16_t priority, uint8_t match_criteria_enable, struct mlx5dv_flow_match_parameters *mask) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int mlx5dv_dr_matcher_destroy(struct mlx5dv_dr_matcher *matcher) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_dr_matcher_set_layout(struct mlx5dv_dr_matcher *matcher, struct mlx5dv_dr_matcher_layout *layout) { return EOPNOTSUPP; }
EMU_EXPORT struct mlx5dv_dr_rule * mlx5dv_dr_rule_create(struct mlx5dv_dr_matcher *matcher, struct mlx5dv_flow_match_parameters *value, size_t num_actions, struct mlx5dv_dr_action *actions[]) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int mlx5dv_dr_rule_destroy(struct mlx5dv_dr_rule *rule) { return EOPNOTSUPP; }
EMU_EXPORT struct mlx5dv_dr_table * mlx5dv_dr_table_create(struct mlx5dv_dr_domain *domain, uint32_t level) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int mlx5dv_dr_table_destroy(struct mlx5dv_dr_table *table) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_dump_dr_domain(FILE *fout, struct mlx5dv_dr_domain *domain) { return EOPNOTSUPP; }
EMU_EXPORT void mlx5dv_free_var(struct mlx5dv_var *dv_var) {}
EMU_EXPORT int mlx5dv_get_clock_info(struct ibv_context *context, struct mlx5dv_clock_info *clock_info) { return EOPNOTSUPP; }
EMU_EXPORT struct ibv_device ** mlx5dv_get_vfio_device_list(struct mlx5dv_vfio_context_attr *attr) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int mlx5dv_init_obj(struct mlx5dv_obj *obj, uint64_t obj_type) { return EOPNOTSUPP; }
EMU_EXPORT bool mlx5dv_is_supported(struct ibv_device *device) { return false; }
EMU_EXPORT int mlx5dv_map_ah_to_qp(struct ibv_ah *ah, uint32_t qp_num) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_modify_qp_lag_port(struct ibv_qp *qp, uint8_t port_num) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_modify_qp_sched_elem(struct ibv_qp *qp, const struct mlx5dv_sched_leaf *requestor, const struct mlx5dv_sched_leaf *responder) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_modify_qp_udp_sport(struct ibv_qp *qp, uint16_t udp_sport) { return EOPNOTSUPP; }
EMU_EXPORT struct ibv_context * mlx5dv_open_device(struct ibv_device *device, struct mlx5dv_context_attr *attr) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT struct mlx5dv_pp * mlx5dv_pp_alloc(struct ibv_context *context, size_t pp_context_sz, const void *pp_context, uint32_t flags) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT void mlx5dv_pp_free(struct mlx5dv_pp *pp) {}
EMU_EXPORT int mlx5dv_qp_cancel_posted_send_wrs(struct mlx5dv_qp_ex *mqp, uint64_t wr_id) { return EOPNOTSUPP; }
EMU_EXPORT struct mlx5dv_qp_ex * mlx5dv_qp_ex_from_ibv_qp_ex(struct ibv_qp_ex *qp) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int mlx5dv_query_device(struct ibv_context *ctx_in, struct mlx5dv_context *attrs_out) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_query_qp_lag_port(struct ibv_qp *qp, uint8_t *port_num, uint8_t *active_port_num) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_reserved_qpn_alloc(struct ibv_context *ctx, uint32_t *qpn) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_reserved_qpn_dealloc(struct ibv_context *ctx, uint32_t qpn) { return EOPNOTSUPP; }
EMU_EXPORT struct mlx5dv_sched_leaf * mlx5dv_sched_leaf_create(struct ibv_context *context, const struct mlx5dv_sched_attr *sched_attr) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int mlx5dv_sched_leaf_destroy(struct mlx5dv_sched_leaf *leaf) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_sched_leaf_modify(struct mlx5dv_sched_leaf *leaf, const struct mlx5dv_sched_attr *sched_attr) { return EOPNOTSUPP; }
EMU_EXPORT struct mlx5dv_sched_node * mlx5dv_sched_node_create(struct ibv_context *context, const struct mlx5dv_sched_attr *sched_attr) {
  errno = EOPNOTSUPP;
  return nullptr;
}
EMU_EXPORT int mlx5dv_sched_node_destroy(struct mlx5dv_sched_node *node) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_sched_node_modify(struct mlx5dv_sched_node *node, const struct mlx5dv_sched_attr *sched_attr) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_vfio_get_events_fd(struct ibv_context *ibctx) { return EOPNOTSUPP; }
EMU_EXPORT int mlx5dv_vfio_process_events(struct ibv_context *context) { return EOPNOTSUPP; }
