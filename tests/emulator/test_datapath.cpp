// Data path: opcodes, scatter-gather, completions, key/bounds/access checks, RC
// retries, UC loss, completion channels.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/time.h>
#include <sys/wait.h>

#include <catch2/catch_test_macros.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <memory>
#include <thread>

#include "emu_test_util.hpp"

using namespace emutest;

namespace {
const uint64_t kGuard = 0x4747474747474747ull;
}

TEST_CASE("rc profile: RoCE-style GIDs, RC and UC, MTU 4096/1024", "[rc][gid]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  ibv_context* ctx = open_dev("hostA", "rdma_en1");
  REQUIRE(ctx);
  ibv_port_attr pa{};
  REQUIRE(ibv_query_port(ctx, 1, &pa) == 0);
  CHECK(pa.max_mtu == IBV_MTU_4096);
  CHECK(pa.active_mtu == IBV_MTU_1024);
  ibv_gid g1 = gid_of(ctx, 1), want = make_v4_gid(10, 0, 0, 1);
  CHECK(std::memcmp(&g1, &want, sizeof want) == 0);
  ibv_gid_entry e{};
  REQUIRE(ibv_query_gid_ex(ctx, 1, 1, &e, 0) == 0);
  CHECK(e.gid_type == IBV_GID_TYPE_ROCE_V2);
  CHECK(ibv_query_gid_ex(ctx, 1, 5, &e, 0) == ENODATA);
  ibv_close_device(ctx);
}

TEST_CASE("SEND with scatter-gather on both sides, SEND_WITH_IMM, unsignalled sends", "[rc][data]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  for (ibv_qp_type t : {IBV_QPT_RC, IBV_QPT_UC}) {
    Side a, b;
    REQUIRE(a.open("hostA", "rdma_en1", t));
    REQUIRE(b.open("hostB", "rdma_en1", t));
    REQUIRE(connect_pair(a, b));
    for (int i = 0; i < 300; ++i) a.buf[i] = static_cast<char>(i);
    // Receive into three pieces: 100 @0, 50 @1000, 200 @2000.
    ibv_sge rs[3] = {{reinterpret_cast<uint64_t>(b.buf.data()), 100, b.mr->lkey},
                     {reinterpret_cast<uint64_t>(b.buf.data()) + 1000, 50, b.mr->lkey},
                     {reinterpret_cast<uint64_t>(b.buf.data()) + 2000, 200, b.mr->lkey}};
    ibv_recv_wr rwr{};
    rwr.wr_id = 42;
    rwr.sg_list = rs;
    rwr.num_sge = 3;
    ibv_recv_wr* rbad = nullptr;
    REQUIRE(ibv_post_recv(b.qp, &rwr, &rbad) == 0);
    // Send from two pieces: 120 @0, 80 @120 → 200 bytes.
    ibv_sge ss[2] = {{reinterpret_cast<uint64_t>(a.buf.data()), 120, a.mr->lkey},
                     {reinterpret_cast<uint64_t>(a.buf.data()) + 120, 80, a.mr->lkey}};
    ibv_send_wr swr{};
    swr.wr_id = 9;
    swr.sg_list = ss;
    swr.num_sge = 2;
    swr.opcode = IBV_WR_SEND_WITH_IMM;
    swr.imm_data = htobe32(0xabcdef01);
    swr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* sbad = nullptr;
    REQUIRE(ibv_post_send(a.qp, &swr, &sbad) == 0);
    ibv_wc wc{};
    REQUIRE(poll_one(b.cq, &wc));
    CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(wc.opcode == IBV_WC_RECV);
    CHECK(wc.byte_len == 200);
    CHECK(wc.wr_id == 42);
    CHECK((wc.wc_flags & IBV_WC_WITH_IMM));
    CHECK(wc.imm_data == htobe32(0xabcdef01));
    CHECK(wc.qp_num == b.qp->qp_num);
    CHECK(wc.src_qp == a.qp->qp_num);
    CHECK(b.buf[99] == static_cast<char>(99));
    CHECK(b.buf[1000] == static_cast<char>(100));
    CHECK(b.buf[1049] == static_cast<char>(149));
    CHECK(b.buf[2000] == static_cast<char>(150));
    CHECK(b.buf[2049] == static_cast<char>(199));
    CHECK(b.buf[2050] == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.wr_id == 9);
    CHECK(wc.opcode == IBV_WC_SEND);

    // Unsignalled: delivered, but no send completion.
    REQUIRE(post_recv(b, 43, 0, 64) == 0);
    REQUIRE(post_send(a, 10, 0, 64, IBV_WR_SEND, 0) == 0);
    REQUIRE(poll_one(b.cq, &wc));
    CHECK(wc.wr_id == 43);
    CHECK(quiet(a.cq));
  }
}

