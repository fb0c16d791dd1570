// Apple's published limits as the library plans for them, without a provider: regions of at most
// max_mr_size that serve every message (RegionPlan), and the first guess of the largest message
// (largest_message_guess).
#include <tbverbs/tbverbs.hpp>

#include <catch2/catch_test_macros.hpp>

#include <cstdlib>

using tbverbs::DeviceAttributes;
using tbverbs::ErrorKind;
using tbverbs::Platform;
using tbverbs::PortAttributes;
using tbverbs::RegionPlan;

namespace {
constexpr std::uint64_t apple_max_mr = 16'384'000; // docs/field-reports.md section 4b: 0xfa0000
constexpr std::size_t page = 16384;                // Apple silicon's page size

struct EnvGuard {
  explicit EnvGuard(const char* value) {
    if (value) ::setenv("TBVERBS_MAX_MESSAGE", value, 1);
    else ::unsetenv("TBVERBS_MAX_MESSAGE");
  }
  ~EnvGuard() { ::unsetenv("TBVERBS_MAX_MESSAGE"); }
};
} // namespace

TEST_CASE("a buffer within max_mr_size is one region", "[regions]") {
  auto p = RegionPlan::make(8u << 20, apple_max_mr, 256 * 1024, page);
  REQUIRE(p);
  CHECK(p->count == 1);
  CHECK(p->region_bytes == 8u << 20);
  auto huge = RegionPlan::make(std::size_t{1} << 30, ~std::uint64_t{0}, 1 << 20, page); // rdma-core
  REQUIRE(huge);
  CHECK(huge->count == 1);
}

TEST_CASE("regions never exceed max_mr_size and every message fits in one", "[regions]") {
  for (std::size_t bytes : {std::size_t{16'384'001}, std::size_t{64} << 20, std::size_t{1} << 30}) {
    for (std::size_t span : {std::size_t{4096}, std::size_t{256} << 10, std::size_t{4} << 20}) {
      auto p = RegionPlan::make(bytes, apple_max_mr, span, page);
      REQUIRE(p);
      CHECK(p->region_bytes <= apple_max_mr);
      CHECK(p->region_bytes % page == 0);
      CHECK(p->stride % page == 0);
      CHECK(p->region_bytes - p->stride >= span);
      // The last region reaches the end, and every range of `span` bytes lies in region offset/stride.
      CHECK((p->count - 1) * p->stride + p->region_bytes >= bytes);
      for (std::size_t off : {std::size_t{0}, p->stride - 1, p->stride, bytes / 2, bytes - span}) {
        const std::size_t k = std::min(off / p->stride, p->count - 1);
        CHECK(off >= k * p->stride);
        CHECK(off + span <= k * p->stride + p->region_bytes);
      }
    }
  }
  // 1 GiB in regions of 16,384,000 bytes overlapping by 256 KiB: 67 regions.
  auto gib = RegionPlan::make(std::size_t{1} << 30, apple_max_mr, 256 * 1024, page);
  REQUIRE(gib);
  CHECK(gib->count == 67);
}

TEST_CASE("a message too large for a region is a capacity error, not a straddling SGE", "[regions]") {
  auto p = RegionPlan::make(std::size_t{64} << 20, apple_max_mr, 16'773'120, page);
  REQUIRE(!p);
  CHECK(p.error().is(ErrorKind::capacity));
}

TEST_CASE("largest message: max_msg_sz, half of max_mr_size, whole frames, the operator's override", "[messages]") {
  PortAttributes port;
  port.max_msg_sz = 16'773'120; // TN3205
  DeviceAttributes dev;
  dev.max_mr_size = apple_max_mr;
  {
    EnvGuard env(nullptr);
    auto g = tbverbs::largest_message_guess(Platform::apple, port, dev, std::size_t{64} << 20);
    REQUIRE(g);
    CHECK(g->bytes <= apple_max_mr / 2);
    CHECK(g->bytes % tbverbs::frame_bytes == 0);
    auto small = tbverbs::largest_message_guess(Platform::apple, port, dev, 256 * 1024);
    REQUIRE(small);
    CHECK(small->bytes == 256 * 1024);
    auto odd = tbverbs::largest_message_guess(Platform::apple, port, dev, 10000);
    REQUIRE(odd);
    CHECK(odd->bytes == 8192);
  }
  {
    EnvGuard env("4K");
    auto g = tbverbs::largest_message_guess(Platform::apple, port, dev, 256 * 1024);
    REQUIRE(g);
    CHECK(g->bytes == 4096);
    CHECK(g->reason == "TBVERBS_MAX_MESSAGE");
  }
  {
    EnvGuard env("lots");
    auto g = tbverbs::largest_message_guess(Platform::apple, port, dev, 256 * 1024);
    REQUIRE(!g);
    CHECK(g.error().is(ErrorKind::invalid_argument));
  }
  {
    EnvGuard env("100"); // below one frame on Thunderbolt
    CHECK(!tbverbs::largest_message_guess(Platform::apple, port, dev, 256 * 1024));
  }
}
