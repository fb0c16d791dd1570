// rdma-core NICs on the emulated profiles (issue 11): rdma-core-roce (mlx5's GID table, every
// address as a RoCE v1 and a RoCE v2 entry) and rdma-core-ib (link layer InfiniBand, LIDs,
// subnet-prefix GIDs). The field's failures play out here: a RoCE v1 end and a v2 end, or v1
// across a routed hop, connect but carry nothing (RC retries exceeded); an InfiniBand port with
// LID 0 fails RTR (docs/field-reports.md section 4b "rdma-core NICs", rows 14, 16, 23).
#include "emu_fixture.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

using namespace emu_test;
using Catch::Matchers::ContainsSubstring;

namespace {

#if TBVERBS_ABI_FROM_PLATFORM && defined(__linux__)
// tbverbs declares rdma-core's struct ibv_gid_entry itself (Apple's verbs.h may lack it).
static_assert(sizeof(tbverbs::detail::GidEntryAbi) == sizeof(::ibv_gid_entry));
static_assert(offsetof(tbverbs::detail::GidEntryAbi, gid_index) == offsetof(::ibv_gid_entry, gid_index));
static_assert(offsetof(tbverbs::detail::GidEntryAbi, port_num) == offsetof(::ibv_gid_entry, port_num));
static_assert(offsetof(tbverbs::detail::GidEntryAbi, gid_type) == offsetof(::ibv_gid_entry, gid_type));
static_assert(offsetof(tbverbs::detail::GidEntryAbi, ndev_ifindex) == offsetof(::ibv_gid_entry, ndev_ifindex));
static_assert(IBV_GID_TYPE_IB == 0 && IBV_GID_TYPE_ROCE_V1 == 1 && IBV_GID_TYPE_ROCE_V2 == 2);
#endif

/// A two-host fabric (hosts "a" and "b", device mlx5_0 each, one cable) from port objects.
class NicFabric {
public:
  NicFabric(const std::string& profile, const std::string& port_a, const std::string& port_b, bool routed = false) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tbverbs-nic-test-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    dir_ = tmpl;
    path_ = (dir_ / "fabric.json").string();
    std::ofstream f(path_);
    f << "{\"profile\": \"" << profile << "\", \"hosts\": ["
      << "{\"name\": \"a\", \"devices\": [{\"name\": \"mlx5_0\", \"ports\": [" << port_a << "]}]},"
      << "{\"name\": \"b\", \"devices\": [{\"name\": \"mlx5_0\", \"ports\": [" << port_b << "]}]}],"
      << "\"cables\": [{\"a\": \"a:mlx5_0:1\", \"b\": \"b:mlx5_0:1\", \"routed\": " << (routed ? "true" : "false")
      << "}]}\n";
    REQUIRE(f.good());
  }
  NicFabric(const NicFabric&) = delete;
  NicFabric& operator=(const NicFabric&) = delete;
  ~NicFabric() {
    ::unsetenv("TBVERBS_EMU_FABRIC");
    ::unsetenv("TBVERBS_EMU_STATE_DIR");
    ::unsetenv("TBVERBS_EMU_HOST");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  void use(const std::string& host) const {
    ::setenv("TBVERBS_EMU_FABRIC", path_.c_str(), 1);
    ::setenv("TBVERBS_EMU_STATE_DIR", (dir_ / "state").c_str(), 1);
    ::setenv("TBVERBS_EMU_HOST", host.c_str(), 1);
  }

private:
  std::filesystem::path dir_;
  std::string path_;
};

struct End {
  tbverbs::Context ctx;
  tbverbs::ProtectionDomain pd;
  tbverbs::CompletionQueue cq;
  tbverbs::AlignedBuffer buf;
  tbverbs::MemoryRegion mr;
  static End open(const NicFabric& f, const std::string& host) {
    f.use(host);
    tbverbs::Context ctx = ok(tbverbs::Context::open(emulator(), "mlx5_0"));
    tbverbs::ProtectionDomain pd = ok(ctx.alloc_pd());
    tbverbs::CompletionQueue cq = ok(ctx.create_cq(64, tbverbs::CqWait::poll));
    tbverbs::AlignedBuffer buf = ok(tbverbs::AlignedBuffer::allocate(64 * 1024));
    tbverbs::MemoryRegion mr = ok(pd.reg_mr(buf, tbverbs::Access::local_write));
    return End{std::move(ctx), std::move(pd), std::move(cq), std::move(buf), std::move(mr)};
  }
  tbverbs::GidTable table() const { return ok(ctx.gid_table(1)); }
};

/// Connects a (from selection sa) and b (from sb) with the RC preset. `hide_types` clears the GID
/// type from both endpoints, as a peer that does not say it (an older tbverbs, another program).
struct RcPair {
  tbverbs::QueuePair a, b;
};
RcPair connect_rc(End& a, const tbverbs::GidSelection& sa, End& b, const tbverbs::GidSelection& sb,
                  bool hide_types = false) {
  auto pa = ok(tbverbs::QpRecipe::rdma_core_rc(sa).prepare(a.pd, a.cq));
  auto pb = ok(tbverbs::QpRecipe::rdma_core_rc(sb).prepare(b.pd, b.cq));
  tbverbs::Endpoint ea = ok(tbverbs::Endpoint::parse(pa.endpoint().serialize()));
  tbverbs::Endpoint eb = ok(tbverbs::Endpoint::parse(pb.endpoint().serialize()));
  if (hide_types) ea.gid_type = eb.gid_type = tbverbs::GidType::unknown;
  tbverbs::QueuePair qa = ok(std::move(pa).connect(eb));
  tbverbs::QueuePair qb = ok(std::move(pb).connect(ea));
  return RcPair{std::move(qa), std::move(qb)};
}

/// One 4 KiB message from a to b: the sender's completion (or its error).
tbverbs::Result<std::size_t> one_message(RcPair& p, End& a, End& b) {
  ok(p.b.recv(1, ok(b.mr.sge(0, 4096))));
  std::memset(a.mr.data(), 0x5a, 4096);
  ok(p.a.send(2, ok(a.mr.sge(0, 4096))));
  std::array<tbverbs::WorkCompletion, 2> wcs;
  return a.cq.wait(wcs, std::chrono::steady_clock::now() + std::chrono::seconds(10));
}

const char* kRoceA = R"({"port": 1, "ipv4": "10.0.0.1/24", "netdev": "enp1s0f0np0"})";
const char* kRoceB = R"({"port": 1, "ipv4": "10.0.0.2/24"})";

} // namespace