TEST_CASE("RDMA WRITE and WRITE_WITH_IMM on the rc profile, with rkey/bounds/access checks", "[rc][write]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_RC));
  REQUIRE(connect_pair(a, b));
  uint64_t base = reinterpret_cast<uint64_t>(b.buf.data());
  std::memset(a.buf.data(), 0x33, 4096);
  ibv_wc wc{};

  REQUIRE(post_send(a, 1, 0, 4096, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 0, base + 100, b.mr->rkey) == 0);
  REQUIRE(poll_one(a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.opcode == IBV_WC_RDMA_WRITE);
  CHECK(b.buf[100] == 0x33);
  CHECK(b.buf[4195] == 0x33);
  CHECK(b.buf[4196] == 0);
  CHECK(quiet(b.cq, 20));  // a plain WRITE consumes no receive

  REQUIRE(post_recv(b, 5, 0, 0) == 0);
  REQUIRE(post_send(a, 2, 0, 16, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED, 0, base + 8000, b.mr->rkey, 77) ==
          0);
  REQUIRE(poll_one(b.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
  CHECK(wc.imm_data == 77u);
  CHECK(wc.byte_len == 16);
  REQUIRE(poll_one(a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);

  SECTION("out of bounds: REM_ACCESS_ERR, nothing written past the region") {
    std::memset(b.buf.data() + b.buf.size() - 8, 0x47, 8);
    REQUIRE(post_send(a, 3, 0, 64, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 0, base + b.buf.size() - 32,
                      b.mr->rkey) == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
    uint64_t tail;
    std::memcpy(&tail, b.buf.data() + b.buf.size() - 8, 8);
    CHECK(tail == kGuard);
    ibv_qp_attr qa{};
    ibv_qp_init_attr qi{};
    REQUIRE(ibv_query_qp(a.qp, &qa, IBV_QP_STATE, &qi) == 0);
    CHECK(qa.qp_state == IBV_QPS_ERR);
  }
  SECTION("bad rkey: REM_ACCESS_ERR") {
    REQUIRE(post_send(a, 3, 0, 64, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 0, base, b.mr->rkey ^ 0x1000) == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
  }
  SECTION("region without REMOTE_WRITE: REM_ACCESS_ERR") {
    std::vector<char> ro(4096, 0);
    ibv_mr* mr = ibv_reg_mr(b.pd, ro.data(), ro.size(), static_cast<int>(IBV_ACCESS_LOCAL_WRITE));
    REQUIRE(mr);
    REQUIRE(post_send(a, 3, 0, 64, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 0, reinterpret_cast<uint64_t>(ro.data()),
                      mr->rkey) == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
    CHECK(ro[0] == 0);
    ibv_dereg_mr(mr);
  }
  SECTION("posting after the error flushes") {
    REQUIRE(post_send(a, 3, 0, 64, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 0, base, 0x12345) == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
    REQUIRE(post_send(a, 4, 0, 64) == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_WR_FLUSH_ERR);
    CHECK(wc.wr_id == 4);
  }
}

TEST_CASE("local key and length errors never touch memory outside a region", "[rc][keys]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_RC));
  REQUIRE(connect_pair(a, b));
  ibv_wc wc{};
  SECTION("bad lkey on the send: LOC_PROT_ERR") {
    REQUIRE(post_send(a, 1, 0, 64, IBV_WR_SEND, IBV_SEND_SIGNALED, 0xdead00) == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_LOC_PROT_ERR);
  }
  SECTION("send SGE past the end of its region: LOC_PROT_ERR") {
    REQUIRE(post_send(a, 1, a.buf.size() - 16, 64) == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_LOC_PROT_ERR);
  }
  SECTION("receive too small: receiver LOC_LEN_ERR, RC sender REM_INV_REQ_ERR, bytes after it untouched") {
    std::memset(b.buf.data() + 32, 0x47, 8);
    REQUIRE(post_recv(b, 2, 0, 32) == 0);
    REQUIRE(post_send(a, 1, 0, 64) == 0);
    REQUIRE(poll_one(b.cq, &wc));
    CHECK(wc.status == IBV_WC_LOC_LEN_ERR);
    uint64_t g;
    std::memcpy(&g, b.buf.data() + 32, 8);
    CHECK(g == kGuard);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_REM_INV_REQ_ERR);
  }
  SECTION("receive with a bad lkey: receiver LOC_PROT_ERR, sender REM_OP_ERR") {
    ibv_sge sge{reinterpret_cast<uint64_t>(b.buf.data()), 64, 0x777000};
    ibv_recv_wr wr{};
    wr.wr_id = 3;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    REQUIRE(ibv_post_recv(b.qp, &wr, &bad) == 0);
    REQUIRE(post_send(a, 1, 0, 64) == 0);
    REQUIRE(poll_one(b.cq, &wc));
    CHECK(wc.status == IBV_WC_LOC_PROT_ERR);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_REM_OP_ERR);
  }
  SECTION("too many SGEs is refused at post time") {
    ibv_sge sges[5] = {};
    ibv_send_wr wr{};
    wr.sg_list = sges;
    wr.num_sge = 5;
    wr.opcode = IBV_WR_SEND;
    ibv_send_wr* bad = nullptr;
    CHECK(ibv_post_send(a.qp, &wr, &bad) == EINVAL);
    CHECK(bad == &wr);
  }
}

TEST_CASE("UC loses a message silently when no receive is posted (quirk empty_rq=drop)", "[uc][loss]") {
  TempFabric f(three_hosts("thunderbolt"));
  REQUIRE(tbemu_set_quirks(f.p(), "empty_rq=drop") == 0);
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1"));
  REQUIRE(b.open("hostB", "rdma_en1"));
  REQUIRE(connect_pair(a, b));
  REQUIRE(post_send(a, 1, 0, 64) == 0);
  ibv_wc wc{};
  REQUIRE(poll_one(a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);  // the sender cannot tell
  CHECK(quiet(b.cq));
  REQUIRE(post_recv(b, 1, 0, 64) == 0);
  CHECK(quiet(b.cq));  // the lost message is not replayed
}

TEST_CASE("RC: no receive posted → RNR retries, then RNR_RETRY_EXC_ERR; rnr_retry 7 waits for a receive",
          "[rc][rnr]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  ibv_wc wc{};
  SECTION("rnr_retry 0") {
    Side a, b;
    REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC));
    REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_RC));
    RcOpts o;
    o.rnr_retry = 0;
    REQUIRE(connect_pair(a, b, o));
    REQUIRE(post_send(a, 1, 0, 64) == 0);
    REQUIRE(post_send(a, 2, 0, 64) == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_RNR_RETRY_EXC_ERR);
    CHECK(wc.wr_id == 1);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_WR_FLUSH_ERR);
    CHECK(wc.wr_id == 2);
  }
  SECTION("rnr_retry 7 (infinite)") {
    Side a, b;
    REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC));
    REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_RC));
    RcOpts o;
    o.rnr_retry = 7;
    REQUIRE(connect_pair(a, b, o));
    a.buf[0] = 'x';
    REQUIRE(post_send(a, 1, 0, 64) == 0);
    CHECK(quiet(a.cq, 50));
    REQUIRE(post_recv(b, 9, 0, 64) == 0);
    REQUIRE(poll_one(a.cq, &wc));  // the sender's poll retries and delivers
    CHECK(wc.status == IBV_WC_SUCCESS);
    REQUIRE(poll_one(b.cq, &wc));
    CHECK(wc.wr_id == 9);
    CHECK(b.buf[0] == 'x');
  }
}

