// Explain mode (explain.hpp): every attribute of a recipe's transitions, with its reason, built
// from the recipe's own pure builders; the sink and the switch.
#include <tbverbs/explain.hpp>

#include <catch2/catch_test_macros.hpp>

#include <cstdlib>
#include <string>
#include <vector>

using namespace tbverbs;

namespace {
bool has(const std::vector<std::string>& lines, const std::string& what) {
  for (const auto& l : lines)
    if (l.find(what) != std::string::npos) return true;
  return false;
}
} // namespace

TEST_CASE("explain lines show every INIT/RTR/RTS attribute of the Thunderbolt recipe with why", "[explain]") {
  auto table = GidTable::from_entries(1, {*Gid::parse("fe80::1"), *Gid::parse("::ffff:10.99.0.1")}, Platform::apple,
                                      "rdma_en2");
  auto sel = table.select();
  REQUIRE(sel);
  QpRecipe r = QpRecipe::thunderbolt(*sel);
  r.capacities({1088, 1088, 1, 1, 0});
  PortAttributes port;
  port.link_layer = LinkLayer::thunderbolt;
  port.active_mtu = Mtu::mtu4096;
  Endpoint local = r.local_endpoint(0x1234, 0xabcdef, 1), remote;
  remote.qp_num = 0x1503;
  remote.psn = 0x8b37c9;
  remote.lid = 2;
  remote.mtu = Mtu::mtu4096;
  remote.gid = *Gid::parse("::ffff:10.99.0.2");
  const auto lines = explain_queue_pair(r, port, {2047, 2047, 1, 1, 0}, local, remote, "link 0 to rank 1");
  CHECK(has(lines, "link 0 to rank 1: create_qp qp_type=UC (Apple's Thunderbolt driver offers UC only"));
  CHECK(has(lines, "create_qp cap.max_send_wr asked 1088, granted 2047 (4 KiB frames on Thunderbolt"));
  CHECK(has(lines, "the driver adjusted it"));
  CHECK(has(lines, "INIT qp_access_flags=0x0 none (SEND/RECV only"));
  CHECK(has(lines, "RTR path_mtu=1024 (the smaller of local 1024 and the peer's 4096; port active MTU 4096"));
  CHECK(has(lines, "RTR dest_qp_num=0x1503 (the peer's QP number"));
  CHECK(has(lines, "RTR rq_psn=0x8b37c9"));
  CHECK(has(lines, "RTR ah_attr.is_global=1 (GRH always"));
  CHECK(has(lines, "RTR ah_attr.grh.dgid=::ffff:10.99.0.2"));
  CHECK(has(lines, "RTR ah_attr.grh.sgid_index=1 (GID[1] ::ffff:10.99.0.1, first IPv4-mapped entry"));
  CHECK(has(lines, "RTR ah_attr.grh.hop_limit=1 (one cable"));
  CHECK(has(lines, "RTR ah_attr.dlid=2"));
  CHECK(has(lines, "RTS sq_psn=0xabcdef (this QP's initial PSN"));
  CHECK_FALSE(has(lines, "rnr_retry")); // UC has no retries
}

TEST_CASE("the RC recipe explains its retry budget", "[explain]") {
  auto table = GidTable::from_entries(1, {*Gid::parse("::ffff:192.168.1.5")}, Platform::rdma_core, "mlx5_0");
  auto sel = table.select();
  REQUIRE(sel);
  QpRecipe r = QpRecipe::rdma_core_rc(*sel);
  PortAttributes port;
  port.link_layer = LinkLayer::ethernet;
  Endpoint remote;
  remote.qp_type = QpType::rc;
  remote.gid = *Gid::parse("::ffff:192.168.1.6");
  const auto lines = explain_queue_pair(r, port, r.requested_capacities(), r.local_endpoint(1, 2), remote, {});
  CHECK(has(lines, "create_qp qp_type=RC"));
  CHECK(has(lines, "INIT qp_access_flags=0x2 REMOTE_WRITE"));
  CHECK(has(lines, "RTS rnr_retry=7"));
  CHECK(has(lines, "RTR min_rnr_timer=12"));
}

TEST_CASE("explain() goes to the sink only when explain mode is on", "[explain]") {
  std::vector<std::string> got;
  set_explain_sink([&](std::string_view l) { got.emplace_back(l); });
  set_explain(false);
  explain("hidden");
  set_explain(true);
  CHECK(explain_enabled());
  explain("shown");
  set_explain(false);
  set_explain_sink({});
  REQUIRE(got.size() == 1);
  CHECK(got[0] == "shown");
}
