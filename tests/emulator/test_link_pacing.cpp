// Link pacing (docs/emulator.md, "Link pacing"): a message is never handed out before the link
// model delivers it (serialisation at B after the previous message on its direction, plus L),
// post_send does not wait for the wire, the two directions of a cable run at once, and a CQ hands
// out what is due first. The links are slow (10 MB/s, 5 ms) so that the model, not the CPU,
// decides every time here, also on a loaded machine: the checks are in milliseconds.
#include <catch2/catch_test_macros.hpp>

#include <chrono>
#include <string>

#include "emu_test_util.hpp"

using namespace emutest;
using Clock = std::chrono::steady_clock;

namespace {

constexpr double kGbps = 0.01;     // 10 MB/s: 1 MB takes 100 ms
constexpr double kLatencyMs = 5;
constexpr uint32_t kBig = 1000000;  // bytes

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
// The model's time for `bytes` after an idle direction.
double model_ms(double bytes) { return bytes / kGbps / 1e6 + kLatencyMs; }

std::string paced_fabric(const char* profile) {
  return std::string(R"({"profile": ")") + profile + R"(", "link": {"gbytes_per_s": )" + std::to_string(kGbps) +
         R"(, "latency_us": )" + std::to_string(kLatencyMs * 1000) + R"(}, "hosts": [
      {"name": "hostA", "devices": [{"name": "rdma_en1", "ports": [{"port": 1, "ipv4": "10.0.0.1/30"}]}]},
      {"name": "hostB", "devices": [{"name": "rdma_en1", "ports": [{"port": 1, "ipv4": "10.0.0.2/30"}]}]}],
    "cables": [["hostA:rdma_en1:1", "hostB:rdma_en1:1"]]})";
}

// Polls until a completion arrives (at most 5 s); returns when it was handed out.
Clock::time_point next(ibv_cq* cq, ibv_wc* wc) {
  const auto end = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < end) {
    const int n = ibv_poll_cq(cq, 1, wc);
    if (n < 0) FAIL("ibv_poll_cq failed: " << n);
    if (n == 1) return Clock::now();
  }
  FAIL("no completion within 5 s");
  return Clock::now();
}

}  // namespace

TEST_CASE("link pacing: a message completes no earlier than size / B + L; post_send does not wait for it",
          "[link]") {
  TempFabric f(paced_fabric("rdma-core-rc"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_UC, 2 * kBig));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_UC, 2 * kBig));
  REQUIRE(connect_pair(a, b));
  REQUIRE(post_recv(b, 1, 0, kBig) == 0);
  REQUIRE(post_recv(b, 2, 0, kBig) == 0);
  const auto t0 = Clock::now();
  REQUIRE(post_send(a, 11, 0, kBig) == 0);
  REQUIRE(post_send(a, 12, 0, kBig) == 0);
  const double post_ms = ms_between(t0, Clock::now());
  CHECK(post_ms < model_ms(kBig) / 2);  // two posts, both returned long before the first is delivered
  ibv_wc wc{};
  const double first = ms_between(t0, next(b.cq, &wc));
  CHECK(wc.wr_id == 1);
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(first >= model_ms(kBig));
  const double second = ms_between(t0, next(b.cq, &wc));
  CHECK(wc.wr_id == 2);
  CHECK(second >= model_ms(2.0 * kBig));  // behind the first on the same direction
  // The sender's completions: no earlier either, in order.
  const double s1 = ms_between(t0, next(a.cq, &wc));
  CHECK(wc.wr_id == 11);
  const double s2 = ms_between(t0, next(a.cq, &wc));
  CHECK(wc.wr_id == 12);
  CHECK(s1 >= model_ms(kBig));
  CHECK(s2 >= model_ms(2.0 * kBig));
  INFO("posts " << post_ms << " ms, receives at " << first << " and " << second << " ms");
  CHECK(second < model_ms(2.0 * kBig) + 1000);  // and no hang
}

