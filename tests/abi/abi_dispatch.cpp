// The data path across the two layouts, without hardware or emulator: the slots tbverbs calls
// through its own ibv_context_ops must be the slots rdma-core's inline functions read.
//
// 1. A "library" built with rdma-core's header fills ::ibv_context::ops; tbverbs, built with its
//    own declarations, sees the same object as abi::ibv_context and calls ops.post_send /
//    post_recv / poll_cq / req_notify_cq. The library reads the work requests tbverbs built and
//    writes work completions tbverbs reads back.
// 2. The reverse: a context laid out with tbverbs' declarations (as an own-ABI provider would)
//    is driven by rdma-core's static inline ibv_post_send, ibv_post_recv, ibv_poll_cq and
//    ibv_req_notify_cq, which read qp->context->ops.post_send (context + 8 + 200) and friends.
//
// Reinterpreting one struct type as the other is exactly what happens in production when the
// two sides are compiled against different declarations; this test is where that contract is
// exercised (see `as` for how it keeps the optimizer out of it). In part 1 tbverbs calls the
// library's functions through a pointer type that differs from theirs in the struct names only,
// as it does in production with TBVERBS_USE_OWN_ABI; clang's -fsanitize=function reports such
// calls, so it is off for that caller.
#include <cstdint>
#include <cstdio>
#include <cstring>

#if __has_include(<infiniband/verbs.h>)
#include <infiniband/verbs.h>
#define TBV_HAVE_VERBS_H 1
#else
#define TBV_HAVE_VERBS_H 0
#endif

#include <tbverbs/detail/abi_own.hpp>

#if !TBV_HAVE_VERBS_H

int main() {
  std::puts("SKIPPED: <infiniband/verbs.h> not found; install libibverbs-dev (rdma-core)");
  return 77;
}

#else

#if defined(__clang__)
#define TBV_NO_SANITIZE_FUNCTION __attribute__((no_sanitize("function")))
#else
#define TBV_NO_SANITIZE_FUNCTION
#endif

namespace own = tbverbs::detail::abi;

namespace {

int failures = 0;
void expect(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) {
    ++failures;
  }
}

// Views an object through the other side's declaration, hiding where it came from: in
// production the object is made by another shared library, out of the optimizer's sight. Within
// one TU, without the barrier, g++ -O2's type-based alias analysis does see both types and
// (legitimately, it is undefined behaviour in ISO C++) drops or reorders the accesses: the
// rdma-core inlines then read stale ops slots. Observed with g++ 12 -O2 while writing this test.
template <class To, class From> To* as(From* p) {
  static_assert(sizeof(To) == sizeof(From));
  To* q = reinterpret_cast<To*>(p);
#if defined(__GNUC__)
  asm volatile("" : "+r"(q) : : "memory");
#endif
  return q;
}

// ---- 1. rdma-core-layout library, tbverbs-layout caller ----------------------------------------

struct LibraryLog {
  std::uint64_t wr_id = 0;
  std::uint64_t remote_addr = 0;
  std::uint32_t rkey = 0, lkey = 0, imm = 0, qp_num = 0;
  int opcode = -1, num_sge = 0, recvs = 0, solicited = -1;
  unsigned flags = 0;
} lib;

int lib_post_send(::ibv_qp* qp, ::ibv_send_wr* wr, ::ibv_send_wr** bad) {
  lib.wr_id = wr->wr_id;
  lib.opcode = wr->opcode;
  lib.flags = wr->send_flags;
  lib.imm = wr->imm_data;
  lib.remote_addr = wr->wr.rdma.remote_addr;
  lib.rkey = wr->wr.rdma.rkey;
  lib.num_sge = wr->num_sge;
  lib.lkey = wr->sg_list[0].lkey;
  lib.qp_num = qp->qp_num;
  *bad = wr->next; // lets the caller see which slot bad_wr went through
  return 0;
}

int lib_post_recv(::ibv_qp*, ::ibv_recv_wr* wr, ::ibv_recv_wr**) {
  for (; wr != nullptr; wr = wr->next) {
    ++lib.recvs;
  }
  return 0;
}