TEST_CASE("peer death: UC loses silently, RC reports RETRY_EXC_ERR", "[death]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  for (ibv_qp_type t : {IBV_QPT_UC, IBV_QPT_RC}) {
    Side a;
    REQUIRE(a.open("hostA", "rdma_en1", t));
    int up[2], down[2];
    REQUIRE(pipe(up) == 0);
    REQUIRE(pipe(down) == 0);
    pid_t child = fork();
    if (child == 0) {
      Side b;
      uint32_t qpn = 0;
      if (b.open("hostB", "rdma_en1", t)) qpn = b.qp->qp_num;
      (void)!write(up[1], &qpn, 4);
      uint32_t peer = 0;
      (void)!read(down[0], &peer, 4);
      int rc = 1;
      if (to_init(b.qp) == 0 && to_rtr(b.qp, peer, make_v4_gid(10, 0, 0, 1), 1) == 0 && to_rts(b.qp) == 0) rc = 0;
      for (int i = 0; i < 4; ++i) post_recv(b, i, 0, 64);
      (void)!write(up[1], &rc, 4);
      _exit(0);  // dies with receives posted and its memory gone
    }
    uint32_t bqpn = 0;
    REQUIRE(read(up[0], &bqpn, 4) == 4);
    REQUIRE(bqpn != 0);
    REQUIRE(to_init(a.qp) == 0);
    REQUIRE(to_rtr(a.qp, bqpn, make_v4_gid(10, 0, 0, 2), 1) == 0);
    RcOpts o;
    REQUIRE(to_rts(a.qp, o) == 0);
    uint32_t mine = a.qp->qp_num;
    REQUIRE(write(down[1], &mine, 4) == 4);
    int crc = -1;
    REQUIRE(read(up[0], &crc, 4) == 4);
    REQUIRE(crc == 0);
    int st = 0;
    waitpid(child, &st, 0);
    REQUIRE(post_send(a, 1, 0, 64) == 0);
    ibv_wc wc{};
    REQUIRE(poll_one(a.cq, &wc, 3000));
    if (t == IBV_QPT_UC)
      CHECK(wc.status == IBV_WC_SUCCESS);
    else
      CHECK(wc.status == IBV_WC_RETRY_EXC_ERR);
    close(up[0]);
    close(up[1]);
    close(down[0]);
    close(down[1]);
  }
}

