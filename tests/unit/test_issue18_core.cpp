// Regression tests of issue 18 (a code review of the core), one TEST_CASE per finding, named
// "finding N (issue 18): ...". They run on the fake provider (fake_verbs.hpp) or on plain GID
// tables; each failed before its fix.
#include "fake_qp.hpp"
#include "two_ranks.hpp"

#include <tbverbs/budget.hpp>
#include <tbverbs/explain.hpp>
#include <tbverbs/link.hpp>
#include <tbverbs/side_channel.hpp>

#include <catch2/catch_test_macros.hpp>

#include <chrono>
#include <future>
#include <optional>
#include <string>
#include <utility>
#include <vector>

using namespace tbverbs;
using fake::FakeVerbs;

namespace {

bool contains_text(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// A prepared RC QP on the fake's mlx5_0, with the given capacities asked for.
using Prepared = fake::PreparedQp;
Prepared prepare_rc(FakeVerbs& f, QpCapacities caps = {16, 16, 2, 2, 64}) { return fake::prepare_qp(f, true, caps); }

} // namespace

TEST_CASE("finding 1 (issue 18): the platform comes from the device's transport and the library, not its name",
          "[issue18]") {
  FakeVerbs f;
  // An rdma-core NIC that udev named rdma_en1: rdma-core, so RC and depths in work requests.
  f.device_names = {"rdma_en1"};
  f.transport_type = 0; // IBV_TRANSPORT_IB
  {
    auto ctx = Context::open(f.library(), "rdma_en1");
    REQUIRE(ctx);
    CHECK(ctx->platform() == Platform::rdma_core); // was apple: any rdma_en* was taken for Thunderbolt
    auto limits = DeviceLimits::of(*ctx);
    REQUIRE(limits);
    CHECK_FALSE(limits->frames);
  }
  // A Thunderbolt device under another name: Apple's.
  f.device_names = {"tb0"};
  f.transport_type = thunderbolt_transport;
  {
    auto list = DeviceList::get(f.library());
    REQUIRE(list);
    CHECK(list->devices().front().transport_type() == thunderbolt_transport);
    CHECK(list->devices().front().platform() == Platform::apple);
    auto missing = list->find("mlx5_9");
    REQUIRE_FALSE(missing);
    CHECK(missing.error().platform == Platform::apple); // diagnosed for the devices that are there
    auto ctx = Context::open(f.library(), "tb0");
    REQUIRE(ctx);
    CHECK(ctx->platform() == Platform::apple);
    auto limits = DeviceLimits::of(*ctx);
    REQUIRE(limits);
    CHECK(limits->frames);
  }
}

TEST_CASE("finding 2 (issue 18): a send chain refused before the driver reports 0 posted, not a driver failure",
          "[issue18][qp]") {
  FakeVerbs f;
  auto p = prepare_rc(f);
  const Endpoint self = p.prep.endpoint();
  auto qp = std::move(p.prep).connect(self);
  REQUIRE(qp);
  const std::uint32_t granted = qp->capacities().max_inline_data;
  REQUIRE(granted == 64);
  static char buf[256];
  const auto base = reinterpret_cast<std::uintptr_t>(buf);
  const abi::ibv_sge small{base, 8, 1};
  const abi::ibv_sge big{base, granted + 1, 1};

  // Request 1 of 3 has inline data above max_inline_data: nothing reaches the driver.
  SendChain<3> chain;
  REQUIRE(chain.push(SendWr::send(10, small)));
  REQUIRE(chain.push(SendWr::send(11, big).inline_data()));
  REQUIRE(chain.push(SendWr::send(12, small)));
  auto r = qp->post(chain);
  REQUIRE_FALSE(r);
  CHECK(f.posted_sends.empty());
  CHECK(r.error().kind == ErrorKind::capacity);
  CHECK(r.error().posted == 0); // was 1: a backend counting credits from `posted` waited for ever
  CHECK(r.error().wr_id == 11); // the refused request
  CHECK(r.error().diagnosis() != nullptr);
  const std::string m = r.error().message();
  INFO(m);
  CHECK_FALSE(contains_text(m, "ibv_post_send failed")); // the driver was never called
  CHECK_FALSE(contains_text(m, "after posting 1"));
  CHECK(contains_text(m, "refused before the driver"));
  CHECK(contains_text(m, "request 1 of the chain"));

  // An operation the QP does not execute, at index 2 (UC has no RDMA READ): also 0 posted.
  f.device_names = {"mlx5_0"};
  auto sel = p.ctx.gid_table(1)->first_ipv4_mapped();
  REQUIRE(sel);
  auto uc_prep = QpRecipe::rdma_core_rc(*sel).qp_type(QpType::uc).prepare(p.pd, p.cq);
  REQUIRE(uc_prep);
  const Endpoint uc_self = uc_prep->endpoint();
  auto uc = std::move(*uc_prep).connect(uc_self);
  REQUIRE(uc);
  SendChain<3> reads;
  REQUIRE(reads.push(SendWr::send(20, small)));
  REQUIRE(reads.push(SendWr::send(21, small)));
  REQUIRE(reads.push(SendWr::rdma_read(22, small, {0x1000, 7})));
  auto u = uc->post(reads);
  REQUIRE_FALSE(u);
  CHECK(f.posted_sends.empty());
  CHECK(u.error().kind == ErrorKind::unsupported);
  CHECK(u.error().posted == 0); // was 2
  CHECK(u.error().wr_id == 22);
  CHECK_FALSE(contains_text(u.error().message(), "ibv_post_send failed"));

  // A single typed post refused before the driver is no driver failure either.
  auto one = qp->post(SendWr::send(30, big).inline_data());
  REQUIRE_FALSE(one);
  CHECK(one.error().posted == 0);
  CHECK_FALSE(contains_text(one.error().message(), "ibv_post_send failed"));
  CHECK(f.posted_sends.empty());

  // A chain the driver itself stops part-way still reports what the driver took (issue 8,
  // finding 3), sends and receives alike.
  SendChain<3> ok;
  for (std::uint64_t id = 40; id < 43; ++id) REQUIRE(ok.push(SendWr::send(id, small)));
  f.post_send_rc = ENOMEM;
  f.post_fail_at = 1;
  auto driver = qp->post(ok);
  REQUIRE_FALSE(driver);
  CHECK(driver.error().posted == 1);
  CHECK(contains_text(driver.error().message(), "ibv_post_send failed with ENOMEM"));
  RecvChain<3> recvs;
  for (std::uint64_t id = 50; id < 53; ++id) REQUIRE(recvs.push(RecvWr(id, small)));
  f.post_recv_rc = ENOMEM;
  f.post_fail_at = 0;
  auto rr = qp->post(recvs);
  REQUIRE_FALSE(rr);
  CHECK(rr.error().posted == 0);
  CHECK(rr.error().wr_id == 50);
}

TEST_CASE("finding 4 (issue 18): a moved-from PreparedQueuePair answers EBADF, never dereferences null",
          "[issue18][prepared]") {
  FakeVerbs f;
  auto p = prepare_rc(f);
  const Endpoint self = p.prep.endpoint();
  const std::uint32_t qpn = self.qp_num;
  const QpCapacities caps = p.prep.capacities();

  // Moved into another object: the source is empty.
  PreparedQueuePair other = std::move(p.prep);
  CHECK(p.prep.native_handle() == nullptr);
  auto again = std::move(p.prep).connect(self); // SEGV under ASan before
  REQUIRE_FALSE(again);
  CHECK(again.error().is(EBADF));
  REQUIRE(again.error().diagnosis() != nullptr);
  CHECK(again.error().diagnosis()->id == "handle-closed");
  CHECK(f.modify_attrs.size() == 1); // INIT only: no modify_qp reached the driver
  // The accessors keep describing the QP that was prepared (a loopback connects the second QP
  // to the first one's endpoint after the first connected).
  CHECK(p.prep.endpoint().qp_num == qpn);
  CHECK(p.prep.capacities().max_inline_data == caps.max_inline_data);
  CHECK(p.prep.recipe().type() == QpType::rc);

  // Moved into the connected QueuePair by a successful connect(): connecting again is EBADF too.
  auto qp = std::move(other).connect(self);
  REQUIRE(qp);
  CHECK(other.native_handle() == nullptr);
  auto twice = std::move(other).connect(self);
  REQUIRE_FALSE(twice);
  CHECK(twice.error().is(EBADF));
  CHECK(twice.error().diagnosis()->id == "handle-closed");
  CHECK(qp->native_handle() != nullptr); // the live QP is untouched
}

TEST_CASE("finding 5 (issue 18): rtr_transition refuses a GID index above 255 instead of truncating it",
          "[issue18][recipe]") {
  std::vector<Gid> entries(301, *Gid::parse("fe80::1"));
  entries[300] = Gid::from_ipv4(0x0a630001); // the only IPv4 entry: index 300 (44 as uint8_t)
  entries[44] = Gid::from_ipv4(0x0a63002c);
  auto table = GidTable::from_entries(1, entries, Platform::rdma_core, "mlx5_0");
  auto sel = table.at_index(300);
  REQUIRE(sel);
  const QpRecipe recipe = QpRecipe::rdma_core_rc(*sel);
  Endpoint peer;
  peer.qp_type = QpType::rc;
  peer.gid = Gid::from_ipv4(0x0a630002);

  auto rtr = recipe.rtr_transition(peer);
  REQUIRE_FALSE(rtr); // was a transition with sgid_index 44
  CHECK(rtr.error().kind == ErrorKind::gid_index_invalid);
  CHECK(rtr.error().gid_index == 300);
  CHECK(contains_text(std::string(rtr.error().detail.view()), "8 bits"));

  // Explain mode builds from the same transition: it names the refusal, never index 44.
  PortAttributes port;
  port.link_layer = LinkLayer::ethernet;
  const auto lines = explain_queue_pair(recipe, port, recipe.requested_capacities(), recipe.local_endpoint(1, 2), peer, {});
  bool refused = false;
  for (const auto& l : lines) {
    INFO(l);
    CHECK_FALSE(contains_text(l, "sgid_index=44"));
    refused = refused || contains_text(l, "GID index 300");
  }
  CHECK(refused);

  // Index 255 is the largest the ABI carries, and is emitted as is.
  auto top = GidTable::from_entries(1, std::vector<Gid>(256, Gid::from_ipv4(0x0a630001)), Platform::rdma_core, "mlx5_0");
  auto sel255 = top.at_index(255);
  REQUIRE(sel255);
  auto ok = QpRecipe::rdma_core_rc(*sel255).rtr_transition(peer);
  REQUIRE(ok);
  CHECK(ok->attr.ah_attr.grh.sgid_index == 255);
}

TEST_CASE("finding 8 (issue 18): qp_state_name names every state, and a value it does not know", "[issue18]") {
  CHECK(std::string(qp_state_name(QpState::reset)) == "IBV_QPS_RESET");
  CHECK(std::string(qp_state_name(QpState::init)) == "IBV_QPS_INIT");
  CHECK(std::string(qp_state_name(QpState::rtr)) == "IBV_QPS_RTR");
  CHECK(std::string(qp_state_name(QpState::rts)) == "IBV_QPS_RTS");
  CHECK(std::string(qp_state_name(QpState::sqd)) == "IBV_QPS_SQD");
  CHECK(std::string(qp_state_name(QpState::sqe)) == "IBV_QPS_SQE");
  CHECK(std::string(qp_state_name(QpState::error)) == "IBV_QPS_ERR");
  CHECK(std::string(qp_state_name(QpState::unknown)) == "IBV_QPS_UNKNOWN");
  CHECK(std::string(qp_state_name(static_cast<QpState>(42))) == "IBV_QPS_UNKNOWN");
}

TEST_CASE("finding 8 (issue 18): fixed_psn is the PSN the endpoint advertises and RTS sends from, masked to 24 bits",
          "[issue18]") {
  FakeVerbs f;
  f.device_names = {"mlx5_0"};
  auto ctx = Context::open(f.library(), "mlx5_0");
  REQUIRE(ctx);
  auto pd = ctx->alloc_pd();
  REQUIRE(pd);
  auto cq = ctx->create_cq(64, CqWait::poll);
  REQUIRE(cq);
  auto sel = ctx->gid_table(1)->first_ipv4_mapped();
  REQUIRE(sel);
  auto recipe = QpRecipe::rdma_core_rc(*sel).fixed_psn(0x7abcdef);
  CHECK(recipe.initial_psn() == 0xabcdef); // the 0x7000000 above 24 bits is dropped
  auto a = recipe.prepare(*pd, *cq);
  auto b = recipe.prepare(*pd, *cq);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->endpoint().psn == 0xabcdef);
  CHECK(b->endpoint().psn == 0xabcdef); // fixed: the same for every QP of the recipe
  Endpoint peer = b->endpoint();
  peer.psn = 0x123456;
  f.modify_attrs.clear();
  auto qp = std::move(*a).connect(peer);
  REQUIRE(qp);
  bool saw_rtr = false, saw_rts = false;
  for (const auto& m : f.modify_attrs) {
    if (m.qp_state == abi::IBV_QPS_RTR) {
      saw_rtr = true;
      CHECK(m.rq_psn == 0x123456); // the peer's
    }
    if (m.qp_state == abi::IBV_QPS_RTS) {
      saw_rts = true;
      CHECK(m.sq_psn == 0xabcdef); // ours
    }
  }
  CHECK(saw_rtr);
  CHECK(saw_rts);
  // Without fixed_psn every QP gets a fresh one.
  auto c = QpRecipe::rdma_core_rc(*sel).prepare(*pd, *cq);
  auto d = QpRecipe::rdma_core_rc(*sel).prepare(*pd, *cq);
  REQUIRE(c);
  REQUIRE(d);
  CHECK(c->endpoint().psn <= 0xffffff);
  CHECK(c->endpoint().psn != d->endpoint().psn);
}