int lib_poll_cq(::ibv_cq*, int n, ::ibv_wc* wc) {
  for (int i = 0; i < n; ++i) {
    wc[i] = ::ibv_wc{};
    wc[i].wr_id = 100 + static_cast<std::uint64_t>(i);
    wc[i].status = i == 0 ? ::IBV_WC_SUCCESS : ::IBV_WC_WR_FLUSH_ERR;
    wc[i].opcode = ::IBV_WC_RECV_RDMA_WITH_IMM;
    wc[i].vendor_err = 0x99;
    wc[i].byte_len = 1024;
    wc[i].imm_data = 0xdeadbeef;
    wc[i].qp_num = 0x111;
    wc[i].src_qp = 0x222;
    wc[i].wc_flags = ::IBV_WC_WITH_IMM | ::IBV_WC_GRH;
    wc[i].pkey_index = 3;
    wc[i].slid = 0x4455;
    wc[i].sl = 6;
    wc[i].dlid_path_bits = 7;
  }
  return n;
}

int lib_req_notify_cq(::ibv_cq*, int solicited_only) {
  lib.solicited = solicited_only;
  return 0;
}

TBV_NO_SANITIZE_FUNCTION void tbverbs_side_calls_library() {
  ::ibv_device pdev{};
  std::strcpy(pdev.name, "mlx5_0");
  ::ibv_context pctx{};
  pctx.device = &pdev;
  pctx.ops.post_send = lib_post_send;
  pctx.ops.post_recv = lib_post_recv;
  pctx.ops.poll_cq = lib_poll_cq;
  pctx.ops.req_notify_cq = lib_req_notify_cq;
  ::ibv_cq pcq{};
  pcq.context = &pctx;
  ::ibv_qp pqp{};
  pqp.context = &pctx;
  pqp.qp_num = 0xabc;
  pqp.qp_type = ::IBV_QPT_UC;

  // What tbverbs holds: the library's objects through its own declarations.
  own::ibv_qp* qp = as<own::ibv_qp>(&pqp);
  own::ibv_cq* cq = as<own::ibv_cq>(&pcq);
  expect(std::strcmp(qp->context->device->name, "mlx5_0") == 0 && qp->qp_num == 0xabc &&
             qp->qp_type == own::IBV_QPT_UC,
         "tbverbs reads device->name, qp_num, qp_type of an rdma-core-layout QP");

  own::ibv_sge sge{0x1000, 64, 0x77};
  own::ibv_send_wr second{};
  own::ibv_send_wr wr{};
  wr.wr_id = 0x5151;
  wr.next = &second;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = own::IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = own::IBV_SEND_SIGNALED | own::IBV_SEND_SOLICITED;
  wr.imm_data = 0x0a0b0c0d;
  wr.wr.rdma.remote_addr = 0xfeed0000;
  wr.wr.rdma.rkey = 0x1234;
  own::ibv_send_wr* bad = nullptr;
  const int rc = qp->context->ops.post_send(qp, &wr, &bad);
  expect(rc == 0 && lib.wr_id == 0x5151 && lib.opcode == ::IBV_WR_RDMA_WRITE_WITH_IMM &&
             lib.flags == (::IBV_SEND_SIGNALED | ::IBV_SEND_SOLICITED) && lib.imm == 0x0a0b0c0d &&
             lib.remote_addr == 0xfeed0000 && lib.rkey == 0x1234 && lib.num_sge == 1 && lib.lkey == 0x77 &&
             lib.qp_num == 0xabc && bad == &second,
         "ctx->ops.post_send (own layout) reaches rdma-core's slot; the library reads the WR");

  own::ibv_recv_wr recv[3]{};
  recv[0].next = &recv[1];
  recv[1].next = &recv[2];
  own::ibv_recv_wr* bad_recv = nullptr;
  expect(qp->context->ops.post_recv(qp, recv, &bad_recv) == 0 && lib.recvs == 3,
         "ctx->ops.post_recv reaches rdma-core's slot; the library walks wr->next");

  own::ibv_wc wc[2]{};
  const int n = cq->context->ops.poll_cq(cq, 2, wc);
  expect(n == 2 && wc[0].wr_id == 100 && wc[1].wr_id == 101 && wc[0].status == own::IBV_WC_SUCCESS &&
             wc[1].status == own::IBV_WC_WR_FLUSH_ERR && wc[1].opcode == own::IBV_WC_RECV_RDMA_WITH_IMM &&
             wc[1].vendor_err == 0x99 && wc[1].byte_len == 1024 && wc[1].imm_data == 0xdeadbeef &&
             wc[1].qp_num == 0x111 && wc[1].src_qp == 0x222 &&
             wc[1].wc_flags == (own::IBV_WC_WITH_IMM | own::IBV_WC_GRH) && wc[1].pkey_index == 3 &&
             wc[1].slid == 0x4455 && wc[1].sl == 6 && wc[1].dlid_path_bits == 7,
         "ctx->ops.poll_cq reaches rdma-core's slot; the library's 2nd ibv_wc reads back whole");

  expect(cq->context->ops.req_notify_cq(cq, 1) == 0 && lib.solicited == 1,
         "ctx->ops.req_notify_cq reaches rdma-core's slot");
}

