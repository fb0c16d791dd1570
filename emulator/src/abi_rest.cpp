// The rest of rdma-core 44's libibverbs ABI (issue 14): the entry points that the field's
// programs and libraries import although the emulator has no kernel behind it. Loading must
// succeed (a BIND_NOW binary, or librdmacm/provider libraries, fail at load time on one missing
// versioned symbol), and every call must either do what rdma-core does or fail cleanly.
//
//  - pure helpers, implemented: rate conversions, the kernel-ABI struct copies librdmacm uses,
//    ibv_init_ah_from_wc, the fork-range calls (fork protection is unneeded here, see there),
//    __ioctl_final_num_attrs, __verbs_log, verbs_init_cq, verbs_open_device (no private data);
//  - the IBVERBS_1.0 compatibility entry points, which take rdma-core's 1.0 object layouts
//    (binaries linked before 2005's 1.1): no 1.0 device list can be made, so each fails
//    (NULL or an error with errno EOPNOTSUPP);
//  - the IBVERBS_PRIVATE_34 provider interface (ibv_cmd_*, execute_ioctl, driver
//    registration, context allocation): those speak to the kernel's uverbs fd, which the
//    emulator does not have, so they fail with EOPNOTSUPP; registering a provider is ignored
//    with a message, since the emulator's devices are its own.
//
// Prototypes: rdma-core 44's <infiniband/verbs.h> (installed) and libibverbs/driver.h,
// marshall.h (not installed by Debian; declared here with the same C parameter lists, the
// provider-private struct types left incomplete since nothing here looks inside them).

#include <infiniband/sa.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_ioctl_cmds.h>

#include <arpa/inet.h>

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))
// An entry point under a non-default version (name@NODE): the C name is internal, the
// versioned alias is what the loader binds old binaries to.
#define EMU_COMPAT(sym) extern "C" __attribute__((visibility("default"), symver(sym)))

namespace {

// Fails the way rdma-core's verbs report a missing feature: errno set, and the value the
// caller's convention expects returned by the caller below.
int unsupported() {
  errno = EOPNOTSUPP;
  return EOPNOTSUPP;
}

template <class T>
T* unsupported_ptr() {
  errno = EOPNOTSUPP;
  return nullptr;
}

}  // namespace

// ---------------------------------------------------------------- IBVERBS_1.0 / 1.1 helpers

// rdma-core 44: const char *ibv_get_sysfs_path(void), the sysfs root, "$SYSFS_PATH" without
// trailing slashes or "/sys". The emulator's own sysfs-like trees are per device (ibdev_path);
// the root is the machine's, which is also where ibv_read_sysfs_file answers for our devices.
EMU_EXPORT const char* ibv_get_sysfs_path(void) {
  static std::string path;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("SYSFS_PATH");
    path = env && *env ? env : "/sys";
    while (path.size() > 1 && path.back() == '/') path.pop_back();
  });
  return path.c_str();
}

namespace {
// IBTA rates and the data rates rdma-core reports for them, in Mbit/s (the FDR, EDR, HDR,
// NDR and XDR entries are their 64b/66b and PAM4 line rates, not the nominal Gbit/s).
struct RateMbps {
  ibv_rate rate;
  int mbps;
};
constexpr RateMbps kRates[] = {
    {IBV_RATE_2_5_GBPS, 2500},    {IBV_RATE_5_GBPS, 5000},       {IBV_RATE_10_GBPS, 10000},
    {IBV_RATE_20_GBPS, 20000},    {IBV_RATE_30_GBPS, 30000},     {IBV_RATE_40_GBPS, 40000},
    {IBV_RATE_60_GBPS, 60000},    {IBV_RATE_80_GBPS, 80000},     {IBV_RATE_120_GBPS, 120000},
    {IBV_RATE_14_GBPS, 14062},    {IBV_RATE_56_GBPS, 56250},     {IBV_RATE_112_GBPS, 112500},
    {IBV_RATE_168_GBPS, 168750},  {IBV_RATE_25_GBPS, 25781},     {IBV_RATE_100_GBPS, 103125},
    {IBV_RATE_200_GBPS, 206250},  {IBV_RATE_300_GBPS, 309375},   {IBV_RATE_28_GBPS, 28125},
    {IBV_RATE_50_GBPS, 53125},    {IBV_RATE_400_GBPS, 425000},   {IBV_RATE_600_GBPS, 637500},
    {IBV_RATE_800_GBPS, 850000},  {IBV_RATE_1200_GBPS, 1275000},
};
}  // namespace

