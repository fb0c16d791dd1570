/// @file memory_region_set.hpp
/// A buffer of any size registered as several memory regions, none larger than the device's
/// max_mr_size, so that every range up to a given length lies inside one of them.
#pragma once

#include "config.hpp"
#include "detail/abi.hpp"
#include "error.hpp"
#include "memory_region.hpp"
#include "protection_domain.hpp"
#include "result.hpp"
#include "types.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

TBVERBS_NAMESPACE_BEGIN

/// How a buffer is cut into regions: `count` regions of `region_bytes` (the last may be shorter),
/// starting every `stride` bytes. Neighbours overlap by `region_bytes - stride` >= the longest
/// range the set serves, so any such range fits wholly inside one region: with one scatter-gather
/// entry per work request (Apple's max_sge is 1) a message can never span two regions.
struct RegionPlan {
  std::size_t region_bytes = 0; ///< Length of each region but the last.
  std::size_t stride = 0;       ///< Distance between region starts (a whole number of pages).
  std::size_t count = 0;        ///< Number of regions.
  std::size_t max_span = 0;     ///< Longest range `sge()` serves.

  /// The plan for `bytes` of memory, regions of at most `max_region_bytes` (the device's
  /// max_mr_size: 16,384,000 on Thunderbolt), serving ranges of up to `max_span` bytes, regions
  /// starting on `page` boundaries. Errors: `capacity` when `max_span` does not fit in a region
  /// with room to step (a region must hold at least twice the span, rounded to pages).
  [[nodiscard]] static Result<RegionPlan> make(std::size_t bytes, std::uint64_t max_region_bytes, std::size_t max_span,
                                               std::size_t page = AlignedBuffer::page_size()) {
    RegionPlan p;
    p.max_span = max_span;
    const std::uint64_t cap = max_region_bytes == 0 ? std::numeric_limits<std::uint64_t>::max() : max_region_bytes;
    if (bytes <= cap) { // one region: the common case on rdma-core, whose max_mr_size is huge
      p.region_bytes = bytes;
      p.stride = bytes;
      p.count = 1;
      p.max_span = bytes;
      return p;
    }
    const std::size_t region = static_cast<std::size_t>(cap / page * page);
    const std::size_t overlap = (max_span + page - 1) / page * page;
    if (region < 2 * overlap || overlap == 0)
      return fail(Error::make(Step::reg_mr, ErrorKind::capacity,
                              "ranges of " + std::to_string(max_span) + " bytes need regions of at least " +
                                  std::to_string(2 * overlap) + " bytes; the device allows " +
                                  std::to_string(max_region_bytes)));
    p.region_bytes = region;
    p.stride = region - overlap;
    p.count = 1 + (bytes - region + p.stride - 1) / p.stride;
    return p;
  }

  /// The index of the region that holds [offset, offset + length) of a buffer of `size` bytes cut
  /// by this plan, or nullopt when the range leaves the buffer or is longer than the overlap. The
  /// same rule on both ends of a link: an RDMA WRITE's sender applies it to the peer's plan to pick
  /// the peer's region (and rkey). Pure.
  std::optional<std::size_t> region_of(std::size_t size, std::size_t offset, std::size_t length) const noexcept {
    if (count == 0 || offset > size || length > size - offset) return std::nullopt;
    const std::size_t k = count > 1 ? (offset / stride < count - 1 ? offset / stride : count - 1) : 0;
    const std::size_t start = k * stride;
    const std::size_t covered = region_bytes < size - start ? region_bytes : size - start;
    if (offset + length > start + covered) return std::nullopt;
    return k;
  }
};

/// One buffer registered as the regions of a RegionPlan (one region when the device allows it).
/// Move-only; keeps its regions (and through them the protection domain) alive; the memory is the
/// caller's and must outlive the set.
class MemoryRegionSet {
public:
  /// Registers `memory` (page-aligned, e.g. an AlignedBuffer) in `pd` as regions of at most
  /// `max_region_bytes` (pass the device's max_mr_size), serving ranges of up to `max_span`
  /// bytes, with ProtectionDomain::reg_mr_two_sided (access rights the driver accepts). Errors:
  /// the plan's `capacity`, or the failing region's reg_mr error (regions registered before it
  /// are deregistered).
  /// With `access`, every region is registered with exactly those rights (e.g. local and remote
  /// write for an RDMA WRITE target) instead of reg_mr_two_sided's.
  [[nodiscard]] static Result<MemoryRegionSet> reg(const ProtectionDomain& pd, std::span<std::byte> memory,
                                                   std::uint64_t max_region_bytes, std::size_t max_span,
                                                   std::optional<Access> access = std::nullopt) {
    auto plan = RegionPlan::make(memory.size(), max_region_bytes, max_span);
    if (!plan) return fail(plan.error());
    MemoryRegionSet set;
    set.base_ = memory.data();
    set.size_ = memory.size();
    set.plan_ = *plan;
    set.regions_.reserve(plan->count);
    for (std::size_t k = 0; k < plan->count; ++k) {
      const std::size_t off = k * plan->stride;
      const std::size_t len = plan->region_bytes < memory.size() - off ? plan->region_bytes : memory.size() - off;
      auto mr = access ? pd.reg_mr(memory.subspan(off, len), *access) : pd.reg_mr_two_sided(memory.subspan(off, len));
      if (!mr) {
        Error e = mr.error();
        return fail(e.with_detail("region " + std::to_string(k + 1) + " of " + std::to_string(plan->count) + ": " +
                                  std::string(e.detail.view())));
      }
      set.regions_.push_back(std::move(*mr));
    }
    return set;
  }

  /// A scatter-gather entry for `length` bytes at `offset`, inside the one region that holds the
  /// whole range. Errors: `invalid_argument` when the range leaves the buffer or is longer than
  /// the plan's max_span (where it could straddle two regions). Allocates nothing.
  [[nodiscard]] Result<abi::ibv_sge> sge(std::size_t offset, std::size_t length) const noexcept {
    if (offset > size_ || length > size_ - offset)
      return fail(Error::make(Step::make_sge, ErrorKind::invalid_argument,
                              "range outside the registered memory region set"));
    const auto k = plan_.region_of(size_, offset, length);
    if (!k)
      return fail(Error::make(Step::make_sge, ErrorKind::invalid_argument,
                              "range longer than the region set's overlap (max_span)"));
    return regions_[*k].sge(offset - *k * plan_.stride, length);
  }

  /// Start of the buffer.
  std::byte* data() const noexcept { return base_; }
  /// Length of the buffer.
  std::size_t size() const noexcept { return size_; }
  /// How the buffer was cut.
  const RegionPlan& plan() const noexcept { return plan_; }
  /// The regions, in address order.
  std::span<const MemoryRegion> regions() const noexcept { return regions_; }

private:
  MemoryRegionSet() = default;
  std::byte* base_ = nullptr;
  std::size_t size_ = 0;
  RegionPlan plan_;
  std::vector<MemoryRegion> regions_;
};

TBVERBS_NAMESPACE_END
