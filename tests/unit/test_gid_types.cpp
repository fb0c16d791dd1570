// GID types and rdma-core NICs (issue 11): mlx5 publishes every address twice, a RoCE v1 and a
// RoCE v2 entry (usually v1 first), so "the first ::ffff: entry" is RoCE v1; InfiniBand tables
// hold only subnet-prefix GIDs and address by LID (docs/field-reports.md section 4b, "rdma-core
// NICs"; rows 14, 16, 23 of section 1). Pure tables, recipes and endpoints, plus the type
// sources through a fake function table and a fake sysfs tree.
#include "fake_verbs.hpp"

#include <catch2/catch_test_macros.hpp>

#include <net/if.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace tbverbs;
using fake::FakeVerbs;

namespace {

Gid G(const char* text) { return *Gid::parse(text); }
GidEntry v1(const char* text, std::string netdev = "eth0") { return {G(text), GidType::roce_v1, std::move(netdev)}; }
GidEntry v2(const char* text, std::string netdev = "eth0") { return {G(text), GidType::roce_v2, std::move(netdev)}; }
GidEntry empty() { return {}; }

GidPortFacts ethernet(Mtu active = Mtu::mtu1024) { return {LinkLayer::ethernet, 0, active, true}; }
GidPortFacts infiniband(std::uint16_t lid, Mtu active = Mtu::mtu4096) {
  return {LinkLayer::infiniband, lid, active, true};
}

GidTable mlx5(std::vector<GidEntry> e, GidPortFacts facts = ethernet()) {
  return GidTable::from_typed_entries(1, std::move(e), Platform::rdma_core, "mlx5_0", facts);
}

// The table mlx5 shows for one IPv4 address: fe80:: v1/v2 at 0/1, ::ffff:a.b.c.d v1/v2 at 2/3.
GidTable mlx5_one_address() {
  return mlx5({v1("fe80::1"), v2("fe80::1"), v1("::ffff:10.0.0.1"), v2("::ffff:10.0.0.1")});
}

/// Unsets an environment variable for the guard's life and restores it afterwards.
struct Env {
  const char* name;
  std::string old;
  bool had;
  Env(const char* n, const char* value) : name(n), had(std::getenv(n) != nullptr) {
    if (had) old = std::getenv(n);
    if (value) ::setenv(n, value, 1);
    else ::unsetenv(n);
  }
  ~Env() {
    if (had) ::setenv(name, old.c_str(), 1);
    else ::unsetenv(name);
  }
};

} // namespace

TEST_CASE("regression: on mlx5 the first ::ffff: entry is RoCE v1 and select() takes the RoCE v2 one", "[gid][roce]") {
  Env a("TBVERBS_GID_INDEX", nullptr), b("TBVERBS_ROCE_VERSION", nullptr);
  const GidTable t = mlx5_one_address();
  // The pre-issue-11 rule ("first IPv4-mapped entry") picks index 2, RoCE v1: what failed in the field.
  REQUIRE(t.first_ipv4_mapped());
  CHECK(t.first_ipv4_mapped()->index() == 2);
  CHECK(t.first_ipv4_mapped()->type() == GidType::roce_v1);
  auto s = t.select();
  REQUIRE(s);
  CHECK(s->index() == 3);
  CHECK(s->type() == GidType::roce_v2);
  CHECK(s->reason() == "first RoCE v2 IPv4 entry");
  CHECK(s->describe() == "GID[3] ::ffff:10.0.0.1 RoCE v2 netdev eth0");
  CHECK(s->netdev() == "eth0");
}

TEST_CASE("RoCE v2 is chosen whichever order the two entries of an address come in", "[gid][roce]") {
  Env a("TBVERBS_GID_INDEX", nullptr), b("TBVERBS_ROCE_VERSION", nullptr);
  const GidTable t = mlx5({v2("fe80::1"), v1("fe80::1"), v2("::ffff:10.0.0.1"), v1("::ffff:10.0.0.1")});
  auto s = t.select();
  REQUIRE(s);
  CHECK(s->index() == 2);
  CHECK(s->type() == GidType::roce_v2);
}

