// Asynchronous events on the emulated fabric (issue 18, finding 7): a port taken down (what
// `tbverbs-emu port-down` does) is IBV_EVENT_PORT_ERR on every context open on that device, with
// its port; up again is IBV_EVENT_PORT_ACTIVE; the other end of the cable sees its own port go
// down too (the link is down); no change, no event.
#include "emu_fixture.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <tbverbs/link.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <optional>
#include <string>
#include <thread>

using namespace emu_test;
using namespace std::chrono_literals;
using Catch::Matchers::ContainsSubstring;
using Clock = std::chrono::steady_clock;

namespace {
PortSpec host_a() { return {"hostA", "rdma_en1", "10.99.0.1/30"}; }
PortSpec host_b() { return {"hostB", "rdma_en1", "10.99.0.2/30"}; }
} // namespace

TEST_CASE("core/async: port down and up are port_error and port_active with the port, on both ends", "[core][async]") {
  Fabric fabric(host_a(), host_b());
  fabric.use("hostA");
  auto a = ok(tbverbs::Context::open(emulator(), "rdma_en1"));
  REQUIRE(emulator().has_async_events());
  fabric.use("hostB");
  auto b = ok(tbverbs::Context::open(emulator(), "rdma_en1"));

  // Nothing happened: the wait ends at its deadline.
  const auto t0 = Clock::now();
  const tbverbs::Error quiet = err(a.wait_async_event(50ms));
  CHECK(quiet.kind == tbverbs::ErrorKind::timeout);
  CHECK(Clock::now() - t0 >= 50ms);

  fabric.set_port_up(fabric.a(), false);
  auto ev = ok(a.wait_async_event(2s));
  CHECK(ev.type() == tbverbs::AsyncEventType::port_error);
  CHECK(ev.port() == 1);
  CHECK(ev.is_failure());
  CHECK(ev.describe() == "IBV_EVENT_PORT_ERR on rdma_en1 port 1");
  // The cable's other end: its port left ACTIVE as well (no link).
  auto far = ok(b.wait_async_event(2s));
  CHECK(far.type() == tbverbs::AsyncEventType::port_error);
  CHECK(far.port() == 1);
  // One event per change.
  CHECK(err(a.wait_async_event(30ms)).kind == tbverbs::ErrorKind::timeout);

  fabric.set_port_up(fabric.a(), true);
  auto up = ok(a.wait_async_event(Clock::now() + 2s));
  CHECK(up.type() == tbverbs::AsyncEventType::port_active);
  CHECK(up.port() == 1);
  CHECK_FALSE(up.is_failure());
  CHECK(ok(b.wait_async_event(2s)).type() == tbverbs::AsyncEventType::port_active);
}

TEST_CASE("core/async: a change while nobody waits is kept for the next wait", "[core][async]") {
  Fabric fabric(host_a(), host_b());
  fabric.use("hostA");
  auto a = ok(tbverbs::Context::open(emulator(), "rdma_en1"));
  fabric.set_port_up(fabric.a(), false);
  auto ev = ok(a.wait_async_event(Clock::now() - 1s)); // a deadline already past still takes it
  CHECK(ev.type() == tbverbs::AsyncEventType::port_error);
}

TEST_CASE("core/async: a moved-from Context answers EBADF", "[core][async]") {
  Fabric fabric(host_a(), host_b());
  fabric.use("hostA");
  auto a = ok(tbverbs::Context::open(emulator(), "rdma_en1"));
  tbverbs::Context moved = std::move(a);
  const tbverbs::Error e = err(a.wait_async_event(10ms)); // NOLINT(bugprone-use-after-move): the point
  CHECK(e.is(EBADF));
  CHECK_THAT(e.message(), ContainsSubstring("moved-from"));
}

