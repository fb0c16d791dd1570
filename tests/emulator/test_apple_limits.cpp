// Thunderbolt profile = Apple's published driver (docs/field-reports.md section 4b):
// every cap reported by ibv_query_device/ibv_query_port is also enforced.
#include <sys/wait.h>

#include <catch2/catch_test_macros.hpp>
#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <memory>

#include "emu_test_util.hpp"

using namespace emutest;

namespace {
constexpr size_t kMaxMrSize = 16384000;  // [R] Anemll/MCDMA: 0xfa0000
constexpr uint32_t kMaxMsg = 16773120;   // TN3205: 4095 frames of 4 KiB

// Runs `body` in a child process and returns its exit status (0 = ok).
template <typename F>
int in_child(F body) {
  pid_t p = fork();
  if (p == 0) _exit(body());
  int st = 0;
  waitpid(p, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}
}  // namespace

TEST_CASE("tb limits: ibv_query_device and ibv_query_port report the published caps", "[tb][limits]") {
  TempFabric f(R"({"hosts": [
      {"name": "hostA", "devices": [{"name": "rdma_en1", "ports": [{"port": 1, "ipv4": "10.0.0.1/30"}]},
                                    {"name": "rdma_en2", "ports": [{"port": 1}]}]},
      {"name": "hostB", "devices": [{"name": "rdma_en1", "ports": [{"port": 1, "ipv4": "10.0.0.2/30"}]}]}],
    "cables": [["hostA:rdma_en1", "hostB:rdma_en1"]]})");
  ibv_context* a = open_dev("hostA", "rdma_en1");
  ibv_context* a2 = open_dev("hostA", "rdma_en2");
  ibv_context* b = open_dev("hostB", "rdma_en1");
  REQUIRE(a);
  REQUIRE(a2);
  REQUIRE(b);
  ibv_device_attr d{};
  REQUIRE(ibv_query_device(a, &d) == 0);
  CHECK(d.max_qp == 11);
  CHECK(d.max_pd == 11);
  CHECK(d.max_cq == 11);
  CHECK(d.max_mr == 100);
  CHECK(d.max_sge == 1);
  CHECK(d.max_srq == 0);
  CHECK(d.max_qp_rd_atom == 0);
  CHECK(d.max_mr_size == kMaxMrSize);
  CHECK(d.max_qp_wr == 4095);
  CHECK(d.max_cqe == 4096);
  CHECK(d.phys_port_cnt == 1);
  // 100 is not an enumerator of ibv_transport_type: read the raw value (loading it as the enum
  // is undefined behaviour, and UBSan says so).
  int transport = 0;
  static_assert(sizeof(a->device->transport_type) == sizeof transport);
  std::memcpy(&transport, &a->device->transport_type, sizeof transport);
  CHECK(transport == 100);
  ibv_port_attr pa{}, pa2{}, pb{};
  REQUIRE(ibv_query_port(a, 1, &pa) == 0);
  REQUIRE(ibv_query_port(a2, 1, &pa2) == 0);
  REQUIRE(ibv_query_port(b, 1, &pb) == 0);
  CHECK(pa.link_layer == 100);
  CHECK(pa.active_mtu == IBV_MTU_4096);
  CHECK(pa.max_mtu == IBV_MTU_4096);
  CHECK(pa.max_msg_sz == kMaxMsg);
  CHECK(pa.lid != 0);
  CHECK(pa2.lid != 0);
  CHECK(pb.lid != 0);
  CHECK(pa.lid != pa2.lid);
  CHECK(pa.lid != pb.lid);
  for (auto* c : {a, a2, b}) ibv_close_device(c);
}

