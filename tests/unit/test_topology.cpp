// Topology discovery as a pure graph (topology.hpp): cables from the ports' subnets, the ring
// order along them, and every problem reported naming both ends; the wire form of the exchange.
#include <tbverbs/topology.hpp>

#include <catch2/catch_test_macros.hpp>

#include <string>
#include <vector>

using namespace tbverbs;

namespace {
PortAddress port(const char* dev, const char* ip, int prefix = 30) {
  PortAddress p;
  p.device = dev;
  p.usable = true;
  p.gid_index = 1;
  p.ipv4 = *parse_ipv4(ip);
  p.prefix = prefix;
  return p;
}
PortAddress down(const char* dev) {
  PortAddress p;
  p.device = dev;
  p.problem = "PORT_DOWN";
  return p;
}
bool has(const std::vector<std::string>& lines, const std::string& what) {
  for (const auto& l : lines)
    if (l.find(what) != std::string::npos) return true;
  return false;
}
} // namespace

TEST_CASE("cables are found from shared /30 subnets, whatever the device names", "[topology]") {
  // host0's rdma_en5 faces host2's rdma_en1, and so on: the ring is 0 -> 2 -> 1 -> 3.
  auto t = Topology::from_ports({{port("rdma_en5", "10.50.0.1"), port("rdma_en3", "10.50.3.2")},
                                 {down("rdma_en1"), port("rdma_en7", "10.50.1.2"), port("rdma_en2", "10.50.2.1")},
                                 {port("rdma_en3", "10.50.1.1"), port("rdma_en1", "10.50.0.2")},
                                 {port("rdma_en4", "10.50.2.2"), port("rdma_en1", "10.50.3.1")}});
  CHECK(t.problems().empty());
  REQUIRE(t.cables().size() == 4);
  const auto c02 = t.between(0, 2);
  REQUIRE(c02.size() == 1);
  CHECK(t.end(c02[0], 0).device == "rdma_en5");
  CHECK(t.end(c02[0], 2).device == "rdma_en1");
  CHECK(t.describe_cable(c02[0]) == "rank 0 rdma_en5 (10.50.0.1/30) <-> rank 2 rdma_en1 (10.50.0.2/30)");
  CHECK(t.between(0, 1).empty());
  auto ring = t.ring();
  REQUIRE(ring);
  CHECK(*ring == std::vector<int>{0, 2, 1, 3});
  CHECK(t.cable_of(1, "rdma_en7").has_value());
  CHECK_FALSE(t.cable_of(1, "rdma_en1").has_value());
}

TEST_CASE("rank order is kept when the cables allow it; two ranks share their cables", "[topology]") {
  auto t = Topology::from_ports({{port("rdma_en2", "10.99.0.1"), port("rdma_en1", "10.99.2.2")},
                                 {port("rdma_en1", "10.99.0.2"), port("rdma_en2", "10.99.1.1")},
                                 {port("rdma_en1", "10.99.1.2"), port("rdma_en2", "10.99.2.1")}});
  auto ring = t.ring();
  REQUIRE(ring);
  CHECK(*ring == std::vector<int>{0, 1, 2});
  auto two = Topology::from_ports({{port("rdma_en1", "10.0.0.1"), port("rdma_en2", "10.0.1.1")},
                                   {port("rdma_en2", "10.0.0.2"), port("rdma_en1", "10.0.1.2")}});
  REQUIRE(two.between(0, 1).size() == 2);
  auto r2 = two.ring();
  REQUIRE(r2);
  CHECK(*r2 == std::vector<int>{0, 1});
}

TEST_CASE("a missing cable: no ring, naming both ranks and their ports", "[topology]") {
  auto t = Topology::from_ports({{port("rdma_en2", "10.60.0.1"), down("rdma_en1")},
                                 {port("rdma_en1", "10.60.0.2"), port("rdma_en2", "10.60.1.1")},
                                 {port("rdma_en1", "10.60.1.2"), down("rdma_en2")}});
  auto r = t.ring();
  REQUIRE_FALSE(r);
  const std::string d(r.error().detail.view());
  CHECK(d.find("no cable between rank 2 and rank 0") != std::string::npos);
  CHECK(d.find("rank 2: rdma_en1 10.60.1.2/30, rdma_en2 PORT_DOWN") != std::string::npos);
  CHECK(d.find("rank 0: rdma_en2 10.60.0.1/30, rdma_en1 PORT_DOWN") != std::string::npos);
}