TEST_CASE("link pacing: the two directions of a cable run at once", "[link]") {
  TempFabric f(paced_fabric("rdma-core-rc"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_UC, kBig));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_UC, kBig));
  REQUIRE(connect_pair(a, b));
  REQUIRE(post_recv(a, 1, 0, kBig) == 0);
  REQUIRE(post_recv(b, 2, 0, kBig) == 0);
  const auto t0 = Clock::now();
  REQUIRE(post_send(a, 11, 0, kBig, IBV_WR_SEND, 0) == 0);
  REQUIRE(post_send(b, 12, 0, kBig, IBV_WR_SEND, 0) == 0);
  ibv_wc wc{};
  const double at_b = ms_between(t0, next(b.cq, &wc));
  CHECK(wc.wr_id == 2);
  const double at_a = ms_between(t0, next(a.cq, &wc));
  CHECK(wc.wr_id == 1);
  INFO("a -> b at " << at_b << " ms, b -> a at " << at_a << " ms");
  CHECK(at_b >= model_ms(kBig));
  CHECK(at_a >= model_ms(kBig));
  // One after the other they would take 2 x 100 ms + 5 ms.
  CHECK(std::max(at_a, at_b) < model_ms(2.0 * kBig) - 0.25 * model_ms(kBig));
}

TEST_CASE("link pacing: a CQ hands out the completion due first, whatever was queued before it", "[link]") {
  TempFabric f(paced_fabric("rdma-core-rc"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_UC, kBig));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_UC, kBig));
  REQUIRE(connect_pair(a, b));
  REQUIRE(post_recv(b, 1, 0, kBig) == 0);
  REQUIRE(post_recv(a, 2, 0, 1000) == 0);
  const auto t0 = Clock::now();
  REQUIRE(post_send(a, 11, 0, kBig) == 0);  // a's send completion is queued first, due at ~105 ms
  REQUIRE(post_send(b, 12, 0, 1000) == 0);  // the small reply is due at ~5 ms on the other direction
  ibv_wc wc{};
  const double reply = ms_between(t0, next(a.cq, &wc));
  CHECK(wc.opcode == IBV_WC_RECV);
  CHECK(wc.wr_id == 2);
  CHECK(reply >= model_ms(1000));
  CHECK(reply < model_ms(kBig));  // not held back by the send completion queued ahead of it
  const double sent = ms_between(t0, next(a.cq, &wc));
  CHECK(wc.opcode == IBV_WC_SEND);
  CHECK(sent >= model_ms(kBig));
}

TEST_CASE("link pacing: RDMA WRITE and WRITE_WITH_IMM are paced", "[link]") {
  TempFabric f(paced_fabric("rdma-core-rc"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_RC, kBig));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_RC, kBig));
  REQUIRE(connect_pair(a, b));
  const auto raddr = reinterpret_cast<uint64_t>(b.buf.data());
  auto t0 = Clock::now();
  REQUIRE(post_send(a, 21, 0, kBig / 2, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 0, raddr, b.mr->rkey) == 0);
  ibv_wc wc{};
  double done = ms_between(t0, next(a.cq, &wc));
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(wc.opcode == IBV_WC_RDMA_WRITE);
  CHECK(done >= model_ms(kBig / 2));
  REQUIRE(post_recv(b, 3, 0, 0) == 0);
  t0 = Clock::now();
  REQUIRE(post_send(a, 22, 0, kBig / 2, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED, 0, raddr, b.mr->rkey, 7) == 0);
  done = ms_between(t0, next(b.cq, &wc));
  CHECK(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
  CHECK(done >= model_ms(kBig / 2));
  CHECK(ms_between(t0, next(a.cq, &wc)) >= model_ms(kBig / 2));
}

TEST_CASE("link pacing: Thunderbolt, a send waiting for credit goes on the wire when the receive is posted",
          "[link][tb]") {
  TempFabric f(paced_fabric("thunderbolt"));
  Side a, b;
  REQUIRE(a.open("hostA", "rdma_en1", IBV_QPT_UC, 4096 * 25));
  REQUIRE(b.open("hostB", "rdma_en1", IBV_QPT_UC, 4096 * 25));
  REQUIRE(connect_pair(a, b));
  const uint32_t len = 4096 * 25;  // 10 ms at 10 MB/s
  const auto t0 = Clock::now();
  REQUIRE(post_send(a, 31, 0, len) == 0);  // empty_rq=wait: waits at the receiver for a receive
  ibv_wc wc{};
  CHECK(quiet(b.cq, 50));
  const auto posted = Clock::now();
  REQUIRE(post_recv(b, 4, 0, len) == 0);
  const double got = ms_between(posted, next(b.cq, &wc));
  CHECK(wc.wr_id == 4);
  CHECK(wc.byte_len == len);
  CHECK(got >= model_ms(len));  // the wire time counts from the credit, not from the post
  CHECK(ms_between(t0, next(a.cq, &wc)) >= ms_between(t0, posted) + model_ms(len));
}
