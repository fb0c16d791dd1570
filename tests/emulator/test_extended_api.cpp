// Issue 14: RDMA READ and the extended send API (ibv_create_qp_ex, ibv_wr_*), which perftest,
// rping and rdma-core's Python tests use.
#include <arpa/inet.h>

#include <catch2/catch_test_macros.hpp>

#include "emu_test_util.hpp"

using namespace emutest;

namespace {

constexpr int kRemoteRw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

// RC both ways, QPs allowing remote reads.
bool connect_rw(Side& a, Side& b) {
  for (auto [x, y] : {std::pair<Side*, Side*>{&a, &b}, {&b, &a}})
    if (to_init(x->qp, kRemoteRw) || to_rtr(x->qp, y->qp->qp_num, gid_of(y->ctx, 1), 1) || to_rts(x->qp)) return false;
  return true;
}

ibv_qp* create_ex(Side& s, ibv_qp_type type, uint64_t ops) {
  ibv_qp_init_attr_ex a{};
  a.send_cq = a.recv_cq = s.cq;
  a.cap.max_send_wr = a.cap.max_recv_wr = 16;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  a.cap.max_inline_data = 64;
  a.qp_type = type;
  a.pd = s.pd;
  a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  a.send_ops_flags = ops;
  return ibv_create_qp_ex(s.ctx, &a);
}

}  // namespace