TEST_CASE("several addresses: the bootstrap address's RoCE v2 entry, else the first RoCE v2 IPv4 entry", "[gid][roce]") {
  Env a("TBVERBS_GID_INDEX", nullptr), b("TBVERBS_ROCE_VERSION", nullptr);
  const GidTable t = mlx5({v1("fe80::1"), v2("fe80::1"), v1("::ffff:10.0.0.1"), v2("::ffff:10.0.0.1"),
                           v1("::ffff:10.0.1.1", "eth1"), v2("::ffff:10.0.1.1", "eth1")});
  auto match = t.select(*parse_ipv4("10.0.1.1"));
  REQUIRE(match);
  CHECK(match->index() == 5);
  CHECK(match->reason() == "RoCE v2 entry matching the bootstrap IPv4 address");
  CHECK(match->netdev() == "eth1");
  // An address on no entry (the bootstrap socket on another interface): the first RoCE v2 IPv4 entry.
  auto other = t.select(*parse_ipv4("192.168.7.7"));
  REQUIRE(other);
  CHECK(other->index() == 3);
  CHECK(other->reason() == "first RoCE v2 IPv4 entry");
  // matching_ipv4 alone prefers the RoCE v2 entry of the address too.
  REQUIRE(t.matching_ipv4(*parse_ipv4("10.0.1.1")));
  CHECK(t.matching_ipv4(*parse_ipv4("10.0.1.1"))->index() == 5);
}

TEST_CASE("IPv6 only: the RoCE v2 global IPv6 entry, never a link-local one", "[gid][roce]") {
  Env a("TBVERBS_GID_INDEX", nullptr), b("TBVERBS_ROCE_VERSION", nullptr);
  const GidTable t = mlx5({v1("fe80::1"), v2("fe80::1"), v1("fd00::5"), v2("fd00::5")});
  auto s = t.select();
  REQUIRE(s);
  CHECK(s->index() == 3);
  CHECK(s->gid() == G("fd00::5"));
  CHECK(s->reason() == "RoCE v2 IPv6 entry (no RoCE v2 IPv4 entry)");
}

TEST_CASE("only link-local RoCE entries: no_ipv4_gid naming every entry with its type", "[gid][roce]") {
  Env a("TBVERBS_GID_INDEX", nullptr), b("TBVERBS_ROCE_VERSION", nullptr);
  auto s = mlx5({v1("fe80::1"), v2("fe80::1")}).select();
  REQUIRE_FALSE(s);
  CHECK(s.error().kind == ErrorKind::no_ipv4_gid);
  const std::string m = s.error().message();
  CHECK(m.find("GID[0]=fe80::1 (RoCE v1)") != std::string::npos);
  CHECK(m.find("GID[1]=fe80::1 (RoCE v2)") != std::string::npos);
  REQUIRE(s.error().diagnosis() != nullptr);
  CHECK(s.error().diagnosis()->id == "no-ipv4-gid-linux");
}

TEST_CASE("RoCE v1 only when asked: TBVERBS_ROCE_VERSION=1, or TBVERBS_GID_INDEX naming a v1 entry", "[gid][roce]") {
  const GidTable t = mlx5_one_address();
  {
    Env a("TBVERBS_GID_INDEX", nullptr), b("TBVERBS_ROCE_VERSION", "1");
    auto s = t.select();
    REQUIRE(s);
    CHECK(s->index() == 2);
    CHECK(s->type() == GidType::roce_v1);
    CHECK(s->reason().find("TBVERBS_ROCE_VERSION=1") != std::string_view::npos);
  }
  {
    Env a("TBVERBS_GID_INDEX", nullptr), b("TBVERBS_ROCE_VERSION", "3");
    auto s = t.select();
    REQUIRE_FALSE(s);
    CHECK(s.error().kind == ErrorKind::invalid_argument);
    CHECK(s.error().message().find("TBVERBS_ROCE_VERSION") != std::string::npos);
  }
  {
    Env a("TBVERBS_GID_INDEX", "2"), b("TBVERBS_ROCE_VERSION", nullptr);
    auto s = t.select();
    REQUIRE(s);
    CHECK(s->index() == 2);
    CHECK(s->type() == GidType::roce_v1);
    CHECK(s->reason().find("operator override") == 0);
    CHECK(s->reason().find("RoCE v1") != std::string_view::npos);
  }
  {
    Env a("TBVERBS_GID_INDEX", "7"), b("TBVERBS_ROCE_VERSION", nullptr); // outside the table: still refused
    CHECK(t.select().error().kind == ErrorKind::gid_index_invalid);
  }
}