TEST_CASE("core/async: a port going down during connect_links' warm-up ends it at once, naming the port",
          "[core][async][link]") {
  Fabric fabric(host_a(), host_b());
  fabric.use(fabric.a().host);
  const tbverbs::Library lib = emulator();
  tbverbs::Context ctx_a = ok(tbverbs::Context::open(lib, "rdma_en1"));
  fabric.use(fabric.b().host);
  tbverbs::Context ctx_b = ok(tbverbs::Context::open(lib, "rdma_en1"));
  tbverbs::ProtectionDomain pd_a = ok(ctx_a.alloc_pd()), pd_b = ok(ctx_b.alloc_pd());
  const tbverbs::GidSelection gid_a = ok(ok(ctx_a.gid_table(1)).select());
  const tbverbs::GidSelection gid_b = ok(ok(ctx_b.gid_table(1)).select());
  // hostB's warm-up messages never arrive: hostA waits in the warm-up until its port goes down.
  fabric.drop_next_qp(fabric.b().host);

  std::promise<std::uint16_t> listening;
  auto port = listening.get_future();
  std::optional<tbverbs::Error> failure[2];
  std::chrono::steady_clock::duration took[2]{};
  auto rank = [&](int r) {
    tbverbs::SideChannelOptions o;
    o.rank = r;
    o.size = 2;
    o.job_token = 0xa57c;
    o.timeout = 20s;
    if (r == 0) {
      o.coordinator = "127.0.0.1:0";
      o.on_listening = [&](std::uint16_t p) { listening.set_value(p); };
    } else {
      o.coordinator = "127.0.0.1:" + std::to_string(port.get());
    }
    auto sc = tbverbs::SideChannel::connect(o);
    if (!sc) return failure[r] = sc.error(), void();
    tbverbs::LinkMailbox mailbox(*sc);
    tbverbs::LinkSpec spec;
    spec.peer = 1 - r;
    spec.context = r == 0 ? &ctx_a : &ctx_b;
    spec.pd = r == 0 ? &pd_a : &pd_b;
    spec.recipe = tbverbs::QpRecipe::thunderbolt(r == 0 ? gid_a : gid_b);
    tbverbs::LinkOptions lo;
    lo.warmup_bytes = 4096;
    lo.attempts = 1;
    lo.warmup_wait = 20s; // the port event, not this wait, must end it
    const auto t0 = Clock::now();
    auto links = tbverbs::connect_links(mailbox, std::span(&spec, 1), lo);
    took[r] = Clock::now() - t0;
    if (!links) failure[r] = links.error();
  };
  auto b = std::async(std::launch::async, rank, 1);
  auto a = std::async(std::launch::async, rank, 0);
  // Both QPs exist: the warm-up is under way (connect, receives and the barrier take
  // milliseconds); then hostA's port goes down.
  const auto until = Clock::now() + 10s;
  while ((fabric.qp_count(fabric.a()) < 1 || fabric.qp_count(fabric.b()) < 1) && Clock::now() < until)
    std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(500ms);
  const auto down = Clock::now();
  fabric.set_port_up(fabric.a(), false);
  REQUIRE(a.wait_for(10s) == std::future_status::ready);
  a.get();
  const auto ended = Clock::now() - down;
  REQUIRE(b.wait_for(30s) == std::future_status::ready);
  b.get();
  REQUIRE(failure[0]);
  INFO(failure[0]->message());
  CHECK(failure[0]->kind == tbverbs::ErrorKind::port_not_active);
  CHECK(failure[0]->step == tbverbs::Step::link_warmup);
  CHECK(failure[0]->device.view() == "rdma_en1");
  CHECK(failure[0]->port == 1);
  CHECK_THAT(failure[0]->message(), ContainsSubstring("IBV_EVENT_PORT_ERR"));
  CHECK(ended < 3s);        // not the 20 s warm-up wait
  CHECK(took[0] < 15s);
  CHECK(failure[1]);        // hostB's link did not go through either, and it did not hang
}

namespace {
/// The completion `cq` has next: one must come within 2 s, failed with IBV_WC_WR_FLUSH_ERR.
tbverbs::Error flushed_completion(tbverbs::CompletionQueue& cq) {
  tbverbs::WorkCompletion wc[1];
  auto got = cq.wait(wc, Clock::now() + 2s);
  REQUIRE_FALSE(got.has_value());
  CHECK(got.error().kind == tbverbs::ErrorKind::wc_error);
  CHECK(got.error().wc_status == tbverbs::wc::wr_flush_err);
  return got.error();
}
} // namespace

TEST_CASE("core/async: a fatal QP error is qp_fatal with the QP's number; its receives are flushed",
          "[core][async][qp]") {
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  Side b = Side::open(fabric, fabric.b());
  Pair p = connect(a, b, [](const tbverbs::GidSelection& g) { return tbverbs::QpRecipe::thunderbolt(g); });
  ok(p.a.recv(21, ok(a.mr.sge(0, 64))));
  // Before the fault: nothing to report.
  CHECK(err(a.ctx.wait_async_event(20ms)).kind == tbverbs::ErrorKind::timeout);

  fabric.qp_fatal(p.a.qp_num());
  auto ev = ok(a.ctx.wait_async_event(2s));
  CHECK(ev.type() == tbverbs::AsyncEventType::qp_fatal);
  CHECK(ev.qp_num() == p.a.qp_num());
  CHECK(ev.is_failure());
  CHECK_THAT(ev.describe(), ContainsSubstring("IBV_EVENT_QP_FATAL"));
  CHECK(flushed_completion(a.cq).wr_id == 21);
  // Reported once; the other end's QP is untouched.
  CHECK(err(a.ctx.wait_async_event(20ms)).kind == tbverbs::ErrorKind::timeout);
  CHECK(err(b.ctx.wait_async_event(20ms)).kind == tbverbs::ErrorKind::timeout);
  CHECK(ok(p.b.query_state()) == tbverbs::QpState::rts);
  CHECK(ok(p.a.query_state()) == tbverbs::QpState::error);
}

