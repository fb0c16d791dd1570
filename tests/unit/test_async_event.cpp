// Context::wait_async_event on fake verbs: the typed event, its acknowledgement, the bounded wait,
// and a library without the optional symbols (issue 18, finding 7). The emulator's port events
// are tested in tests/emulated/test_core_async_events.cpp.
#include "fake_verbs.hpp"

#include <catch2/catch_test_macros.hpp>

#include <tbverbs/tbverbs.hpp>

#include <chrono>
#include <cstring>
#include <string>

using namespace tbverbs;
using namespace std::chrono_literals;
using fake::FakeVerbs;
using Clock = std::chrono::steady_clock;
namespace abi = tbverbs::detail::abi;

TEST_CASE("async events: a port error comes back typed, with its port, acknowledged", "[async_event]") {
  FakeVerbs f;
  f.enable_async_events();
  abi::ibv_async_event raw{};
  raw.event_type = abi::IBV_EVENT_PORT_ERR;
  raw.element.port_num = 1;
  f.async_events.push_back(raw);
  abi::ibv_qp qp{};
  qp.qp_num = 0x1234;
  raw = {};
  raw.event_type = abi::IBV_EVENT_QP_FATAL;
  raw.element.qp = &qp;
  f.async_events.push_back(raw);
  raw = {};
  const int newer = 77; // a type newer than this tbverbs: written as bytes, not cast to the enum
  std::memcpy(&raw.event_type, &newer, sizeof newer);
  f.async_events.push_back(raw);

  auto lib = f.library();
  CHECK(lib.has_async_events());
  auto ctx = Context::open(lib, "rdma_en2");
  REQUIRE(ctx);
  auto ev = ctx->wait_async_event(1s);
  REQUIRE(ev);
  CHECK(ev->type() == AsyncEventType::port_error);
  CHECK(ev->port() == 1);
  CHECK(ev->is_port_event());
  CHECK(ev->is_failure());
  CHECK(ev->qp_num() == 0);
  CHECK(ev->device() == "rdma_en2");
  CHECK(ev->describe() == "IBV_EVENT_PORT_ERR on rdma_en2 port 1");
  CHECK(f.async_acks == 1);

  auto qe = ctx->wait_async_event(Clock::now() + 1s);
  REQUIRE(qe);
  CHECK(qe->type() == AsyncEventType::qp_fatal);
  CHECK(qe->qp_num() == 0x1234);
  CHECK(qe->port() == 0);
  CHECK(qe->describe() == "IBV_EVENT_QP_FATAL on rdma_en2 QP 4660");

  auto unknown = ctx->wait_async_event(1s);
  REQUIRE(unknown);
  CHECK(unknown->type() == AsyncEventType::unknown);
  CHECK(unknown->raw_type() == 77);
  CHECK(unknown->describe() == "unknown (type 77) on rdma_en2");
  CHECK(f.async_acks == 3);
}

TEST_CASE("async events: no event means a timeout at the deadline, not before and not much after", "[async_event]") {
  FakeVerbs f;
  f.enable_async_events();
  auto ctx = Context::open(f.library(), "rdma_en2");
  REQUIRE(ctx);
  const auto t0 = Clock::now();
  auto ev = ctx->wait_async_event(60ms);
  const auto took = Clock::now() - t0;
  REQUIRE_FALSE(ev);
  CHECK(ev.error().kind == ErrorKind::timeout);
  CHECK(ev.error().step == Step::get_async_event);
  CHECK(ev.error().diagnosis() != nullptr);
  CHECK(took >= 60ms);
  CHECK(took < 1s);
  // A deadline already past still takes a pending event.
  abi::ibv_async_event raw{};
  raw.event_type = abi::IBV_EVENT_PORT_ACTIVE;
  raw.element.port_num = 2;
  f.async_events.push_back(raw);
  auto late = ctx->wait_async_event(Clock::now() - 1s);
  REQUIRE(late);
  CHECK(late->type() == AsyncEventType::port_active);
  CHECK(late->port() == 2);
}

TEST_CASE("async events: a library without ibv_get_async_event says so", "[async_event]") {
  FakeVerbs f; // no async symbols, as on a library that exports none
  auto lib = f.library();
  CHECK_FALSE(lib.has_async_events());
  auto ctx = Context::open(lib, "rdma_en2");
  REQUIRE(ctx);
  auto ev = ctx->wait_async_event(10ms);
  REQUIRE_FALSE(ev);
  CHECK(ev.error().kind == ErrorKind::unsupported);
  CHECK(ev.error().diagnosis() != nullptr);
  CHECK(ev.error().message().find("ibv_get_async_event") != std::string::npos);
}

TEST_CASE("async events: a failing verb keeps its errno", "[async_event]") {
  FakeVerbs f;
  f.api.get_async_event = [](abi::ibv_context*, abi::ibv_async_event*) {
    errno = EBADF;
    return -1;
  };
  f.api.ack_async_event = [](abi::ibv_async_event*) {};
  auto ctx = Context::open(f.library(), "rdma_en2");
  REQUIRE(ctx);
  auto ev = ctx->wait_async_event(1s);
  REQUIRE_FALSE(ev);
  CHECK(ev.error().is(EBADF));
  CHECK(ev.error().step == Step::get_async_event);
}

TEST_CASE("async events: names for every type", "[async_event]") {
  CHECK(async_event_name(AsyncEventType::port_error) == "IBV_EVENT_PORT_ERR");
  CHECK(async_event_name(AsyncEventType::cq_error) == "IBV_EVENT_CQ_ERR");
  CHECK(async_event_name(AsyncEventType::wq_fatal) == "IBV_EVENT_WQ_FATAL");
  CHECK(async_event_name(AsyncEventType::unknown) == "unknown");
}