EMU_EXPORT int ibv_rate_to_mbps(ibv_rate rate) {
  for (const auto& r : kRates)
    if (r.rate == rate) return r.mbps;
  return -1;
}

EMU_EXPORT ibv_rate mbps_to_ibv_rate(int mbps) {
  for (const auto& r : kRates)
    if (r.mbps == mbps) return r.rate;
  return IBV_RATE_MAX;
}

// Kernel-ABI struct copies (rdma-core's marshall.h), used by librdmacm on the events the
// kernel's rdma_cm hands over. Field by field: the kernel structs differ in order and width.
EMU_EXPORT void ibv_copy_ah_attr_from_kern(ibv_ah_attr* dst, ib_uverbs_ah_attr* src) {
  std::memcpy(dst->grh.dgid.raw, src->grh.dgid, sizeof dst->grh.dgid);
  dst->grh.flow_label = src->grh.flow_label;
  dst->grh.sgid_index = src->grh.sgid_index;
  dst->grh.hop_limit = src->grh.hop_limit;
  dst->grh.traffic_class = src->grh.traffic_class;
  dst->dlid = src->dlid;
  dst->sl = src->sl;
  dst->src_path_bits = src->src_path_bits;
  dst->static_rate = src->static_rate;
  dst->is_global = src->is_global;
  dst->port_num = src->port_num;
}

EMU_EXPORT void ibv_copy_qp_attr_from_kern(ibv_qp_attr* dst, ib_uverbs_qp_attr* src) {
  dst->cur_qp_state = static_cast<ibv_qp_state>(src->cur_qp_state);
  dst->path_mtu = static_cast<ibv_mtu>(src->path_mtu);
  dst->path_mig_state = static_cast<ibv_mig_state>(src->path_mig_state);
  dst->qkey = src->qkey;
  dst->rq_psn = src->rq_psn;
  dst->sq_psn = src->sq_psn;
  dst->dest_qp_num = src->dest_qp_num;
  dst->qp_access_flags = static_cast<int>(src->qp_access_flags);
  dst->cap.max_send_wr = src->max_send_wr;
  dst->cap.max_recv_wr = src->max_recv_wr;
  dst->cap.max_send_sge = src->max_send_sge;
  dst->cap.max_recv_sge = src->max_recv_sge;
  dst->cap.max_inline_data = src->max_inline_data;
  ibv_copy_ah_attr_from_kern(&dst->ah_attr, &src->ah_attr);
  ibv_copy_ah_attr_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);
  dst->pkey_index = src->pkey_index;
  dst->alt_pkey_index = src->alt_pkey_index;
  dst->en_sqd_async_notify = src->en_sqd_async_notify;
  dst->sq_draining = src->sq_draining;
  dst->max_rd_atomic = src->max_rd_atomic;
  dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
  dst->min_rnr_timer = src->min_rnr_timer;
  dst->port_num = src->port_num;
  dst->timeout = src->timeout;
  dst->retry_cnt = src->retry_cnt;
  dst->rnr_retry = src->rnr_retry;
  dst->alt_port_num = src->alt_port_num;
  dst->alt_timeout = src->alt_timeout;
  dst->qp_state = static_cast<ibv_qp_state>(src->qp_state);
}

EMU_EXPORT void ibv_copy_path_rec_from_kern(ibv_sa_path_rec* dst, ib_user_path_rec* src) {
  std::memcpy(dst->dgid.raw, src->dgid, sizeof dst->dgid);
  std::memcpy(dst->sgid.raw, src->sgid, sizeof dst->sgid);
  dst->dlid = src->dlid;
  dst->slid = src->slid;
  dst->raw_traffic = static_cast<int>(src->raw_traffic);
  dst->flow_label = src->flow_label;
  dst->hop_limit = src->hop_limit;
  dst->traffic_class = src->traffic_class;
  dst->reversible = static_cast<int>(src->reversible);
  dst->numb_path = src->numb_path;
  dst->pkey = src->pkey;
  dst->sl = src->sl;
  dst->mtu_selector = src->mtu_selector;
  dst->mtu = static_cast<uint8_t>(src->mtu);
  dst->rate_selector = src->rate_selector;
  dst->rate = src->rate;
  dst->packet_life_time_selector = src->packet_life_time_selector;
  dst->packet_life_time = src->packet_life_time;
  dst->preference = src->preference;
}