TEST_CASE("a table with only RoCE v1 addresses is refused by default and says how to ask for v1", "[gid][roce]") {
  Env a("TBVERBS_GID_INDEX", nullptr), b("TBVERBS_ROCE_VERSION", nullptr);
  auto s = mlx5({v1("fe80::1"), v1("::ffff:10.0.0.1")}).select();
  REQUIRE_FALSE(s);
  CHECK(s.error().message().find("TBVERBS_ROCE_VERSION=1") != std::string::npos);
}

TEST_CASE("an rdma-core table without types (old provider, no sysfs) keeps the first IPv4-mapped rule", "[gid][roce]") {
  Env a("TBVERBS_GID_INDEX", nullptr), b("TBVERBS_ROCE_VERSION", nullptr);
  const GidTable t = GidTable::from_entries(1, {G("fe80::1"), G("::ffff:10.0.0.1")}, Platform::rdma_core, "mlx4_0");
  CHECK_FALSE(t.has_types());
  auto s = t.select();
  REQUIRE(s);
  CHECK(s->index() == 1);
  CHECK(s->type() == GidType::unknown);
  CHECK(s->reason() == "first IPv4-mapped entry (GID types unknown)");
  CHECK(s->describe() == "GID[1] ::ffff:10.0.0.1");
}

TEST_CASE("regression: an InfiniBand port has no IPv4-mapped GID and is selected by its port GID (ds4#813)", "[gid][ib]") {
  Env a("TBVERBS_GID_INDEX", nullptr), b("TBVERBS_ROCE_VERSION", nullptr);
  const GidTable t = mlx5({{G("fe80::248a:703:49:5c2e"), GidType::ib, ""}, empty(), empty()}, infiniband(7));
  CHECK(t.is_infiniband());
  CHECK_FALSE(t.first_ipv4_mapped()); // the old rule refused every InfiniBand fabric
  auto s = t.select();
  REQUIRE(s);
  CHECK(s->index() == 0);
  CHECK(s->is_infiniband());
  CHECK(s->port_facts().lid == 7);
  CHECK(s->reason() == "InfiniBand port GID (addressing by LID)");
  CHECK(s->describe() == "GID[0] fe80::248a:703:49:5c2e IB LID 7");
  // Old kernels report link layer 0 for InfiniBand: a LID and no IPv4 entry tell it apart.
  const GidTable old = mlx5({{G("fe80::1"), GidType::unknown, ""}}, {LinkLayer::unspecified, 3, Mtu::mtu2048, true});
  CHECK(old.is_infiniband());
  CHECK(old.select());
}

TEST_CASE("the RC preset takes the port's active MTU and RTR the smaller of both ends'", "[recipe][mtu]") {
  Env a("TBVERBS_GID_INDEX", nullptr), b("TBVERBS_ROCE_VERSION", nullptr);
  const GidTable t4096 = mlx5({v1("fe80::1"), v2("fe80::1"), v1("::ffff:10.0.0.1"), v2("::ffff:10.0.0.1")},
                              ethernet(Mtu::mtu4096));
  const auto rc = QpRecipe::rdma_core_rc(*t4096.select());
  CHECK(rc.path_mtu() == Mtu::mtu4096);
  const Endpoint mine = rc.local_endpoint(0x11, 1);
  CHECK(mine.mtu == Mtu::mtu4096);
  CHECK(mine.gid_type == GidType::roce_v2);
  CHECK(mine.link_layer == LinkLayer::ethernet);
  Endpoint peer = mine;
  peer.mtu = Mtu::mtu1024; // a peer on a 1500-byte Ethernet MTU
  CHECK(rc.rtr_transition(peer)->attr.path_mtu == abi::IBV_MTU_1024);
  peer.mtu = Mtu::mtu4096;
  CHECK(rc.rtr_transition(peer)->attr.path_mtu == abi::IBV_MTU_4096);
  // Row 16: a path MTU above the port's active MTU is refused at RTR: asking for more is capped.
  const auto capped = QpRecipe::rdma_core_rc(*mlx5_one_address().select()).mtu(Mtu::mtu4096);
  CHECK(capped.local_mtu() == Mtu::mtu1024);
  CHECK(capped.local_endpoint(1, 1).mtu == Mtu::mtu1024);
  CHECK(capped.rtr_transition(peer)->attr.path_mtu == abi::IBV_MTU_1024);
  // A table without port facts (tests, tools) keeps the old fixed 1024.
  const auto plain = QpRecipe::rdma_core_rc(*GidTable::from_entries(1, {G("::ffff:10.0.0.1")}, Platform::rdma_core).select());
  CHECK(plain.path_mtu() == Mtu::mtu1024);
}