TEST_CASE("emulated mlx5: GID types and netdevs reach the table, and select() takes the RoCE v2 entry", "[rdma-core][roce]") {
  EnvGuard gi("TBVERBS_GID_INDEX", ""), rv("TBVERBS_ROCE_VERSION", "");
  NicFabric fabric("rdma-core-roce", kRoceA, R"({"port": 1, "ipv4": "10.0.0.2/24", "ipv6": "fd00::2"})");
  End a = End::open(fabric, "a");
  const tbverbs::GidTable t = a.table();
  CHECK(t.size() == 256);
  CHECK(t.type_source() == "_ibv_query_gid_table");
  CHECK(t.port_facts().link_layer == tbverbs::LinkLayer::ethernet);
  CHECK(t.type_at(0) == tbverbs::GidType::roce_v1);
  CHECK(t.type_at(1) == tbverbs::GidType::roce_v2);
  CHECK(t.type_at(2) == tbverbs::GidType::roce_v1);
  CHECK(t.type_at(3) == tbverbs::GidType::roce_v2);
  CHECK(t.at(2) == t.at(3)); // one address, two entries
  CHECK(t.netdev_at(3) == "enp1s0f0np0"); // from the sysfs-like tree under ibdev_path
  const tbverbs::GidSelection s = ok(t.select());
  CHECK(s.index() == 3);
  CHECK(s.describe() == "GID[3] ::ffff:10.0.0.1 RoCE v2 netdev enp1s0f0np0");
  // The bootstrap address picks its own v2 entry; IPv6 entries sit at 4/5 on host b.
  End b = End::open(fabric, "b");
  const tbverbs::GidTable tb = b.table();
  CHECK(ok(tb.select(*tbverbs::parse_ipv4("10.0.0.2"))).index() == 3);
  CHECK(tb.type_at(5) == tbverbs::GidType::roce_v2);
  CHECK(tb.at(5) == *tbverbs::Gid::parse("fd00::2"));
  CHECK(tb.netdev_at(5) == "mlx5_0p1");
}

