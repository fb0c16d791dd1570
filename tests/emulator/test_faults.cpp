// Fault injection: fail the Nth call, drop one direction, orphaned QP holder, delay.
#include <signal.h>
#include <sys/wait.h>

#include <catch2/catch_test_macros.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>

#include "emu_test_util.hpp"

using namespace emutest;

TEST_CASE("fault: fail the Nth call of a verb with a chosen errno", "[fault]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side s;
  REQUIRE(s.open("hostA", "rdma_en1"));
  // The 2nd ibv_create_qp on hostA from now on fails with EBUSY, once.
  REQUIRE(tbemu_fault_fail_call(f.p(), "hostA", "ibv_create_qp", 2, EBUSY, 1) == 0);
  ibv_qp* first = s.qp;
  REQUIRE(s.create_qp());
  ibv_qp* second = s.qp;
  errno = 0;
  CHECK_FALSE(s.create_qp());
  CHECK(errno == EBUSY);
  CHECK(s.create_qp());
  ibv_destroy_qp(first);
  ibv_destroy_qp(second);

  // modify_qp returns the errno itself.
  REQUIRE(tbemu_fault_fail_call(f.p(), nullptr, "ibv_modify_qp", 1, ETIMEDOUT, 1) == 0);
  CHECK(to_init(s.qp) == ETIMEDOUT);
  CHECK(to_init(s.qp) == 0);

  // A fault on another host does not fire here.
  REQUIRE(tbemu_fault_fail_call(f.p(), "hostB", "ibv_alloc_pd", 1, ENOMEM, 0) == 0);
  ibv_pd* pd = ibv_alloc_pd(s.ctx);
  CHECK(pd != nullptr);
  if (pd) ibv_dealloc_pd(pd);
  REQUIRE(tbemu_fault_clear(f.p()) == 0);
  CHECK(tbemu_fault_fail_call(f.p(), "nohost", "ibv_alloc_pd", 1, ENOMEM, 0) == ENOENT);
}

TEST_CASE("fault: drop one direction of a QP pair", "[fault][drop]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  SECTION("by QP number, UC: that direction loses everything, the other works") {
    Side a, b;
    REQUIRE(a.open("hostA", "rdma_en1"));
    REQUIRE(b.open("hostB", "rdma_en1"));
    REQUIRE(connect_pair(a, b));
    REQUIRE(tbemu_fault_drop_qp(f.p(), a.qp->qp_num) == 0);
    REQUIRE(post_recv(b, 1, 0, 64) == 0);
    REQUIRE(post_send(a, 1, 0, 64) == 0);
    ibv_wc wc{};
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(quiet(b.cq));
    REQUIRE(post_recv(a, 2, 0, 64) == 0);
    REQUIRE(post_send(b, 2, 0, 64) == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.wr_id == 2);
    CHECK(wc.opcode == IBV_WC_RECV);
  }
  SECTION("next QP created on a host, RC: the sender sees RETRY_EXC_ERR") {
    REQUIRE(tbemu_fault_drop_next_qp(f.p(), "hostA") == 0);
    Side a, b;
    REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC));
    REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_RC));
    REQUIRE(connect_pair(a, b));
    REQUIRE(post_recv(b, 1, 0, 64) == 0);
    REQUIRE(post_send(a, 1, 0, 64) == 0);
    ibv_wc wc{};
    REQUIRE(poll_one(a.cq, &wc, 3000));
    CHECK(wc.status == IBV_WC_RETRY_EXC_ERR);
    // Only the next QP was affected: b → a still works.
    Side c;
    REQUIRE(c.open("hostA", "rdma_en1", IBV_QPT_RC));
  }
}

TEST_CASE("fault: delivery delay", "[fault][delay]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1"));
  REQUIRE(b.open("hostB", "rdma_en1"));
  REQUIRE(connect_pair(a, b));
  REQUIRE(tbemu_fault_delay(f.p(), "hostA", 100000) == 0);  // 100 ms
  REQUIRE(post_recv(b, 1, 0, 64) == 0);
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE(post_send(a, 1, 0, 64) == 0);
  ibv_wc wc{};
  CHECK(quiet(b.cq, 30));
  REQUIRE(poll_one(a.cq, &wc));  // the sender's poll drives the delayed delivery
  REQUIRE(poll_one(b.cq, &wc));
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  CHECK(ms >= 100);
  CHECK(wc.status == IBV_WC_SUCCESS);
}

#ifdef TBVERBS_EMU_CLI_PATH
TEST_CASE("fault: an orphaned process holding QPs makes create_qp fail with EBUSY", "[fault][orphan]") {
  TempFabric f(three_hosts("thunderbolt"));
  std::string pidfile = f.dir + "/holder.pid";
  std::string cmd = std::string(TBVERBS_EMU_CLI_PATH) + " --fabric " + f.path +
                    " hold-qps hostA rdma_en1 -n 10 --seconds 60 --daemon --pidfile " + pidfile;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p);
  char line[256] = {};
  bool got = fgets(line, sizeof line, p) != nullptr;
  int rc = pclose(p);
  REQUIRE(got);
  REQUIRE(rc == 0);
  int pid = 0;
  REQUIRE(std::sscanf(line, "holding %*d QPs on %*s pid %d", &pid) == 1);
  CHECK(getppid() != pid);
  CHECK(tbemu_qp_count(f.p(), "hostA", "rdma_en1") == 10);

  Side s;
  errno = 0;
  CHECK_FALSE(s.open("hostA", "rdma_en1"));
  CHECK(errno == EBUSY);
  // Killing the orphan frees its QPs.
  REQUIRE(kill(pid, SIGKILL) == 0);
  for (int i = 0; i < 100 && kill(pid, 0) == 0; ++i) usleep(20000);
  CHECK(s.create_qp());
}
#endif