EMU_EXPORT void ibv_copy_path_rec_to_kern(ib_user_path_rec* dst, ibv_sa_path_rec* src) {
  std::memcpy(dst->dgid, src->dgid.raw, sizeof dst->dgid);
  std::memcpy(dst->sgid, src->sgid.raw, sizeof dst->sgid);
  dst->dlid = src->dlid;
  dst->slid = src->slid;
  dst->raw_traffic = static_cast<uint32_t>(src->raw_traffic);
  dst->flow_label = src->flow_label;
  dst->hop_limit = src->hop_limit;
  dst->traffic_class = src->traffic_class;
  dst->reversible = static_cast<uint32_t>(src->reversible);
  dst->numb_path = src->numb_path;
  dst->pkey = src->pkey;
  dst->sl = src->sl;
  dst->mtu_selector = src->mtu_selector;
  dst->mtu = src->mtu;
  dst->rate_selector = src->rate_selector;
  dst->rate = src->rate;
  dst->packet_life_time_selector = src->packet_life_time_selector;
  dst->packet_life_time = src->packet_life_time;
  dst->preference = src->preference;
}

// Fork protection: rdma-core madvises registered ranges only after ibv_fork_init set it up,
// and reports success without doing anything otherwise. Here ibv_fork_init has nothing to set
// up (ibv_is_fork_initialized says IBV_FORK_UNNEEDED: the peer reaches this process's memory
// by its pid, so a child's copy-on-write pages never stand in for the parent's), so the
// ranges are left alone, as rdma-core leaves them when fork support is unneeded.
EMU_EXPORT int ibv_dontfork_range(void*, size_t) { return 0; }
EMU_EXPORT int ibv_dofork_range(void*, size_t) { return 0; }

// rdma-core's GID type reading (verbs.cpp): 0 = IB/RoCE v1, 1 = RoCE v2.
extern "C" int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index, int* type);

// The address of the sender of a received UD message, as libibverbs(3) documents it: the
// sender's LID and SL from the completion, and when the completion says a GRH is present, the
// sender's GID (the GRH's source) and our GID index it was sent to (its destination). On an
// Ethernet port a RoCE v2 message over IPv4 carries an IPv4 header in the GRH's last 20
// bytes instead (version 4 there, not 6 in the first nibble), as rdma-core reads it: the GIDs
// are the IPv4-mapped addresses and our index is the RoCE v2 entry of the destination.
EMU_EXPORT int ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh,
                                   ibv_ah_attr* ah_attr) {
  if (!context || !wc || !ah_attr || ((wc->wc_flags & IBV_WC_GRH) && !grh)) {
    errno = EINVAL;
    return -1;
  }
  std::memset(ah_attr, 0, sizeof *ah_attr);
  ah_attr->dlid = wc->slid;
  ah_attr->sl = wc->sl;
  ah_attr->src_path_bits = wc->dlid_path_bits;
  ah_attr->port_num = port_num;
  if (!(wc->wc_flags & IBV_WC_GRH)) return 0;
  ibv_port_attr pa{};
  if (int rc = ibv_query_port(context, port_num, &pa)) {
    errno = rc;
    return -1;
  }
  const uint32_t flow = ntohl(grh->version_tclass_flow);
  const auto* raw = reinterpret_cast<const uint8_t*>(grh);
  const bool ipv4 = pa.link_layer == IBV_LINK_LAYER_ETHERNET && (flow >> 28) != 6 && (raw[20] >> 4) == 4;
  ibv_gid sender{}, dest{};
  if (ipv4) {
    // IPv4 header at byte 20: TOS at +1, source address at +12, destination at +16.
    sender.raw[10] = sender.raw[11] = dest.raw[10] = dest.raw[11] = 0xff;
    std::memcpy(sender.raw + 12, raw + 20 + 12, 4);
    std::memcpy(dest.raw + 12, raw + 20 + 16, 4);
    ah_attr->grh.traffic_class = raw[21];
  } else {
    sender = grh->sgid;
    dest = grh->dgid;
    ah_attr->grh.flow_label = flow & 0xFFFFF;
    ah_attr->grh.traffic_class = static_cast<uint8_t>((flow >> 20) & 0xFF);
  }
  int index = -1;
  for (int i = 0; i < pa.gid_tbl_len && index < 0; ++i) {
    ibv_gid g;
    if (ibv_query_gid(context, port_num, i, &g) != 0 || std::memcmp(&g, &dest, sizeof g) != 0) continue;
    int type = 0;
    if (ipv4 && (ibv_query_gid_type(context, port_num, static_cast<unsigned>(i), &type) != 0 || type != 1)) continue;
    index = i;
  }
  if (index < 0) {
    errno = ENOENT;  // the message was addressed to a GID this port does not hold
    return -1;
  }
  ah_attr->is_global = 1;
  ah_attr->grh.dgid = sender;
  ah_attr->grh.sgid_index = static_cast<uint8_t>(index);
  ah_attr->grh.hop_limit = 0xFF;  // the reply may cross as many routers as the request did
  return 0;
}

