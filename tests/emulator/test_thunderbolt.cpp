// Thunderbolt profile: the Apple driver behaviour of docs/field-reports.md section 4.
#include <catch2/catch_test_macros.hpp>
#include <cerrno>
#include <sys/wait.h>

#include "emu_test_util.hpp"

using namespace emutest;

TEST_CASE("tb: GID table is fe80 only until the port has an IPv4 address", "[tb][gid]") {
  TempFabric f(three_hosts("thunderbolt", false));
  ibv_context* ctx = open_dev("hostA", "rdma_en1");
  REQUIRE(ctx);
  ibv_port_attr pa{};
  REQUIRE(ibv_query_port(ctx, 1, &pa) == 0);
  CHECK(pa.gid_tbl_len == 1024);
  CHECK(pa.active_mtu == IBV_MTU_4096);
  CHECK(pa.state == IBV_PORT_ACTIVE);
  ibv_gid g0 = gid_of(ctx, 0), g1 = gid_of(ctx, 1), zero{};
  CHECK(g0.raw[0] == 0xfe);
  CHECK(g0.raw[1] == 0x80);
  CHECK(std::memcmp(&g1, &zero, sizeof zero) == 0);

  // Another process (the CLI, here the C API) adds the address at run time.
  REQUIRE(tbemu_set_ipv4(f.p(), "hostA", "rdma_en1", 1, "169.254.10.1/16") == 0);
  g1 = gid_of(ctx, 1);
  ibv_gid want = make_v4_gid(169, 254, 10, 1);
  CHECK(std::memcmp(&g1, &want, sizeof want) == 0);

  // Changed, then removed.
  REQUIRE(tbemu_set_ipv4(f.p(), "hostA", "rdma_en1", 1, "10.9.9.1/30") == 0);
  want = make_v4_gid(10, 9, 9, 1);
  g1 = gid_of(ctx, 1);
  CHECK(std::memcmp(&g1, &want, sizeof want) == 0);
  REQUIRE(tbemu_clear_ipv4(f.p(), "hostA", "rdma_en1", 1) == 0);
  g1 = gid_of(ctx, 1);
  CHECK(std::memcmp(&g1, &zero, sizeof zero) == 0);
  ibv_gid out{};
  CHECK(ibv_query_gid(ctx, 1, 1024, &out) == -1);
  ibv_close_device(ctx);
}

TEST_CASE("tb: only UC queue pairs; RC and UD are refused with EOPNOTSUPP", "[tb][qp]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side s;
  REQUIRE(s.open("hostA", "rdma_en1"));
  for (ibv_qp_type t : {IBV_QPT_RC, IBV_QPT_UD}) {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = s.cq;
    a.cap.max_send_wr = a.cap.max_recv_wr = 4;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.qp_type = t;
    errno = 0;
    CHECK(ibv_create_qp(s.pd, &a) == nullptr);
    CHECK(errno == EOPNOTSUPP);
  }
}

TEST_CASE("tb: at most 10 QPs per device, counted across processes", "[tb][qp]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side s;
  REQUIRE(s.open("hostA", "rdma_en1"));  // QP 1
  int go[2], done[2];
  REQUIRE(pipe(go) == 0);
  REQUIRE(pipe(done) == 0);
  pid_t child = fork();
  if (child == 0) {
    Side c;
    bool ok = c.open("hostA", "rdma_en1");  // QP 2
    std::vector<ibv_qp*> extra;
    for (int i = 0; ok && i < 4; ++i) ok = c.create_qp(), extra.push_back(c.qp);  // QPs 3..6
    char r = ok ? 'y' : 'n';
    (void)!write(done[1], &r, 1);
    (void)!read(go[0], &r, 1);  // hold them until the parent has checked
    _exit(0);
  }
  char r = 0;
  REQUIRE(read(done[0], &r, 1) == 1);
  REQUIRE(r == 'y');
  CHECK(tbemu_qp_count(f.p(), "hostA", "rdma_en1") == 6);
  std::vector<ibv_qp*> mine{s.qp};
  for (int i = 0; i < 4; ++i) {  // QPs 7..10
    REQUIRE(s.create_qp());
    mine.push_back(s.qp);
  }
  errno = 0;
  CHECK_FALSE(s.create_qp());  // the 11th
  CHECK(errno == EBUSY);
  // Another device is not affected.
  Side other;
  CHECK(other.open("hostA", "rdma_en2"));
  // When the other process exits its QPs are released, like the kernel does.
  (void)!write(go[1], "x", 1);
  int st = 0;
  waitpid(child, &st, 0);
  CHECK(s.create_qp());
  mine.push_back(s.qp);
  for (ibv_qp* q : mine) ibv_destroy_qp(q);
  s.qp = nullptr;
}