TEST_CASE("RDMA READ on RC: data, opcode, and the responder's checks", "[rc][read]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC, 1 << 16, 64, kRemoteRw));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_RC, 1 << 16, 64, kRemoteRw));
  ibv_device_attr da{};
  REQUIRE(ibv_query_device(a.ctx, &da) == 0);
  CHECK(da.max_qp_rd_atom == 16);
  REQUIRE(connect_rw(a, b));
  const uint64_t base = reinterpret_cast<uint64_t>(b.buf.data());
  for (size_t i = 0; i < 8192; ++i) b.buf[i] = static_cast<char>(i * 7);
  ibv_wc wc{};

  REQUIRE(post_send(a, 1, 100, 8000, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED, 0, base + 50, b.mr->rkey) == 0);
  REQUIRE(poll_one(a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.opcode == IBV_WC_RDMA_READ);
  CHECK(wc.byte_len == 8000);
  CHECK(std::memcmp(a.buf.data() + 100, b.buf.data() + 50, 8000) == 0);
  CHECK(a.buf[99] == 0);
  CHECK(a.buf[8100] == 0);
  CHECK(quiet(b.cq, 20));  // the responder sees no completion

  SECTION("a region without REMOTE_READ: REM_ACCESS_ERR, nothing read") {
    std::vector<char> wo(4096, 0x5a);
    ibv_mr* mr = ibv_reg_mr(b.pd, wo.data(), wo.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    REQUIRE(mr);
    std::memset(a.buf.data(), 0, 64);
    REQUIRE(post_send(a, 2, 0, 64, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED, 0, reinterpret_cast<uint64_t>(wo.data()),
                      mr->rkey) == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
    CHECK(a.buf[0] == 0);
    ibv_dereg_mr(mr);
  }
  SECTION("beyond the region: REM_ACCESS_ERR") {
    REQUIRE(post_send(a, 2, 0, 64, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED, 0, base + b.buf.size() - 32, b.mr->rkey) == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
  }
  SECTION("into a local region without LOCAL_WRITE: LOC_PROT_ERR") {
    std::vector<char> ro(4096, 0);
    ibv_mr* mr = ibv_reg_mr(a.pd, ro.data(), ro.size(), 0);
    REQUIRE(mr);
    ibv_sge sge{reinterpret_cast<uint64_t>(ro.data()), 64, mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 3;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = base;
    wr.wr.rdma.rkey = b.mr->rkey;
    ibv_send_wr* bad = nullptr;
    REQUIRE(ibv_post_send(a.qp, &wr, &bad) == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_LOC_PROT_ERR);
    CHECK(ro[0] == 0);
    ibv_dereg_mr(mr);
  }
  SECTION("RTS asking for more reads in flight than max_qp_rd_atom: EINVAL") {
    ibv_qp_attr qa{};
    qa.qp_state = IBV_QPS_RTS;
    qa.max_rd_atomic = 17;
    CHECK(ibv_modify_qp(a.qp, &qa, IBV_QP_STATE | IBV_QP_MAX_QP_RD_ATOMIC) == EINVAL);
  }
}

namespace {

constexpr int kAtomicRw = kRemoteRw | IBV_ACCESS_REMOTE_ATOMIC;

// One atomic through ibv_post_send; the original value lands in a's buffer at `off`.
int post_atomic(Side& a, uint64_t wr_id, uint64_t off, ibv_wr_opcode op, uint64_t raddr, uint32_t rkey,
                uint64_t compare_add, uint64_t swap = 0, uint32_t len = 8) {
  ibv_sge sge{reinterpret_cast<uint64_t>(a.buf.data()) + off, len, a.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.atomic.remote_addr = raddr;
  wr.wr.atomic.rkey = rkey;
  wr.wr.atomic.compare_add = compare_add;
  wr.wr.atomic.swap = swap;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(a.qp, &wr, &bad);
}

uint64_t word(const Side& s, size_t off) {
  uint64_t v = 0;
  std::memcpy(&v, s.buf.data() + off, 8);
  return v;
}

}  // namespace

TEST_CASE("atomics on RC: fetch-and-add and compare-and-swap, the caps, and the responder's checks",
          "[rc][atomic]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC, 1 << 16, 64, kAtomicRw));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_RC, 1 << 16, 64, kAtomicRw));
  ibv_device_attr da{};
  REQUIRE(ibv_query_device(a.ctx, &da) == 0);
  CHECK(da.atomic_cap == IBV_ATOMIC_HCA);
  CHECK(da.max_qp_init_rd_atom == 16);
  for (auto [x, y] : {std::pair<Side*, Side*>{&a, &b}, {&b, &a}})
    REQUIRE((to_init(x->qp, kAtomicRw) == 0 && to_rtr(x->qp, y->qp->qp_num, gid_of(y->ctx, 1), 1) == 0 &&
             to_rts(x->qp) == 0));
  const uint64_t base = reinterpret_cast<uint64_t>(b.buf.data());
  const uint64_t v0 = 0x1122334455667788ull;
  std::memcpy(b.buf.data() + 64, &v0, 8);
  ibv_wc wc{};

  REQUIRE(post_atomic(a, 1, 0, IBV_WR_ATOMIC_FETCH_AND_ADD, base + 64, b.mr->rkey, 5) == 0);
  REQUIRE(poll_one(a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.opcode == IBV_WC_FETCH_ADD);
  CHECK(word(a, 0) == v0);
  CHECK(word(b, 64) == v0 + 5);
  // A compare that fails leaves the word; one that matches swaps it. Both return the original.
  REQUIRE(post_atomic(a, 2, 8, IBV_WR_ATOMIC_CMP_AND_SWP, base + 64, b.mr->rkey, v0, 42) == 0);
  REQUIRE(poll_one(a.cq, &wc));
  CHECK((wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_COMP_SWAP));
  CHECK(word(a, 8) == v0 + 5);
  CHECK(word(b, 64) == v0 + 5);
  REQUIRE(post_atomic(a, 3, 16, IBV_WR_ATOMIC_CMP_AND_SWP, base + 64, b.mr->rkey, v0 + 5, 42) == 0);
  REQUIRE(poll_one(a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(word(a, 16) == v0 + 5);
  CHECK(word(b, 64) == 42);
  CHECK(word(b, 72) == 0);  // 8 bytes only
  CHECK(quiet(b.cq, 20));   // the responder sees no completion

  SECTION("the builders of the extended API run the same atomics") {
    ibv_destroy_qp(a.qp);
    a.qp = create_ex(a, IBV_QPT_RC, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP);
    REQUIRE(a.qp);
    ibv_qp_ex* x = ibv_qp_to_qp_ex(a.qp);
    REQUIRE(x);
    ibv_destroy_qp(b.qp);
    b.qp = nullptr;
    REQUIRE(b.create_qp());
    for (auto [p, q] : {std::pair<Side*, Side*>{&a, &b}, {&b, &a}})
      REQUIRE((to_init(p->qp, kAtomicRw) == 0 && to_rtr(p->qp, q->qp->qp_num, gid_of(q->ctx, 1), 1) == 0 &&
               to_rts(p->qp) == 0));
    ibv_wr_start(x);
    x->wr_id = 7;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_atomic_fetch_add(x, b.mr->rkey, base + 64, 8);
    ibv_wr_set_sge(x, a.mr->lkey, reinterpret_cast<uint64_t>(a.buf.data()) + 24, 8);
    x->wr_id = 8;
    ibv_wr_atomic_cmp_swp(x, b.mr->rkey, base + 64, 50, 7);
    ibv_wr_set_sge(x, a.mr->lkey, reinterpret_cast<uint64_t>(a.buf.data()) + 32, 8);
    REQUIRE(ibv_wr_complete(x) == 0);
    for (uint64_t id = 7; id <= 8; ++id) {
      REQUIRE(poll_one(a.cq, &wc));
      CHECK((wc.status == IBV_WC_SUCCESS && wc.wr_id == id));
    }
    CHECK(word(a, 24) == 42);
    CHECK(word(a, 32) == 50);
    CHECK(word(b, 64) == 7);
  }
  SECTION("a region without REMOTE_ATOMIC: REM_ACCESS_ERR, the word untouched") {
    std::vector<char> rw(4096, 0);
    ibv_mr* mr = ibv_reg_mr(b.pd, rw.data(), rw.size(), kRemoteRw);
    REQUIRE(mr);
    REQUIRE(post_atomic(a, 4, 0, IBV_WR_ATOMIC_FETCH_AND_ADD, reinterpret_cast<uint64_t>(rw.data()), mr->rkey, 1) == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
    CHECK(rw[0] == 0);
    ibv_dereg_mr(mr);
  }
  SECTION("a remote address not 8-aligned: the responder's Invalid Request") {
    REQUIRE(post_atomic(a, 4, 0, IBV_WR_ATOMIC_FETCH_AND_ADD, base + 68, b.mr->rkey, 1) == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_REM_INV_REQ_ERR);
    CHECK(word(b, 64) == 42);
  }
  SECTION("a local SGE of other than 8 bytes: refused at post") {
    CHECK(post_atomic(a, 4, 0, IBV_WR_ATOMIC_FETCH_AND_ADD, base + 64, b.mr->rkey, 1, 0, 16) == EINVAL);
  }
}

TEST_CASE("atomics are refused on UC and absent on Thunderbolt (max_qp_rd_atom 0)", "[uc][tb][atomic]") {
  {
    TempFabric f(three_hosts("rdma-core-rc"));
    Side a, b;
    REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_UC));
    REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_UC));
    REQUIRE(connect_pair(a, b));
    CHECK(post_atomic(a, 1, 0, IBV_WR_ATOMIC_FETCH_AND_ADD, reinterpret_cast<uint64_t>(b.buf.data()), b.mr->rkey, 1) ==
          EINVAL);
  }
  TempFabric f(three_hosts("thunderbolt"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_UC));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_UC));
  ibv_device_attr da{};
  REQUIRE(ibv_query_device(a.ctx, &da) == 0);
  CHECK(da.atomic_cap == IBV_ATOMIC_NONE);
  CHECK(da.max_qp_rd_atom == 0);
  REQUIRE(connect_pair(a, b));
  CHECK(post_atomic(a, 1, 0, IBV_WR_ATOMIC_CMP_AND_SWP, reinterpret_cast<uint64_t>(b.buf.data()), b.mr->rkey, 0, 1) ==
        EINVAL);
}

TEST_CASE("RDMA READ is refused on UC at post (IB spec: UC carries SEND and WRITE)", "[uc][read]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_UC));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_UC));
  REQUIRE(connect_pair(a, b));
  CHECK(post_send(a, 1, 0, 64, IBV_WR_RDMA_READ, IBV_SEND_SIGNALED, 0, reinterpret_cast<uint64_t>(b.buf.data()),
                  b.mr->rkey) == EINVAL);
}

TEST_CASE("extended send API: a wr_start..wr_complete batch moves data like ibv_post_send", "[rc][qpex]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC, 1 << 16, 64, kRemoteRw));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_RC, 1 << 16, 64, kRemoteRw));
  ibv_destroy_qp(a.qp);
  a.qp = create_ex(a, IBV_QPT_RC,
                   IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
                       IBV_QP_EX_WITH_RDMA_READ);
  REQUIRE(a.qp);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(a.qp);
  REQUIRE(x);
  CHECK(ibv_qp_to_qp_ex(b.qp) == nullptr);  // made by ibv_create_qp: no extended view
  REQUIRE(connect_rw(a, b));
  const uint64_t base = reinterpret_cast<uint64_t>(b.buf.data());
  std::memset(a.buf.data(), 0x21, 256);
  std::memset(b.buf.data() + 4096, 0x43, 128);
  REQUIRE(post_recv(b, 10, 1024, 256) == 0);
  REQUIRE(post_recv(b, 11, 2048, 256) == 0);
  const char inl[] = "inline payload";

  ibv_wr_start(x);
  x->wr_id = 1;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(x);
  ibv_wr_set_sge(x, a.mr->lkey, reinterpret_cast<uint64_t>(a.buf.data()), 200);
  x->wr_id = 2;
  ibv_wr_send_imm(x, htonl(0x1234));
  ibv_wr_set_inline_data(x, const_cast<char*>(inl), sizeof inl);
  x->wr_id = 3;
  ibv_wr_rdma_write(x, b.mr->rkey, base + 3000);
  ibv_wr_set_sge(x, a.mr->lkey, reinterpret_cast<uint64_t>(a.buf.data()), 100);
  x->wr_id = 4;
  ibv_wr_rdma_read(x, b.mr->rkey, base + 4096);
  ibv_wr_set_sge(x, a.mr->lkey, reinterpret_cast<uint64_t>(a.buf.data()) + 8192, 128);
  REQUIRE(ibv_wr_complete(x) == 0);

  ibv_wc wc{};
  for (uint64_t id = 1; id <= 4; ++id) {
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(wc.wr_id == id);
  }
  REQUIRE(poll_one(b.cq, &wc));
  CHECK((wc.wr_id == 10 && wc.byte_len == 200 && b.buf[1024] == 0x21));
  REQUIRE(poll_one(b.cq, &wc));
  CHECK((wc.wr_id == 11 && (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 0x1234));
  CHECK(std::memcmp(b.buf.data() + 2048, inl, sizeof inl) == 0);
  CHECK((b.buf[3000] == 0x21 && b.buf[3099] == 0x21 && b.buf[3100] == 0));
  CHECK((a.buf[8192] == 0x43 && a.buf[8319] == 0x43 && a.buf[8320] == 0));

  SECTION("a setter before any opcode, too many SGEs, too much inline data: wr_complete says EINVAL") {
    ibv_wr_start(x);
    ibv_wr_set_sge(x, a.mr->lkey, reinterpret_cast<uint64_t>(a.buf.data()), 8);
    CHECK(ibv_wr_complete(x) == EINVAL);
    ibv_sge two[2] = {{reinterpret_cast<uint64_t>(a.buf.data()), 8, a.mr->lkey},
                      {reinterpret_cast<uint64_t>(a.buf.data()) + 8, 8, a.mr->lkey}};
    ibv_wr_start(x);
    ibv_wr_send(x);
    ibv_wr_set_sge_list(x, 2, two);  // the QP was created with one send SGE
    CHECK(ibv_wr_complete(x) == EINVAL);
    std::vector<char> big(4096, 1);
    ibv_wr_start(x);
    ibv_wr_send(x);
    ibv_wr_set_inline_data(x, big.data(), big.size());
    CHECK(ibv_wr_complete(x) == EINVAL);
    CHECK(quiet(a.cq, 20));  // nothing of a refused batch was posted
  }
  SECTION("wr_abort posts nothing") {
    ibv_wr_start(x);
    x->wr_id = 9;
    ibv_wr_send(x);
    ibv_wr_set_sge(x, a.mr->lkey, reinterpret_cast<uint64_t>(a.buf.data()), 8);
    ibv_wr_abort(x);
    CHECK(quiet(a.cq, 20));
  }
}

TEST_CASE("extended send API: what is not modelled is refused at creation", "[qpex]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  Side s;
  REQUIRE(s.open("hostA", "rdma_en1", IBV_QPT_RC));
  errno = 0;
  CHECK(create_ex(s, IBV_QPT_RC, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW) == nullptr);  // no memory windows
  CHECK(errno == EOPNOTSUPP);
  errno = 0;
  CHECK(create_ex(s, IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_READ) == nullptr);  // UC carries no READ
  CHECK(errno == EOPNOTSUPP);
}

TEST_CASE("extended send API on Thunderbolt: absent (our assumption: TN3205 documents ibv_post_send only)",
          "[tb][qpex]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side s;
  REQUIRE(s.open("hostA", "rdma_en1", IBV_QPT_UC));
  errno = 0;
  CHECK(create_ex(s, IBV_QPT_UC, IBV_QP_EX_WITH_SEND) == nullptr);
  CHECK(errno == EOPNOTSUPP);
}

TEST_CASE("extended CQ: start/next/end polling and the read callbacks; what is not modelled is refused",
          "[rc][cqex]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_RC));
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 64;
  ca.wc_flags = IBV_WC_STANDARD_FLAGS;
  ibv_cq_ex* cx = ibv_create_cq_ex(b.ctx, &ca);
  REQUIRE(cx);
  // b's QP completes into the extended CQ.
  ibv_destroy_qp(b.qp);
  ibv_destroy_cq(b.cq);
  b.cq = ibv_cq_ex_to_cq(cx);
  REQUIRE(b.create_qp());
  REQUIRE(connect_pair(a, b));
  ibv_poll_cq_attr pa{};
  CHECK(ibv_start_poll(cx, &pa) == ENOENT);  // empty: nothing to end
  REQUIRE(post_recv(b, 21, 0, 256) == 0);
  REQUIRE(post_recv(b, 22, 256, 256) == 0);
  REQUIRE(post_send(a, 1, 0, 100, IBV_WR_SEND, IBV_SEND_SIGNALED) == 0);
  REQUIRE(post_send(a, 2, 0, 7, IBV_WR_SEND_WITH_IMM, IBV_SEND_SIGNALED, 0, 0, 0, htonl(0xabcd)) == 0);
  ibv_wc wc{};
  for (int i = 0; i < 2; ++i) {
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_SUCCESS);
  }
  int r = ENOENT;
  for (int i = 0; i < 2000 && r == ENOENT; ++i) r = ibv_start_poll(cx, &pa);
  REQUIRE(r == 0);
  CHECK(cx->status == IBV_WC_SUCCESS);
  CHECK(cx->wr_id == 21);
  CHECK(ibv_wc_read_opcode(cx) == IBV_WC_RECV);
  CHECK(ibv_wc_read_byte_len(cx) == 100);
  CHECK(ibv_wc_read_qp_num(cx) == b.qp->qp_num);
  CHECK(ibv_wc_read_src_qp(cx) == a.qp->qp_num);
  CHECK((ibv_wc_read_wc_flags(cx) & IBV_WC_WITH_IMM) == 0);
  REQUIRE(ibv_next_poll(cx) == 0);
  CHECK(cx->wr_id == 22);
  CHECK(ibv_wc_read_byte_len(cx) == 7);
  CHECK((ibv_wc_read_wc_flags(cx) & IBV_WC_WITH_IMM) != 0);
  CHECK(ntohl(ibv_wc_read_imm_data(cx)) == 0xabcd);
  CHECK(ibv_next_poll(cx) == ENOENT);
  ibv_end_poll(cx);

  ca.wc_flags = static_cast<uint64_t>(IBV_WC_STANDARD_FLAGS) | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
  errno = 0;
  CHECK(ibv_create_cq_ex(b.ctx, &ca) == nullptr);
  CHECK(errno == EOPNOTSUPP);
}

TEST_CASE("ibv_rereg_mr: access, range and PD change in place; a QP reset leaves no completions",
          "[rc][rereg]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC, 1 << 16, 64, kRemoteRw));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_RC, 1 << 16, 64, kRemoteRw));
  REQUIRE(connect_rw(a, b));
  const uint64_t base = reinterpret_cast<uint64_t>(b.buf.data());
  ibv_wc wc{};
  CHECK(ibv_rereg_mr(b.mr, 0, nullptr, nullptr, 0, 0) == IBV_REREG_MR_ERR_INPUT);  // no change asked
  CHECK(errno == EINVAL);

  SECTION("access: without REMOTE_WRITE a WRITE is refused by the responder, the keys stay") {
    const uint32_t rkey = b.mr->rkey;
    REQUIRE(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE) == 0);
    CHECK(b.mr->rkey == rkey);
    REQUIRE(post_send(a, 1, 0, 64, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 0, base, rkey) == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
  }
  SECTION("range: new keys, a receive posted into the old range fails; RESET empties the CQs") {
    std::vector<char> other(4096, 0);
    const uint32_t old = b.mr->lkey;
    REQUIRE(post_recv(b, 5, 0, 256) == 0);
    REQUIRE(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, other.data(), other.size(), 0) == 0);
    CHECK(b.mr->lkey != old);
    CHECK(b.mr->addr == other.data());
    REQUIRE(post_send(a, 1, 0, 64, IBV_WR_SEND, IBV_SEND_SIGNALED) == 0);
    REQUIRE(poll_one(b.cq, &wc));
    CHECK((wc.wr_id == 5 && wc.status == IBV_WC_LOC_PROT_ERR));
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_REM_OP_ERR);
    // a's QP is in ERR: what it is given now is flushed into its CQ, and RESET removes that.
    REQUIRE(post_send(a, 2, 0, 64, IBV_WR_SEND, IBV_SEND_SIGNALED) == 0);
    ibv_qp_attr qa{};
    qa.qp_state = IBV_QPS_RESET;
    REQUIRE(ibv_modify_qp(a.qp, &qa, IBV_QP_STATE) == 0);
    CHECK(quiet(a.cq, 20));
  }
  SECTION("PD: a region of another PD than the QP's is refused at the receive") {
    ibv_pd* pd2 = ibv_alloc_pd(b.ctx);
    REQUIRE(pd2);
    REQUIRE(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_PD, pd2, nullptr, 0, 0) == 0);
    CHECK(b.mr->pd == pd2);
    CHECK(ibv_dealloc_pd(pd2) == EBUSY);  // the region now counts on it
    REQUIRE(post_recv(b, 6, 0, 256) == 0);
    REQUIRE(post_send(a, 1, 0, 64, IBV_WR_SEND, IBV_SEND_SIGNALED) == 0);
    REQUIRE(poll_one(b.cq, &wc));
    CHECK(wc.status == IBV_WC_LOC_PROT_ERR);
    REQUIRE(ibv_rereg_mr(b.mr, IBV_REREG_MR_CHANGE_PD, b.pd, nullptr, 0, 0) == 0);
    CHECK(ibv_dealloc_pd(pd2) == 0);
  }
}

TEST_CASE("address handles: checked and kept on RoCE, absent on Thunderbolt", "[ah]") {
  {
    TempFabric f(three_hosts("rdma-core-rc"));
    Side s;
    REQUIRE(s.open("hostA", "rdma_en1", IBV_QPT_RC));
    ibv_ah_attr aa{};
    aa.port_num = 1;
    aa.is_global = 1;
    aa.grh.dgid = gid_of(s.ctx, 1);
    aa.grh.sgid_index = 1;
    ibv_ah* ah = ibv_create_ah(s.pd, &aa);
    REQUIRE(ah);
    CHECK(ibv_destroy_ah(ah) == 0);
    aa.is_global = 0;  // RoCE needs a GRH
    errno = 0;
    CHECK(ibv_create_ah(s.pd, &aa) == nullptr);
    CHECK(errno == EINVAL);
    aa.is_global = 1;
    aa.grh.sgid_index = 200;  // outside the GID table
    CHECK(ibv_create_ah(s.pd, &aa) == nullptr);
    CHECK(errno == EINVAL);
  }
  TempFabric f(three_hosts("thunderbolt"));
  Side s;
  REQUIRE(s.open("hostA", "rdma_en1", IBV_QPT_UC));
  ibv_ah_attr aa{};
  aa.port_num = 1;
  aa.is_global = 1;
  errno = 0;
  CHECK(ibv_create_ah(s.pd, &aa) == nullptr);
  CHECK(errno == EOPNOTSUPP);
}