TEST_CASE("tb limits: ibv_reg_mr up to max_mr_size (16,384,000) works, one byte more is EINVAL", "[tb][limits][mr]") {
  TempFabric f(three_hosts("thunderbolt"));
  ibv_context* ctx = open_dev("hostA", "rdma_en1");
  REQUIRE(ctx);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  REQUIRE(pd);
  // malloc'd, never written: registration populates and pins the pages (docs/emulator.md, "Registration
  // and pinning"), as the kernel does for a NIC.
  std::unique_ptr<char, decltype(&std::free)> buf(static_cast<char*>(std::malloc(kMaxMrSize + 4096)), &std::free);
  ibv_mr* ok = ibv_reg_mr(pd, buf.get(), kMaxMrSize, IBV_ACCESS_LOCAL_WRITE);
  CHECK(ok != nullptr);
  errno = 0;
  CHECK(ibv_reg_mr(pd, buf.get(), kMaxMrSize + 1, IBV_ACCESS_LOCAL_WRITE) == nullptr);
  CHECK(errno == EINVAL);
  if (ok) ibv_dereg_mr(ok);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

TEST_CASE("tb limits: 100 MRs per device across the processes of a host; the 101st is ENOMEM", "[tb][limits][mr]") {
  TempFabric f(three_hosts("thunderbolt"));
  std::vector<char> buf(4096);
  int go[2], ready[2];
  REQUIRE(pipe(go) == 0);
  REQUIRE(pipe(ready) == 0);
  pid_t child = fork();
  if (child == 0) {  // another process on hostA holds 40 of them
    ibv_context* c = open_dev("hostA", "rdma_en1");
    ibv_pd* pd = c ? ibv_alloc_pd(c) : nullptr;
    int n = 0;
    for (; pd && n < 40; ++n)
      if (!ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE)) break;
    char r = n == 40 ? 'y' : 'n';
    (void)!write(ready[1], &r, 1);
    (void)!read(go[0], &r, 1);
    _exit(0);
  }
  char r = 0;
  REQUIRE(read(ready[0], &r, 1) == 1);
  REQUIRE(r == 'y');
  ibv_context* ctx = open_dev("hostA", "rdma_en1");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  REQUIRE(pd);
  std::vector<ibv_mr*> mine;
  for (int i = 0; i < 60; ++i) {
    ibv_mr* m = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
    REQUIRE(m);
    mine.push_back(m);
  }
  errno = 0;
  CHECK(ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE) == nullptr);  // the 101st
  CHECK(errno == ENOMEM);
  // Another device of the same host has its own 100.
  ibv_context* ctx2 = open_dev("hostA", "rdma_en2");
  ibv_pd* pd2 = ibv_alloc_pd(ctx2);
  ibv_mr* other = ibv_reg_mr(pd2, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  CHECK(other != nullptr);
  // The other process exits: its 40 are released.
  (void)!write(go[1], "x", 1);
  int st = 0;
  waitpid(child, &st, 0);
  ibv_mr* again = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  CHECK(again != nullptr);
  if (again) mine.push_back(again);
  for (auto* m : mine) ibv_dereg_mr(m);
  if (other) ibv_dereg_mr(other);
  ibv_dealloc_pd(pd2);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx2);
  ibv_close_device(ctx);
}

TEST_CASE("tb limits: 11 PDs and 11 CQs per device across processes; the 12th is ENOMEM", "[tb][limits]") {
  TempFabric f(three_hosts("thunderbolt"));
  ibv_context* ctx = open_dev("hostA", "rdma_en1");
  REQUIRE(ctx);
  // A child process takes 4 PDs and 4 CQs and keeps them while the parent counts.
  int go[2], ready[2];
  REQUIRE(pipe(go) == 0);
  REQUIRE(pipe(ready) == 0);
  pid_t child = fork();
  if (child == 0) {
    ibv_context* c = open_dev("hostA", "rdma_en1");
    bool ok = c != nullptr;
    for (int i = 0; ok && i < 4; ++i) ok = ibv_alloc_pd(c) && ibv_create_cq(c, 16, nullptr, nullptr, 0);
    char r = ok ? 'y' : 'n';
    (void)!write(ready[1], &r, 1);
    (void)!read(go[0], &r, 1);
    _exit(0);
  }
  char r = 0;
  REQUIRE(read(ready[0], &r, 1) == 1);
  REQUIRE(r == 'y');
  std::vector<ibv_pd*> pds;
  std::vector<ibv_cq*> cqs;
  for (int i = 0; i < 7; ++i) {
    ibv_pd* pd = ibv_alloc_pd(ctx);
    REQUIRE(pd);
    pds.push_back(pd);
    ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
    REQUIRE(cq);
    cqs.push_back(cq);
  }
  errno = 0;
  CHECK(ibv_alloc_pd(ctx) == nullptr);
  CHECK(errno == ENOMEM);
  errno = 0;
  CHECK(ibv_create_cq(ctx, 16, nullptr, nullptr, 0) == nullptr);
  CHECK(errno == ENOMEM);
  // Freed ones can be taken again; a dead process's are freed.
  REQUIRE(ibv_dealloc_pd(pds.back()) == 0);
  pds.pop_back();
  ibv_pd* pd = ibv_alloc_pd(ctx);
  CHECK(pd != nullptr);
  if (pd) pds.push_back(pd);
  (void)!write(go[1], "x", 1);
  int st = 0;
  waitpid(child, &st, 0);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  CHECK(cq != nullptr);
  if (cq) cqs.push_back(cq);
  // CQs are at most max_cqe entries.
  errno = 0;
  CHECK(ibv_create_cq(ctx, 4097, nullptr, nullptr, 0) == nullptr);
  CHECK(errno == EINVAL);
  for (auto* c : cqs) ibv_destroy_cq(c);
  for (auto* p : pds) ibv_dealloc_pd(p);
  ibv_close_device(ctx);
}