TEST_CASE("tb: depths are granted as 2^k-1 frames (at least 1023, at most 4095) and read back", "[tb][depth]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side s;
  REQUIRE(s.open("hostA", "rdma_en1"));
  const std::pair<uint32_t, uint32_t> cases[] = {{0, 1023}, {32, 1023}, {256, 1023}, {1023, 1023},
                                                 {1024, 2047}, {3000, 4095}, {10000, 4095}};
  for (auto [req, want] : cases) {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = s.cq;
    a.cap.max_send_wr = a.cap.max_recv_wr = req;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.qp_type = IBV_QPT_UC;
    ibv_qp* q = ibv_create_qp(s.pd, &a);
    REQUIRE(q);
    CHECK(a.cap.max_recv_wr == want);  // the create_qp read-back
    CHECK(a.cap.max_send_wr == want);
    ibv_qp_attr qa{};
    ibv_qp_init_attr qi{};
    REQUIRE(ibv_query_qp(q, &qa, IBV_QP_CAP, &qi) == 0);
    CHECK(qi.cap.max_recv_wr == want);
    CHECK(qa.cap.max_send_wr == want);
    ibv_destroy_qp(q);
  }
}

TEST_CASE("tb: a depth-256 QP (granted 1023 frames) refuses the 64th posted 64 KiB receive with ENOMEM (hellas#35)",
          "[tb][depth]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side s;
  REQUIRE(s.open("hostA", "rdma_en1", IBV_QPT_UC, 64 << 10, 256));
  REQUIRE(to_init(s.qp) == 0);
  int first_failure = -1, ret = 0;
  for (int i = 0; i < 256; ++i)
    if ((ret = post_recv(s, static_cast<uint64_t>(i), 0, 64 << 10)) != 0) {
      first_failure = i;
      break;
    }
  CHECK(first_failure == 63);  // the field: post_recv[63/256] ret=-12
  CHECK(ret == ENOMEM);
  // 1008 frames are taken: a 15-frame receive still fits, then nothing does.
  CHECK(post_recv(s, 999, 0, 15 * 4096) == 0);
  CHECK(post_recv(s, 1000, 0, 100) == ENOMEM);
}

TEST_CASE("tb: a depth-32 QP takes two 512 KiB receives and two 512 KiB sends (macOS 26.3)", "[tb][depth]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_UC, 1 << 20, 32));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_UC, 1 << 20, 32));
  REQUIRE(connect_pair(a, b));
  for (size_t i = 0; i < a.buf.size(); ++i) a.buf[i] = static_cast<char>(i * 7 + 3);
  REQUIRE(post_recv(b, 1, 0, 512 << 10) == 0);
  REQUIRE(post_recv(b, 2, 512 << 10, 512 << 10) == 0);
  REQUIRE(post_send(a, 11, 0, 512 << 10) == 0);
  REQUIRE(post_send(a, 12, 512 << 10, 512 << 10) == 0);
  ibv_wc wc{};
  for (uint64_t id : {1, 2}) {
    REQUIRE(poll_one(b.cq, &wc, 10000));
    CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(wc.wr_id == id);
    CHECK(wc.byte_len == 512u << 10);
  }
  CHECK(std::memcmp(a.buf.data(), b.buf.data(), a.buf.size()) == 0);
}

