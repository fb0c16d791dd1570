// Pins tbverbs' own verbs declarations to the literal rdma-core 44 layout on x86-64 Linux/glibc
// (docs/abi.md, "Sizes and offsets"), independently of any installed header, so the
// own declarations are checked even on a machine without libibverbs-dev. Where <infiniband/verbs.h>
// is present the same numbers are asserted for it too, which checks the reference table itself.
// Other platforms (pthread sizes differ, e.g. glibc aarch64 or macOS) report skipped (77).
#include <cstddef>
#include <cstdio>

#include <tbverbs/detail/abi_own.hpp>

#if defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__)

#if __has_include(<infiniband/verbs.h>)
#include <infiniband/verbs.h>
#define TBV_HAVE_VERBS_H 1
#else
#define TBV_HAVE_VERBS_H 0
#endif

namespace own = tbverbs::detail::abi;

#if TBV_HAVE_VERBS_H
#define TBV_PLATFORM_SIZE(T, n) static_assert(sizeof(::T) == (n), "verbs.h sizeof " #T);
#define TBV_PLATFORM_AT(T, M, n) static_assert(offsetof(::T, M) == (n), "verbs.h " #T "." #M);
#else
#define TBV_PLATFORM_SIZE(T, n)
#define TBV_PLATFORM_AT(T, M, n)
#endif
#define TBV_SIZE(T, n)                                                                                       \
  static_assert(sizeof(own::T) == (n), "sizeof " #T);                                                        \
  TBV_PLATFORM_SIZE(T, n)
#define TBV_AT(T, M, n)                                                                                      \
  static_assert(offsetof(own::T, M) == (n), #T "." #M);                                                      \
  TBV_PLATFORM_AT(T, M, n)

TBV_SIZE(ibv_device, 664)
TBV_AT(ibv_device, node_type, 16)
TBV_AT(ibv_device, transport_type, 20)
TBV_AT(ibv_device, name, 24)
TBV_AT(ibv_device, dev_name, 88)
TBV_AT(ibv_device, dev_path, 152)
TBV_AT(ibv_device, ibdev_path, 408)
static_assert(sizeof(own::ibv_device{}.name) == 64 && sizeof(own::ibv_device{}.dev_path) == 256);

TBV_SIZE(ibv_context, 328)
TBV_SIZE(ibv_context_ops, 256)
TBV_AT(ibv_context, device, 0)
TBV_AT(ibv_context, ops, 8)
TBV_AT(ibv_context, cmd_fd, 264)
TBV_AT(ibv_context, async_fd, 268)
TBV_AT(ibv_context, num_comp_vectors, 272)
TBV_AT(ibv_context, mutex, 280)
TBV_AT(ibv_context, abi_compat, 320)
// What verbs.h's inline ibv_poll_cq / ibv_req_notify_cq / ibv_post_srq_recv / ibv_post_send /
// ibv_post_recv read: ctx + 8 + slot.
TBV_AT(ibv_context, ops.poll_cq, 96)
TBV_AT(ibv_context, ops.req_notify_cq, 104)
TBV_AT(ibv_context, ops.post_srq_recv, 168)
TBV_AT(ibv_context, ops.post_send, 208)
TBV_AT(ibv_context, ops.post_recv, 216)

TBV_SIZE(ibv_pd, 16)
TBV_AT(ibv_pd, context, 0)
TBV_AT(ibv_pd, handle, 8)
TBV_SIZE(ibv_mr, 48)
TBV_AT(ibv_mr, context, 0)
TBV_AT(ibv_mr, pd, 8)
TBV_AT(ibv_mr, addr, 16)
TBV_AT(ibv_mr, length, 24)
TBV_AT(ibv_mr, handle, 32)
TBV_AT(ibv_mr, lkey, 36)
TBV_AT(ibv_mr, rkey, 40)

TBV_SIZE(ibv_cq, 128)
TBV_AT(ibv_cq, context, 0)
TBV_AT(ibv_cq, channel, 8)
TBV_AT(ibv_cq, cq_context, 16)
TBV_AT(ibv_cq, handle, 24)
TBV_AT(ibv_cq, cqe, 28)
TBV_AT(ibv_cq, mutex, 32)
TBV_AT(ibv_cq, cond, 72)
TBV_AT(ibv_cq, comp_events_completed, 120)

TBV_SIZE(ibv_qp, 160)
TBV_AT(ibv_qp, context, 0)
TBV_AT(ibv_qp, qp_context, 8)
TBV_AT(ibv_qp, pd, 16)
TBV_AT(ibv_qp, send_cq, 24)
TBV_AT(ibv_qp, recv_cq, 32)
TBV_AT(ibv_qp, srq, 40)
TBV_AT(ibv_qp, handle, 48)
TBV_AT(ibv_qp, qp_num, 52)
TBV_AT(ibv_qp, state, 56)
TBV_AT(ibv_qp, qp_type, 60)
TBV_AT(ibv_qp, mutex, 64)
TBV_AT(ibv_qp, cond, 104)
TBV_AT(ibv_qp, events_completed, 152)

TBV_SIZE(ibv_port_attr, 52)
static_assert(alignof(own::ibv_port_attr) == 4);
TBV_AT(ibv_port_attr, state, 0)
TBV_AT(ibv_port_attr, max_mtu, 4)
TBV_AT(ibv_port_attr, active_mtu, 8)
TBV_AT(ibv_port_attr, gid_tbl_len, 12)
TBV_AT(ibv_port_attr, lid, 34)
TBV_AT(ibv_port_attr, active_speed, 44)
TBV_AT(ibv_port_attr, link_layer, 46)
TBV_AT(ibv_port_attr, flags, 47)
TBV_AT(ibv_port_attr, port_cap_flags2, 48)

TBV_SIZE(ibv_device_attr, 232)
TBV_AT(ibv_device_attr, phys_port_cnt, 227)
TBV_SIZE(ibv_qp_init_attr, 64)
TBV_AT(ibv_qp_init_attr, cap, 32)
TBV_AT(ibv_qp_init_attr, qp_type, 52)
TBV_AT(ibv_qp_init_attr, sq_sig_all, 56)

TBV_SIZE(ibv_gid, 16)
TBV_SIZE(ibv_global_route, 24)
TBV_AT(ibv_global_route, dgid, 0)
TBV_AT(ibv_global_route, flow_label, 16)
TBV_AT(ibv_global_route, sgid_index, 20)
TBV_AT(ibv_global_route, hop_limit, 21)
TBV_AT(ibv_global_route, traffic_class, 22)

TBV_SIZE(ibv_ah_attr, 32)
TBV_AT(ibv_ah_attr, grh, 0)
TBV_AT(ibv_ah_attr, dlid, 24)
TBV_AT(ibv_ah_attr, sl, 26)
TBV_AT(ibv_ah_attr, src_path_bits, 27)
TBV_AT(ibv_ah_attr, static_rate, 28)
TBV_AT(ibv_ah_attr, is_global, 29)
TBV_AT(ibv_ah_attr, port_num, 30)

TBV_SIZE(ibv_qp_attr, 144)
TBV_AT(ibv_qp_attr, qp_state, 0)
TBV_AT(ibv_qp_attr, path_mtu, 8)
TBV_AT(ibv_qp_attr, qkey, 16)
TBV_AT(ibv_qp_attr, rq_psn, 20)
TBV_AT(ibv_qp_attr, sq_psn, 24)
TBV_AT(ibv_qp_attr, dest_qp_num, 28)
TBV_AT(ibv_qp_attr, qp_access_flags, 32)
TBV_AT(ibv_qp_attr, cap, 36)
TBV_AT(ibv_qp_attr, ah_attr, 56)
TBV_AT(ibv_qp_attr, alt_ah_attr, 88)
TBV_AT(ibv_qp_attr, pkey_index, 120)
TBV_AT(ibv_qp_attr, max_rd_atomic, 126)
TBV_AT(ibv_qp_attr, max_dest_rd_atomic, 127)
TBV_AT(ibv_qp_attr, min_rnr_timer, 128)
TBV_AT(ibv_qp_attr, port_num, 129)
TBV_AT(ibv_qp_attr, timeout, 130)
TBV_AT(ibv_qp_attr, retry_cnt, 131)
TBV_AT(ibv_qp_attr, rnr_retry, 132)
TBV_AT(ibv_qp_attr, rate_limit, 136)

TBV_SIZE(ibv_wc, 48)
TBV_AT(ibv_wc, wr_id, 0)
TBV_AT(ibv_wc, status, 8)
TBV_AT(ibv_wc, opcode, 12)
TBV_AT(ibv_wc, vendor_err, 16)
TBV_AT(ibv_wc, byte_len, 20)
TBV_AT(ibv_wc, imm_data, 24)
TBV_AT(ibv_wc, qp_num, 28)
TBV_AT(ibv_wc, src_qp, 32)
TBV_AT(ibv_wc, wc_flags, 36)
TBV_AT(ibv_wc, pkey_index, 40)
TBV_AT(ibv_wc, slid, 42)
TBV_AT(ibv_wc, sl, 44)
TBV_AT(ibv_wc, dlid_path_bits, 45)

TBV_SIZE(ibv_sge, 16)
TBV_AT(ibv_sge, addr, 0)
TBV_AT(ibv_sge, length, 8)
TBV_AT(ibv_sge, lkey, 12)

TBV_SIZE(ibv_send_wr, 128)
TBV_AT(ibv_send_wr, wr_id, 0)
TBV_AT(ibv_send_wr, next, 8)
TBV_AT(ibv_send_wr, sg_list, 16)
TBV_AT(ibv_send_wr, num_sge, 24)
TBV_AT(ibv_send_wr, opcode, 28)
TBV_AT(ibv_send_wr, send_flags, 32)
TBV_AT(ibv_send_wr, imm_data, 36)
TBV_AT(ibv_send_wr, wr, 40)
TBV_AT(ibv_send_wr, wr.rdma.remote_addr, 40)
TBV_AT(ibv_send_wr, wr.rdma.rkey, 48)
TBV_AT(ibv_send_wr, wr.atomic.remote_addr, 40)
TBV_AT(ibv_send_wr, wr.atomic.compare_add, 48)
TBV_AT(ibv_send_wr, wr.atomic.swap, 56)
TBV_AT(ibv_send_wr, wr.atomic.rkey, 64)
TBV_AT(ibv_send_wr, wr.ud.ah, 40)
TBV_AT(ibv_send_wr, wr.ud.remote_qpn, 48)
TBV_AT(ibv_send_wr, wr.ud.remote_qkey, 52)
TBV_AT(ibv_send_wr, qp_type, 72)
TBV_AT(ibv_send_wr, bind_mw, 80)
TBV_AT(ibv_send_wr, tso, 80)
static_assert(sizeof(own::ibv_send_wr{}.wr) == 32);

TBV_SIZE(ibv_recv_wr, 32)
TBV_AT(ibv_recv_wr, wr_id, 0)
TBV_AT(ibv_recv_wr, next, 8)
TBV_AT(ibv_recv_wr, sg_list, 16)
TBV_AT(ibv_recv_wr, num_sge, 24)

int main() {
  std::printf("ok   abi_own.hpp matches rdma-core 44's x86-64 glibc layout (sizes and offsets "
              "from docs/abi.md)%s\n",
              TBV_HAVE_VERBS_H ? "; so does <infiniband/verbs.h>" : "");
  return 0;
}

#else

int main() {
  std::puts("SKIPPED: the literal rdma-core 44 layout table is for x86-64 Linux with glibc; "
            "abi.compare checks this platform against its own <infiniband/verbs.h>");
  return 77;
}

#endif