TEST_CASE("tb limits: max_sge 1: create_qp with 2 SGEs is EINVAL, a post with 2 is EINVAL", "[tb][limits][sge]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side s;
  REQUIRE(s.open("hostA", "rdma_en1"));
  for (int which = 0; which < 2; ++which) {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = s.cq;
    a.cap.max_send_wr = a.cap.max_recv_wr = 4;
    a.cap.max_send_sge = which == 0 ? 2 : 1;
    a.cap.max_recv_sge = which == 1 ? 2 : 1;
    a.qp_type = IBV_QPT_UC;
    errno = 0;
    CHECK(ibv_create_qp(s.pd, &a) == nullptr);
    CHECK(errno == EINVAL);
  }
  REQUIRE(to_init(s.qp) == 0);
  ibv_sge sges[2] = {{reinterpret_cast<uint64_t>(s.buf.data()), 64, s.mr->lkey},
                     {reinterpret_cast<uint64_t>(s.buf.data()) + 64, 64, s.mr->lkey}};
  ibv_recv_wr rwr{};
  rwr.sg_list = sges;
  rwr.num_sge = 2;
  ibv_recv_wr* rbad = nullptr;
  CHECK(ibv_post_recv(s.qp, &rwr, &rbad) == EINVAL);
}

TEST_CASE("tb limits: a send longer than max_msg_sz completes with LOC_LEN_ERR", "[tb][limits][msg]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_UC, 4096, 4095));
  REQUIRE(b.open("hostB", "rdma_en1"));
  REQUIRE(connect_pair(a, b));
  ibv_sge sge{reinterpret_cast<uint64_t>(a.buf.data()), kMaxMsg + 1, a.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 9;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  REQUIRE(ibv_post_send(a.qp, &wr, &bad) == 0);
  ibv_wc wc{};
  REQUIRE(poll_one(a.cq, &wc));
  CHECK(wc.status == IBV_WC_LOC_LEN_ERR);
  CHECK(wc.wr_id == 9);
}

TEST_CASE("tb limits: waiting and in-flight sends hold send-queue frames; a full send queue is ENOMEM",
          "[tb][limits][depth]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_UC, 1 << 16, 32));  // granted 1023 frames
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_UC, 1 << 16, 32));
  REQUIRE(connect_pair(a, b));
  // No receives posted (empty_rq=wait): 63 sends of 16 frames wait, the 64th does not fit.
  int posted = 0;
  for (; posted < 100; ++posted)
    if (post_send(a, static_cast<uint64_t>(posted), 0, 64 << 10) != 0) break;
  CHECK(posted == 63);
  CHECK(post_send(a, 100, 0, 64 << 10) == ENOMEM);
  // One receive lets one send go, which frees its 16 frames.
  REQUIRE(post_recv(b, 1, 0, 64 << 10) == 0);
  ibv_wc wc{};
  REQUIRE(poll_one(b.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(post_send(a, 101, 0, 64 << 10) == 0);
  CHECK(post_send(a, 102, 0, 64 << 10) == ENOMEM);
}

TEST_CASE("tb limits: PDs leaked by orphaned processes count against the 11; RTR then fails with ENODATA",
          "[tb][limits][pd]") {
  TempFabric f(three_hosts("thunderbolt"));
  REQUIRE(tbemu_fault_leak_pds(f.p(), "hostA", "rdma_en1", 10) == 0);
  CHECK(tbemu_fault_leak_pds(f.p(), "hostA", "rdma_en1", 2) == ENOSPC);
  CHECK(std::string(tbemu_describe(f.p())).find("pds=10 (10 leaked)") != std::string::npos);
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1"));  // the 11th PD
  REQUIRE(b.open("hostB", "rdma_en1"));
  errno = 0;
  CHECK(ibv_alloc_pd(a.ctx) == nullptr);
  CHECK(errno == ENOMEM);
  REQUIRE(to_init(a.qp) == 0);
  CHECK(to_rtr(a.qp, b.qp->qp_num, gid_of(b.ctx, 1), 1) == ENODATA);
  // Another device is not affected, nor are leaked PDs freed by a process exit...
  CHECK(in_child([] {
          Side c;
          return c.open("hostA", "rdma_en2") ? 0 : 1;
        }) == 0);
  CHECK(to_rtr(a.qp, b.qp->qp_num, gid_of(b.ctx, 1), 1) == ENODATA);
  // ... only by a "reboot" (reset, or clearing the faults).
  REQUIRE(tbemu_fault_clear(f.p()) == 0);
  CHECK(to_rtr(a.qp, b.qp->qp_num, gid_of(b.ctx, 1), 1) == 0);
}