TEST_CASE("InfiniBand: LID addressing within a subnet, a GRH when the subnet prefixes differ; RoCE always a GRH", "[recipe][ib]") {
  Env a("TBVERBS_GID_INDEX", nullptr), b("TBVERBS_ROCE_VERSION", nullptr);
  const GidTable t = mlx5({{G("fe80::aaaa"), GidType::ib, ""}}, infiniband(5));
  const auto rc = QpRecipe::rdma_core_rc(*t.select());
  CHECK(rc.path_mtu() == Mtu::mtu4096);
  Endpoint peer = rc.local_endpoint(0x22, 9, 6);
  peer.gid = G("fe80::bbbb");
  peer.lid = 6;
  const QpTransition same = rc.rtr_transition(peer).value();
  CHECK(same.attr.ah_attr.is_global == 0);
  CHECK(same.attr.ah_attr.dlid == 6);
  CHECK(Gid(std::to_array(same.attr.ah_attr.grh.dgid.raw)).is_zero());
  peer.gid = G("fec0:0:0:1::bbbb"); // another subnet: routed through an IB router, GRH needed
  const QpTransition routed = rc.rtr_transition(peer).value();
  CHECK(routed.attr.ah_attr.is_global == 1);
  CHECK(routed.attr.ah_attr.dlid == 6);
  CHECK(Gid(std::to_array(routed.attr.ah_attr.grh.dgid.raw)) == peer.gid);
  CHECK(routed.attr.ah_attr.grh.sgid_index == 0);
  // RoCE: always global, even between "subnet prefixes" that agree (all fe80::).
  const auto roce = QpRecipe::rdma_core_rc(*mlx5_one_address().select());
  Endpoint rpeer = roce.local_endpoint(0x33, 1);
  rpeer.gid = G("::ffff:10.0.0.2");
  CHECK(roce.rtr_transition(rpeer)->attr.ah_attr.is_global == 1);
  CHECK(roce.rtr_transition(rpeer)->attr.ah_attr.grh.sgid_index == 3);
}

TEST_CASE("endpoint wire form carries the GID type and link layer; older frames read as unknown", "[endpoint]") {
  Endpoint e;
  e.qp_num = 0x123;
  e.psn = 0x456;
  e.lid = 9;
  e.qp_type = QpType::rc;
  e.gid = G("::ffff:10.0.0.1");
  e.gid_type = GidType::roce_v2;
  e.link_layer = LinkLayer::infiniband;
  auto w = e.serialize();
  auto back = Endpoint::parse(w);
  REQUIRE(back);
  CHECK(*back == e);
  // A frame from a build before these fields had zeros there (and a matching checksum).
  Endpoint older = e;
  older.gid_type = GidType::unknown;
  older.link_layer = LinkLayer::unspecified;
  auto ow = older.serialize();
  CHECK(static_cast<int>(ow[21]) == 0);
  CHECK(static_cast<int>(ow[22]) == 0);
  REQUIRE(Endpoint::parse(ow));
  CHECK(Endpoint::parse(ow)->gid_type == GidType::unknown);
  CHECK(Endpoint::parse(ow)->link_layer == LinkLayer::unspecified);
}

namespace {
// Types for the fake's entries, served through whichever optional symbol a test installs.
std::vector<std::uint32_t> g_abi_types; // enum ibv_gid_type per index
int fake_query_gid_ex(abi::ibv_context*, std::uint32_t port, std::uint32_t index, detail::GidEntryAbi* e,
                      std::uint32_t flags, std::size_t size) {
  if (flags != 0 || size != sizeof(detail::GidEntryAbi) || index >= g_abi_types.size()) return EINVAL;
  *e = {};
  e->gid_index = index;
  e->port_num = port;
  e->gid_type = g_abi_types[index];
  return 0;
}
ssize_t fake_query_gid_table(abi::ibv_context*, detail::GidEntryAbi* e, std::size_t max, std::uint32_t,
                             std::size_t size) {
  if (size != sizeof(detail::GidEntryAbi) || max < g_abi_types.size()) return -EINVAL;
  for (std::size_t i = 0; i < g_abi_types.size(); ++i) {
    e[i] = {};
    e[i].gid_index = static_cast<std::uint32_t>(i);
    e[i].port_num = 1;
    e[i].gid_type = g_abi_types[i];
    e[i].ndev_ifindex = i == 3 ? 1 : 0; // interface 1 is the loopback on Linux
  }
  return static_cast<ssize_t>(g_abi_types.size());
}
int fake_query_gid_type(abi::ibv_context*, std::uint8_t, unsigned index, int* type) {
  if (index >= g_abi_types.size()) return -1;
  *type = g_abi_types[index] == 2 ? 1 : 0;
  return 0;
}

void mlx5_fake(FakeVerbs& f) {
  f.device_names = {"mlx5_0"};
  f.link_layer = 2; // Ethernet
  f.gids = {G("fe80::1"), G("fe80::1"), G("::ffff:10.0.0.1"), G("::ffff:10.0.0.1")};
  g_abi_types = {1, 2, 1, 2};
}
} // namespace