TEST_CASE("core/async: a program that never reads async events still sees a fatal QP's work flushed",
          "[core][async][qp]") {
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  Side b = Side::open(fabric, fabric.b());
  Pair p = connect(a, b, [](const tbverbs::GidSelection& g) { return tbverbs::QpRecipe::thunderbolt(g); });
  ok(p.a.recv(31, ok(a.mr.sge(0, 64))));
  fabric.qp_fatal(p.a.qp_num());
  CHECK(flushed_completion(a.cq).wr_id == 31);   // found by the poll, not by an event reader
  ok(p.a.send(32, ok(a.mr.sge(64, 64))));       // a QP in ERR takes sends and flushes them
  CHECK(flushed_completion(a.cq).wr_id == 32);
  CHECK(ok(a.ctx.wait_async_event(2s)).type() == tbverbs::AsyncEventType::qp_fatal); // still reported
}

TEST_CASE("core/async: a removed device is device_fatal, flushes its QPs, reads PORT_DOWN and cannot be opened",
          "[core][async][device]") {
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  Side b = Side::open(fabric, fabric.b());
  Pair p = connect(a, b, [](const tbverbs::GidSelection& g) { return tbverbs::QpRecipe::thunderbolt(g); });
  ok(p.a.recv(41, ok(a.mr.sge(0, 64))));

  fabric.set_device_removed(fabric.a(), true);
  auto ev = ok(a.ctx.wait_async_event(2s));
  CHECK(ev.type() == tbverbs::AsyncEventType::device_fatal);
  CHECK(ev.is_failure());
  // DEVICE_FATAL alone: no QP or port events follow it on the removed device.
  CHECK(err(a.ctx.wait_async_event(30ms)).kind == tbverbs::ErrorKind::timeout);
  CHECK(flushed_completion(a.cq).wr_id == 41);
  CHECK(ok(a.ctx.query_port(1)).state != tbverbs::PortState::active);
  // The cable's other end lost its link.
  auto far = ok(b.ctx.wait_async_event(2s));
  CHECK(far.type() == tbverbs::AsyncEventType::port_error);
  // Gone from under its ibv_device: opening it fails with ENODEV, until it comes back.
  fabric.use(fabric.a().host);
  const tbverbs::Error gone = err(tbverbs::Context::open(emulator(), "rdma_en1"));
  INFO(gone.message());
  CHECK(gone.is(ENODEV));
  fabric.set_device_removed(fabric.a(), false);
  tbverbs::Context again = ok(tbverbs::Context::open(emulator(), "rdma_en1"));
  CHECK(ok(again.query_port(1)).state == tbverbs::PortState::active);
  CHECK(ok(b.ctx.wait_async_event(2s)).type() == tbverbs::AsyncEventType::port_active);
}

TEST_CASE("core/async: a CQ that overran is cq_error", "[core][async][cq]") {
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  Side b = Side::open(fabric, fabric.b());
  fabric.use(fabric.a().host);
  tbverbs::CompletionQueue small = ok(a.ctx.create_cq(2));
  tbverbs::PreparedQueuePair pa = ok(tbverbs::QpRecipe::thunderbolt(a.select()).prepare(a.pd, a.cq, small));
  tbverbs::PreparedQueuePair pb = ok(tbverbs::QpRecipe::thunderbolt(b.select()).prepare(b.pd, b.cq));
  const tbverbs::Endpoint ea = pa.endpoint(), eb = pb.endpoint();
  tbverbs::QueuePair qa = ok(std::move(pa).connect(eb));
  tbverbs::QueuePair qb = ok(std::move(pb).connect(ea));
  CHECK(err(a.ctx.wait_async_event(20ms)).kind == tbverbs::ErrorKind::timeout);
  // hostB's four sends land in hostA's two-entry receive CQ (nobody polls it): two completions are lost.
  for (std::uint64_t i = 0; i < 4; ++i) ok(qa.recv(50 + i, ok(a.mr.sge(64 * i, 64))));
  for (std::uint64_t i = 0; i < 4; ++i) ok(qb.send(60 + i, ok(b.mr.sge(64 * i, 64))));
  for (int i = 0; i < 4; ++i) (void)wait_one(b.cq);
  auto ev = ok(a.ctx.wait_async_event(2s));
  CHECK(ev.type() == tbverbs::AsyncEventType::cq_error);
  CHECK(ev.is_failure());
  CHECK(err(a.ctx.wait_async_event(20ms)).kind == tbverbs::ErrorKind::timeout); // once
}
