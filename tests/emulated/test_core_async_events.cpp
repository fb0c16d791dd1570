// Asynchronous events on the emulated fabric (issue 18, finding 7): a port taken down (what
// `tbverbs-emu port-down` does) is IBV_EVENT_PORT_ERR on every context open on that device, with
// its port; up again is IBV_EVENT_PORT_ACTIVE; the other end of the cable sees its own port go
// down too (the link is down); no change, no event.
#include "emu_fixture.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <chrono>

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