// rdma-core resolves the destination MAC and VLAN of a RoCE address through the kernel's
// neighbour table (netlink); emulated ports have no netdev in the kernel.
EMU_EXPORT int ibv_resolve_eth_l2_from_gid(ibv_context*, ibv_ah_attr*, uint8_t[6], uint16_t*) {
  unsupported();
  return -1;
}

// IBVERBS_1.1, non-default: the pre-2017 provider registration. rdma-core 44 keeps it only to
// tell an old provider that it is no longer supported; so does the emulator.
using legacy_driver_init = void* (*)(const char*, int);
EMU_COMPAT("ibv_register_driver@IBVERBS_1.1") void emu_register_driver_1_1(const char* name, legacy_driver_init) {
  std::fprintf(stderr, "tbverbs-emu: provider %s uses the pre-rdma-core driver interface; ignored\n",
               name ? name : "(unnamed)");
}

// ---------------------------------------------------------------- IBVERBS_1.0 compatibility

// Every 1.0 object comes from the 1.0 device list, which cannot be made (it would need
// rdma-core's 1.0 wrapper layouts around every object); the rest are unreachable with a valid
// object, and answer an error instead of reading one.
struct ibv_device_1_0;
struct ibv_context_1_0;
struct ibv_pd_1_0;
struct ibv_mr_1_0;
struct ibv_cq_1_0;
struct ibv_qp_1_0;
struct ibv_srq_1_0;
struct ibv_ah_1_0;
struct ibv_comp_channel;

