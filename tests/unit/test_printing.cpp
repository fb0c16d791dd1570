// Printable types (issue 13): to_string and operator<< for Endpoint, Gid, GidSelection, QpType,
// Mtu, PortState, LinkLayer, GidType and Error. (std::format of the same types is checked by
// tests/printing/format_check.cpp, with a standard library that has <format>.)
#include <catch2/catch_test_macros.hpp>

#include <tbverbs/tbverbs.hpp>

#include <sstream>
#include <string>

using namespace tbverbs;

namespace {
template <class T> std::string streamed(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

Endpoint sample_endpoint() {
  Endpoint e;
  e.qp_num = 0x123;
  e.psn = 0x62a2f5;
  e.lid = 0;
  e.port = 1;
  e.mtu = Mtu::mtu1024;
  e.qp_type = QpType::uc;
  e.gid = Gid::from_ipv4(0x0a630001); // 10.99.0.1
  e.link_layer = LinkLayer::thunderbolt;
  e.caps = EndpointCaps::equal_frames;
  return e;
}
} // namespace

TEST_CASE("issue 13: the enums print their verbs names", "[printing]") {
  CHECK(to_string(QpType::uc) == "UC");
  CHECK(to_string(QpType::rc) == "RC");
  CHECK(to_string(QpType::ud) == "UD");
  CHECK(to_string(static_cast<QpType>(9)) == "unknown QP type");
  CHECK(to_string(Mtu::mtu256) == "256");
  CHECK(to_string(Mtu::mtu4096) == "4096");
  CHECK(to_string(static_cast<Mtu>(0)) == "unknown MTU");
  CHECK(to_string(PortState::active) == "PORT_ACTIVE");
  CHECK(to_string(PortState::down) == "PORT_DOWN");
  CHECK(to_string(LinkLayer::thunderbolt) == "Thunderbolt");
  CHECK(to_string(LinkLayer::ethernet) == "Ethernet");
  CHECK(to_string(GidType::roce_v2) == "RoCE v2");

  CHECK(streamed(QpType::rc) == "RC");
  CHECK(streamed(Mtu::mtu2048) == "2048");
  CHECK(streamed(PortState::init) == "PORT_INIT");
  CHECK(streamed(LinkLayer::infiniband) == "InfiniBand");
  CHECK(streamed(GidType::roce_v1) == "RoCE v1");
  // Each name is the same through both spellings, for every value of each enum.
  for (int v = 0; v < 256; ++v) {
    CHECK(streamed(static_cast<QpType>(v)) == to_string(static_cast<QpType>(v)));
    CHECK(streamed(static_cast<Mtu>(v)) == to_string(static_cast<Mtu>(v)));
    CHECK(streamed(static_cast<PortState>(v)) == to_string(static_cast<PortState>(v)));
    CHECK(streamed(static_cast<LinkLayer>(v)) == to_string(static_cast<LinkLayer>(v)));
  }
}

TEST_CASE("issue 13: a Gid prints its IPv6 text", "[printing]") {
  const Gid g = Gid::from_ipv4(0x0a000001);
  CHECK(to_string(g) == "::ffff:10.0.0.1");
  CHECK(streamed(g) == "::ffff:10.0.0.1");
  CHECK(streamed(Gid()) == "::");
  auto ll = Gid::parse("fe80::1");
  REQUIRE(ll);
  CHECK(streamed(*ll) == "fe80::1");
}

TEST_CASE("issue 13: a GidSelection prints its index, value and type", "[printing]") {
  const GidTable table = GidTable::from_typed_entries(
      1, {{Gid(), GidType::unknown, ""}, {Gid::from_ipv4(0x0a000001), GidType::roce_v2, "eth0"}});
  auto sel = table.roce();
  REQUIRE(sel);
  CHECK(to_string(*sel) == "GID[1] ::ffff:10.0.0.1 RoCE v2 netdev eth0");
  CHECK(streamed(*sel) == sel->describe());
}

TEST_CASE("issue 13: an Endpoint prints every field on one line", "[printing]") {
  Endpoint e = sample_endpoint();
  CHECK(to_string(e) ==
        "QPN 0x000123, PSN 0x62a2f5, LID 0x0000, GID ::ffff:10.99.0.1, port 1, MTU 1024, UC, Thunderbolt, caps equal_frames");
  CHECK(streamed(e) == to_string(e));
  e.gid_type = GidType::roce_v2;
  e.link_layer = LinkLayer::unspecified;
  e.caps = EndpointCaps::none;
  e.qp_type = QpType::rc;
  e.mtu = Mtu::mtu4096;
  e.lid = 0x1a;
  CHECK(to_string(e) == "QPN 0x000123, PSN 0x62a2f5, LID 0x001a, GID ::ffff:10.99.0.1 (RoCE v2), port 1, MTU 4096, RC");
  e.caps = static_cast<EndpointCaps>(0x11);
  CHECK(to_string(e).ends_with(", caps rdma_write 0x10"));
}

TEST_CASE("issue 13: an Error prints its whole message", "[printing]") {
  Error e = Error::from_return(Step::modify_qp_rtr, EINVAL).from(Platform::apple);
  e.on("rdma_en1", 1, 1);
  CHECK(to_string(e) == e.message());
  CHECK(streamed(e) == e.message());
  CHECK(streamed(e).starts_with("ibv_modify_qp(RTR) failed with EINVAL"));
}