TEST_CASE("GID types come from _ibv_query_gid_table, else _ibv_query_gid_ex, else ibv_query_gid_type", "[gid][loader]") {
  Env a("TBVERBS_GID_INDEX", nullptr), b("TBVERBS_ROCE_VERSION", nullptr);
  static_assert(sizeof(detail::GidEntryAbi) == 32, "rdma-core's struct ibv_gid_entry is 32 bytes");
  for (const char* source : {"_ibv_query_gid_table", "_ibv_query_gid_ex", "ibv_query_gid_type"}) {
    CAPTURE(source);
    FakeVerbs f;
    mlx5_fake(f);
    const std::string s = source;
    if (s == "_ibv_query_gid_table") f.api.query_gid_table = fake_query_gid_table;
    if (s != "ibv_query_gid_type") f.api.query_gid_ex = fake_query_gid_ex;
    f.api.query_gid_type = fake_query_gid_type;
    CHECK(f.library().has_gid_types());
    auto ctx = Context::open(f.library(), "mlx5_0");
    REQUIRE(ctx);
    // No sysfs tree for the fake device: only the verbs can give the types.
    std::strcpy(ctx->native_handle()->device->ibdev_path, "/nonexistent/tbverbs-test");
    auto t = ctx->gid_table(1);
    REQUIRE(t);
    CHECK(t->type_source() == source);
    CHECK(t->type_at(0) == GidType::roce_v1);
    CHECK(t->type_at(3) == GidType::roce_v2);
    CHECK(t->port_facts().link_layer == LinkLayer::ethernet);
    auto sel = t->select();
    REQUIRE(sel);
    CHECK(sel->index() == 3);
#if defined(__linux__)
    if (s == "_ibv_query_gid_table") {
      char lo[IF_NAMESIZE + 1] = {};
      if (::if_indextoname(1, lo) != nullptr) CHECK(sel->netdev() == lo);
    }
#endif
  }
  FakeVerbs none; // no type symbol at all, no sysfs: unknown types, the old rule
  mlx5_fake(none);
  CHECK_FALSE(none.library().has_gid_types());
  auto ctx = Context::open(none.library(), "mlx5_0");
  REQUIRE(ctx);
  std::strcpy(ctx->native_handle()->device->ibdev_path, "/nonexistent/tbverbs-test");
  auto t = ctx->gid_table(1);
  REQUIRE(t);
  CHECK(t->type_source() == "none");
  CHECK(t->select()->index() == 2);
}

TEST_CASE("without a type verb the table reads sysfs gid_attrs/types and ndevs under ibdev_path", "[gid][sysfs]") {
#if !defined(__linux__)
  SKIP("sysfs is Linux only");
#else
  Env a("TBVERBS_GID_INDEX", nullptr), b("TBVERBS_ROCE_VERSION", nullptr);
  const auto dir = std::filesystem::temp_directory_path() / ("tbverbs-sysfs-" + std::to_string(::getpid()));
  const auto attrs = dir / "ports" / "1" / "gid_attrs";
  std::filesystem::create_directories(attrs / "types");
  std::filesystem::create_directories(attrs / "ndevs");
  const char* types[] = {"IB/RoCE v1", "RoCE v2", "IB/RoCE v1", "RoCE v2"};
  for (int i = 0; i < 4; ++i) {
    std::ofstream(attrs / "types" / std::to_string(i)) << types[i] << "\n";
    std::ofstream(attrs / "ndevs" / std::to_string(i)) << "enp1s0f0np0\n";
  }
  FakeVerbs f;
  mlx5_fake(f);
  auto ctx = Context::open(f.library(), "mlx5_0");
  REQUIRE(ctx);
  std::strcpy(ctx->native_handle()->device->ibdev_path, dir.c_str());
  auto t = ctx->gid_table(1);
  REQUIRE(t);
  CHECK(t->type_source() == "sysfs");
  CHECK(t->type_at(2) == GidType::roce_v1);
  CHECK(t->netdev_at(1) == "enp1s0f0np0");
  auto s = t->select();
  REQUIRE(s);
  CHECK(s->index() == 3);
  CHECK(s->describe() == "GID[3] ::ffff:10.0.0.1 RoCE v2 netdev enp1s0f0np0");
  // On an InfiniBand port the same "IB/RoCE v1" string means IB.
  f.link_layer = 1;
  auto ib = ctx->gid_table(1);
  REQUIRE(ib);
  CHECK(ib->type_at(0) == GidType::ib);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
#endif
}

