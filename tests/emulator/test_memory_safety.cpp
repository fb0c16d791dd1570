// Memory safety of the emulator's data path (issue 9): nothing is written into a region after its
// ibv_dereg_mr returned, and concurrent pollers of one CQ never get the same completion twice.
#include <catch2/catch_test_macros.hpp>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "emu_test_util.hpp"

using namespace emutest;

TEST_CASE("memory safety: a region deregistered while a send into it is in flight is not written after "
          "ibv_dereg_mr returned",
          "[memory_safety]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  constexpr size_t len = 8u << 20;
  int written_after = 0, tries = 0;
  for (int t = 0; t < 40; ++t) {
    Side a, b;
    REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC, len));
    REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_RC, len));
    REQUIRE(connect_pair(a, b, RcOpts{}));
    std::memset(a.buf.data(), 0x11, len);
    REQUIRE(post_recv(b, 1, 0, len) == 0);
    std::atomic<bool> go{false};
    std::thread sender([&] {
      while (!go.load()) {
      }
      post_send(a, 2, 0, len);
    });
    go = true;
    // Deregister the receive region while the sender copies into it (about a millisecond).
    std::this_thread::sleep_for(std::chrono::microseconds(100 + 50 * (t % 10)));
    REQUIRE(ibv_dereg_mr(b.mr) == 0);
    b.mr = nullptr;
    // From here the memory is ours again: nothing may change it.
    std::memset(b.buf.data(), 0x5a, len);
    sender.join();
    ibv_wc wc{};
    poll_one(a.cq, &wc, 2000);  // the send's completion (any status): the copy is over
    poll_one(b.cq, &wc, 200);
    ++tries;
    for (size_t i = 0; i < len; i += 4096)
      if (static_cast<unsigned char>(b.buf[i]) != 0x5a) {
        ++written_after;
        break;
      }
  }
  INFO(written_after << " of " << tries << " regions written after their dereg returned");
  CHECK(written_after == 0);
}

TEST_CASE("memory safety: two threads polling one CQ never get the same completion twice", "[memory_safety]") {
  TempFabric f(three_hosts("rdma-core-rc"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC, 1 << 20, 4096));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_RC, 1 << 20, 4096));
  REQUIRE(connect_pair(a, b, RcOpts{}));
  constexpr int n = 1000;  // within the CQ (1024 entries)
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < n; ++i) REQUIRE(post_recv(b, static_cast<uint64_t>(round * n + i), 0, 64) == 0);
    // Every completion is queued first (RC delivers inside post_send); then two threads race
    // for them one at a time, as a backend with a progress thread and a caller would.
    for (int i = 0; i < n; ++i) REQUIRE(post_send(a, 1, 0, 64, IBV_WR_SEND, 0) == 0);
    std::vector<int> seen(n, 0);
    std::atomic<int> got{0}, ready{0};
    auto poller = [&] {
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      ibv_wc wc[1];
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (got.load() < n && std::chrono::steady_clock::now() < end) {
        if (ibv_poll_cq(b.cq, 1, wc) != 1) continue;
        __atomic_add_fetch(&seen[wc[0].wr_id - static_cast<uint64_t>(round * n)], 1, __ATOMIC_RELAXED);
        got.fetch_add(1);
      }
    };
    std::thread p1(poller), p2(poller);
    p1.join();
    p2.join();
    int twice = 0, missing = 0;
    for (int v : seen) twice += v > 1, missing += v == 0;
    INFO("round " << round << ": " << twice << " completions seen twice, " << missing << " missing");
    CHECK(twice == 0);
    CHECK(missing == 0);
  }
}

TEST_CASE("memory safety: a send to a QP whose owner's pid now names another process is not written into "
          "that process",
          "[memory_safety][pid_reuse]") {
  TempFabric f(three_hosts("thunderbolt"));
  Side a;
  REQUIRE(a.open("hostA", "rdma_en1"));
  int up[2], down[2];
  REQUIRE(pipe(up) == 0);
  REQUIRE(pipe(down) == 0);
  pid_t child = fork();
  if (child == 0) {
    // The receiver: its QP stands for a dead process's QP whose pid this process got.
    Side b;
    uint32_t qpn = 0;
    if (b.open("hostB", "rdma_en1")) qpn = b.qp->qp_num;
    std::memset(b.buf.data(), 0x33, b.buf.size());
    (void)!write(up[1], &qpn, 4);
    uint32_t peer = 0;
    (void)!read(down[0], &peer, 4);
    int rc = 1;
    if (to_init(b.qp) == 0 && to_rtr(b.qp, peer, make_v4_gid(10, 0, 0, 1), 1) == 0 && to_rts(b.qp) == 0) rc = 0;
    if (post_recv(b, 7, 0, 4096) != 0) rc = 1;
    (void)!write(up[1], &rc, 4);
    (void)!read(down[0], &peer, 4);  // the parent sent
    ibv_wc wc{};
    const bool got = poll_one(b.cq, &wc, 300);
    bool untouched = true;
    for (size_t i = 0; i < 4096; ++i) untouched = untouched && b.buf[i] == 0x33;
    _exit(rc != 0 ? 2 : got ? 3 : untouched ? 0 : 4);
  }
  uint32_t bqpn = 0;
  REQUIRE(read(up[0], &bqpn, 4) == 4);
  REQUIRE(bqpn != 0);
  REQUIRE(to_init(a.qp) == 0);
  REQUIRE(to_rtr(a.qp, bqpn, make_v4_gid(10, 0, 0, 2), 1) == 0);
  REQUIRE(to_rts(a.qp) == 0);
  uint32_t mine = a.qp->qp_num;
  REQUIRE(write(down[1], &mine, 4) == 4);
  int crc = -1;
  REQUIRE(read(up[0], &crc, 4) == 4);
  REQUIRE(crc == 0);
  REQUIRE(tbemu_fault_pid_reused(f.p(), bqpn) == 0);
  std::memset(a.buf.data(), 0x77, 4096);
  REQUIRE(post_send(a, 1, 0, 4096) == 0);
  ibv_wc wc{};
  // The receiver counts as dead: under empty_rq=wait the send never completes (no credits from a
  // dead peer); what matters is that the process holding the pid saw nothing.
  (void)poll_one(a.cq, &wc, 300);
  REQUIRE(write(down[1], &mine, 4) == 4);
  int st = 0;
  waitpid(child, &st, 0);
  INFO("child exit " << (WIFEXITED(st) ? WEXITSTATUS(st) : -1) << " (3: a completion arrived, 4: memory written)");
  CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  close(up[0]);
  close(up[1]);
  close(down[0]);
  close(down[1]);
}
