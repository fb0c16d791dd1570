// Core library over the emulated fabric: queue pairs, the data path and the profile limits
// (UC only, 10 QPs per device, port down, SEND/RECV only on Thunderbolt), deadlines and checks.
#include "emu_fixture.hpp"

#include <tbverbs/budget.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

using namespace emu_test;
using Catch::Matchers::ContainsSubstring;

namespace {
PortSpec host_a() { return {"hostA", "rdma_en1", "10.99.0.1/30"}; }
PortSpec host_b() { return {"hostB", "rdma_en1", "10.99.0.2/30"}; }
PortSpec rc_a() { return {"nodeA", "mlx5_0", "10.0.0.1/24"}; }
PortSpec rc_b() { return {"nodeB", "mlx5_0", "10.0.0.2/24"}; }

auto thunderbolt = [](const tbverbs::GidSelection& s) { return tbverbs::QpRecipe::thunderbolt(s); };
auto rdma_core_rc = [](const tbverbs::GidSelection& s) { return tbverbs::QpRecipe::rdma_core_rc(s); };

// --- The two-process test's child side, without Catch2 (a child must never throw into it). ---

#define CHILD_CHECK(cond, code)                                                                   \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::fprintf(stderr, "child %d: check failed: %s\n", static_cast<int>(::getpid()), #cond);  \
      return code;                                                                                \
    }                                                                                             \
  } while (0)
#define CHILD_OK(expr, code)                                                                      \
  do {                                                                                            \
    if (!(expr)) {                                                                                \
      std::fprintf(stderr, "child %d: %s: %s\n", static_cast<int>(::getpid()), #expr,            \
                   (expr).error().message().c_str());                                             \
      return code;                                                                                \
    }                                                                                             \
  } while (0)