TEST_CASE("regression: a RoCE v1 end and a RoCE v2 end are refused at connect, before a silent RTR", "[recipe][roce]") {
  Env a("TBVERBS_GID_INDEX", nullptr), b("TBVERBS_ROCE_VERSION", nullptr);
  FakeVerbs f;
  mlx5_fake(f);
  f.api.query_gid_ex = fake_query_gid_ex;
  auto ctx = Context::open(f.library(), "mlx5_0");
  REQUIRE(ctx);
  auto pd = ctx->alloc_pd();
  auto cq = ctx->create_cq(16, CqWait::poll);
  REQUIRE(pd);
  REQUIRE(cq);
  auto sel = ctx->gid_table(1)->select();
  REQUIRE(sel);
  CHECK(sel->type() == GidType::roce_v2);
  auto prep = QpRecipe::rdma_core_rc(*sel).prepare(*pd, *cq);
  REQUIRE(prep);
  Endpoint peer = prep->endpoint();
  peer.gid = G("::ffff:10.0.0.2");
  peer.gid_type = GidType::roce_v1; // the peer's operator pinned TBVERBS_GID_INDEX to its v1 entry
  const std::size_t modifies = f.modify_masks.size();
  auto q = std::move(*prep).connect(peer);
  REQUIRE_FALSE(q);
  CHECK(q.error().kind == ErrorKind::incompatible_peer);
  REQUIRE(q.error().diagnosis() != nullptr);
  CHECK(q.error().diagnosis()->id == "roce-version-mismatch");
  CHECK(q.error().message().find("RoCE v1") != std::string::npos);
  CHECK(f.modify_masks.size() == modifies); // no RTR was attempted
}

TEST_CASE("regression: RTR on an InfiniBand port with LID 0 is diagnosed as no subnet manager", "[recipe][ib]") {
  Env a("TBVERBS_GID_INDEX", nullptr), b("TBVERBS_ROCE_VERSION", nullptr);
  FakeVerbs f;
  f.device_names = {"mlx5_0"};
  f.link_layer = 1;            // InfiniBand; the fake's port reports LID 0
  f.gids = {G("fe80::aaaa")};
  f.modify_qp_rc[abi::IBV_QPS_RTR] = EINVAL;
  auto ctx = Context::open(f.library(), "mlx5_0");
  REQUIRE(ctx);
  auto pd = ctx->alloc_pd();
  auto cq = ctx->create_cq(16, CqWait::poll);
  REQUIRE(pd);
  REQUIRE(cq);
  auto sel = ctx->gid_table(1)->select();
  REQUIRE(sel);
  CHECK(sel->is_infiniband());
  auto prep = QpRecipe::rdma_core_rc(*sel).prepare(*pd, *cq);
  REQUIRE(prep);
  Endpoint peer = prep->endpoint();
  peer.gid = G("fe80::bbbb");
  peer.lid = 4;
  auto q = std::move(*prep).connect(peer);
  REQUIRE_FALSE(q);
  CHECK(q.error().step == Step::modify_qp_rtr);
  CHECK(q.error().is(EINVAL));
  REQUIRE(q.error().diagnosis() != nullptr);
  CHECK(q.error().diagnosis()->id == "infiniband-no-subnet-manager");
  CHECK(std::string(q.error().diagnosis()->remedy).find("opensm") != std::string::npos);
}

