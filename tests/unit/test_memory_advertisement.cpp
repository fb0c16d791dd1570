// MemoryAdvertisement: the wire form round-trips, every corruption is refused by name, and at()
// names the rkey of the region that holds a range (the same plan as the owner's MemoryRegionSet).
#include <tbverbs/memory_advertisement.hpp>

#include <catch2/catch_test_macros.hpp>

#include <cstddef>
#include <vector>

namespace {

tbverbs::MemoryAdvertisement sample(std::size_t bytes, std::uint64_t max_region, std::size_t max_span) {
  auto plan = tbverbs::RegionPlan::make(bytes, max_region, max_span, 4096);
  REQUIRE(plan);
  tbverbs::MemoryAdvertisement a;
  a.address = 0x7f0000001000u;
  a.length = bytes;
  a.plan = *plan;
  for (std::size_t k = 0; k < plan->count; ++k) a.rkeys.push_back(static_cast<std::uint32_t>(0x1000 + k));
  return a;
}

} // namespace

TEST_CASE("memory advertisement: the wire form round-trips, one region and several") {
  for (auto a : {sample(1 << 20, 16384000, 256 << 10), sample(64u << 20, 16384000, 256 << 10)}) {
    const auto wire = a.serialize();
    auto b = tbverbs::MemoryAdvertisement::parse(wire);
    REQUIRE(b);
    CHECK(b->address == a.address);
    CHECK(b->length == a.length);
    CHECK(b->plan.count == a.plan.count);
    CHECK(b->plan.stride == a.plan.stride);
    CHECK(b->plan.region_bytes == a.plan.region_bytes);
    CHECK(b->plan.max_span == a.plan.max_span);
    CHECK(b->rkeys == a.rkeys);
  }
  CHECK(sample(64u << 20, 16384000, 256 << 10).plan.count > 1); // the case above really has several
}

TEST_CASE("memory advertisement: a flipped byte, a cut, another magic or a newer version is refused") {
  const auto wire = sample(64u << 20, 16384000, 256 << 10).serialize();
  for (std::size_t i = 0; i < wire.size(); ++i) {
    auto bad = wire;
    bad[i] ^= std::byte{0x01};
    auto r = tbverbs::MemoryAdvertisement::parse(bad);
    INFO("byte " << i);
    REQUIRE_FALSE(r);
    CHECK(r.error().kind == tbverbs::ErrorKind::bad_frame);
  }
  for (std::size_t n = 0; n < wire.size(); ++n) {
    auto r = tbverbs::MemoryAdvertisement::parse(std::span<const std::byte>(wire.data(), n));
    INFO("first " << n << " bytes");
    CHECK_FALSE(r);
  }
  auto newer = wire;
  newer[5] = std::byte{9}; // version 9 (the CRC no longer matches either: the version is read first)
  auto r = tbverbs::MemoryAdvertisement::parse(newer);
  REQUIRE_FALSE(r);
  CHECK(r.error().message().find("newer version") != std::string::npos);
}

TEST_CASE("memory advertisement: at() names the region that holds a range, and refuses one outside") {
  const auto a = sample(64u << 20, 16384000, 256 << 10);
  auto first = a.at(0, 4096);
  REQUIRE(first);
  CHECK(first->addr == a.address);
  CHECK(first->rkey == a.rkeys.front());
  const std::size_t last_start = (64u << 20) - 4096;
  auto last = a.at(last_start, 4096);
  REQUIRE(last);
  CHECK(last->addr == a.address + last_start);
  CHECK(last->rkey == a.rkeys.back());
  CHECK_FALSE(a.at(64u << 20, 1));                  // past the end
  CHECK_FALSE(a.at(0, a.plan.region_bytes + 1));     // no one region holds it
  // Within the overlap: region 1 holds a range that starts where region 0's stride ends.
  auto second = a.at(a.plan.stride, a.plan.max_span);
  REQUIRE(second);
  CHECK(second->rkey == a.rkeys[1]);
}
