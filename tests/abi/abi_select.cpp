// Built twice: with -DTBVERBS_USE_OWN_ABI (abi.hpp must take tbverbs' own declarations) and
// without (it must take <infiniband/verbs.h> when that exists). Both builds compile the same
// code against tbverbs::detail::abi, using the names and fields the library uses, so a name or
// field missing from either side fails the build; at run time it drives a fake context's ops
// table the way the data path does.
#include <tbverbs/detail/abi.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>

#if defined(TBVERBS_USE_OWN_ABI)
static_assert(TBVERBS_ABI_FROM_PLATFORM == 0, "TBVERBS_USE_OWN_ABI must select abi_own.hpp");
#define TBV_EXPECTED "tbverbs' own declarations (TBVERBS_USE_OWN_ABI)"
#elif __has_include(<infiniband/verbs.h>)
static_assert(TBVERBS_ABI_FROM_PLATFORM == 1, "<infiniband/verbs.h> exists and must be used");
#define TBV_EXPECTED "the platform's <infiniband/verbs.h>"
#else
static_assert(TBVERBS_ABI_FROM_PLATFORM == 0, "without <infiniband/verbs.h> abi_own.hpp is used");
#define TBV_EXPECTED "tbverbs' own declarations (no <infiniband/verbs.h> here)"
#endif

namespace abi = tbverbs::detail::abi;

// Everything tbverbs reads from objects the library allocates sits before their first pthread
// member, so it does not move with the platform's pthread sizes (mutex/cond: glibc x86-64 40/48 B,
// glibc aarch64 48/48 B, macOS 64/48 B). Only what follows does (ibv_context::abi_compat, the
// object sizes). Checked in both modes, i.e. for the platform's verbs.h as well.
static_assert(offsetof(abi::ibv_context, ops) + sizeof(abi::ibv_context_ops) <=
              offsetof(abi::ibv_context, cmd_fd));
static_assert(offsetof(abi::ibv_context, num_comp_vectors) + sizeof(int) <=
              offsetof(abi::ibv_context, mutex));
static_assert(offsetof(abi::ibv_cq, cqe) + sizeof(int) <= offsetof(abi::ibv_cq, mutex));
static_assert(offsetof(abi::ibv_qp, qp_type) + sizeof(abi::ibv_qp_type) <= offsetof(abi::ibv_qp, mutex));
// The data-path slots: device pointer, then the ops table (verbs.h inlines read these).
static_assert(offsetof(abi::ibv_context, ops.post_send) == (1 + 25) * sizeof(void*));
static_assert(offsetof(abi::ibv_context, ops.post_recv) == (1 + 26) * sizeof(void*));
static_assert(offsetof(abi::ibv_context, ops.poll_cq) == (1 + 11) * sizeof(void*));
static_assert(offsetof(abi::ibv_context, ops.req_notify_cq) == (1 + 12) * sizeof(void*));
static_assert(offsetof(abi::ibv_qp, qp_num) == 6 * sizeof(void*) + 4);

namespace {

int posted_sends = 0;
int posted_recvs = 0;
int notified = 0;

int fake_post_send(abi::ibv_qp* qp, abi::ibv_send_wr* wr, abi::ibv_send_wr** bad) {
  for (; wr != nullptr; wr = wr->next) {
    if (qp->qp_num != 0x1234 || wr->opcode != abi::IBV_WR_RDMA_WRITE ||
        (wr->send_flags & abi::IBV_SEND_SIGNALED) == 0 || wr->wr.rdma.remote_addr != 0xabcd000 ||
        wr->wr.rdma.rkey != 77 || wr->num_sge != 1 || wr->sg_list[0].lkey != 42) {
      *bad = wr;
      return 22; // EINVAL, returned as a positive number like post_send does
    }
    ++posted_sends;
  }
  return 0;
}

int fake_post_recv(abi::ibv_qp*, abi::ibv_recv_wr* wr, abi::ibv_recv_wr**) {
  for (; wr != nullptr; wr = wr->next) {
    ++posted_recvs;
  }
  return 0;
}

int fake_poll_cq(abi::ibv_cq*, int n, abi::ibv_wc* wc) {
  if (n < 1) {
    return 0;
  }
  wc[0] = abi::ibv_wc{};
  wc[0].wr_id = 7;
  wc[0].status = abi::IBV_WC_RETRY_EXC_ERR;
  wc[0].opcode = abi::IBV_WC_RECV;
  wc[0].byte_len = 4096;
  wc[0].qp_num = 0x1234;
  wc[0].wc_flags = abi::IBV_WC_WITH_IMM;
  wc[0].imm_data = 0x01020304;
  return 1;
}

int fake_req_notify_cq(abi::ibv_cq*, int solicited_only) {
  notified += 1 + solicited_only;
  return 0;
}

int failures = 0;
void expect(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAIL %s\n", what);
    ++failures;
  }
}

} // namespace