bool send_all(int fd, const void* p, std::size_t n) {
  return ::send(fd, p, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
}
bool recv_all(int fd, void* p, std::size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = ::recv(fd, c, n, 0);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

// One side of the two-process exchange: connect a UC QP with the Thunderbolt recipe through
// `sock`, post a receive, barrier, send `count` messages of `size` bytes tagged with `me`, and
// check every byte of the `count` messages received from the peer.
int uc_exchange_side(const Fabric& fabric, const PortSpec& port, int sock, std::uint8_t me, std::uint8_t peer) {
  constexpr int count = 8;
  constexpr std::size_t size = 3 * 4096 + 100; // 4 frames on both sides
  fabric.use(port.host);
  auto lib = tbverbs::Library::load(TBVERBS_EMU_LIBRARY);
  CHILD_OK(lib, 10);
  auto ctx = tbverbs::Context::open(*lib, port.device);
  CHILD_OK(ctx, 11);
  CHILD_CHECK(ctx->platform() == tbverbs::Platform::apple, 12);
  auto table = ctx->gid_table(1);
  CHILD_OK(table, 13);
  auto sel = table->select();
  CHILD_OK(sel, 14);
  CHILD_CHECK(sel->index() == 1, 15);
  auto pd = ctx->alloc_pd();
  CHILD_OK(pd, 16);
  auto buf = tbverbs::AlignedBuffer::allocate(2 * count * 16384);
  CHILD_OK(buf, 17);
  auto mr = pd->reg_mr(*buf);
  CHILD_OK(mr, 18);
  auto cq = ctx->create_cq(64);
  CHILD_OK(cq, 19);
  const tbverbs::QpRecipe recipe = tbverbs::QpRecipe::thunderbolt(*sel);
  CHILD_CHECK(recipe.type() == tbverbs::QpType::uc, 20);
  auto prep = recipe.prepare(*pd, *cq);
  CHILD_OK(prep, 21);
  CHILD_CHECK(prep->endpoint().gid == sel->gid(), 22);

  const auto mine = prep->endpoint().serialize();
  std::array<std::byte, tbverbs::Endpoint::wire_size> theirs{};
  CHILD_CHECK(send_all(sock, mine.data(), mine.size()) && recv_all(sock, theirs.data(), theirs.size()), 23);
  auto remote = tbverbs::Endpoint::parse(theirs);
  CHILD_OK(remote, 24);
  CHILD_CHECK(remote->qp_type == tbverbs::QpType::uc, 25);
  auto qp = std::move(*prep).connect(*remote);
  CHILD_OK(qp, 26);

  // Receives first (one slot per message), then the "receives posted" barrier, then send.
  const std::size_t rx = count * 16384;
  for (int i = 0; i < count; ++i) {
    auto s = mr->sge(rx + static_cast<std::size_t>(i) * 16384, size);
    CHILD_OK(s, 27);
    auto r = qp->recv(static_cast<std::uint64_t>(1000 + i), *s);
    CHILD_OK(r, 28);
  }
  char token = 'R';
  CHILD_CHECK(send_all(sock, &token, 1) && recv_all(sock, &token, 1), 29);
  for (int i = 0; i < count; ++i) {
    std::byte* p = mr->data() + static_cast<std::size_t>(i) * 16384;
    for (std::size_t k = 0; k < size; ++k) p[k] = static_cast<std::byte>(me * 31 + i * 7 + k % 251);
    auto s = mr->sge(static_cast<std::size_t>(i) * 16384, size);
    CHILD_OK(s, 30);
    auto r = qp->send(static_cast<std::uint64_t>(i), *s);
    CHILD_OK(r, 31);
  }
  int sends = 0, recvs = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::array<tbverbs::WorkCompletion, 16> wcs;
  while (sends < count || recvs < count) {
    auto n = cq->wait(wcs, deadline);
    CHILD_OK(n, 32); // a failed completion or the deadline
    for (std::size_t j = 0; j < *n; ++j) {
      const auto& wc = wcs[j];
      if (!wc.is_recv()) {
        ++sends;
        continue;
      }
      const int i = static_cast<int>(wc.wr_id()) - 1000;
      CHILD_CHECK(i == recvs, 33); // in order on one QP
      CHILD_CHECK(wc.byte_len() == size, 34);
      const std::byte* p = mr->data() + rx + static_cast<std::size_t>(i) * 16384;
      for (std::size_t k = 0; k < size; ++k)
        CHILD_CHECK(p[k] == static_cast<std::byte>(peer * 31 + i * 7 + k % 251), 35);
      ++recvs;
    }
  }
  // Nobody tears down before the other has all its data.
  CHILD_CHECK(send_all(sock, &token, 1) && recv_all(sock, &token, 1), 36);
  return 0;
}

} // namespace

TEST_CASE("core/qp: two processes connect UC QPs with the Thunderbolt recipe and exchange SEND/RECV data",
          "[core][qp][fork]") {
  Fabric fabric(host_a(), host_b());
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  Child a([&] {
    ::close(sv[1]);
    return uc_exchange_side(fabric, fabric.a(), sv[0], 1, 2);
  });
  Child b([&] {
    ::close(sv[0]);
    return uc_exchange_side(fabric, fabric.b(), sv[1], 2, 1);
  });
  ::close(sv[0]);
  ::close(sv[1]);
  CHECK(a.wait() == 0);
  CHECK(b.wait() == 0);
}

TEST_CASE("core/qp: RC is refused on Thunderbolt at create_qp with EOPNOTSUPP and the UC-only diagnosis",
          "[core][qp]") {
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  const auto rc = tbverbs::QpRecipe::thunderbolt(a.select()).qp_type(tbverbs::QpType::rc);
  const tbverbs::Error e = err(rc.prepare(a.pd, a.cq));
  CHECK(e.step == tbverbs::Step::create_qp);
  CHECK(e.is(EOPNOTSUPP));
  CHECK(e.platform == tbverbs::Platform::apple);
  REQUIRE(e.diagnosis() != nullptr);
  CHECK(e.diagnosis()->id == "qp-type-uc-only");
  CHECK_THAT(e.message(), ContainsSubstring("IBV_QPT_UC"));
  // for_platform picks UC here, which works.
  CHECK(tbverbs::QpRecipe::for_platform(a.ctx.platform(), a.select()).type() == tbverbs::QpType::uc);
  ok(tbverbs::QpRecipe::for_platform(a.ctx.platform(), a.select()).prepare(a.pd, a.cq));
}

TEST_CASE("core/platform: a device's platform is its transport, not its name (issue 18, finding 1)", "[core][qp]") {
  SECTION("an rdma-core RC NIC called rdma_en1 is rdma-core: RC, RDMA WRITE, depths in work requests") {
    Fabric fabric({"nodeA", "rdma_en1", "10.0.0.1/24"}, {"nodeB", "rdma_en1", "10.0.0.2/24"}, "rdma-core-rc");
    fabric.use("nodeA");
    const auto list = ok(tbverbs::DeviceList::get(emulator()));
    const tbverbs::Device dev = ok(list.find("rdma_en1"));
    CHECK(dev.transport_type() != tbverbs::thunderbolt_transport);
    CHECK(dev.platform() == tbverbs::Platform::rdma_core);
    CHECK(list.platform() == tbverbs::Platform::rdma_core);
    Side a = Side::open(fabric, fabric.a());
    Side b = Side::open(fabric, fabric.b(), tbverbs::Access::local_write | tbverbs::Access::remote_write);
    CHECK(a.ctx.platform() == tbverbs::Platform::rdma_core);
    const auto limits = ok(tbverbs::DeviceLimits::of(a.ctx));
    CHECK_FALSE(limits.frames);
    CHECK(limits.qps > tbverbs::apple_usable_qps);
    const auto recipe = tbverbs::QpRecipe::for_platform(a.ctx.platform(), a.select());
    CHECK(recipe.type() == tbverbs::QpType::rc);
    Pair p = connect(a, b, [](const tbverbs::GidSelection& s) {
      return tbverbs::QpRecipe::for_platform(tbverbs::Platform::rdma_core, s);
    });
    REQUIRE(p.a.rdma_write_allowed());
    for (int i = 0; i < 512; ++i) a.mr.data()[i] = static_cast<std::byte>(i * 7 + 3);
    ok(p.a.rdma_write(7, ok(a.mr.sge(0, 512)), reinterpret_cast<std::uintptr_t>(b.mr.data()), b.mr.rkey()));
    CHECK(wait_one(a.cq).wr_id() == 7);
    CHECK(std::memcmp(b.mr.data(), a.mr.data(), 512) == 0);
  }
  SECTION("a Thunderbolt device by any other name is Apple's: UC, 10 QPs, depths in 4 KiB frames") {
    Fabric fabric({"hostA", "tb0", "10.99.0.1/30"}, {"hostB", "tb0", "10.99.0.2/30"});
    fabric.use("hostA");
    const auto list = ok(tbverbs::DeviceList::get(emulator()));
    const tbverbs::Device dev = ok(list.find("tb0"));
    CHECK(dev.transport_type() == tbverbs::thunderbolt_transport);
    CHECK(dev.platform() == tbverbs::Platform::apple);
    // A device that is not there is diagnosed for the platform of those that are.
    const tbverbs::Error missing = err(list.find("rdma_en9"));
    CHECK(missing.platform == tbverbs::Platform::apple);
    Side a = Side::open(fabric, fabric.a());
    CHECK(a.ctx.platform() == tbverbs::Platform::apple);
    const auto limits = ok(tbverbs::DeviceLimits::of(a.ctx));
    CHECK(limits.frames);
    CHECK(limits.qps == tbverbs::apple_usable_qps);
    CHECK(tbverbs::QpRecipe::for_platform(a.ctx.platform(), a.select()).type() == tbverbs::QpType::uc);
  }
  SECTION("the rule itself: transport 100 or Apple's library") {
    using tbverbs::Platform;
    STATIC_CHECK(tbverbs::platform_of_device(tbverbs::thunderbolt_transport, Platform::rdma_core) == Platform::apple);
    STATIC_CHECK(tbverbs::platform_of_device(0, Platform::apple) == Platform::apple);
    STATIC_CHECK(tbverbs::platform_of_device(0, Platform::rdma_core) == Platform::rdma_core);
    STATIC_CHECK(tbverbs::platform_of_device(1, Platform::any) == Platform::rdma_core);
  }
}

TEST_CASE("core/qp: the 11th QP on a Thunderbolt device is EBUSY with the QP-cap diagnosis", "[core][qp]") {
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  const auto recipe = tbverbs::QpRecipe::thunderbolt(a.select());
  std::vector<tbverbs::PreparedQueuePair> qps;
  for (int i = 0; i < 10; ++i) qps.push_back(ok(recipe.prepare(a.pd, a.cq)));
  CHECK(fabric.qp_count(fabric.a()) == 10);

  const tbverbs::Error e = err(recipe.prepare(a.pd, a.cq));
  CHECK(e.step == tbverbs::Step::create_qp);
  CHECK(e.is(EBUSY));
  REQUIRE(e.diagnosis() != nullptr);
  CHECK(e.diagnosis()->id == "create-qp-ebusy-qp-cap");
  const std::string m = e.message();
  CHECK_THAT(m, ContainsSubstring("10 QPs per device"));
  CHECK_THAT(m, ContainsSubstring("Don't retry"));
  CHECK_THAT(m, ContainsSubstring("10 QPs already open on this device"));

  // Destroying one frees a slot: the cap is the count, not a stuck state.
  qps.pop_back();
  ok(recipe.prepare(a.pd, a.cq));
}

TEST_CASE("core/qp: a port that is down makes alloc_pd fail, and the error names the port state", "[core][qp]") {
  PortSpec down = host_a();
  down.up = false;
  Fabric fabric(down, host_b());
  fabric.use("hostA");
  auto ctx = ok(tbverbs::Context::open(emulator(), "rdma_en1"));
  CHECK(ok(ctx.query_port(1)).state == tbverbs::PortState::down);
  const tbverbs::Error e = err(ctx.alloc_pd());
  CHECK(e.step == tbverbs::Step::alloc_pd);
  CHECK(e.platform == tbverbs::Platform::apple);
  CHECK_THAT(e.message(), ContainsSubstring("PORT_DOWN"));
  REQUIRE(e.diagnosis() != nullptr);
  CHECK(e.diagnosis()->id == "alloc-pd-port-down");
  CHECK_THAT(e.message(), ContainsSubstring("PORT_ACTIVE (4) on both ends"));
  const tbverbs::Error inactive = err(ctx.require_active_port(1));
  CHECK(inactive.kind == tbverbs::ErrorKind::port_not_active);

  // Port back up: the PD can be allocated.
  fabric.set_port_up(fabric.a(), true);
  ok(ctx.alloc_pd());
}

TEST_CASE("core/qp: wait() with no sender returns a timeout error within the deadline", "[core][qp]") {
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  Side b = Side::open(fabric, fabric.b());
  Pair p = connect(a, b, thunderbolt);
  ok(p.a.recv(1, ok(a.mr.sge(0, 64))));

  for (const bool channel : {true, false}) {
    INFO("completion channel: " << channel);
    auto cq = ok(a.ctx.create_cq(16, channel));
    std::array<tbverbs::WorkCompletion, 4> wcs;
    const auto t0 = std::chrono::steady_clock::now();
    const tbverbs::Error e = err(cq.wait(wcs, t0 + std::chrono::milliseconds(200)));
    const auto took = std::chrono::steady_clock::now() - t0;
    CHECK(e.kind == tbverbs::ErrorKind::timeout);
    CHECK(e.step == tbverbs::Step::wait_cq);
    CHECK(took >= std::chrono::milliseconds(200));
    CHECK(took < std::chrono::milliseconds(1500));
    REQUIRE(e.diagnosis() != nullptr);
  }
  // The QP's own CQ too (a receive posted, nothing sent).
  std::array<tbverbs::WorkCompletion, 4> wcs;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(err(a.cq.wait(wcs, t0 + std::chrono::milliseconds(100))).kind == tbverbs::ErrorKind::timeout);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1500));
}