// ---- 2. tbverbs-layout provider, rdma-core inline callers --------------------------------------

int provider_calls = 0;

// The provider's functions have rdma-core's signatures, so the inline callers call them through
// their exact type; only where the pointer is stored (an own-layout slot) is under test.
int provider_post_send(::ibv_qp* qp, ::ibv_send_wr* wr, ::ibv_send_wr**) {
  provider_calls += (qp->qp_num == 0xdef && wr->wr.ud.remote_qpn == 0x55 &&
                     wr->wr.ud.remote_qkey == 0x11111111 && wr->opcode == ::IBV_WR_SEND)
                        ? 1
                        : 100;
  return 0;
}
int provider_post_recv(::ibv_qp*, ::ibv_recv_wr* wr, ::ibv_recv_wr**) {
  provider_calls += wr->num_sge == 2 ? 10 : 100;
  return 0;
}
int provider_poll_cq(::ibv_cq*, int, ::ibv_wc* wc) {
  wc[0] = ::ibv_wc{};
  wc[0].status = ::IBV_WC_REM_ACCESS_ERR;
  wc[0].qp_num = 0xdef;
  return 1;
}
int provider_req_notify_cq(::ibv_cq*, int solicited_only) {
  provider_calls += solicited_only == 0 ? 1000 : 100;
  return 0;
}

template <class Slot, class Fn> Slot slot(Fn* fn) { return reinterpret_cast<Slot>(fn); }

void rdma_core_inlines_call_provider() {
  own::ibv_context octx{};
  octx.ops.post_send = slot<decltype(octx.ops.post_send)>(provider_post_send);
  octx.ops.post_recv = slot<decltype(octx.ops.post_recv)>(provider_post_recv);
  octx.ops.poll_cq = slot<decltype(octx.ops.poll_cq)>(provider_poll_cq);
  octx.ops.req_notify_cq = slot<decltype(octx.ops.req_notify_cq)>(provider_req_notify_cq);
  own::ibv_cq ocq{};
  ocq.context = &octx;
  own::ibv_qp oqp{};
  oqp.context = &octx;
  oqp.qp_num = 0xdef;

  ::ibv_qp* qp = as<::ibv_qp>(&oqp);
  ::ibv_cq* cq = as<::ibv_cq>(&ocq);
  ::ibv_send_wr wr{};
  wr.opcode = ::IBV_WR_SEND;
  wr.wr.ud.remote_qpn = 0x55;
  wr.wr.ud.remote_qkey = 0x11111111;
  ::ibv_send_wr* bad = nullptr;
  expect(::ibv_post_send(qp, &wr, &bad) == 0 && provider_calls == 1,
         "rdma-core's inline ibv_post_send calls the own-layout ops.post_send");
  ::ibv_recv_wr rwr{};
  rwr.num_sge = 2;
  ::ibv_recv_wr* bad_recv = nullptr;
  expect(::ibv_post_recv(qp, &rwr, &bad_recv) == 0 && provider_calls == 11,
         "rdma-core's inline ibv_post_recv calls the own-layout ops.post_recv");
  ::ibv_wc wc{};
  expect(::ibv_poll_cq(cq, 1, &wc) == 1 && wc.status == ::IBV_WC_REM_ACCESS_ERR && wc.qp_num == 0xdef,
         "rdma-core's inline ibv_poll_cq calls the own-layout ops.poll_cq");
  expect(::ibv_req_notify_cq(cq, 0) == 0 && provider_calls == 1011,
         "rdma-core's inline ibv_req_notify_cq calls the own-layout ops.req_notify_cq");
}

} // namespace

int main() {
  tbverbs_side_calls_library();
  rdma_core_inlines_call_provider();
  std::printf("%s: %d failure(s)\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}

#endif