EMU_COMPAT("ibv_get_device_list@IBVERBS_1.0") ibv_device_1_0** emu_get_device_list_1_0(int* num) {
  if (num) *num = 0;
  return unsupported_ptr<ibv_device_1_0*>();
}
EMU_COMPAT("ibv_free_device_list@IBVERBS_1.0") void emu_free_device_list_1_0(ibv_device_1_0**) {}
EMU_COMPAT("ibv_get_device_name@IBVERBS_1.0") const char* emu_get_device_name_1_0(ibv_device_1_0*) {
  return unsupported_ptr<const char>();
}
EMU_COMPAT("ibv_get_device_guid@IBVERBS_1.0") __be64 emu_get_device_guid_1_0(ibv_device_1_0*) {
  unsupported();
  return 0;
}
EMU_COMPAT("ibv_open_device@IBVERBS_1.0") ibv_context_1_0* emu_open_device_1_0(ibv_device_1_0*) {
  return unsupported_ptr<ibv_context_1_0>();
}
EMU_COMPAT("ibv_close_device@IBVERBS_1.0") int emu_close_device_1_0(ibv_context_1_0*) { return unsupported(); }
EMU_COMPAT("ibv_get_async_event@IBVERBS_1.0") int emu_get_async_event_1_0(ibv_context_1_0*, void*) {
  unsupported();
  return -1;
}
EMU_COMPAT("ibv_ack_async_event@IBVERBS_1.0") void emu_ack_async_event_1_0(void*) {}
EMU_COMPAT("ibv_query_device@IBVERBS_1.0") int emu_query_device_1_0(ibv_context_1_0*, ibv_device_attr*) {
  return unsupported();
}
EMU_COMPAT("ibv_query_port@IBVERBS_1.0") int emu_query_port_1_0(ibv_context_1_0*, uint8_t, ibv_port_attr*) {
  return unsupported();
}
EMU_COMPAT("ibv_query_gid@IBVERBS_1.0") int emu_query_gid_1_0(ibv_context_1_0*, uint8_t, int, ibv_gid*) {
  unsupported();
  return -1;
}
EMU_COMPAT("ibv_query_pkey@IBVERBS_1.0") int emu_query_pkey_1_0(ibv_context_1_0*, uint8_t, int, __be16*) {
  unsupported();
  return -1;
}
EMU_COMPAT("ibv_alloc_pd@IBVERBS_1.0") ibv_pd_1_0* emu_alloc_pd_1_0(ibv_context_1_0*) {
  return unsupported_ptr<ibv_pd_1_0>();
}
EMU_COMPAT("ibv_dealloc_pd@IBVERBS_1.0") int emu_dealloc_pd_1_0(ibv_pd_1_0*) { return unsupported(); }
EMU_COMPAT("ibv_reg_mr@IBVERBS_1.0") ibv_mr_1_0* emu_reg_mr_1_0(ibv_pd_1_0*, void*, size_t, int) {
  return unsupported_ptr<ibv_mr_1_0>();
}
EMU_COMPAT("ibv_dereg_mr@IBVERBS_1.0") int emu_dereg_mr_1_0(ibv_mr_1_0*) { return unsupported(); }
EMU_COMPAT("ibv_create_cq@IBVERBS_1.0")
ibv_cq_1_0* emu_create_cq_1_0(ibv_context_1_0*, int, void*, ibv_comp_channel*, int) {
  return unsupported_ptr<ibv_cq_1_0>();
}
EMU_COMPAT("ibv_resize_cq@IBVERBS_1.0") int emu_resize_cq_1_0(ibv_cq_1_0*, int) { return unsupported(); }
EMU_COMPAT("ibv_destroy_cq@IBVERBS_1.0") int emu_destroy_cq_1_0(ibv_cq_1_0*) { return unsupported(); }
EMU_COMPAT("ibv_get_cq_event@IBVERBS_1.0") int emu_get_cq_event_1_0(ibv_comp_channel*, ibv_cq_1_0**, void**) {
  unsupported();
  return -1;
}
EMU_COMPAT("ibv_ack_cq_events@IBVERBS_1.0") void emu_ack_cq_events_1_0(ibv_cq_1_0*, unsigned int) {}
EMU_COMPAT("ibv_create_srq@IBVERBS_1.0") ibv_srq_1_0* emu_create_srq_1_0(ibv_pd_1_0*, ibv_srq_init_attr*) {
  return unsupported_ptr<ibv_srq_1_0>();
}
EMU_COMPAT("ibv_modify_srq@IBVERBS_1.0") int emu_modify_srq_1_0(ibv_srq_1_0*, ibv_srq_attr*, int) {
  return unsupported();
}
EMU_COMPAT("ibv_query_srq@IBVERBS_1.0") int emu_query_srq_1_0(ibv_srq_1_0*, ibv_srq_attr*) { return unsupported(); }
EMU_COMPAT("ibv_destroy_srq@IBVERBS_1.0") int emu_destroy_srq_1_0(ibv_srq_1_0*) { return unsupported(); }
EMU_COMPAT("ibv_create_qp@IBVERBS_1.0") ibv_qp_1_0* emu_create_qp_1_0(ibv_pd_1_0*, void*) {
  return unsupported_ptr<ibv_qp_1_0>();
}
EMU_COMPAT("ibv_query_qp@IBVERBS_1.0") int emu_query_qp_1_0(ibv_qp_1_0*, ibv_qp_attr*, int, void*) {
  return unsupported();
}
EMU_COMPAT("ibv_modify_qp@IBVERBS_1.0") int emu_modify_qp_1_0(ibv_qp_1_0*, ibv_qp_attr*, int) {
  return unsupported();
}
EMU_COMPAT("ibv_destroy_qp@IBVERBS_1.0") int emu_destroy_qp_1_0(ibv_qp_1_0*) { return unsupported(); }
EMU_COMPAT("ibv_create_ah@IBVERBS_1.0") ibv_ah_1_0* emu_create_ah_1_0(ibv_pd_1_0*, ibv_ah_attr*) {
  return unsupported_ptr<ibv_ah_1_0>();
}
EMU_COMPAT("ibv_destroy_ah@IBVERBS_1.0") int emu_destroy_ah_1_0(ibv_ah_1_0*) { return unsupported(); }
EMU_COMPAT("ibv_attach_mcast@IBVERBS_1.0") int emu_attach_mcast_1_0(ibv_qp_1_0*, ibv_gid*, uint16_t) {
  return unsupported();
}
EMU_COMPAT("ibv_detach_mcast@IBVERBS_1.0") int emu_detach_mcast_1_0(ibv_qp_1_0*, ibv_gid*, uint16_t) {
  return unsupported();
}