TEST_CASE("finding 8 (issue 18): wait_with_liveness returns completions, names a silent peer at the deadline, and a "
          "lost one at once",
          "[issue18][side_channel]") {
  using namespace std::chrono_literals;
  using Clock = std::chrono::steady_clock;
  FakeVerbs f;
  auto ctx = Context::open(f.library(), "rdma_en1");
  REQUIRE(ctx);
  auto cq = ctx->create_cq(16, CqWait::poll);
  REQUIRE(cq);

  auto ranks = two_ranks(0x18f8);
  std::optional<SideChannel> zero(std::move(ranks.first)), one(std::move(ranks.second));

  WorkCompletion wc[4];
  // A completion waiting: returned, the peer not even asked.
  abi::ibv_wc done{};
  done.wr_id = 5;
  done.status = abi::IBV_WC_SUCCESS;
  done.opcode = abi::IBV_WC_RECV;
  f.completions.push_back(done);
  auto got = wait_with_liveness(*cq, wc, *zero, 1, Clock::now() + 1s, Step::link_warmup, "the warm-up");
  REQUIRE(got);
  CHECK(*got == 1);
  CHECK(wc[0].wr_id() == 5);

  // Nothing comes and the peer is alive: timeout at the caller's step, saying what it waited for.
  const auto t0 = Clock::now();
  auto silent = wait_with_liveness(*cq, wc, *zero, 1, t0 + 100ms, Step::link_warmup, "the warm-up", 20ms);
  const auto took = Clock::now() - t0;
  REQUIRE_FALSE(silent);
  CHECK(silent.error().is(ErrorKind::timeout));
  CHECK(silent.error().step == Step::link_warmup);
  CHECK(contains_text(std::string(silent.error().detail.view()), "waiting for the warm-up"));
  CHECK(took >= 100ms);
  CHECK(took < 2s);

  // The peer goes away: peer_lost within a few intervals, long before the deadline.
  one->close();
  const auto t1 = Clock::now();
  auto lost = wait_with_liveness(*cq, wc, *zero, -1, t1 + 10s, Step::link_warmup, "the warm-up", 20ms);
  REQUIRE_FALSE(lost);
  CHECK(lost.error().is(ErrorKind::peer_lost));
  CHECK(Clock::now() - t1 < 3s);
}