TEST_CASE("a port in PORT_INIT on rdma-core is diagnosed as no subnet manager", "[diagnosis][ib]") {
  Error e = Error::make(Step::query_port, ErrorKind::port_not_active, "state PORT_INIT");
  e.from(Platform::rdma_core);
  REQUIRE(e.diagnosis() != nullptr);
  CHECK(e.diagnosis()->id == "infiniband-no-subnet-manager");
  Error down = Error::make(Step::query_port, ErrorKind::port_not_active, "state PORT_DOWN");
  down.from(Platform::rdma_core);
  CHECK(down.diagnosis()->id == "port-not-active-linux");
}

TEST_CASE("GID type names are the ones show_gids prints", "[gid]") {
  CHECK(gid_type_name(GidType::roce_v2) == "RoCE v2");
  CHECK(gid_type_name(GidType::roce_v1) == "RoCE v1");
  CHECK(gid_type_name(GidType::ib) == "IB");
  CHECK(gid_type_name(GidType::unknown) == "unknown");
}

TEST_CASE("finding 12 (issue 8): TBVERBS_GID_INDEX names devices, never silently overrides the bootstrap address",
          "[gid][issue8]") {
  Env b("TBVERBS_ROCE_VERSION", nullptr);
  const GidTable t = mlx5({v1("fe80::1"), v2("fe80::1"), v1("::ffff:10.0.0.1"), v2("::ffff:10.0.0.1"),
                           v1("::ffff:10.0.1.1", "eth1"), v2("::ffff:10.0.1.1", "eth1")});
  SECTION("a bare index applies to every device") {
    Env a("TBVERBS_GID_INDEX", "2");
    auto s = t.select();
    REQUIRE(s);
    CHECK(s->index() == 2);
    CHECK(s->reason() == "operator override (TBVERBS_GID_INDEX), a RoCE v1 entry");
  }
  SECTION("the per-device form applies to the named device and port only") {
    {
      Env a("TBVERBS_GID_INDEX", "mlx5_1:2,mlx5_0:5");
      auto s = t.select();
      REQUIRE(s);
      CHECK(s->index() == 5);
      CHECK(s->reason() == "operator override");
    }
    {
      Env a("TBVERBS_GID_INDEX", "mlx5_0:1:4");
      auto s = t.select();
      REQUIRE(s);
      CHECK(s->index() == 4);
    }
    {
      Env a("TBVERBS_GID_INDEX", "mlx5_0:2:4,mlx5_1:0"); // other port, other device: the rules apply
      auto opt = t.env_override();
      REQUIRE(opt);
      CHECK_FALSE(opt->has_value());
      auto s = t.select();
      REQUIRE(s);
      CHECK(s->index() == 3);
      CHECK(s->reason() == "first RoCE v2 IPv4 entry");
    }
  }
  SECTION("malformed values name the syntax") {
    for (const char* bad : {"two", "-1", "mlx5_0:-2", "mlx5_0:", ":3", "mlx5_0:x", "mlx5_0:0:3", "mlx5_0:1:3,", "3,4"}) {
      Env a("TBVERBS_GID_INDEX", bad);
      auto s = t.select();
      INFO(bad);
      REQUIRE_FALSE(s);
      CHECK(s.error().kind == ErrorKind::gid_index_invalid);
    }
    Env a("TBVERBS_GID_INDEX", "mlx5_0:x");
    CHECK(t.select().error().message().find("DEVICE:PORT:INDEX") != std::string::npos);
  }
  SECTION("an index contradicting the bootstrap address on this port is an error") {
    Env a("TBVERBS_GID_INDEX", "3"); // 10.0.0.1, while the bootstrap socket is on 10.0.1.1 (GID[5])
    auto s = t.select(*parse_ipv4("10.0.1.1"));
    REQUIRE_FALSE(s);
    CHECK(s.error().kind == ErrorKind::gid_index_invalid);
    CHECK(s.error().message().find("two explicit choices disagree") != std::string::npos);
    CHECK(s.error().message().find("mlx5_0:5") != std::string::npos);
    // The same address, or a bootstrap address on another interface (no entry here), is fine.
    CHECK(t.select(*parse_ipv4("10.0.0.1"))->index() == 3);
    CHECK(t.select(*parse_ipv4("192.168.7.7"))->index() == 3);
  }
  SECTION("select_automatic ignores it") {
    Env a("TBVERBS_GID_INDEX", "2");
    auto s = t.select_automatic(*parse_ipv4("10.0.1.1"));
    REQUIRE(s);
    CHECK(s->index() == 5);
  }
}