// ---------------------------------------------------------------- IBVERBS_PRIVATE_34

// The provider-private types of rdma-core's driver.h, opaque here.
struct verbs_device;
struct verbs_device_ops;
struct verbs_context_ops;
struct verbs_sysfs_dev;
struct verbs_mr;
struct verbs_cq;
struct verbs_qp;
struct verbs_srq;
struct verbs_xrcd;
struct verbs_dm;
struct verbs_counters;
struct verbs_flow_action;
struct ibv_command_buffer;

// rdma-core's variable: may a destroy after the device was disassociated succeed? Only
// providers read it; the emulator's devices are never disassociated.
extern "C" {
__attribute__((visibility("default"))) bool verbs_allow_disassociate_destroy = false;
}

// A provider library loaded beside the emulator (rdma-core's libmlx5, say) registers itself
// from its constructor; the emulator's device list is the fabric's, so the provider is not used.
EMU_EXPORT void verbs_register_driver_34(const verbs_device_ops* ops) {
  // struct verbs_device_ops starts with the provider's name (driver.h).
  const char* name = ops ? *reinterpret_cast<const char* const*>(ops) : nullptr;
  std::fprintf(stderr, "tbverbs-emu: provider %s not used: the emulator's devices are the fabric's\n",
               name ? name : "(unnamed)");
}

EMU_EXPORT void* _verbs_init_and_alloc_context(ibv_device*, int, size_t, verbs_context*, uint32_t) {
  return unsupported_ptr<void>();
}
// Only ever handed a context that _verbs_init_and_alloc_context made, which it never does.
EMU_EXPORT void verbs_uninit_context(verbs_context*) {}
EMU_EXPORT void verbs_set_ops(verbs_context*, const verbs_context_ops*) {}

// A provider's open with its private data: our devices take none, so without it this is
// ibv_open_device.
EMU_EXPORT ibv_context* verbs_open_device(ibv_device* device, void* private_data) {
  if (private_data) return unsupported_ptr<ibv_context>();
  return ibv_open_device(device);
}

// The common part of a provider's CQ (rdma-core's verbs_init_cq): its owner and event counts.
EMU_EXPORT void verbs_init_cq(ibv_cq* cq, ibv_context* context, ibv_comp_channel* channel, void* cq_context) {
  cq->context = context;
  cq->channel = channel;
  cq->cq_context = cq_context;
  cq->comp_events_completed = 0;
  cq->async_events_completed = 0;
  pthread_mutex_init(&cq->mutex, nullptr);
  pthread_cond_init(&cq->cond, nullptr);
  if (channel) __atomic_add_fetch(&channel->refcnt, 1, __ATOMIC_RELAXED);
}

// rdma-core's provider logging: to stderr when VERBS_LOG_LEVEL (0 none .. 4 debug) admits
// the message's level (rdma-core can also log to VERBS_LOG_FILE; stderr is enough here).
EMU_EXPORT void __verbs_log(verbs_context*, uint32_t level, const char* fmt, ...) {
  static const long threshold = [] {
    const char* env = std::getenv("VERBS_LOG_LEVEL");
    return env ? std::strtol(env, nullptr, 0) : 0L;
  }();
  if (!fmt || static_cast<long>(level) > threshold) return;
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
}

// The layout of the head of rdma-core's struct ibv_command_buffer (cmd_ioctl.h): the link to
// the next buffer, then the attribute cursor, then (after bookkeeping) the ioctl header whose
// attrs[] the cursor walks. Only what the count needs.
struct CommandBufferHead {
  CommandBufferHead* next;
  ib_uverbs_attr* next_attr;
  ib_uverbs_attr* last_attr;
  uint8_t uhw_in_idx, uhw_out_idx, uhw_in_headroom_dwords, uhw_out_headroom_dwords;
  uint8_t flags;
  ib_uverbs_ioctl_hdr hdr;
};

// The attributes an ioctl would carry: the caller's plus those of every linked buffer.
EMU_EXPORT unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, ibv_command_buffer* link) {
  for (auto* b = reinterpret_cast<CommandBufferHead*>(link); b; b = b->next)
    num_attrs += static_cast<unsigned>(b->next_attr - b->hdr.attrs);
  return num_attrs;
}

