// A peer stopped inside a verb (issue 19, item 2): a process that got SIGSTOP while it held the
// emulator's lock of a QP's receive queue and of its CQ must not make the other side's verbs wait
// for it. Before the emulator's bounded locks, rank 0 hung in pthread_mutex_lock (cq_push under
// ibv_post_send) past every timeout of the program above it.
#include "emu_fixture.hpp"

#include <catch2/catch_test_macros.hpp>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

using namespace emu_test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {
PortSpec host_a() { return {"hostA", "rdma_en1", "10.99.0.1/30"}; }
PortSpec host_b() { return {"hostB", "rdma_en1", "10.99.0.2/30"}; }

// Whether /proc says `pid` is stopped (its state, after the last ')' of /proc/<pid>/stat, is T).
bool stopped(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = all.rfind(')');
  return paren != std::string::npos && paren + 2 < all.size() && all[paren + 2] == 'T';
}
} // namespace

TEST_CASE("core/stopped peer: verbs that meet the locks of a stopped process end within the bound",
          "[core][qp][stopped]") {
  // empty_rq=drop: a message that cannot be delivered is lost and its send completes (under the
  // default credit reading it would wait for the receiver, its post still returning at once).
  EnvGuard quirk("TBVERBS_EMU_QUIRKS", "empty_rq=drop");
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  Side b = Side::open(fabric, fabric.b());
  Pair p = connect(a, b, [](const tbverbs::GidSelection& g) { return tbverbs::QpRecipe::thunderbolt(g); });
  REQUIRE(Control::get().hold_qp_locks_and_stop != nullptr);
  const std::string path = fabric.path();
  const std::uint32_t held_qpn = p.b.qp_num();
  Child holder([&] { return Control::get().hold_qp_locks_and_stop(path.c_str(), held_qpn) == 0 ? 0 : 1; });
  const auto until = Clock::now() + 10s;
  while (!stopped(holder.pid()) && Clock::now() < until) std::this_thread::sleep_for(5ms);
  REQUIRE(stopped(holder.pid()));

  // hostA sends to the QP whose receive queue the stopped process holds: UC loses the message
  // (as with a peer that stopped taking it), and the verb returns.
  auto t0 = Clock::now();
  ok(p.a.send(81, ok(a.mr.sge(0, 64))));
  CHECK(wait_one(a.cq, 5000ms).wr_id() == 81);
  CHECK(Clock::now() - t0 < 2s);

  // hostB's own verbs on the held queue and CQ: the receive is refused with EBUSY, the send's
  // completion (into the held CQ) is lost; neither waits for the stopped process.
  t0 = Clock::now();
  const tbverbs::Error busy = err(p.b.recv(82, ok(b.mr.sge(0, 64))));
  INFO(busy.message());
  CHECK(busy.is(EBUSY));
  ok(p.b.send(83, ok(b.mr.sge(64, 64))));
  CHECK(Clock::now() - t0 < 2s);

  // The holder dies: the robust locks recover and everything works again.
  ::kill(holder.pid(), SIGKILL);
  CHECK(holder.wait(10s) == 128 + SIGKILL);
  ok(p.b.recv(84, ok(b.mr.sge(0, 64))));
  ok(p.a.send(85, ok(a.mr.sge(0, 64))));
  CHECK(wait_one(a.cq).wr_id() == 85);
  CHECK(wait_one(b.cq).wr_id() == 84);
}