TEST_CASE("asymmetric netmasks, shared subnets, duplicates and lonely ports are problems", "[topology]") {
  // Asymmetric: rank 0 says /24 (rank 1 is on it), rank 1 says /30 (rank 0 is not).
  auto a = Topology::from_ports({{port("rdma_en1", "10.0.0.1", 24)}, {port("rdma_en1", "10.0.0.9", 30)}});
  CHECK(a.cables().empty());
  CHECK(has(a.problems(), "asymmetric: rank 0 rdma_en1 (10.0.0.1/24) and rank 1 rdma_en1 (10.0.0.9/30) disagree"));
  // Three ports on one subnet: ambiguous; one rank with two ports on it.
  auto b = Topology::from_ports({{port("rdma_en2", "10.80.0.1")},
                                 {port("rdma_en1", "10.80.0.2"), port("rdma_en2", "10.80.0.3")}});
  CHECK(b.cables().empty());
  CHECK(has(b.problems(), "ambiguous: rank 0 rdma_en2 (10.80.0.1/30), rank 1 rdma_en1 (10.80.0.2/30)"));
  CHECK(has(b.problems(), "one rank, one subnet: rank 1 rdma_en1"));
  // The same address on both ends.
  auto c = Topology::from_ports({{port("rdma_en1", "10.1.0.1")}, {port("rdma_en1", "10.1.0.1")}});
  CHECK(has(c.problems(), "duplicate address"));
  // A port nobody faces.
  auto d = Topology::from_ports({{port("rdma_en1", "10.2.0.1"), port("rdma_en2", "10.3.0.1")},
                                 {port("rdma_en1", "10.2.0.2")}});
  CHECK(d.cables().size() == 1);
  CHECK(has(d.problems(), "alone: rank 0 rdma_en2 (10.3.0.1/30) faces no rank of this job"));
  auto r = d.ring();
  CHECK(r);
}

TEST_CASE("the ports' wire form round-trips and refuses truncated or foreign bytes", "[topology]") {
  std::vector<PortAddress> ports{port("rdma_en2", "10.99.0.1"), down("rdma_en1")};
  ports[0].prefix_known = true;
  const auto wire = Topology::serialize_ports(ports);
  auto back = Topology::parse_ports(wire, 3);
  REQUIRE(back);
  REQUIRE(back->size() == 2);
  CHECK((*back)[0].device == "rdma_en2");
  CHECK((*back)[0].ipv4 == ports[0].ipv4);
  CHECK((*back)[0].prefix == 30);
  CHECK((*back)[0].prefix_known);
  CHECK((*back)[0].gid_index == 1);
  CHECK_FALSE((*back)[1].usable);
  CHECK((*back)[1].problem == "PORT_DOWN");
  auto cut = Topology::parse_ports(std::span(wire).first(wire.size() - 3), 3);
  REQUIRE_FALSE(cut);
  CHECK(cut.error().is(ErrorKind::bad_frame));
  CHECK(std::string(cut.error().detail.view()).find("rank 3") != std::string::npos);
  const std::byte junk[4] = {};
  CHECK_FALSE(Topology::parse_ports(junk, 1));
}

TEST_CASE("finding 3 (issue 19): a peer's topology message with a GID index field of 0x80000000 is refused, "
          "not converted with a signed overflow", "[topology][regression]") {
  // The field is the GID index + 1, big-endian, at a fixed place after the device name: magic (4),
  // count (1), name length (1), "rdma_en2" (8), port (1), flags (1), then the field.
  const auto good = Topology::serialize_ports({port("rdma_en2", "10.99.0.1")});
  REQUIRE(Topology::parse_ports(good, 1));
  constexpr std::size_t at = 4 + 1 + 1 + 8 + 1 + 1;
  REQUIRE(std::to_integer<int>(good[at + 3]) == 2);  // GID index 1
  auto with_field = [&](std::uint32_t v) {
    auto w = good;
    for (int i = 0; i < 4; ++i) w[at + static_cast<std::size_t>(i)] = static_cast<std::byte>(v >> (24 - 8 * i));
    return Topology::parse_ports(w, 1);
  };
  for (std::uint32_t v : {0x80000000u, 0x80000001u, 0xffffffffu, 0x7fffffffu, 65537u}) {
    auto r = with_field(v);
    REQUIRE_FALSE(r);
    CHECK(r.error().is(ErrorKind::bad_frame));
    CHECK(std::string(r.error().detail.view()).find("rank 1 sent a topology message with GID index") != std::string::npos);
  }
  auto top = with_field(65536u);  // index 65535, the largest carried
  REQUIRE(top);
  CHECK((*top)[0].gid_index == 65535);
  // A usable port without a GID index, a netmask longer than 32 bits, unknown flags: refused too.
  auto none = with_field(0);
  REQUIRE_FALSE(none);
  CHECK(std::string(none.error().detail.view()).find("usable port 1 (rdma_en2) but no GID index") != std::string::npos);
  auto w = good;
  w[at + 4 + 4] = std::byte{33};
  CHECK_FALSE(Topology::parse_ports(w, 1));
  w = good;
  w[at - 1] = std::byte{4};
  CHECK_FALSE(Topology::parse_ports(w, 1));
}

TEST_CASE("issue 38: a peer's device name or problem with a control character is refused, never printed",
          "[topology][regression]") {
  // Before: the name reached every message naming the port as it came ("\x1b[2J" cleared the
  // terminal of whoever read the error).
  auto forged = port("rdma_en2", "10.99.0.1");
  forged.device = "rdma\x1b[2J";
  auto r = Topology::parse_ports(Topology::serialize_ports({forged}), 1);
  REQUIRE_FALSE(r);
  CHECK(r.error().is(ErrorKind::bad_frame));
  const std::string said(r.error().detail.view());
  CHECK(said.find("control characters in port 1") != std::string::npos);
  CHECK(said.find('\x1b') == std::string::npos);
  auto problem = down("rdma_en1");
  problem.problem = "PORT_DOWN\r\nrank 0: all ranks verified";
  CHECK_FALSE(Topology::parse_ports(Topology::serialize_ports({problem}), 1));
  CHECK(Topology::parse_ports(Topology::serialize_ports({port("rdma_en2", "10.99.0.1"), down("rdma_en1")}), 1));
}