TEST_CASE("core/qp: rdma_write is refused on the Thunderbolt recipe and changes the peer's memory on rdma-core-rc",
          "[core][qp]") {
  SECTION("Thunderbolt: unsupported, nothing posted") {
    Fabric fabric(host_a(), host_b());
    Side a = Side::open(fabric, fabric.a());
    Side b = Side::open(fabric, fabric.b(), tbverbs::Access::local_write | tbverbs::Access::remote_write);
    Pair p = connect(a, b, thunderbolt);
    CHECK_FALSE(p.a.rdma_write_allowed());
    std::memset(a.mr.data(), 0x5a, 64);
    const auto remote = reinterpret_cast<std::uintptr_t>(b.mr.data());
    const tbverbs::Error e = err(p.a.rdma_write(7, ok(a.mr.sge(0, 64)), remote, b.mr.rkey()));
    CHECK(e.kind == tbverbs::ErrorKind::unsupported);
    CHECK(e.step == tbverbs::Step::post_send);
    CHECK_THAT(e.message(), ContainsSubstring("SEND/RECV only"));
    CHECK(e.platform == tbverbs::Platform::apple);
    CHECK(e.device.view() == "rdma_en1");
    REQUIRE(e.diagnosis() != nullptr);
    CHECK(e.diagnosis()->id == "unsupported-thunderbolt");
    // Nothing was posted: no completion, and the peer's memory is untouched.
    std::array<tbverbs::WorkCompletion, 2> wcs;
    CHECK(ok(a.cq.poll(wcs)) == 0);
    CHECK(b.mr.data()[0] == std::byte{0});
  }
  SECTION("rdma-core-rc: the write lands in the peer's region") {
    Fabric fabric(rc_a(), rc_b(), "rdma-core-rc");
    Side a = Side::open(fabric, fabric.a());
    Side b = Side::open(fabric, fabric.b(), tbverbs::Access::local_write | tbverbs::Access::remote_write);
    CHECK(a.ctx.platform() == tbverbs::Platform::rdma_core);
    Pair p = connect(a, b, rdma_core_rc);
    CHECK(p.a.type() == tbverbs::QpType::rc);
    REQUIRE(p.a.rdma_write_allowed());
    for (int i = 0; i < 4096; ++i) a.mr.data()[i] = static_cast<std::byte>(i * 13 + 1);
    const auto remote = reinterpret_cast<std::uintptr_t>(b.mr.data()) + 8192;
    ok(p.a.rdma_write(42, ok(a.mr.sge(0, 4096)), remote, b.mr.rkey()));
    const auto wc = wait_one(a.cq);
    CHECK(wc.wr_id() == 42);
    CHECK(std::memcmp(b.mr.data() + 8192, a.mr.data(), 4096) == 0);
    CHECK(b.mr.data()[8191] == std::byte{0});
    CHECK(b.mr.data()[8192 + 4096] == std::byte{0});
  }
}