TEST_CASE("completion channel: a real fd woken by a sender in another process", "[channel]") {
  TempFabric f(three_hosts("thunderbolt"));
  REQUIRE(tbemu_set_quirks(f.p(), "completion_channels=on") == 0);
  ibv_context* ctx = open_dev("hostB", "rdma_en1");
  REQUIRE(ctx);
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
  REQUIRE(ch);
  REQUIRE(ch->fd >= 0);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  int marker = 0;
  ibv_cq* cq = ibv_create_cq(ctx, 16, &marker, ch, 0);
  REQUIRE(cq);
  std::vector<char> buf(4096);
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), static_cast<int>(IBV_ACCESS_LOCAL_WRITE));
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ia.qp_type = IBV_QPT_UC;
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  REQUIRE(qp);
  int up[2], down[2];
  REQUIRE(pipe(up) == 0);
  REQUIRE(pipe(down) == 0);
  pid_t child = fork();
  if (child == 0) {
    Side a;
    uint32_t qpn = a.open("hostA", "rdma_en1") ? a.qp->qp_num : 0;
    (void)!write(up[1], &qpn, 4);
    uint32_t peer = 0;
    (void)!read(down[0], &peer, 4);
    if (to_init(a.qp) == 0 && to_rtr(a.qp, peer, make_v4_gid(10, 0, 0, 2), 1) == 0 && to_rts(a.qp) == 0)
      post_send(a, 1, 0, 128);
    ibv_wc wc;
    poll_one(a.cq, &wc);
    _exit(0);
  }
  uint32_t aqpn = 0;
  REQUIRE(read(up[0], &aqpn, 4) == 4);
  REQUIRE(to_init(qp) == 0);
  REQUIRE(to_rtr(qp, aqpn, make_v4_gid(10, 0, 0, 1), 1) == 0);
  REQUIRE(to_rts(qp) == 0);
  ibv_sge sge{reinterpret_cast<uint64_t>(buf.data()), 4096, mr->lkey};
  ibv_recv_wr rwr{};
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  REQUIRE(ibv_post_recv(qp, &rwr, &bad) == 0);
  REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
  uint32_t mine = qp->qp_num;
  REQUIRE(write(down[1], &mine, 4) == 4);
  pollfd p{ch->fd, POLLIN, 0};
  REQUIRE(poll(&p, 1, 3000) == 1);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  REQUIRE(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0);
  CHECK(ev_cq == cq);
  CHECK(ev_ctx == &marker);
  ibv_ack_cq_events(cq, 1);
  ibv_wc wc{};
  REQUIRE(poll_one(cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.byte_len == 128);
  // Not re-armed: nothing more on the fd.
  CHECK(poll(&p, 1, 50) == 0);
  int st = 0;
  waitpid(child, &st, 0);
  ibv_destroy_qp(qp);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  CHECK(ibv_destroy_comp_channel(ch) == 0);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

TEST_CASE("bad fabric file and unknown host give clear errors, not crashes", "[fabric]") {
  {
    TempFabric f(R"({"hosts": [{"name": "x", "devices": ["rdma_en1"]}], "cables": [["x:rdma_en1:1", "y:rdma_en1"]]})");
    errno = 0;
    int n = -1;
    CHECK(ibv_get_device_list(&n) == nullptr);
    CHECK(errno == EINVAL);
    CHECK(tbemu_set_ipv4(f.p(), "x", "rdma_en1", 1, "10.0.0.1/30") == EINVAL);
    CHECK(std::string(tbemu_last_error()).find("unknown host \"y\"") != std::string::npos);
  }
  {
    TempFabric f("{ not json");
    errno = 0;
    CHECK(ibv_get_device_list(nullptr) == nullptr);
    CHECK(errno == EINVAL);
  }
  {
    TempFabric f(three_hosts("thunderbolt"));
    setenv("TBVERBS_EMU_HOST", "nosuchhost", 1);
    errno = 0;
    CHECK(ibv_get_device_list(nullptr) == nullptr);
    CHECK(errno == ENODEV);
    CHECK(tbemu_set_ipv4(f.p(), "hostA", "rdma_en1", 1, "300.1.1.1") == EINVAL);
  }
}

TEST_CASE("a PD or CQ still in use cannot be destroyed (EBUSY), in order it can", "[lifetime]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side s;
  REQUIRE(s.open("hostA", "rdma_en1"));
  CHECK(ibv_destroy_cq(s.cq) == EBUSY);
  CHECK(ibv_dealloc_pd(s.pd) == EBUSY);
  REQUIRE(ibv_destroy_qp(s.qp) == 0);
  s.qp = nullptr;
  CHECK(ibv_destroy_cq(s.cq) == 0);
  s.cq = nullptr;
  CHECK(ibv_dealloc_pd(s.pd) == EBUSY);  // the MR still uses it
  REQUIRE(ibv_dereg_mr(s.mr) == 0);
  s.mr = nullptr;
  CHECK(ibv_dealloc_pd(s.pd) == 0);
  s.pd = nullptr;
}

TEST_CASE("RC over an unreachable dgid (rc profile) connects, then sends fail with RETRY_EXC_ERR", "[rc][unreachable]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_RC));
  REQUIRE(to_init(a.qp) == 0);
  // hostC's address lives on the other cable: RoCE accepts RTR, the packets go nowhere.
  REQUIRE(to_rtr(a.qp, b.qp->qp_num, make_v4_gid(10, 0, 1, 2), 1) == 0);
  REQUIRE(to_rts(a.qp) == 0);
  REQUIRE(post_send(a, 1, 0, 64) == 0);
  ibv_wc wc{};
  REQUIRE(poll_one(a.cq, &wc, 3000));
  CHECK(wc.status == IBV_WC_RETRY_EXC_ERR);
}

TEST_CASE("RC needs matching PSNs (RETRY_EXC_ERR otherwise); UC resynchronises", "[rc][psn]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  for (ibv_qp_type t : {IBV_QPT_RC, IBV_QPT_UC}) {
    Side a, b;
    REQUIRE(a.open("hostA", "rdma_en1", t));
    REQUIRE(b.open("hostB", "rdma_en1", t));
    REQUIRE(connect_pair(a, b));  // PSN 0 both ways
    // Re-connect a's send side with a PSN b does not expect.
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_RTS;
    at.sq_psn = 0x123456;
    REQUIRE(ibv_modify_qp(a.qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
    REQUIRE(post_recv(b, 1, 0, 4096) == 0);
    REQUIRE(post_send(a, 1, 0, 3000) == 0);
    ibv_wc wc{};
    REQUIRE(poll_one(a.cq, &wc, 3000));
    if (t == IBV_QPT_RC) {
      CHECK(wc.status == IBV_WC_RETRY_EXC_ERR);
      CHECK(quiet(b.cq, 20));
    } else {
      CHECK(wc.status == IBV_WC_SUCCESS);
      REQUIRE(poll_one(b.cq, &wc));
      CHECK(wc.byte_len == 3000);
    }
  }
  // Matching PSNs keep working across multi-packet messages (3000 B = 3 packets at MTU 1024).
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_RC));
  REQUIRE(connect_pair(a, b));
  for (int i = 0; i < 5; ++i) {
    REQUIRE(post_recv(b, i, 0, 4096) == 0);
    REQUIRE(post_send(a, i, 0, 3000) == 0);
    ibv_wc wc{};
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_SUCCESS);
    REQUIRE(poll_one(b.cq, &wc));
    CHECK(wc.status == IBV_WC_SUCCESS);
  }
  REQUIRE(post_send(a, 9, 0, 64, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 0, reinterpret_cast<uint64_t>(b.buf.data()),
                    b.mr->rkey) == 0);
  ibv_wc wc{};
  REQUIRE(poll_one(a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  REQUIRE(post_recv(b, 10, 0, 4096) == 0);
  REQUIRE(post_send(a, 10, 0, 100) == 0);
  REQUIRE(poll_one(b.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
}

TEST_CASE("threads: concurrent RC traffic on separate QPs in one process, with deferred (RNR) sends", "[threads]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  constexpr int kPairs = 3, kMsgs = 300;
  std::vector<std::unique_ptr<Side>> a(kPairs), b(kPairs);
  RcOpts o;
  o.rnr_retry = 7;  // senders run ahead of receives: deferred and retried by polls
  for (int i = 0; i < kPairs; ++i) {
    a[i] = std::make_unique<Side>();
    b[i] = std::make_unique<Side>();
    REQUIRE(a[i]->open("hostA", "rdma_en1", IBV_QPT_RC, 1 << 16, 512));
    REQUIRE(b[i]->open("hostB", "rdma_en1", IBV_QPT_RC, 1 << 16, 512));
    REQUIRE(connect_pair(*a[i], *b[i], o));
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kPairs; ++i) {
    threads.emplace_back([&, i] {  // sender
      Side& s = *a[i];
      int done = 0;
      for (int m = 0; m < kMsgs; ++m) {
        // A send buffer may be reused only once its send has completed (slot m % 8).
        ibv_wc w;
        while (done < m - 7 && poll_one(s.cq, &w, 5000)) done += w.status == IBV_WC_SUCCESS ? 1 : (++failures, 0);
        std::memcpy(s.buf.data() + (m % 8) * 1024, &m, sizeof m);
        if (post_send(s, m, (m % 8) * 1024, 1024) != 0) ++failures;
        ibv_wc wc;
        while (ibv_poll_cq(s.cq, 1, &wc) == 1) done += wc.status == IBV_WC_SUCCESS ? 1 : (++failures, 0);
      }
      ibv_wc wc;
      while (done < kMsgs && poll_one(s.cq, &wc, 5000)) done += wc.status == IBV_WC_SUCCESS ? 1 : (++failures, 0);
      if (done != kMsgs) ++failures;
    });
    threads.emplace_back([&, i] {  // receiver, posting late and in small batches
      Side& r = *b[i];
      int got = 0, posted = 0;
      while (got < kMsgs) {
        if (posted - got < 4 && posted < kMsgs) post_recv(r, posted, (posted % 8) * 1024, 1024), ++posted;
        ibv_wc wc;
        if (ibv_poll_cq(r.cq, 1, &wc) == 1) {
          int v = -1;
          std::memcpy(&v, r.buf.data() + (wc.wr_id % 8) * 1024, sizeof v);
          if (wc.status != IBV_WC_SUCCESS || v != static_cast<int>(wc.wr_id)) ++failures;
          ++got;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures.load() == 0);
}

namespace {
void on_alarm(int) {}
// Runs `blocking_call` in a child process with SIGALRM (no SA_RESTART) due after 100 ms; returns
// the child's exit status: 0 when the call returned -1 with EINTR, 1 otherwise, 2 when it was
// still blocked 5 s later (killed: the signal did not end it).
template <class F> int status_after_signal(F blocking_call) {
  const pid_t child = fork();
  if (child == 0) {
    struct sigaction sa {};
    sa.sa_handler = on_alarm;  // no SA_RESTART: the signal must end the wait
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, nullptr);
    itimerval t{};
    t.it_value.tv_usec = 100 * 1000;
    setitimer(ITIMER_REAL, &t, nullptr);
    const int r = blocking_call();
    _exit(r == -1 && errno == EINTR ? 0 : 1);
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int st = 0;
  while (waitpid(child, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) {
      kill(child, SIGKILL);
      waitpid(child, &st, 0);
      return 2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 3;
}
} // namespace

TEST_CASE("a signal ends ibv_get_cq_event and ibv_get_async_event with EINTR, as rdma-core's read() does", "[channel][signal]") {
  // qperf ends its timed tests with SIGALRM; an emulator that looped on EINTR hung it (issue 19 item 6).
  TempFabric f(three_hosts("thunderbolt"));
  REQUIRE(tbemu_set_quirks(f.p(), "completion_channels=on") == 0);
  ibv_context* ctx = open_dev("hostB", "rdma_en1");
  REQUIRE(ctx);
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
  REQUIRE(ch);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, ch, 0);
  REQUIRE(cq);
  REQUIRE(ibv_req_notify_cq(cq, 0) == 0);
  CHECK(status_after_signal([&] {
          ibv_cq* ev_cq = nullptr;
          void* ev_ctx = nullptr;
          return ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
        }) == 0);
  CHECK(status_after_signal([&] {
          ibv_async_event ev{};
          return ibv_get_async_event(ctx, &ev);
        }) == 0);
  // A non-blocking async fd answers at once.
  const int fl = fcntl(ctx->async_fd, F_GETFL);
  REQUIRE(fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0);
  ibv_async_event ev{};
  errno = 0;
  CHECK(ibv_get_async_event(ctx, &ev) == -1);
  CHECK(errno == EAGAIN);
  ibv_destroy_cq(cq);
  CHECK(ibv_destroy_comp_channel(ch) == 0);
  ibv_close_device(ctx);
}