EMU_EXPORT int execute_ioctl(ibv_context*, ibv_command_buffer*) { return unsupported(); }

EMU_EXPORT int ibv_read_ibdev_sysfs_file(char* buf, size_t size, verbs_sysfs_dev*, const char*, ...) {
  if (buf && size) buf[0] = '\0';
  unsupported();
  return -1;
}

// The kernel commands of rdma-core's providers: no uverbs fd, so none can be issued. They
// return the errno value as rdma-core's do (ibv_cmd_poll_cq: -1, like poll_cq).
#define EMU_CMD(name, ...) \
  EMU_EXPORT int name(__VA_ARGS__) { return unsupported(); }
EMU_CMD(ibv_cmd_get_context, verbs_context*, void*, size_t, void*, size_t)
EMU_CMD(ibv_cmd_query_context, ibv_context*, ibv_command_buffer*)
EMU_CMD(ibv_cmd_create_flow_action_esp, ibv_context*, ibv_flow_action_esp_attr*, verbs_flow_action*,
        ibv_command_buffer*)
EMU_CMD(ibv_cmd_modify_flow_action_esp, verbs_flow_action*, ibv_flow_action_esp_attr*, ibv_command_buffer*)
EMU_CMD(ibv_cmd_query_device_any, ibv_context*, const ibv_query_device_ex_input*, ibv_device_attr_ex*, size_t,
        void*, size_t*)
EMU_CMD(ibv_cmd_query_port, ibv_context*, uint8_t, ibv_port_attr*, void*, size_t)
EMU_CMD(ibv_cmd_alloc_pd, ibv_context*, ibv_pd*, void*, size_t, void*, size_t)
EMU_CMD(ibv_cmd_dealloc_pd, ibv_pd*)
EMU_CMD(ibv_cmd_open_xrcd, ibv_context*, verbs_xrcd*, int, ibv_xrcd_init_attr*, void*, size_t, void*, size_t)
EMU_CMD(ibv_cmd_close_xrcd, verbs_xrcd*)
EMU_CMD(ibv_cmd_reg_mr, ibv_pd*, void*, size_t, uint64_t, int, verbs_mr*, void*, size_t, void*, size_t)
EMU_CMD(ibv_cmd_rereg_mr, verbs_mr*, uint32_t, void*, size_t, uint64_t, int, ibv_pd*, void*, size_t, void*, size_t)
EMU_CMD(ibv_cmd_dereg_mr, verbs_mr*)
EMU_CMD(ibv_cmd_query_mr, ibv_pd*, verbs_mr*, uint32_t)
EMU_CMD(ibv_cmd_advise_mr, ibv_pd*, ibv_advise_mr_advice, uint32_t, ibv_sge*, uint32_t)
EMU_CMD(ibv_cmd_reg_dmabuf_mr, ibv_pd*, uint64_t, size_t, uint64_t, int, int, verbs_mr*)
EMU_CMD(ibv_cmd_alloc_mw, ibv_pd*, ibv_mw_type, ibv_mw*, void*, size_t, void*, size_t)
EMU_CMD(ibv_cmd_dealloc_mw, ibv_mw*)
EMU_CMD(ibv_cmd_create_cq, ibv_context*, int, ibv_comp_channel*, int, ibv_cq*, void*, size_t, void*, size_t)
EMU_CMD(ibv_cmd_create_cq_ex, ibv_context*, const ibv_cq_init_attr_ex*, verbs_cq*, void*, size_t, void*, size_t,
        uint32_t)
