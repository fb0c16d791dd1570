// Core library: registered memory within Apple's published limits on the emulated Thunderbolt
// profile (max_mr_size 16,384,000 enforced at ibv_reg_mr) and under both contested readings of
// which access flags registration accepts (quirk mr_access).
#include "emu_fixture.hpp"

#include <catch2/catch_test_macros.hpp>

#include <cerrno>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstring>
#include <string>

using namespace emu_test;
using Catch::Matchers::ContainsSubstring;

namespace {
PortSpec host_a() { return {"hostA", "rdma_en1", "10.99.0.1/30"}; }
PortSpec host_b() { return {"hostB", "rdma_en1", "10.99.0.2/30"}; }
} // namespace

TEST_CASE("core/regions: a buffer above max_mr_size is refused as one region with the diagnosis, served as a "
          "MemoryRegionSet, and a message across a region boundary arrives intact",
          "[core][regions]") {
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  Side b = Side::open(fabric, fabric.b());
  const auto dev = ok(b.ctx.query_device());
  REQUIRE(dev.max_mr_size == 16'384'000); // docs/field-reports.md section 4b

  constexpr std::size_t bytes = 40u << 20, msg = 256u << 10;
  tbverbs::AlignedBuffer big = ok(tbverbs::AlignedBuffer::allocate(bytes));
  const tbverbs::Error whole = err(b.pd.reg_mr(big));
  CHECK(whole.is(EINVAL));
  CHECK_THAT(std::string(whole.detail.view()), ContainsSubstring("exceeds max_mr_size"));
  const tbverbs::Diagnosis* d = tbverbs::find_diagnosis(whole);
  REQUIRE(d != nullptr);
  CHECK(d->id == "reg-mr-exceeds-max-mr-size");

  tbverbs::MemoryRegionSet set = ok(tbverbs::MemoryRegionSet::reg(b.pd, big.bytes(), dev.max_mr_size, msg));
  REQUIRE(set.regions().size() == set.plan().count);
  CHECK(set.plan().count == 3);
  for (const tbverbs::MemoryRegion& r : set.regions()) CHECK(r.size() <= dev.max_mr_size);
  // Longer than the overlap: refused rather than straddling two regions.
  CHECK(!set.sge(0, set.plan().region_bytes + 4096));

  // A message from [region_bytes - 64 KiB, region_bytes + 192 KiB): past the end of region 0, so it
  // must come from region 1, the one that holds it whole.
  const std::size_t off = set.plan().region_bytes - 64 * 1024;
  for (std::size_t i = 0; i < msg; ++i) big.data()[off + i] = static_cast<std::byte>((i * 7 + 3) & 0xff);
  const tbverbs::abi::ibv_sge sge = ok(set.sge(off, msg));
  CHECK(sge.lkey == set.regions()[1].lkey());

  tbverbs::AlignedBuffer dst = ok(tbverbs::AlignedBuffer::allocate(msg));
  tbverbs::MemoryRegion dst_mr = ok(a.pd.reg_mr(dst));
  Pair p = connect(a, b, [](tbverbs::GidSelection g) { return tbverbs::QpRecipe::thunderbolt(std::move(g)); });
  ok(p.a.recv(1, ok(dst_mr.sge(0, msg))));
  ok(p.b.send(2, sge));
  const tbverbs::WorkCompletion wc = wait_one(a.cq);
  CHECK(wc.byte_len() == msg);
  CHECK(std::memcmp(dst.data(), big.data() + off, msg) == 0);
}

TEST_CASE("core/regions: reg_mr_two_sided registers under every mr_access reading and remembers the set that "
          "worked",
          "[core][regions][quirks]") {
  struct Reading {
    const char* quirk;
    bool local_only_works;
  };
  for (Reading r : {Reading{"mr_access=any", true}, Reading{"mr_access=local_write_only", true},
                    Reading{"mr_access=remote_required", false}}) {
    DYNAMIC_SECTION(r.quirk) {
      EnvGuard quirk("TBVERBS_EMU_QUIRKS", r.quirk);
      Fabric fabric(host_a(), host_b());
      fabric.use("hostA");
      const tbverbs::Library lib = emulator();
      tbverbs::Context ctx = ok(tbverbs::Context::open(lib, "rdma_en1"));
      tbverbs::ProtectionDomain pd = ok(ctx.alloc_pd());
      tbverbs::AlignedBuffer buf = ok(tbverbs::AlignedBuffer::allocate(1 << 20));

      auto plain = pd.reg_mr(buf, tbverbs::Access::local_write);
      CHECK(static_cast<bool>(plain) == r.local_only_works);
      if (!plain) {
        CHECK(plain.error().is(EINVAL));
        CHECK_THAT(std::string(plain.error().detail.view()), ContainsSubstring("access flags refused"));
      }
      tbverbs::MemoryRegion mr = ok(pd.reg_mr_two_sided(buf.bytes()));
      const bool remote = tbverbs::includes(mr.access(), tbverbs::Access::remote_write);
      CHECK(remote == !r.local_only_works);
      // The second registration takes the remembered set first, and gets the same one.
      tbverbs::MemoryRegion again = ok(pd.reg_mr_two_sided(buf.bytes()));
      CHECK(again.access() == mr.access());
    }
  }
}

TEST_CASE("core/regions: a closed or moved-from MemoryRegion answers EBADF from sge() and empty accessors, never a crash",
          "[core][regions]") {
  Fabric fabric(host_a(), host_b());
  Side a = Side::open(fabric, fabric.a());
  REQUIRE(a.mr.size() > 0);
  CHECK(a.mr.lkey() != 0);
  tbverbs::MemoryRegion moved = std::move(a.mr);
  // NOLINTBEGIN(bugprone-use-after-move): the moved-from state is the point
  CHECK(a.mr.data() == nullptr);
  CHECK(a.mr.size() == 0);
  CHECK(a.mr.bytes().empty());
  CHECK(a.mr.lkey() == 0);
  CHECK(a.mr.rkey() == 0);
  const tbverbs::Error from_moved = err(a.mr.sge(0, 64));
  // NOLINTEND(bugprone-use-after-move)
  CHECK(from_moved.is(EBADF));
  CHECK_THAT(from_moved.message(), ContainsSubstring("moved-from"));

  CHECK(ok(moved.sge(0, 64)).length == 64);
  ok(moved.close());
  CHECK(moved.size() == 0);
  CHECK(moved.lkey() == 0);
  CHECK(err(moved.sge(0, 64)).is(EBADF));
}