TEST_CASE("RC path MTU is the smaller of both ends' active MTUs, and traffic flows", "[rdma-core][mtu]") {
  EnvGuard gi("TBVERBS_GID_INDEX", ""), rv("TBVERBS_ROCE_VERSION", "");
  NicFabric fabric("rdma-core-roce", R"({"port": 1, "ipv4": "10.0.0.1/24", "active_mtu": 4096})", kRoceB);
  End a = End::open(fabric, "a");
  End b = End::open(fabric, "b");
  const auto sa = ok(a.table().select()), sb = ok(b.table().select());
  CHECK(tbverbs::QpRecipe::rdma_core_rc(sa).local_endpoint(1, 1).mtu == tbverbs::Mtu::mtu4096);
  CHECK(tbverbs::QpRecipe::rdma_core_rc(sb).local_endpoint(1, 1).mtu == tbverbs::Mtu::mtu1024);
  tbverbs::Endpoint eb = tbverbs::QpRecipe::rdma_core_rc(sb).local_endpoint(1, 1);
  CHECK(ok(tbverbs::QpRecipe::rdma_core_rc(sa).rtr_transition(eb)).attr.path_mtu == tbverbs::abi::IBV_MTU_1024);
  // The emulator refuses a path MTU above the port's active MTU (row 16): a fixed 4096 on b
  // would fail RTR, the negotiated one connects.
  RcPair p = connect_rc(a, sa, b, sb);
  CHECK(ok(one_message(p, a, b)) == 1);
  CHECK(b.mr.data()[4095] == std::byte{0x5a});
  auto too_big = ok(tbverbs::QpRecipe::rdma_core_rc(sb).prepare(b.pd, b.cq));
  tbverbs::QpTransition rtr = ok(tbverbs::QpRecipe::rdma_core_rc(sb).rtr_transition(
      tbverbs::QpRecipe::rdma_core_rc(sa).local_endpoint(p.a.qp_num(), 1)));
  rtr.attr.path_mtu = tbverbs::abi::IBV_MTU_4096;
  CHECK(a.ctx.info()->api->modify_qp(too_big.native_handle(), &rtr.attr, rtr.mask) == EINVAL);
}

TEST_CASE("regression: a RoCE v1 end and a RoCE v2 end connect but carry nothing (RC retries exceeded)", "[rdma-core][roce]") {
  EnvGuard gi("TBVERBS_GID_INDEX", ""), rv("TBVERBS_ROCE_VERSION", "");
  NicFabric fabric("rdma-core-roce", kRoceA, kRoceB);
  End a = End::open(fabric, "a");
  End b = End::open(fabric, "b");
  const auto sa = ok(a.table().select());        // RoCE v2, index 3
  const auto sb = ok(b.table().at_index(2));     // the operator pinned b to its RoCE v1 entry
  REQUIRE(sa.type() == tbverbs::GidType::roce_v2);
  REQUIRE(sb.type() == tbverbs::GidType::roce_v1);
  SECTION("peers that do not say their GID type: RTR succeeds, the first send ends in RETRY_EXC_ERR") {
    RcPair p = connect_rc(a, sa, b, sb, /*hide_types=*/true);
    const tbverbs::Error e = err(one_message(p, a, b));
    CHECK(e.kind == tbverbs::ErrorKind::wc_error);
    CHECK(e.wc_status == tbverbs::wc::retry_exc_err);
    REQUIRE(e.diagnosis() != nullptr);
    CHECK(e.diagnosis()->id == "wc-retry-exceeded");
    CHECK_THAT(std::string(e.diagnosis()->remedy), ContainsSubstring("RoCE v2"));
  }
  SECTION("tbverbs endpoints say it: connect refuses before RTR, with the RoCE-version diagnosis") {
    auto pa = ok(tbverbs::QpRecipe::rdma_core_rc(sa).prepare(a.pd, a.cq));
    auto pb = ok(tbverbs::QpRecipe::rdma_core_rc(sb).prepare(b.pd, b.cq));
    const tbverbs::Error e = err(std::move(pa).connect(pb.endpoint()));
    CHECK(e.kind == tbverbs::ErrorKind::incompatible_peer);
    REQUIRE(e.diagnosis() != nullptr);
    CHECK(e.diagnosis()->id == "roce-version-mismatch");
  }
}