TEST_CASE("fault: sticky loss - a UC send meeting no receive kills that direction", "[fault][sticky]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1"));
  REQUIRE(b.open("hostB", "rdma_en1"));
  REQUIRE(connect_pair(a, b));
  REQUIRE(tbemu_fault_sticky_loss(f.p(), nullptr) == 0);
  ibv_wc wc{};
  // Receives posted first: delivered.
  REQUIRE(post_recv(b, 1, 0, 64) == 0);
  REQUIRE(post_send(a, 1, 0, 64) == 0);
  REQUIRE(poll_one(b.cq, &wc));
  REQUIRE(poll_one(a.cq, &wc));
  // A send before the receive: lost, and a→b stays dead although receives are posted now.
  REQUIRE(post_send(a, 2, 0, 64) == 0);
  REQUIRE(poll_one(a.cq, &wc));
  REQUIRE(post_recv(b, 2, 0, 64) == 0);
  REQUIRE(post_send(a, 3, 0, 64) == 0);
  REQUIRE(poll_one(a.cq, &wc));
  CHECK(quiet(b.cq));
  // b→a is unaffected.
  REQUIRE(post_recv(a, 4, 0, 64) == 0);
  REQUIRE(post_send(b, 4, 0, 64) == 0);
  REQUIRE(poll_one(a.cq, &wc));
  CHECK(wc.opcode == IBV_WC_RECV);
}

TEST_CASE("fault: data-path verbs fail with the errno convention of each", "[fault][datapath]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1"));
  REQUIRE(b.open("hostB", "rdma_en1"));
  REQUIRE(connect_pair(a, b));
  REQUIRE(tbemu_fault_fail_call(f.p(), "hostA", "ibv_post_send", 2, ENOMEM, 1) == 0);
  REQUIRE(tbemu_fault_fail_call(f.p(), "hostB", "ibv_post_recv", 1, ENOMEM, 1) == 0);
  REQUIRE(tbemu_fault_fail_call(f.p(), "hostB", "ibv_poll_cq", 1, EIO, 1) == 0);
  CHECK(post_recv(b, 1, 0, 64) == ENOMEM);  // post_* return the errno
  CHECK(post_recv(b, 1, 0, 64) == 0);
  CHECK(post_send(a, 1, 0, 64) == 0);
  CHECK(post_send(a, 2, 0, 64) == ENOMEM);
  ibv_wc wc{};
  CHECK(ibv_poll_cq(b.cq, 1, &wc) == -EIO);  // poll_cq returns it negative
  REQUIRE(poll_one(b.cq, &wc));
  CHECK(wc.wr_id == 1);
}

TEST_CASE("run-time changes: port down mid-run loses UC traffic and fails RC; address change keeps QPs", "[runtime]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  ibv_wc wc{};
  SECTION("UC") {
    Side a, b;
    REQUIRE(a.open("hostA", "rdma_en1"));
    REQUIRE(b.open("hostB", "rdma_en1"));
    REQUIRE(connect_pair(a, b));
    REQUIRE(tbemu_set_port_up(f.p(), "hostB", "rdma_en1", 1, 0) == 0);
    REQUIRE(post_recv(b, 1, 0, 64) == 0);
    REQUIRE(post_send(a, 1, 0, 64) == 0);
    REQUIRE(poll_one(a.cq, &wc));
    CHECK(wc.status == IBV_WC_SUCCESS);
    CHECK(quiet(b.cq));
    REQUIRE(tbemu_set_port_up(f.p(), "hostB", "rdma_en1", 1, 1) == 0);
    // Changing an address does not disturb connected QPs (they address by QPN).
    REQUIRE(tbemu_set_ipv4(f.p(), "hostB", "rdma_en1", 1, "10.0.0.6/30") == 0);
    REQUIRE(post_send(a, 2, 0, 64) == 0);
    REQUIRE(poll_one(b.cq, &wc));
    CHECK(wc.status == IBV_WC_SUCCESS);
  }
  SECTION("RC") {
    Side a, b;
    REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC));
    REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_RC));
    REQUIRE(connect_pair(a, b));
    REQUIRE(tbemu_set_port_up(f.p(), "hostA", "rdma_en1", 1, 0) == 0);
    REQUIRE(post_recv(b, 1, 0, 64) == 0);
    REQUIRE(post_send(a, 1, 0, 64) == 0);
    REQUIRE(poll_one(a.cq, &wc, 3000));
    CHECK(wc.status == IBV_WC_RETRY_EXC_ERR);
  }
}

#ifdef TBVERBS_EMU_CLI_PATH
TEST_CASE("fault: kill-host kills the processes holding QPs on a host (peer death)", "[fault][death]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  std::string pidfile = f.dir + "/holder.pid";
  std::string cmd = std::string(TBVERBS_EMU_CLI_PATH) + " --fabric " + f.path +
                    " hold-qps hostB rdma_en1 -n 2 --seconds 60 --daemon --pidfile " + pidfile;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p);
  char line[256] = {};
  bool got = fgets(line, sizeof line, p) != nullptr;
  REQUIRE(pclose(p) == 0);
  REQUIRE(got);
  CHECK(tbemu_qp_count(f.p(), "hostB", "rdma_en1") == 2);
  int killed = 0;
  REQUIRE(tbemu_kill_host(f.p(), "hostB", SIGKILL, &killed) == 0);
  CHECK(killed == 1);
  int n = -1;
  for (int i = 0; i < 100 && (n = tbemu_qp_count(f.p(), "hostB", "rdma_en1")) != 0; ++i) usleep(20000);
  CHECK(n == 0);
}
#endif