EMU_CMD(ibv_cmd_req_notify_cq, ibv_cq*, int)
EMU_CMD(ibv_cmd_resize_cq, ibv_cq*, int, void*, size_t, void*, size_t)
EMU_CMD(ibv_cmd_destroy_cq, ibv_cq*)
EMU_CMD(ibv_cmd_modify_cq, ibv_cq*, ibv_modify_cq_attr*, void*, size_t)
EMU_CMD(ibv_cmd_create_srq, ibv_pd*, ibv_srq*, ibv_srq_init_attr*, void*, size_t, void*, size_t)
EMU_CMD(ibv_cmd_create_srq_ex, ibv_context*, verbs_srq*, ibv_srq_init_attr_ex*, void*, size_t, void*, size_t)
EMU_CMD(ibv_cmd_modify_srq, ibv_srq*, ibv_srq_attr*, int, void*, size_t)
EMU_CMD(ibv_cmd_query_srq, ibv_srq*, ibv_srq_attr*, void*, size_t)
EMU_CMD(ibv_cmd_destroy_srq, ibv_srq*)
EMU_CMD(ibv_cmd_create_qp, ibv_pd*, ibv_qp*, ibv_qp_init_attr*, void*, size_t, void*, size_t)
EMU_CMD(ibv_cmd_create_qp_ex, ibv_context*, verbs_qp*, ibv_qp_init_attr_ex*, void*, size_t, void*, size_t)
EMU_CMD(ibv_cmd_create_qp_ex2, ibv_context*, verbs_qp*, ibv_qp_init_attr_ex*, void*, size_t, void*, size_t)
EMU_CMD(ibv_cmd_open_qp, ibv_context*, verbs_qp*, int, ibv_qp_open_attr*, void*, size_t, void*, size_t)
EMU_CMD(ibv_cmd_query_qp, ibv_qp*, ibv_qp_attr*, int, ibv_qp_init_attr*, void*, size_t)
EMU_CMD(ibv_cmd_modify_qp, ibv_qp*, ibv_qp_attr*, int, void*, size_t)
EMU_CMD(ibv_cmd_modify_qp_ex, ibv_qp*, ibv_qp_attr*, int, void*, size_t, void*, size_t)
EMU_CMD(ibv_cmd_destroy_qp, ibv_qp*)
EMU_CMD(ibv_cmd_post_send, ibv_qp*, ibv_send_wr*, ibv_send_wr**)
EMU_CMD(ibv_cmd_post_recv, ibv_qp*, ibv_recv_wr*, ibv_recv_wr**)
EMU_CMD(ibv_cmd_post_srq_recv, ibv_srq*, ibv_recv_wr*, ibv_recv_wr**)
EMU_CMD(ibv_cmd_create_ah, ibv_pd*, ibv_ah*, ibv_ah_attr*, void*, size_t)
EMU_CMD(ibv_cmd_destroy_ah, ibv_ah*)
EMU_CMD(ibv_cmd_attach_mcast, ibv_qp*, const ibv_gid*, uint16_t)
EMU_CMD(ibv_cmd_detach_mcast, ibv_qp*, const ibv_gid*, uint16_t)
EMU_CMD(ibv_cmd_create_flow, ibv_qp*, ibv_flow*, ibv_flow_attr*, void*, size_t)
EMU_CMD(ibv_cmd_destroy_flow, ibv_flow*)
EMU_CMD(ibv_cmd_create_wq, ibv_context*, ibv_wq_init_attr*, ibv_wq*, void*, size_t, void*, size_t)
EMU_CMD(ibv_cmd_destroy_flow_action, verbs_flow_action*)
EMU_CMD(ibv_cmd_modify_wq, ibv_wq*, ibv_wq_attr*, void*, size_t)
EMU_CMD(ibv_cmd_destroy_wq, ibv_wq*)
EMU_CMD(ibv_cmd_create_rwq_ind_table, ibv_context*, ibv_rwq_ind_table_init_attr*, ibv_rwq_ind_table*, void*, size_t)
EMU_CMD(ibv_cmd_destroy_rwq_ind_table, ibv_rwq_ind_table*)
EMU_CMD(ibv_cmd_create_counters, ibv_context*, ibv_counters_init_attr*, verbs_counters*, ibv_command_buffer*)
EMU_CMD(ibv_cmd_destroy_counters, verbs_counters*)
EMU_CMD(ibv_cmd_read_counters, verbs_counters*, uint64_t*, uint32_t, uint32_t, ibv_command_buffer*)
EMU_CMD(ibv_cmd_alloc_dm, ibv_context*, const ibv_alloc_dm_attr*, verbs_dm*, ibv_command_buffer*)
EMU_CMD(ibv_cmd_free_dm, verbs_dm*)
EMU_CMD(ibv_cmd_reg_dm_mr, ibv_pd*, verbs_dm*, uint64_t, size_t, unsigned int, verbs_mr*, ibv_command_buffer*)
#undef EMU_CMD

EMU_EXPORT int ibv_cmd_poll_cq(ibv_cq*, int, ibv_wc*) {
  unsupported();
  return -1;
}