TEST_CASE("tb: SEND/RECV works; RDMA WRITE completes but moves nothing; send with immediate is refused",
          "[tb][data]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1"));
  REQUIRE(b.open("hostB", "rdma_en1"));
  REQUIRE(connect_pair(a, b));
  std::memset(a.buf.data(), 0x5a, 4096);
  REQUIRE(post_recv(b, 7, 0, 4096) == 0);
  REQUIRE(post_send(a, 1, 0, 4096) == 0);
  ibv_wc wc{};
  REQUIRE(poll_one(b.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.opcode == IBV_WC_RECV);
  CHECK(wc.byte_len == 4096);
  CHECK(wc.wr_id == 7);
  CHECK(wc.qp_num == b.qp->qp_num);
  CHECK(b.buf[4095] == 0x5a);
  REQUIRE(poll_one(a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.opcode == IBV_WC_SEND);

  std::memset(a.buf.data(), 0x11, 4096);
  REQUIRE(post_send(a, 2, 0, 4096, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 0,
                    reinterpret_cast<uint64_t>(b.buf.data()) + 8192, b.mr->rkey) == 0);
  REQUIRE(poll_one(a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.opcode == IBV_WC_RDMA_WRITE);
  CHECK(b.buf[8192] == 0);  // accepted, completed, never executed

  CHECK(post_send(a, 3, 0, 16, IBV_WR_SEND_WITH_IMM) == EINVAL);
}

TEST_CASE("tb: a send and its receive must span the same number of 4 KiB frames", "[tb][frames]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1"));
  REQUIRE(b.open("hostB", "rdma_en1"));
  REQUIRE(connect_pair(a, b));
  REQUIRE(post_recv(b, 1, 0, 8192) == 0);  // 2 frames
  REQUIRE(post_send(a, 1, 0, 100) == 0);   // 1 frame
  ibv_wc wc{};
  REQUIRE(poll_one(b.cq, &wc));
  CHECK(wc.status != IBV_WC_SUCCESS);
  CHECK(wc.status == IBV_WC_LOC_LEN_ERR);
  // Same frame count with different byte sizes is fine.
  REQUIRE(post_recv(b, 2, 0, 4096) == 0);
  REQUIRE(post_send(a, 2, 0, 100) == 0);
  REQUIRE(poll_one(b.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.byte_len == 100);
}

TEST_CASE("tb: port down makes ibv_alloc_pd fail; both cable ends go PORT_DOWN", "[tb][port]") {
  TempFabric f(three_hosts("thunderbolt"));
  REQUIRE(tbemu_set_port_up(f.p(), "hostB", "rdma_en1", 1, 0) == 0);
  ibv_context* ctx = open_dev("hostA", "rdma_en1");
  REQUIRE(ctx);
  ibv_port_attr pa{};
  REQUIRE(ibv_query_port(ctx, 1, &pa) == 0);
  CHECK(pa.state == IBV_PORT_DOWN);
  errno = 0;
  CHECK(ibv_alloc_pd(ctx) == nullptr);
  CHECK(errno == ENETDOWN);
  REQUIRE(tbemu_set_port_up(f.p(), "hostB", "rdma_en1", 1, 1) == 0);
  REQUIRE(ibv_query_port(ctx, 1, &pa) == 0);
  CHECK(pa.state == IBV_PORT_ACTIVE);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  CHECK(pd != nullptr);
  if (pd) ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

TEST_CASE("tb: RTR fails as the field saw it", "[tb][rtr]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side a, b, c;
  REQUIRE(a.open("hostA", "rdma_en1"));
  REQUIRE(b.open("hostB", "rdma_en1"));
  REQUIRE(c.open("hostC", "rdma_en1"));
  REQUIRE(to_init(a.qp) == 0);
  ibv_gid zero{};
  SECTION("unset dgid: EINVAL") { CHECK(to_rtr(a.qp, b.qp->qp_num, zero, 1) == EINVAL); }
  SECTION("no GRH: EINVAL") { CHECK(to_rtr(a.qp, b.qp->qp_num, gid_of(b.ctx, 1), 1, false) == EINVAL); }
  SECTION("sgid index not the IPv4-mapped entry (fe80 at 0, ::ffff: at 1): EINVAL") {
    CHECK(to_rtr(a.qp, b.qp->qp_num, gid_of(b.ctx, 1), 0) == EINVAL);
  }
  SECTION("source without IPv4 (index 1 empty): ENODATA") {
    REQUIRE(tbemu_clear_ipv4(f.p(), "hostA", "rdma_en1", 1) == 0);
    CHECK(to_rtr(a.qp, b.qp->qp_num, gid_of(b.ctx, 1), 1) == ENODATA);
  }
  SECTION("link-local dgid: ETIMEDOUT") {
    CHECK(to_rtr(a.qp, b.qp->qp_num, gid_of(b.ctx, 0), 1) == ETIMEDOUT);
  }
  SECTION("peer's IPv4 on another cable: ETIMEDOUT") {
    CHECK(to_rtr(a.qp, c.qp->qp_num, gid_of(c.ctx, 1), 1) == ETIMEDOUT);
  }
  SECTION("the right GID works") { CHECK(to_rtr(a.qp, b.qp->qp_num, gid_of(b.ctx, 1), 1) == 0); }
}

TEST_CASE("tb: ipv4_gid_index moves the IPv4-mapped GID (e.g. to index 2); RTR from index 1 is EINVAL (mlx PR #3389)",
          "[tb][gid]") {
  TempFabric f(R"({"hosts": [
      {"name": "hostA", "devices": [{"name": "rdma_en1", "ports": [{"port": 1, "ipv4": "10.0.0.1/30", "ipv4_gid_index": 2}]}]},
      {"name": "hostB", "devices": [{"name": "rdma_en1", "ports": [{"port": 1, "ipv4": "10.0.0.2/30", "ipv4_gid_index": 2}]}]}],
    "cables": [["hostA:rdma_en1", "hostB:rdma_en1"]]})");
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1"));
  REQUIRE(b.open("hostB", "rdma_en1"));
  ibv_gid g1 = gid_of(a.ctx, 1), g2 = gid_of(a.ctx, 2), want = make_v4_gid(10, 0, 0, 1);
  CHECK(g1.raw[0] == 0xfe);
  CHECK(std::memcmp(&g2, &want, sizeof want) == 0);
  REQUIRE(to_init(a.qp) == 0);
  CHECK(to_rtr(a.qp, b.qp->qp_num, gid_of(b.ctx, 2), 1) == EINVAL);  // hard-coded index 1
  CHECK(to_rtr(a.qp, b.qp->qp_num, gid_of(b.ctx, 2), 2) == 0);
}