TEST_CASE("regression: RoCE v1 across a routed hop connects but carries nothing; RoCE v2 gets across", "[rdma-core][roce]") {
  EnvGuard gi("TBVERBS_GID_INDEX", "");
  NicFabric fabric("rdma-core-roce", kRoceA, R"({"port": 1, "ipv4": "10.0.1.2/24"})", /*routed=*/true);
  End a = End::open(fabric, "a");
  End b = End::open(fabric, "b");
  SECTION("RoCE v1 (TBVERBS_ROCE_VERSION=1 on both ends)") {
    EnvGuard rv("TBVERBS_ROCE_VERSION", "1");
    const auto sa = ok(a.table().select()), sb = ok(b.table().select());
    CHECK(sa.type() == tbverbs::GidType::roce_v1);
    RcPair p = connect_rc(a, sa, b, sb);
    CHECK(err(one_message(p, a, b)).wc_status == tbverbs::wc::retry_exc_err);
  }
  SECTION("RoCE v2 (the default)") {
    EnvGuard rv("TBVERBS_ROCE_VERSION", "");
    const auto sa = ok(a.table().select()), sb = ok(b.table().select());
    RcPair p = connect_rc(a, sa, b, sb);
    CHECK(ok(one_message(p, a, b)) == 1);
  }
}

TEST_CASE("InfiniBand: the port GID, LID addressing within a subnet, a GRH across subnets", "[rdma-core][ib]") {
  EnvGuard gi("TBVERBS_GID_INDEX", ""), rv("TBVERBS_ROCE_VERSION", "");
  for (const char* prefix_b : {"fe80:0:0:0", "fec0:0:0:1"}) {
    CAPTURE(prefix_b);
    NicFabric fabric("rdma-core-ib", R"({"port": 1})",
                     std::string(R"({"port": 1, "subnet_prefix": ")") + prefix_b + "\"}");
    End a = End::open(fabric, "a");
    End b = End::open(fabric, "b");
    const tbverbs::GidTable t = a.table();
    CHECK(t.port_facts().link_layer == tbverbs::LinkLayer::infiniband);
    CHECK(t.port_facts().lid != 0);
    CHECK(t.port_facts().active_mtu == tbverbs::Mtu::mtu4096);
    CHECK_FALSE(t.first_ipv4_mapped()); // no IPv4 GID on InfiniBand: the old rule refused it
    const auto sa = ok(t.select()), sb = ok(b.table().select());
    CHECK(sa.index() == 0);
    CHECK(sa.type() == tbverbs::GidType::ib);
    const tbverbs::Endpoint eb = tbverbs::QpRecipe::rdma_core_rc(sb).local_endpoint(1, 1, sb.port_facts().lid);
    const bool same_subnet = std::string(prefix_b) == "fe80:0:0:0";
    CHECK(ok(tbverbs::QpRecipe::rdma_core_rc(sa).rtr_transition(eb)).attr.ah_attr.is_global == (same_subnet ? 0 : 1));
    RcPair p = connect_rc(a, sa, b, sb);
    CHECK(ok(one_message(p, a, b)) == 1);
  }
}

TEST_CASE("regression: an InfiniBand port with LID 0 (no subnet manager) is PORT_INIT and fails RTR", "[rdma-core][ib]") {
  EnvGuard gi("TBVERBS_GID_INDEX", ""), rv("TBVERBS_ROCE_VERSION", "");
  NicFabric fabric("rdma-core-ib", R"({"port": 1})", R"({"port": 1, "lid": 0})");
  End a = End::open(fabric, "a");
  End b = End::open(fabric, "b");
  const tbverbs::Error port = err(b.ctx.require_active_port(1));
  CHECK(port.kind == tbverbs::ErrorKind::port_not_active);
  REQUIRE(port.diagnosis() != nullptr);
  CHECK(port.diagnosis()->id == "infiniband-no-subnet-manager");
  // Past the port check (a program that does not make it), RTR is where it fails, on both ends.
  const auto sa = ok(a.table().select()), sb = ok(b.table().select());
  CHECK(sb.port_facts().lid == 0);
  auto pa = ok(tbverbs::QpRecipe::rdma_core_rc(sa).prepare(a.pd, a.cq));
  auto pb = ok(tbverbs::QpRecipe::rdma_core_rc(sb).prepare(b.pd, b.cq));
  const tbverbs::Endpoint ea = pa.endpoint(), eb = pb.endpoint();
  CHECK(eb.lid == 0);
  for (const tbverbs::Error& e : {err(std::move(pa).connect(eb)), err(std::move(pb).connect(ea))}) {
    CHECK(e.step == tbverbs::Step::modify_qp_rtr);
    CHECK(e.is(EINVAL));
    REQUIRE(e.diagnosis() != nullptr);
    CHECK(e.diagnosis()->id == "infiniband-no-subnet-manager");
    CHECK_THAT(e.message(), ContainsSubstring("opensm"));
  }
}