int main() {
  std::printf("abi.hpp selected %s\n", TBV_EXPECTED);

  abi::ibv_device device{};
  std::strcpy(device.name, "rdma_en3");
  device.node_type = abi::IBV_NODE_CA;
  device.transport_type = abi::IBV_TRANSPORT_IB;

  abi::ibv_context ctx{};
  ctx.device = &device;
  ctx.ops.post_send = fake_post_send;
  ctx.ops.post_recv = fake_post_recv;
  ctx.ops.poll_cq = fake_poll_cq;
  ctx.ops.req_notify_cq = fake_req_notify_cq;

  abi::ibv_pd pd{};
  pd.context = &ctx;
  abi::ibv_mr mr{};
  mr.context = &ctx;
  mr.pd = &pd;
  mr.lkey = 42;
  mr.rkey = 77;

  abi::ibv_comp_channel channel{};
  channel.context = &ctx;
  channel.fd = -1;
  abi::ibv_cq cq{};
  cq.context = &ctx;
  cq.channel = &channel;
  cq.cqe = 16;

  abi::ibv_port_attr port{};
  port.state = abi::IBV_PORT_ACTIVE;
  port.active_mtu = abi::IBV_MTU_1024;
  port.max_mtu = abi::IBV_MTU_4096;
  port.gid_tbl_len = 1024;
  port.link_layer = 2; // Ethernet
  abi::ibv_device_attr device_attr{};
  device_attr.phys_port_cnt = 1;
  expect(device_attr.phys_port_cnt == 1, "device_attr.phys_port_cnt");

  abi::ibv_gid gid{};
  gid.raw[10] = 0xff;
  gid.raw[11] = 0xff;
  gid.global.interface_id = 0;

  abi::ibv_qp_init_attr init{};
  init.send_cq = &cq;
  init.recv_cq = &cq;
  init.srq = nullptr;
  init.qp_type = abi::IBV_QPT_UC;
  init.cap.max_send_wr = 16;
  init.cap.max_recv_wr = 16;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.sq_sig_all = 0;

  abi::ibv_qp qp{};
  qp.context = &ctx;
  qp.pd = &pd;
  qp.send_cq = &cq;
  qp.recv_cq = &cq;
  qp.qp_num = 0x1234;
  qp.qp_type = init.qp_type;
  qp.state = abi::IBV_QPS_RESET;

  abi::ibv_qp_attr attr{};
  attr.qp_state = abi::IBV_QPS_RTR;
  attr.path_mtu = port.active_mtu;
  attr.dest_qp_num = 0x4321;
  attr.rq_psn = 0xabcdef;
  attr.qp_access_flags = abi::IBV_ACCESS_LOCAL_WRITE | abi::IBV_ACCESS_REMOTE_WRITE;
  attr.ah_attr.is_global = 1;
  attr.ah_attr.port_num = 1;
  attr.ah_attr.grh.dgid = gid;
  attr.ah_attr.grh.sgid_index = 1;
  attr.ah_attr.grh.hop_limit = 1;
  const int mask =
      abi::IBV_QP_STATE | abi::IBV_QP_AV | abi::IBV_QP_PATH_MTU | abi::IBV_QP_DEST_QPN | abi::IBV_QP_RQ_PSN;
  expect(mask == 0x101181, "RTR mask");
  expect(attr.qp_access_flags == 3, "access flags");

  abi::ibv_sge sge{};
  sge.addr = reinterpret_cast<std::uintptr_t>(&device);
  sge.length = 64;
  sge.lkey = mr.lkey;
  abi::ibv_send_wr send{};
  send.wr_id = 1;
  send.sg_list = &sge;
  send.num_sge = 1;
  send.opcode = abi::IBV_WR_RDMA_WRITE;
  send.send_flags = abi::IBV_SEND_SIGNALED;
  send.wr.rdma.remote_addr = 0xabcd000;
  send.wr.rdma.rkey = mr.rkey;
  abi::ibv_send_wr* bad_send = nullptr;
  expect(qp.context->ops.post_send(&qp, &send, &bad_send) == 0 && posted_sends == 1,
         "post_send through ctx->ops");
  send.opcode = abi::IBV_WR_SEND;
  expect(qp.context->ops.post_send(&qp, &send, &bad_send) == 22 && bad_send == &send,
         "post_send error and bad_wr");

  abi::ibv_recv_wr recv[2]{};
  recv[0].next = &recv[1];
  recv[0].sg_list = &sge;
  recv[0].num_sge = 1;
  abi::ibv_recv_wr* bad_recv = nullptr;
  expect(qp.context->ops.post_recv(&qp, recv, &bad_recv) == 0 && posted_recvs == 2,
         "post_recv through ctx->ops");

  abi::ibv_wc wc[4];
  const int n = cq.context->ops.poll_cq(&cq, 4, wc);
  expect(n == 1 && wc[0].status == abi::IBV_WC_RETRY_EXC_ERR && wc[0].status != abi::IBV_WC_SUCCESS &&
             (wc[0].opcode & abi::IBV_WC_RECV) != 0 && wc[0].qp_num == qp.qp_num &&
             (wc[0].wc_flags & abi::IBV_WC_WITH_IMM) != 0,
         "poll_cq through ctx->ops");
  expect(cq.context->ops.req_notify_cq(&cq, 0) == 0 && notified == 1, "req_notify_cq");
  expect(std::strcmp(ctx.device->name, "rdma_en3") == 0, "device->name");

  std::printf("%s: %d failure(s)\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}