TEST_CASE("core/qp: a bad lkey or an out-of-range sge is an error, never a write outside the region",
          "[core][qp]") {
  SECTION("sge() refuses a range outside the region") {
    Fabric fabric(host_a(), host_b());
    Side a = Side::open(fabric, fabric.a());
    const std::size_t n = a.mr.size();
    CHECK(err(a.mr.sge(n, 1)).kind == tbverbs::ErrorKind::invalid_argument);
    CHECK(err(a.mr.sge(0, n + 1)).kind == tbverbs::ErrorKind::invalid_argument);
    CHECK(err(a.mr.sge(n - 10, 11)).kind == tbverbs::ErrorKind::invalid_argument);
    CHECK(err(a.mr.sge(SIZE_MAX, 2)).kind == tbverbs::ErrorKind::invalid_argument);
    CHECK_THAT(err(a.mr.sge(n, 1)).message(), ContainsSubstring("outside the registered memory region"));
    ok(a.mr.sge(n - 10, 10));
  }
  SECTION("a send with a bad lkey completes with IBV_WC_LOC_PROT_ERR, reported by poll as wc_error") {
    Fabric fabric(rc_a(), rc_b(), "rdma-core-rc");
    Side a = Side::open(fabric, fabric.a());
    Side b = Side::open(fabric, fabric.b());
    Pair p = connect(a, b, rdma_core_rc);
    ok(p.b.recv(1, ok(b.mr.sge(0, 4096))));
    std::memset(b.mr.data(), 0x77, 4096);
    tbverbs::abi::ibv_sge bad = ok(a.mr.sge(0, 64));
    bad.lkey ^= 0x5a5a00u; // a key nobody registered
    ok(p.a.send(9, bad));
    std::array<tbverbs::WorkCompletion, 4> wcs;
    const tbverbs::Error e = err(a.cq.wait(wcs, std::chrono::steady_clock::now() + std::chrono::seconds(5)));
    CHECK(e.kind == tbverbs::ErrorKind::wc_error);
    CHECK(e.wc_status == tbverbs::wc::loc_prot_err);
    CHECK(e.wr_id == 9);
    CHECK_THAT(e.message(), ContainsSubstring("IBV_WC_LOC_PROT_ERR"));
    // The receiver's buffer was not written.
    CHECK(b.mr.data()[0] == std::byte{0x77});
  }
  SECTION("a receive posted outside its region fails its completion; the sender's data goes nowhere") {
    Fabric fabric(rc_a(), rc_b(), "rdma-core-rc");
    Side a = Side::open(fabric, fabric.a());
    Side b = Side::open(fabric, fabric.b());
    Pair p = connect(a, b, rdma_core_rc);
    tbverbs::abi::ibv_sge beyond = ok(b.mr.sge(0, 4096));
    beyond.addr += b.mr.size(); // past the end of the region, same lkey
    ok(p.b.recv(3, beyond));
    ok(p.a.send(4, ok(a.mr.sge(0, 4096))));
    std::array<tbverbs::WorkCompletion, 4> wcs;
    const tbverbs::Error e = err(b.cq.wait(wcs, std::chrono::steady_clock::now() + std::chrono::seconds(5)));
    CHECK(e.kind == tbverbs::ErrorKind::wc_error);
    CHECK(e.wc_status == tbverbs::wc::loc_prot_err);
    CHECK(e.wr_id == 3);
  }
}

TEST_CASE("core/qp: RTR toward a GID that is not at the other end of the cable fails with ETIMEDOUT and the "
          "per-cable remedy",
          "[core][qp]") {
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  auto p1 = ok(tbverbs::QpRecipe::thunderbolt(a.select()).prepare(a.pd, a.cq));
  auto p2 = ok(tbverbs::QpRecipe::thunderbolt(a.select()).prepare(a.pd, a.cq));
  // Both QPs are on hostA: p2's GID is this port's own address, not the peer's across the cable.
  const tbverbs::Error e = err(std::move(p1).connect(p2.endpoint()));
  CHECK(e.step == tbverbs::Step::modify_qp_rtr);
  CHECK(e.is(ETIMEDOUT));
  CHECK(e.gid_index == 1);
  const std::string m = e.message();
  CHECK_THAT(m, ContainsSubstring("local GID ::ffff:10.99.0.1 -> remote GID ::ffff:10.99.0.1"));
  REQUIRE(e.diagnosis() != nullptr);
  CHECK_THAT(m, ContainsSubstring("/30 per cable"));
}

TEST_CASE("core/qp: RTR with the port gone down under it says the port left ACTIVE, not an unreachable dgid "
          "(issue 32 item 5)",
          "[core][qp]") {
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  Side b = Side::open(fabric, fabric.b());
  auto pa = ok(tbverbs::QpRecipe::thunderbolt(a.select()).prepare(a.pd, a.cq));
  auto pb = ok(tbverbs::QpRecipe::thunderbolt(b.select()).prepare(b.pd, b.cq));
  fabric.set_port_up(fabric.a(), false); // the cable pulled between set-up's steps
  const tbverbs::Error e = err(std::move(pa).connect(pb.endpoint()));
  fabric.set_port_up(fabric.a(), true);
  CHECK(e.step == tbverbs::Step::modify_qp_rtr);
  const std::string m = e.message();
  CHECK_THAT(m, ContainsSubstring("the port left ACTIVE (port 1 is PORT_DOWN now)"));
  REQUIRE(e.diagnosis() != nullptr);
  CHECK(e.diagnosis()->id == "transition-port-down");
}

TEST_CASE("core/qp: a peer endpoint with a zero GID or another QP type is refused before RTR", "[core][qp]") {
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  Side b = Side::open(fabric, fabric.b());
  auto pb = ok(tbverbs::QpRecipe::thunderbolt(b.select()).prepare(b.pd, b.cq));

  tbverbs::Endpoint zero = pb.endpoint();
  zero.gid = tbverbs::Gid(); // what JACCL sent when the peer had no IPv4-mapped GID
  const tbverbs::Error e1 = err(ok(tbverbs::QpRecipe::thunderbolt(a.select()).prepare(a.pd, a.cq)).connect(zero));
  CHECK(e1.kind == tbverbs::ErrorKind::incompatible_peer);
  CHECK_THAT(e1.message(), ContainsSubstring("zero"));

  tbverbs::Endpoint rc = pb.endpoint();
  rc.qp_type = tbverbs::QpType::rc;
  const tbverbs::Error e2 = err(ok(tbverbs::QpRecipe::thunderbolt(a.select()).prepare(a.pd, a.cq)).connect(rc));
  CHECK(e2.kind == tbverbs::ErrorKind::incompatible_peer);
  CHECK(e2.step == tbverbs::Step::check_endpoint);
}
